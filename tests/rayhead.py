"""A real local Ray cluster for tests and benchmarks: `ray start --head --block` on 127.0.0.1 with
every port our own and its own auth token (passed in the environment: ~/.ray is left alone),
stopped by ending the process we started (`ray start --block` stops its children on SIGTERM)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.polling import wait_until


@dataclass
class RayHead:
    address: str
    pid: int  # the `ray start` process; Ray's own processes are its descendants
    env: dict[str, str]  # for whatever connects to it: the token


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


# What `ray start` says when its raylet did not register with the GCS within the 30 s Ray waits
# (a constant in ray/_private/node.py): on a loaded machine that is a slow start, not a failure.
SLOW_START = "timed out during startup"
START_DEADLINE_S = 300  # every attempt's wait together


@contextlib.contextmanager
def ray_head(num_cpus: int = 2) -> Iterator[RayHead]:
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    deadline = time.monotonic() + START_DEADLINE_S
    while True:
        temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths live under it
        gcs, proc = _start(num_cpus, env, temp)
        log = (temp / "start.log").read_text()
        if proc.poll() is None:
            break
        _stop(proc, temp)
        if SLOW_START not in log or time.monotonic() > deadline:
            raise RuntimeError(f"ray start failed:\n{log}")
        # (Ray gave up on its own 30 s: started again, with new ports and a new folder.)
    try:
        yield RayHead(f"127.0.0.1:{gcs}", proc.pid, env)
    finally:
        _stop(proc, temp)


def _start(num_cpus: int, env: dict[str, str], temp: Path) -> tuple[int, subprocess.Popen]:
    """`ray start --head --block` in ``temp``, waited for until it says it started or exits."""
    gcs, client, dash, agent, agent_grpc, metrics, env_agent, nm, om = free_ports(9)
    log_path = temp / "start.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", f"--num-cpus={num_cpus}",
             "--node-ip-address=127.0.0.1", f"--port={gcs}", f"--ray-client-server-port={client}",
             "--include-dashboard=false", f"--dashboard-port={dash}", f"--dashboard-agent-listen-port={agent}",
             f"--dashboard-agent-grpc-port={agent_grpc}", f"--metrics-export-port={metrics}",
             f"--runtime-env-agent-port={env_agent}", f"--node-manager-port={nm}", f"--object-manager-port={om}",
             f"--temp-dir={temp}", "--disable-usage-stats"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        wait_until(lambda: "Ray runtime started" in log_path.read_text() or proc.poll() is not None, 120,
                   "ray start")
    except BaseException:
        _stop(proc, temp)
        raise
    return gcs, proc


def _stop(proc: subprocess.Popen, temp: Path) -> None:
    """End what `ray start` started (it stops its children on SIGTERM; one that gave up leaves
    none running as far as Ray goes, and what its session still holds is ended) and remove its
    folder."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # (its own session, start_new_session: ours alone)
    shutil.rmtree(temp, ignore_errors=True)
