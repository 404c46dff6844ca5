"""Poison rows in the query log (written into the real store file, as a damaged disk or a bad
replica would): a real monitored gateway quarantines each one (seq, reason, counted in
``analysim_monitor_quarantined_rows_total``), folds every good query written after them, and
after a restart resumes past them without counting them twice."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from mlaas_monitor.model import Policy
from mlaas_monitor.monitor.attacks import ApiClient
from mlaas_monitor.monitor.client import FORWARD_TIMEOUT_S, SCRAPE_TIMEOUT_S
from mlaas_monitor.store import Store
from tests.polling import scaled
from tests.procs import descendants
from tests.test_gateway_helpers import ADMIN_KEY, Client, credit_model, credit_rows, start_module, wait_until
from tests.test_live_helpers import http_get
from tests.test_monitor_durability import gone
from tests.threads import CheckedThread

F = len(credit_model().schema)


def _store(db: Path, policy: Policy | None = None) -> None:
    """A store with the credit model (and its policy)."""
    store = Store(db)
    store.add_model(credit_model())
    if policy is not None:
        store.set_policy("credit", policy)
    store.close()


def _start(db: Path, port_file: Path) -> tuple[subprocess.Popen[str], Client]:
    proc, ports = start_module(["mlaas_monitor.monitor", "gateway", "--db", str(db), "--port", "0", "--grpc-port", "0"],
                               port_file, "the gateway's port file")  # fmt: skip
    return proc, Client("127.0.0.1", ports["http"], ADMIN_KEY)


def _poison(db: Path) -> dict[int, str]:
    """Bad rows appended to the log as the gateway's own inserts would be numbered; {seq: reason}."""
    good_x = np.zeros((2, F), "<f8").tobytes()
    two = np.zeros(2, "<i4").tobytes()
    nan_x = np.full((1, F), np.nan, "<f8").tobytes()
    rows: list[tuple[str, tuple[Any, ...]]] = [
        ("undecodable", ("credit", 2, F, good_x[:-8], two, None, None)),  # features blob short of n_rows x n_features
        ("label", ("credit", 2, F, good_x, np.array([0, 99], "<i4").tobytes(), None, None)),
        ("leaf", ("credit", 2, F, good_x, two, None, np.array([0, 10**6], "<i4").tobytes())),
        ("leaf", ("credit", 2, F, good_x, two, None, np.array([-1, 0], "<i4").tobytes())),
        ("not_finite", ("credit", 1, F, nan_x, np.zeros(1, "<i4").tobytes(), None, None)),
        ("empty", ("credit", 0, F, b"", b"", None, None)),
        ("unknown_model", ("no-such-model", 2, F, good_x, two, None, None)),
    ]
    out = {}
    with closing(sqlite3.connect(db, timeout=30, isolation_level=None)) as c:
        c.execute("BEGIN IMMEDIATE")
        seq = c.execute("SELECT next FROM sequences WHERE name = 'query_log'").fetchone()[0]
        for reason, (model, n, f, feats, labels, conf, leaves) in rows:
            c.execute('INSERT INTO query_log (id, ts, "user", model, n_rows, n_features, features, labels, confidences,'
                      " leaves) VALUES (?, strftime('%s', 'now'), 'mallory', ?, ?, ?, ?, ?, ?, ?)",
                      (seq, model, n, f, feats, labels, conf, leaves))  # fmt: skip
            out[seq] = reason
            seq += 1
        c.execute("UPDATE sequences SET next = ? WHERE name = 'query_log'", (seq,))
        c.execute("COMMIT")
    return out


def _n_queries(admin: Client) -> dict[str, int]:
    status, body = admin.get("/v1/admin/monitor/credit")
    return {u["subject"]: u["n_queries"] for u in body["users"]} if status == 200 else {}


