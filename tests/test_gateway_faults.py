"""Gateway faults that must fail safe, against real processes, sockets and files: a store that
lost a table is refused at start (never re-created empty and billed into); slow uploads are
cut off and capped; a large broken model row is parsed once until it changes."""

from __future__ import annotations

import json
import os
import resource
import socket
import sqlite3
import subprocess
import sys
from contextlib import AbstractContextManager, closing
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from analysim.errors import UserError
from analysim.logs import BURST
from mlaas_monitor.auth import hash_key
from mlaas_monitor.metrics import CAPPED_KINDS, REJECTION_CODES
from mlaas_monitor.service import Limits
from mlaas_monitor.store import Store
from tests.polling import scaled, wait_until
from tests.procs import started
from tests.test_gateway_helpers import (
    ADMIN_KEY,
    ROOT,
    Client,
    Running,
    credit_model,
    credit_rows,
    iris_model,
    running_gateway,
    start_module,
)
from tests.test_gateway_replicas import raw_connection
from tests.test_live_helpers import http_get


def _tables(db: Path) -> set[str]:
    with closing(sqlite3.connect(db)) as c:
        return {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_a_store_missing_its_ledger_is_refused_not_recreated(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    with running_gateway(db) as g:
        alice = g.new_user("alice")
        assert alice.post("/v1/models/credit/predict", {"rows": credit_rows()[:5]})[0] == 200
    with closing(sqlite3.connect(db)) as c:
        c.execute("DROP TABLE ledger")
        c.commit()
    p = subprocess.run([sys.executable, "-m", "mlaas_monitor.monitor", "gateway", "--db", str(db), "--port", "0",
                        "--grpc-port", "0"], cwd=ROOT, env={"ANALYSIM_ADMIN_KEY": ADMIN_KEY, "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=scaled(60))  # fmt: skip
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert "ledger table is missing" in p.stderr and "restore the store" in p.stderr, p.stderr
    assert "ledger" not in _tables(db)  # left as it was


# Damage done to a store with a user and charged queries, and what the refusal must name.
# Each would have opened (the table re-created empty) when only meta's version was trusted.
STORE_DAMAGE = {
    "ledger and meta lost": (["DROP TABLE ledger", "DROP TABLE meta"], "ledger table, meta table are missing"),
    "ledger and the version row lost": (["DROP TABLE ledger", "DELETE FROM meta WHERE key = 'schema_version'"],
                                        "ledger table, schema version"),
    "ledger lost, meta reads 3": (["DROP TABLE ledger", "UPDATE meta SET value = '3' WHERE key = 'schema_version'"],
                                  "ledger table is missing"),
    "users lost": (["DROP TABLE users"], "users table is missing"),
    "a ledger column lost": (["ALTER TABLE ledger DROP COLUMN amount_micros"], "column ledger.amount_micros is missing"),
    "a version that is not one": (["UPDATE meta SET value = 'x' WHERE key = 'schema_version'"], "schema version 'x'"),
}


def _charged_store(db: str) -> None:
    """A store with a model, a user and 5 charged rows."""
    with running_gateway(db) as g:
        assert g.new_user("alice").post("/v1/models/credit/predict", {"rows": credit_rows()[:5]})[0] == 200


@pytest.mark.parametrize("damage", STORE_DAMAGE)
def test_a_damaged_store_is_refused_at_open_whatever_meta_says(store_db: str, damage: str) -> None:
    statements, named = STORE_DAMAGE[damage]
    _charged_store(store_db)
    con = raw_connection(store_db)
    for stmt in statements:
        con.execute(stmt)
    con.close()
    args = ["--no-monitor"] if "://" in store_db else []
    p = subprocess.run([sys.executable, "-m", "mlaas_monitor.monitor", "gateway", "--db", store_db, "--port", "0",
                        "--grpc-port", "0", *args], cwd=ROOT, env={"ANALYSIM_ADMIN_KEY": ADMIN_KEY, "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=scaled(60))  # fmt: skip
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert named in p.stderr and "restore the store" in p.stderr, p.stderr
    with pytest.raises(UserError, match="restore the store"):  # and nothing was re-created meanwhile
        Store(store_db)


def test_a_new_store_is_created_whole(tmp_path: Path) -> None:
    db = tmp_path / "new.db"
    Store(db).close()
    assert {"meta", "models", "users", "query_log", "ledger", "sequences"} <= _tables(db)


def test_slow_uploads_are_cut_off_and_capped(tmp_path: Path) -> None:
    """50 clients announce a 1 MB body and send one byte: each is answered (408 after the body
    timeout, or 503 beyond the upload cap) and its connection closed, while a normal client is
    served meanwhile."""
    limits = Limits(body_timeout_s=1.0, max_uploads=20)
    with running_gateway(tmp_path / "s.db", limits=limits) as g:
        key = g.new_key("alice")
        head = (f"POST /v1/models/credit/predict HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
                "Content-Type: application/json\r\nContent-Length: 1048576\r\n\r\n{").encode()
        socks = []
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", g.port), timeout=scaled(10))
            s.sendall(head)
            socks.append(s)
        try:
            assert g.client(key).post("/v1/models/credit/predict", {"rows": credit_rows()[:3]})[0] == 200
            statuses = []
            for s in socks:
                data = b""
                while chunk := s.recv(65536):  # until the server closes it (the socket's timeout: 10 s)
                    data += chunk
                statuses.append(int(data.split()[1]))
        finally:
            for s in socks:
                s.close()
    assert set(statuses) <= {408, 503} and statuses.count(408) >= 1 and statuses.count(503) >= 1, statuses
    assert statuses.count(408) <= 20


def _load_failures(g: Running, model: str) -> float:
    status, text = g.admin.get("/metrics")
    assert status == 200
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "analysim_gateway_model_load_failures_total" and s.labels.get("model") == model)  # fmt: skip


def test_a_large_broken_model_row_is_parsed_once_until_it_changes(tmp_path: Path) -> None:
    """A 4 MB model row that fails validation: parsed once, then answered 503 from memory
    (it was parsed on the event loop on every request for it, stalling every other one);
    parsed again once the row is replaced."""
    db = tmp_path / "s.db"
    with running_gateway(db) as g:
        spec = json.dumps({"format": 1, "tree": {"left": list(range(500_000))}})
        assert len(spec) > 3_000_000
        with closing(sqlite3.connect(db)) as c:
            c.execute("INSERT INTO models (id, created, spec, reveal_confidence, confidence_decimals, reveal_leaf, price_micros) VALUES ('big', 1.0, ?, 1, 2, 0, 1000)", (spec,))
            c.commit()
        user = g.new_user("alice")
        for _ in range(20):
            status, body = user.post("/v1/models/big/predict", {"rows": [[1]]})
            assert status == 503 and body["error"]["code"] == "model_unavailable"
        assert _load_failures(g, "big") == 1
        assert user.post("/v1/models/credit/predict", {"rows": credit_rows()[:3]})[0] == 200
        g.store.add_model(replace(iris_model(), id="big"), replace=True)  # the row changes: tried again
        assert user.get("/v1/models/big")[0] == 200
        assert _load_failures(g, "big") == 1


# A models row a client could never have set, and what the refusal names.
UNSERVABLE_ROWS = {
    "a negative price": ("price_micros = -1000", "price"),
    "decimals out of range": ("confidence_decimals = 99", "confidence_decimals"),
    "top_k of 0": ("top_k = 0", "top_k"),
}


def _damaged_model_gateway(db: str, damage: str) -> AbstractContextManager[Running]:
    """A gateway over a store holding credit (damaged by DAMAGE, an UPDATE's SET) and iris."""
    store = Store(db)
    store.add_model(credit_model())
    store.add_model(iris_model())
    store.close()
    con = raw_connection(db)
    con.execute(f"UPDATE models SET {damage} WHERE id = 'credit'")
    con.close()
    return running_gateway(db, models=[])


def _served_others_and_charged_nothing(g: Running, user: Client) -> None:
    status, body = user.post("/v1/models/credit/predict", {"rows": credit_rows()[:3]})
    assert (status, body["error"]["code"]) == (503, "model_unavailable"), body
    assert g.charged() == (0, 0, 0) and user.get("/v1/usage")[1]["rows"] == 0
    status, listed = user.get("/v1/models")
    assert status == 200 and [m["id"] for m in listed["models"]] == ["iris"], listed
    assert user.post("/v1/models/iris/predict", {"rows": [[5.1, 3.5, 1.4, 0.2]]})[0] == 200
    assert g.charged()[0] == 1


@pytest.mark.parametrize("row", UNSERVABLE_ROWS)
def test_a_model_row_out_of_range_is_refused_for_that_model_and_not_charged(store_db: str, row: str) -> None:
    damage, named = UNSERVABLE_ROWS[row]
    with _damaged_model_gateway(store_db, damage) as g:
        user = g.new_user("alice")
        _served_others_and_charged_nothing(g, user)
        assert named in user.post("/v1/models/credit/predict", {"rows": credit_rows()[:1]})[1]["error"]["message"]


def test_a_created_column_stored_as_text_takes_down_that_model_alone(tmp_path: Path) -> None:
    # (PostgreSQL's typed columns cannot hold text there; SQLite's can.)
    with _damaged_model_gateway(str(tmp_path / "s.db"), "created = 'yesterday'") as g:
        user = g.new_user("alice")
        _served_others_and_charged_nothing(g, user)
        assert "created" in user.get("/v1/models/credit")[1]["error"]["message"]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_body_not_in_its_content_encoding_is_400_without_a_traceback(
    tmp_path: Path, encoding: str, caplog: pytest.LogCaptureFixture
) -> None:
    with running_gateway(tmp_path / "s.db") as g:
        user = g.new_user("alice")
        body = json.dumps({"rows": credit_rows()[:1]}).encode()  # not compressed
        status, answer = user.request("POST", "/v1/models/credit/predict", raw=body,
                                      headers={"Content-Encoding": encoding})  # fmt: skip
        assert (status, answer["error"]["code"]) == (400, "malformed_body"), answer
        assert encoding in answer["error"]["message"]
        assert user.post("/v1/models/credit/predict", {"rows": credit_rows()[:1]})[0] == 200  # (a new connection)
        assert g.charged()[0] == 1
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


def test_the_gateway_exports_the_log_lines_its_rate_limit_left_out(tmp_path: Path) -> None:
    """40 clients that leave before their body arrives: each is logged, up to the burst of
    the rate limit; the gateway's /metrics counts the lines left out."""
    db = tmp_path / "s.db"
    Store(db).close()
    _, ports = start_module(["mlaas_monitor", "gateway", "--db", str(db), "--port", "0", "--grpc-port", "0",
                             "--no-monitor"], tmp_path / "ports.json", "the gateway's port file")  # fmt: skip
    head = (f"POST /v1/admin/users HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ADMIN_KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{").encode()
    for _ in range(BURST + 20):
        with socket.create_connection(("127.0.0.1", ports["http"]), timeout=scaled(30)) as s:
            s.sendall(head)

    def left_out() -> float:
        _, text = http_get("127.0.0.1", ports["metrics"], "/metrics")
        return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == "analysim_log_lines_suppressed_total")  # fmt: skip

    assert wait_until(left_out, what="log lines left out, counted") >= 1


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_idle_connections_do_not_exhaust_descriptors_and_requests_are_served(tmp_path: Path) -> None:
    """1,100 idle unauthenticated connections (half of them with half a request head) to a
    gateway limited to 1,024 descriptors: its descriptors stay under the limit, a client with
    a request is served meanwhile, and the idle ones are closed after --idle-timeout."""
    db, port_file = tmp_path / "s.db", tmp_path / "ports.json"
    with running_gateway(db):  # the credit model and a user, then closed
        pass
    store = Store(db)
    store.add_user("alice", hash_key("alice-key-0123456789"), None, None)
    store.close()
    proc = started(subprocess.Popen(
        [sys.executable, "-m", "mlaas_monitor", "gateway", "--db", str(db), "--port", "0", "--grpc-port", "0",
         "--no-monitor", "--idle-timeout", "5", "--port-file", str(port_file)],
        cwd=ROOT, env={**os.environ, "ANALYSIM_ADMIN_KEY": ADMIN_KEY}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024)),
    ))  # fmt: skip
    wait_until(lambda: proc.poll() is not None or port_file.exists(), what="the gateway's port file")
    assert proc.poll() is None, proc.communicate()
    port = json.loads(port_file.read_text())["http"]
    idle = []
    try:
        for i in range(1100):
            s = socket.create_connection(("127.0.0.1", port), timeout=scaled(30))
            if i % 2:
                s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # half a head
            idle.append(s)
        assert _fds(proc.pid) < 1024
        alice = Client("127.0.0.1", port, "alice-key-0123456789")

        def served() -> bool:  # as a client would, it tries again on a connection reset
            try:
                return alice.post("/v1/models/credit/predict", {"rows": credit_rows()[:2]})[0] == 200
            except ConnectionError:
                return False

        wait_until(served, 10, "a query answered among the idle connections", poll_s=0.1)
        assert _fds(proc.pid) < 1024
        # The idle ones that were left are closed by the idle timeout.
        wait_until(lambda: _fds(proc.pid) < 100, what="idle connections closed")
    finally:
        for s in idle:
            s.close()
    proc.terminate()
    _, err = proc.communicate(timeout=scaled(30))
    assert "Traceback" not in err, err[-3000:]


def test_every_rejection_reason_is_exported_at_zero_from_the_start(tmp_path: Path) -> None:
    # A real gateway, nothing asked of it yet: each error code and each cap kind has its series
    # at 0, so that increase() alerts and dashboards read "none" until the first, not "no data".
    with running_gateway(tmp_path / "s.db") as g:
        status, text = g.admin.get("/metrics")
    assert status == 200
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    rejections = {s.labels["reason"]: s.value for s in samples if s.name == "analysim_gateway_rejections_total"}
    capped = {s.labels["kind"]: s.value for s in samples if s.name == "analysim_gateway_connections_capped_total"}
    assert rejections == dict.fromkeys(REJECTION_CODES, 0.0), rejections
    assert capped == dict.fromkeys(CAPPED_KINDS, 0.0), capped
