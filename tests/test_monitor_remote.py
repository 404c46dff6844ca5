"""The monitor as its own service (``python -m mlaas_monitor.monitor watch``) over the
gateway's gRPC query stream: the same statuses as the in-process monitor, and a SIGKILL
restart resumes them from its own SQLite file."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from mlaas_monitor.model import Policy
from mlaas_monitor.monitor.service import monitor_extension
from mlaas_monitor.server import GatewayThread
from mlaas_monitor.service import Gateway
from mlaas_monitor.store import Store
from tests.test_gateway_helpers import (
    ADMIN_KEY,
    Client,
    credit_model,
    credit_rows,
    start_module,
    wait_until,
)


def start_watch(target: str, db: Path, state: Path, port_file: Path) -> tuple[subprocess.Popen[str], Client]:
    proc, ports = start_module(
        ["mlaas_monitor.monitor", "watch", "--target", target, "--models-db", str(db), "--state", str(state),
         "--port", "0"], port_file, "the remote monitor's port file",
    )  # fmt: skip
    return proc, Client("127.0.0.1", ports["http"], ADMIN_KEY)


def users_of(client: Client) -> dict[str, Any]:
    status, body = client.get("/v1/admin/monitor/credit")
    assert status == 200, body
    return {u["subject"]: u for u in body["users"]}


def test_remote_monitor_matches_in_process_and_survives_sigkill(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    store = Store(db)
    store.add_model(credit_model())
    store.set_policy("credit", Policy(reveal_leaf=True))
    rows = credit_rows()
    procs: list[subprocess.Popen[str]] = []
    try:
        run(store, db, tmp_path, rows, procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
        store.close()


def run(store: Store, db: Path, tmp_path: Path, rows: list[list[Any]], procs: list[subprocess.Popen[str]]) -> None:
    with GatewayThread(Gateway(store, ADMIN_KEY), extensions=[monitor_extension()]) as t:
        assert t.bound is not None
        admin = Client("127.0.0.1", t.bound.http_port, ADMIN_KEY)
        keys = {n: admin.post("/v1/admin/users", {"name": n})[1]["api_key"] for n in ("ann", "ben")}
        sent = {"ann": 0, "ben": 0}

        def send(name: str, lo: int, hi: int, batch: int) -> None:
            c = Client("127.0.0.1", t.bound.http_port, keys[name])  # type: ignore[union-attr]
            for i in range(lo, hi, batch):
                assert c.post("/v1/models/credit/predict", {"rows": rows[i : min(hi, i + batch)]})[0] == 200
            sent[name] += hi - lo

        send("ann", 0, 90, 3)  # before the remote monitor exists: it replays them
        proc, remote = start_watch(t.grpc_target, db, tmp_path / "remote.db", tmp_path / "remote.port")
        procs.append(proc)
        send("ben", 0, 70, 2)

        def agree() -> dict[str, Any] | None:
            here, there = users_of(admin), users_of(remote)
            if any(there.get(n, {}).get("n_queries") != k or here.get(n, {}).get("n_queries") != k for n, k in sent.items()):
                return None
            return there if all(here[n]["status"] == there[n]["status"] for n in sent) else None

        before = wait_until(agree, what="the remote monitor to agree with the in-process one")
        assert before["ann"]["status"]["coverage_mass"] > 0
        fams = {f.name: f for f in text_string_to_metric_families(remote.get("/metrics")[1])}
        assert any(s.labels.get("subject") == "ann" for s in fams["analysim_extraction_status"].samples)
        assert Client("127.0.0.1", remote.port).get("/v1/admin/monitor")[0] == 401
        assert Client("127.0.0.1", remote.port, keys["ann"]).get("/metrics")[0] == 401

        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        send("ann", 90, 150, 5)  # while it is down
        proc, remote = start_watch(t.grpc_target, db, tmp_path / "remote.db", tmp_path / "remote.port")
        procs.append(proc)
        wait_until(agree, what="the restarted remote monitor to catch up")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