def _quarantined(admin: Client) -> dict[str, float]:
    status, text = admin.get("/metrics")
    assert status == 200, text
    return {s.labels["reason"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "analysim_monitor_quarantined_rows_total"}  # fmt: skip


def test_poison_rows_are_quarantined_and_the_monitor_goes_on(tmp_path: Path) -> None:
    db, port_file = tmp_path / "store.db", tmp_path / "ports.json"
    _store(db, Policy(reveal_leaf=True))
    rows = credit_rows()
    proc, admin = _start(db, port_file)
    try:
        key = admin.post("/v1/admin/users", {"name": "alice"})[1]["api_key"]
        alice = Client("127.0.0.1", admin.port, key)
        assert alice.post("/v1/models/credit/predict", {"rows": rows[:10]})[0] == 200
        wait_until(lambda: _n_queries(admin).get("alice") == 10, what="alice's first queries folded")
        bad = _poison(db)
        assert alice.post("/v1/models/credit/predict", {"rows": rows[10:30]})[0] == 200
        # Queries logged after the poison rows are folded: the cursor moved past them.
        wait_until(lambda: _n_queries(admin).get("alice") == 30, what="queries after the poison rows folded")
        assert "mallory" not in _n_queries(admin)
        counts = _quarantined(admin)
        for reason in set(bad.values()):
            assert counts[reason] == list(bad.values()).count(reason), (reason, counts)
        with closing(sqlite3.connect(db)) as c:
            recorded = dict(c.execute("SELECT seq, reason FROM monitor_quarantine"))
        assert recorded == bad
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(scaled(30)) == 0
        # A restart reads the log again from the start: the same rows are skipped, not counted
        # again, and monitoring goes on.
        proc, admin = _start(db, port_file)
        assert _n_queries(admin).get("alice") == 30
        assert sum(_quarantined(admin).values()) == 0
        alice = Client("127.0.0.1", admin.port, key)
        assert alice.post("/v1/models/credit/predict", {"rows": rows[30:35]})[0] == 200
        wait_until(lambda: _n_queries(admin).get("alice") == 35, what="monitoring resumed after the restart")
    finally:
        proc.kill()
        proc.wait(scaled(30))


def _ops(port: int, path: str) -> tuple[int, str]:
    return http_get("127.0.0.1", port, path)


def _rejected(port: int, reason: str) -> float:
    status, text = _ops(port, "/metrics")
    assert status == 200
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "analysim_gateway_rejections_total" and s.labels.get("reason") == reason)  # fmt: skip


def _monitor_up(port: int) -> float:
    status, text = _ops(port, "/metrics")
    assert status == 200
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "analysim_gateway_monitor_up")  # fmt: skip


def test_a_monitor_that_cannot_read_the_log_is_not_up_nor_ready(tmp_path: Path) -> None:
    """The log unreadable under a running monitor (its table renamed away): the monitor answers
    but makes no progress; the gateway says so in analysim_gateway_monitor_up and /readyz, and
    both recover once the log is back."""
    db, port_file = tmp_path / "store.db", tmp_path / "ports.json"
    _store(db)
    proc, ports = start_module(["mlaas_monitor.monitor", "gateway", "--db", str(db), "--port", "0", "--grpc-port", "0"],
                               port_file, "the gateway's port file")  # fmt: skip
    ops = ports["metrics"]
    try:
        assert _ops(ops, "/readyz")[0] == 200 and _monitor_up(ops) == 1
        with closing(sqlite3.connect(db, timeout=30)) as c:
            c.execute("ALTER TABLE query_log RENAME TO query_log_away")
        wait_until(lambda: _monitor_up(ops) == 0, what="monitor_up 0 while the monitor cannot read the log")
        status, why = _ops(ops, "/readyz")
        assert status == 503 and "not following the query log" in why, (status, why)
        with closing(sqlite3.connect(db, timeout=30)) as c:
            c.execute("ALTER TABLE query_log_away RENAME TO query_log")
        wait_until(lambda: _monitor_up(ops) == 1 and _ops(ops, "/readyz")[0] == 200, what="the monitor following again")
    finally:
        proc.kill()
        proc.wait(scaled(30))


def _children(pid: int) -> list[int]:
    """Live child processes (the restarted monitor is started from a worker thread: /proc's
    per-thread children lists would miss it)."""
    return [c for c in descendants(pid) if not gone(c)]


