"""Restart durability of the monitor state, with a real gateway process (``python -m
mlaas_monitor.monitor gateway``) killed with SIGKILL and stopped with SIGTERM: every user's
and group's summaries, status, history and warnings come back, and monitoring resumes."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from mlaas_monitor.model import Policy
from mlaas_monitor.store import Store
from tests.polling import scaled
from tests.test_gateway_helpers import (
    ADMIN_KEY,
    Client,
    credit_model,
    credit_rows,
    start_module,
    wait_until,
)


def start(db: Path, port_file: Path, checkpoint_interval: float = 1.0) -> tuple[subprocess.Popen[str], Client]:
    proc, ports = start_module(
        ["mlaas_monitor.monitor", "gateway", "--db", str(db), "--port", "0", "--grpc-port", "0",
         "--monitor-checkpoint-interval", str(checkpoint_interval)], port_file, "the gateway's port file",
    )  # fmt: skip
    return proc, Client("127.0.0.1", ports["http"], ADMIN_KEY)


def views(admin: Client, subjects: list[str]) -> dict[str, Any]:
    out = {}
    for s in subjects:
        status, body = admin.get(f"/v1/admin/monitor/credit/subjects/{s}")
        assert status == 200, body
        out[s] = body
    out["warnings"] = admin.get("/v1/admin/warnings?model=credit")[1]["warnings"]
    return out


def caught_up(admin: Client, expected: dict[str, int]) -> bool:
    status, body = admin.get("/v1/admin/monitor/credit")
    if status != 200:
        return False
    seen = {u["subject"]: u["n_queries"] for u in body["users"]}
    return all(seen.get(u, 0) == n for u, n in expected.items())


def gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie waiting for its new parent to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def send(port: int, key: str, rows: list[list[Any]], batch: int) -> None:
    c = Client("127.0.0.1", port, key)
    for i in range(0, len(rows), batch):
        status, body = c.post("/v1/models/credit/predict", {"rows": rows[i : i + batch]})
        assert status == 200, body


def test_monitor_state_survives_sigkill_and_sigterm(tmp_path: Path) -> None:
    db, port_file = tmp_path / "store.db", tmp_path / "ports.json"
    store = Store(db)
    store.add_model(credit_model())
    store.set_policy("credit", Policy(reveal_leaf=True))
    store.close()
    rows = credit_rows()
    # No periodic checkpoint in the first life: after the group is declared (which
    # checkpoints), everything the killed process knew must come back from the replay.
    proc, admin = start(db, port_file, checkpoint_interval=3600)
    try:
        keys = {n: admin.post("/v1/admin/users", {"name": n})[1]["api_key"] for n in ("alice", "bob", "carol")}
        port = admin.port
        send(port, keys["alice"], rows[:60], 3)
        wait_until(lambda: caught_up(admin, {"alice": 60}), what="alice's rows")
        # From here on no warning (a warning checkpoints at once): what follows exists only
        # in the killed process's memory and in the query log.
        assert admin.request("PUT", "/v1/admin/monitor/credit/config", {"thresholds": {}})[0] == 200
        send(port, keys["bob"], rows[60:100], 2)
        assert admin.post("/v1/admin/groups", {"name": "ring", "members": ["alice", "bob"]})[0] == 200
        send(port, keys["bob"], rows[100:160], 4)
        send(port, keys["carol"], rows[:37], 1)
        sent = {"alice": 60, "bob": 100, "carol": 37}
        wait_until(lambda: caught_up(admin, sent), what="the monitor to catch up")
        subjects = ["alice", "bob", "carol", "group:ring"]
        before = views(admin, subjects)
        assert before["alice"]["history"] and before["group:ring"]["history"]
        assert before["group:ring"]["n_queries"] == 160
        assert len(before["carol"]["history"]) >= 1 and before["warnings"]

        # SIGKILL: whatever was not checkpointed is replayed from the query log. The
        # monitor the gateway started goes with it (its stdin closes).
        (monitor_pid,) = map(int, Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split())
        # It runs below the gateway's CPU priority, so that it never takes the gateway's core
        # (10 lower, as far as the kernel's lowest, 19, goes: under `nice -n 19 make test` both are 19).
        gateway_nice = os.getpriority(os.PRIO_PROCESS, proc.pid)
        assert os.getpriority(os.PRIO_PROCESS, monitor_pid) == min(gateway_nice + 10, 19)
        proc.send_signal(signal.SIGKILL)
        proc.wait(scaled(30))
        wait_until(lambda: gone(monitor_pid), what="the gateway's monitor to exit with it")
        proc, admin = start(db, port_file)
        after = views(admin, subjects)
        assert after == before

        # Monitoring resumes where it stopped.
        port = admin.port
        send(port, keys["carol"], rows[37:100], 7)
        sent["carol"] = 100
        wait_until(lambda: caught_up(admin, sent), what="the monitor to resume")
        resumed = views(admin, ["carol"])["carol"]
        assert resumed["n_queries"] == 100 and sum(resumed["leaves"]["counts"]) == 100
        assert resumed["history"][: len(before["carol"]["history"])] == before["carol"]["history"]
        assert len(resumed["history"]) > len(before["carol"]["history"])
        before2 = views(admin, subjects)

        # SIGTERM: a graceful stop checkpoints; nothing changes across the restart.
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(scaled(30)) == 0
        proc, admin = start(db, port_file)
        assert views(admin, subjects) == before2
    finally:
        proc.kill()
        proc.wait(scaled(30))
