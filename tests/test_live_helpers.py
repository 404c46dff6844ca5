"""Shared helpers for the live-emulation tests: real scheduler and agent processes on
127.0.0.1 with ephemeral ports (scheduler_svc.launcher), conditions waited for with deadlines,
Prometheus text parsed with prometheus_client."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from analysim.clusters import parse_cluster
from analysim.tls import TlsFiles
from scheduler_svc.client import SchedulerClient
from scheduler_svc.launcher import LocalRun
from tests.polling import scaled, slowdown, wait_until
from tests.procs import started


def local_run(workdir: Path, **kw: object) -> LocalRun:
    """A LocalRun for a test: its deadlines stretched by this machine's measured slowdown, and
    every process it starts killed when the test ends (a timeout or a failure included)."""
    return LocalRun(workdir, deadline_scale=slowdown(), on_spawn=started, **kw)


@contextmanager
def live(tmp: Path, sched_args: list[str], cluster: str, nodes: int, agents: int = 2,
         agent_args: list[str] = (), auth: bool = True, tls: TlsFiles | None = None,
         ) -> Iterator[tuple[LocalRun, SchedulerClient]]:
    """A scheduler with ``sched_args`` (cluster added) and ``agents`` agent processes, with
    provisioned tokens (the client holds the operator's) unless ``auth`` is False; ``tls``: what
    agents and the client present and trust (the scheduler's TLS options go in ``sched_args``)."""
    run = local_run(tmp / "procs", tls=tls)
    try:
        if auth:
            run.provision([n.name for n in parse_cluster(cluster).nodes], max(agents, 1))
        run.start_scheduler([*sched_args, "--cluster", cluster, "--log-level", "WARNING"])
        if agents:
            run.start_agents(cluster, nodes, agents, list(agent_args))
        with run.client() as client:
            client.wait_ready()
            yield run, client
    finally:
        run.stop()


def scrape(host: str, port: int) -> dict[str, list]:
    """{metric family name: [samples]} from a real /metrics endpoint."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=scaled(10)) as r:
        text = r.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def http_get(host: str, port: int, path: str) -> tuple[int, str]:
    """(status, body) of a plain GET, error statuses included (e.g. /readyz answering 503)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=scaled(10)) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def sample_sum(samples: list, name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def wait_port_free(port: int, host: str = "127.0.0.1") -> None:
    """Wait until a just-killed server's port can be bound again (the kernel may hold it for a
    moment), before a new server is started on it; never assume it is free at once."""

    def bindable() -> bool:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                return False
            return True

    wait_until(bindable, 60, f"port {port} free to bind again")
