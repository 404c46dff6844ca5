"""The monitor service behind gateway replicas (real PostgreSQL, real processes): a colluding
group whose members' requests land on different workers of `analysim gateway --workers 2`
gets the group status it gets through one replica; a path-finding attacker spread over the
workers is warned at the same query count as against one; the monitor SIGKILLed and
restarted: the workers keep serving, the monitor catches up from its cursor."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mlaas_monitor import auth
from mlaas_monitor.model import Policy
from mlaas_monitor.monitor.attacks import ApiClient, Domain, Oracle, Pathfinding
from mlaas_monitor.store import Store
from tests.pg import PgCluster
from tests.polling import scaled
from tests.test_gateway_helpers import ADMIN_KEY, Client, credit_model, credit_rows, start_module, wait_until
from tests.test_monitor_daemon import free_port, metric

pytestmark = pytest.mark.timeout(300)
RING = ("m1", "m2", "m3")
ACCOUNTS = (*RING, "pf", "late")


@dataclass
class Deployment:
    url: str  # PostgreSQL
    tmp: Path
    keys: dict[str, str]
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    monitor: Client | None = None
    gateway: Client | None = None
    workers: list[dict[str, Any]] = field(default_factory=list)

    def start_monitor(self, port: int) -> None:
        proc, ports = start_module(
            ["mlaas_monitor.monitor", "serve", "--db", self.url, "--state", str(self.tmp / "monitor.db"), "--port", str(port)],
            self.tmp / "monitor.port", "the monitor's port file",
        )  # fmt: skip
        self.procs.append(proc)
        self.monitor = Client("127.0.0.1", ports["http"], ADMIN_KEY)

    def start_gateway(self, workers: int) -> None:
        assert self.monitor is not None
        proc, ports = start_module(
            ["analysim", "gateway", "--db", self.url, "--port", "0", "--grpc-port", "0", "--workers", str(workers),
             "--monitor-url", f"http://127.0.0.1:{self.monitor.port}"], self.tmp / "gateway.port", "the gateway to listen",
        )  # fmt: skip
        self.procs.append(proc)
        self.gateway = Client("127.0.0.1", ports["http"], ADMIN_KEY)
        self.workers = ports.get("workers", [])

    def client(self, name: str) -> Client:
        assert self.gateway is not None
        return Client("127.0.0.1", self.gateway.port, self.keys[name])

    def caught_up(self, sent: dict[str, int]) -> bool:
        assert self.monitor is not None
        status, body = self.monitor.get("/v1/admin/monitor/credit")
        seen = {u["subject"]: u["n_queries"] for u in body.get("users", [])} if status == 200 else {}
        return all(seen.get(n) == k for n, k in sent.items())

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(scaled(60))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(scaled(30))


def deploy(cluster: PgCluster, tmp: Path, workers: int) -> Deployment:
    url = cluster.new_database()
    store = Store(url)
    store.add_model(credit_model())
    store.set_policy("credit", Policy(reveal_leaf=True))
    keys = {n: auth.new_key() for n in ACCOUNTS}
    for n, k in keys.items():
        store.add_user(n, auth.hash_key(k), None, None)
    store.close()
    tmp.mkdir()
    d = Deployment(url, tmp, keys)
    d.start_monitor(free_port())
    d.start_gateway(workers)
    return d


def scenario(d: Deployment) -> dict[str, Any]:
    """The same requests, one after another (so the log holds them in the same order
    whichever worker answers): a declared ring of three colluders, then path-finding."""
    assert d.gateway is not None and d.monitor is not None
    assert d.gateway.post("/v1/admin/groups", {"name": "ring", "members": list(RING)})[0] == 200
    rows = credit_rows()
    # Several connections per account: SO_REUSEPORT spreads connections over the workers.
    conns = {m: [d.client(m) for _ in range(3)] for m in RING}
    sent = dict.fromkeys(RING, 0)
    for j, i in enumerate(range(0, 180, 3)):
        m = RING[j % 3]
        status, body = conns[m][(j // 3) % 3].post("/v1/models/credit/predict", {"rows": rows[i : i + 3]})
        assert status == 200, body
        sent[m] += 3
    gw_url = f"http://127.0.0.1:{d.gateway.port}"
    clients = [ApiClient(gw_url, d.keys["pf"]) for _ in range(4)]
    info = clients[0].call("GET", "/v1/models/credit")
    oracle = Oracle(clients, "credit", Domain.from_public(info["features"]), None)
    Pathfinding(oracle, seed=1).run()
    oracle.close()
    sent["pf"] = oracle.queries
    wait_until(lambda: d.caught_up(sent), what="the monitor to see every row", deadline_s=60)
    ring = d.monitor.get("/v1/admin/monitor/credit/groups/ring")[1]
    warnings = d.monitor.get("/v1/admin/warnings?model=credit&subject=pf")[1]["warnings"]
    return {"sent": sent, "ring": ring, "pf_warnings": {w["method"]: w["n_queries"] for w in warnings}}


@pytest.fixture
def deployments(pg_cluster: PgCluster, tmp_path: Path) -> Iterator[tuple[Deployment, Deployment]]:
    one = two = None
    try:
        one = deploy(pg_cluster, tmp_path / "one", 1)
        two = deploy(pg_cluster, tmp_path / "two", 2)
        yield one, two
    finally:
        for d in (one, two):
            if d is not None:
                d.stop()


def test_replicas_see_one_monitor(deployments: tuple[Deployment, Deployment]) -> None:
    one, two = deployments
    ref, got = scenario(one), scenario(two)
    # Both workers answered (each worker's own metrics listener counts its requests).
    served = [metric(Client("127.0.0.1", w["metrics"]), "analysim_gateway_requests_total") for w in two.workers]
    assert len(served) == 2 and min(served) > 0, served
    assert got["sent"] == ref["sent"]
    assert got["ring"]["n_queries"] == ref["ring"]["n_queries"] == 180
    for method, v in ref["ring"]["status"].items():
        assert abs(got["ring"]["status"][method] - v) <= 0.001, (method, got["ring"]["status"], ref["ring"]["status"])
    assert ref["pf_warnings"], "path-finding over 12 leaves is warned about"
    assert got["pf_warnings"] == ref["pf_warnings"]

    # The monitor SIGKILLed: both workers keep serving; restarted, it catches up from its cursor.
    assert two.monitor is not None
    port = two.monitor.port
    history = two.monitor.get("/v1/admin/monitor/credit/users/m1")[1]["history"]
    monitor_proc = two.procs[0]
    monitor_proc.send_signal(signal.SIGKILL)
    monitor_proc.wait(scaled(30))
    late = [two.client("late") for _ in range(4)]
    rows = credit_rows()
    for i in range(0, 80, 2):
        status, body = late[i % 4].post("/v1/models/credit/predict", {"rows": rows[i : i + 2]})
        assert status == 200, body
    two.start_monitor(port)
    wait_until(lambda: two.caught_up({**got["sent"], "late": 80}), what="the restarted monitor to catch up", deadline_s=60)
    resumed = two.monitor.get("/v1/admin/monitor/credit/users/m1")[1]
    assert resumed["history"] == history  # nothing folded twice