def test_a_killed_monitor_child_is_restarted(tmp_path: Path) -> None:
    """SIGKILL the monitor a gateway runs as its child: the gateway is not ready while it is
    gone, starts another (analysim_gateway_monitor_restarts_total), and monitoring resumes."""
    db, port_file = tmp_path / "store.db", tmp_path / "ports.json"
    _store(db)
    rows = credit_rows()
    proc, ports = start_module(["mlaas_monitor.monitor", "gateway", "--db", str(db), "--port", "0", "--grpc-port", "0"],
                               port_file, "the gateway's port file")  # fmt: skip
    admin, ops = Client("127.0.0.1", ports["http"], ADMIN_KEY), ports["metrics"]
    try:
        key = admin.post("/v1/admin/users", {"name": "alice"})[1]["api_key"]
        alice = Client("127.0.0.1", admin.port, key)
        assert alice.post("/v1/models/credit/predict", {"rows": rows[:10]})[0] == 200
        wait_until(lambda: _n_queries(admin).get("alice") == 10, what="alice's queries folded")
        (first,) = _children(proc.pid)  # the monitor, below the gateway
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: _monitor_up(ops) == 0, what="the gateway noticing its monitor gone")
        wait_until(lambda: (c := _children(proc.pid)) and c != [first] and _monitor_up(ops) == 1, 60,
                   "a new monitor, followed")
        assert _ops(ops, "/readyz")[0] == 200
        status, text = _ops(ops, "/metrics")
        assert "analysim_gateway_monitor_restarts_total 1.0" in text
        assert alice.post("/v1/models/credit/predict", {"rows": rows[10:25]})[0] == 200
        wait_until(lambda: _n_queries(admin).get("alice") == 25, what="monitoring resumed in the new monitor")
    finally:
        proc.kill()
        proc.wait(scaled(30))


# Values the gateway never writes, column by column (SQLite stores what it is given, but for
# numbers in a text column, which its affinity turns into text).
POISON_COLUMNS = [("ts", "'yesterday'"), ("ts", "x'00ff'"), ("ts", "9e999"), ("ts", "-9e999"), ("user", "x'616c'"),
                  ("model", "x'63726564'")]  # fmt: skip


def _poison_columns(db: Path) -> list[int]:
    """A good-looking row of mallory's with one poisoned column each (POISON_COLUMNS); their seqs."""
    x = np.zeros((1, F), "<f8").tobytes()
    label = np.zeros(1, "<i4").tobytes()
    seqs = []
    with closing(sqlite3.connect(db, timeout=30, isolation_level=None)) as c:
        c.execute("BEGIN IMMEDIATE")
        seq = c.execute("SELECT next FROM sequences WHERE name = 'query_log'").fetchone()[0]
        for column, value in POISON_COLUMNS:
            v = {"ts": "strftime('%s', 'now')", "user": "'mallory'", "model": "'credit'", column: value}
            c.execute(f'INSERT INTO query_log (id, ts, "user", model, n_rows, n_features, features, labels)'
                      f" VALUES (?, {v['ts']}, {v['user']}, {v['model']}, 1, ?, ?, ?)", (seq, F, x, label))  # fmt: skip
            seqs.append(seq)
            seq += 1
        c.execute("UPDATE sequences SET next = ? WHERE name = 'query_log'", (seq,))
        c.execute("COMMIT")
    return seqs


def _quarantined_seqs(db: Path) -> set[int]:
    with closing(sqlite3.connect(db, timeout=30)) as c:
        return {r[0] for r in c.execute("SELECT seq FROM monitor_quarantine")}


def test_poison_in_any_column_is_quarantined_at_start_and_while_running(tmp_path: Path) -> None:
    """Rows poisoned while the gateway is down do not stop it starting; rows poisoned under a
    running monitor are quarantined, not folded; good queries around them are folded."""
    db, port_file = tmp_path / "store.db", tmp_path / "ports.json"
    _store(db)
    before = _poison_columns(db)  # written while no gateway runs
    proc, admin = _start(db, port_file)
    key = admin.post("/v1/admin/users", {"name": "alice"})[1]["api_key"]
    alice = Client("127.0.0.1", admin.port, key)
    assert alice.post("/v1/models/credit/predict", {"rows": credit_rows()[:10]})[0] == 200
    wait_until(lambda: _n_queries(admin).get("alice") == 10, what="alice's queries folded past the poison")
    assert set(before) <= _quarantined_seqs(db)
    during = _poison_columns(db)
    assert alice.post("/v1/models/credit/predict", {"rows": credit_rows()[10:20]})[0] == 200
    wait_until(lambda: _n_queries(admin).get("alice") == 20, what="alice's queries folded past the new poison")
    assert set(during) <= _quarantined_seqs(db)
    assert set(_n_queries(admin)) == {"alice"}  # mallory's rows were never folded
    assert _quarantined(admin).get("undecodable") == len(before) + len(during)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(scaled(30)) == 0
    assert "Traceback" not in proc.communicate()[1]


def test_a_frozen_monitor_child_holds_no_admin_route_and_stalls_no_answer(tmp_path: Path) -> None:
    """SIGSTOP the gateway's monitor (it still accepts connections, answers nothing): a
    forwarded admin route is 503 after FORWARD_TIMEOUT_S, not 60 s, and while a scrape of
    /metrics waits on the monitor's metrics, queries are answered meanwhile."""
    db, port_file = tmp_path / "store.db", tmp_path / "ports.json"
    _store(db)
    proc, ports = start_module(["mlaas_monitor.monitor", "gateway", "--db", str(db), "--port", "0", "--grpc-port", "0"],
                               port_file, "the gateway's port file")  # fmt: skip
    admin, ops = Client("127.0.0.1", ports["http"], ADMIN_KEY), ports["metrics"]
    alice = Client("127.0.0.1", admin.port, admin.post("/v1/admin/users", {"name": "alice"})[1]["api_key"])
    assert alice.post("/v1/models/credit/predict", {"rows": credit_rows()[:5]})[0] == 200
    wait_until(lambda: _n_queries(admin).get("alice") == 5, what="alice's queries folded")
    (child,) = _children(proc.pid)
    os.kill(child, signal.SIGSTOP)
    try:
        start = time.monotonic()
        status, body = admin.get("/v1/admin/monitor/credit")
        took = time.monotonic() - start
        assert (status, body["error"]["code"]) == (503, "monitor_unavailable"), body
        assert FORWARD_TIMEOUT_S <= took < 50, took  # (it was held 60 s)
        span: list[float] = []

        def scrape() -> None:
            span.append(time.monotonic())
            assert _ops(ops, "/metrics")[0] == 200
            span.append(time.monotonic())

        scraper = CheckedThread(scrape, name="scraper")
        scraper.start()
        answered: list[tuple[float, float]] = []
        while scraper.is_alive():
            sent = time.monotonic()
            assert alice.post("/v1/models/credit/predict", {"rows": credit_rows()[:1]})[0] == 200
            answered.append((sent, time.monotonic()))
        scraper.join(scaled(30))
        assert span[1] - span[0] >= SCRAPE_TIMEOUT_S * 0.9, span  # the scrape did wait on the monitor
        during = [a for a in answered if span[0] <= a[0] and a[1] <= span[1]]
        assert len(during) >= 3, (span, answered)  # (the event loop was blocked for the whole scrape)
        # A client's read answered 503 is asked again after its Retry-After, and is answered once
        # the monitor is back (monitor-eval's client, on a loaded machine)
        got: list[Any] = []
        reader = CheckedThread(lambda: got.append(ApiClient(f"http://127.0.0.1:{admin.port}", ADMIN_KEY,
                                                            retry_for=scaled(300)).call("GET", "/v1/admin/monitor/credit")),
                               name="reader")  # fmt: skip
        reader.start()
        wait_until(lambda: _rejected(ops, "monitor_unavailable") >= 2, what="the reader's first GET answered 503",
                   deadline_s=120)  # fmt: skip
        assert reader.is_alive()
        os.kill(child, signal.SIGCONT)
        reader.join(scaled(120))
        assert got and "users" in got[0], got
    finally:
        os.kill(child, signal.SIGCONT)


def test_a_forwarded_admin_request_gets_the_body_timeout(tmp_path: Path) -> None:
    """An admin request to a monitor route whose body trickles in is cut off (408) after the
    gateway's --body-timeout, as any other route's."""
    db, port_file = tmp_path / "store.db", tmp_path / "ports.json"
    _store(db)
    _, ports = start_module(["mlaas_monitor.monitor", "gateway", "--db", str(db), "--port", "0", "--grpc-port", "0",
                             "--body-timeout", "1"], port_file, "the gateway's port file")  # fmt: skip
    head = (f"PUT /v1/admin/monitor/credit/config HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ADMIN_KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{").encode()
    with socket.create_connection(("127.0.0.1", ports["http"]), timeout=scaled(30)) as s:
        s.sendall(head)
        data = b""
        while chunk := s.recv(65536):  # until the gateway closes it
            data += chunk
    assert data.split()[1] == b"408", data[:300]
