"""Gateway replicas over one PostgreSQL store: real `analysim gateway` processes (--workers 2
on one port, or separate replicas on their own ports), real PostgreSQL (tests/pg.py).

One quota and one rate limit across replicas, idempotency keys across replicas, a key
revoked on one replica refused by the other, and the query log readable by a cursor without
gaps while several writers append."""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from analysim._protos.v1 import prediction_pb2 as pb
from analysim._protos.v1 import prediction_pb2_grpc as pb_grpc
from analysim.errors import UserError
from mlaas_monitor.store import Store
from mlaas_monitor.store_records import Admission, QueryRecord, Refused
from mlaas_monitor.store_schema import SCHEMA_VERSION
from tests.polling import scaled
from tests.test_gateway_helpers import ADMIN_KEY, Client, credit_model, credit_rows, start_module, wait_until
from tests.test_gateway_http import PREDICT

pytestmark = pytest.mark.timeout(240)


def gateway(db: str, port_file: Path, *extra: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    return start_module(["analysim", "gateway", "--db", db, "--port", "0", "--grpc-port", "0", "--no-monitor", *extra],
                        port_file, "the gateway to listen")  # fmt: skip


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(scaled(60)) == 0, proc.communicate()
    finally:
        proc.kill()
        proc.communicate()


@pytest.fixture
def store_with_model(pg_db: str) -> str:
    s = Store(pg_db)
    s.add_model(credit_model())
    s.close()
    return pg_db


@pytest.fixture
def two_workers(store_with_model: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    proc, ports = gateway(store_with_model, tmp_path / "ports.json", "--workers", "2")
    try:
        yield ports
    finally:
        stop(proc)


@pytest.fixture
def two_replicas(store_with_model: str, tmp_path: Path) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Two gateways on their own ports (as two pods behind a Service), one store."""
    a, pa = gateway(store_with_model, tmp_path / "a.json")
    try:
        b, pb = gateway(store_with_model, tmp_path / "b.json")
        try:
            yield pa, pb
        finally:
            stop(b)
    finally:
        stop(a)


def requests_served(metrics_port: int) -> float:
    text = Client("127.0.0.1", metrics_port).get("/metrics")[1]
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "analysim_gateway_requests_total")  # fmt: skip


def test_a_quota_hammered_through_two_workers_charges_at_most_the_quota(two_workers: dict[str, Any]) -> None:
    port = two_workers["http"]
    admin = Client("127.0.0.1", port, ADMIN_KEY)
    status, body = admin.post("/v1/admin/users", {"name": "q", "quota_rows": 100})
    assert status == 200, body
    key = body["api_key"]

    def hammer(i: int) -> int:
        answered = 0
        for j in range(30):
            c = Client("127.0.0.1", port, key)  # a new connection each time: the kernel picks the worker
            status, body = c.post(PREDICT, {"rows": credit_rows()[: 1 + (i + j) % 4]})
            c.close()
            assert status in (200, 429), body
            if status == 200:
                answered += len(body["predictions"])
            else:
                assert body["error"]["code"] == "quota_exceeded"
        return answered

    with ThreadPoolExecutor(6) as pool:
        answered = sum(pool.map(hammer, range(6)))
    usage = admin.get("/v1/usage?user=q")[1]
    assert usage["rows"] == answered <= 100
    # gRPC shares the workers' other port: the same ledger, whichever worker answers.
    for _ in range(4):  # a new channel (connection) each time
        with grpc.insecure_channel(f"127.0.0.1:{two_workers['grpc']}") as ch:
            got = pb_grpc.PredictionServiceStub(ch).GetUsage(pb.GetUsageRequest(user="q"),
                                                             metadata=(("authorization", f"Bearer {ADMIN_KEY}"),))  # fmt: skip
            assert got.rows == answered
    assert answered > 100 - 4  # refused only when the next batch would not fit
    # Both workers served (and each reports its own requests on its own metrics port).
    workers = two_workers["workers"]
    assert len(workers) == 2 and two_workers["metrics"] == workers[0]["metrics"]
    assert all(requests_served(w["metrics"]) > 0 for w in workers)


def test_a_rate_limit_is_one_bucket_across_replicas(two_replicas: tuple[dict[str, Any], dict[str, Any]]) -> None:
    pa, pb = two_replicas
    admin = Client("127.0.0.1", pa["http"], ADMIN_KEY)
    key = admin.post("/v1/admin/users", {"name": "r", "rate_limit": 0.001})[1]["api_key"]  # one request, then 1000 s
    a, b = Client("127.0.0.1", pa["http"], key), Client("127.0.0.1", pb["http"], key)
    assert a.post(PREDICT, {"rows": credit_rows()[:1]})[0] == 200
    status, body = b.post(PREDICT, {"rows": credit_rows()[:1]})  # a user B has never seen, its bucket spent on A
    assert (status, body["error"]["code"]) == (429, "rate_limited")
    assert b.last_headers is not None and int(b.last_headers["Retry-After"]) >= 900


def test_idempotency_keys_hold_across_replicas(two_replicas: tuple[dict[str, Any], dict[str, Any]]) -> None:
    pa, pb = two_replicas
    admin = Client("127.0.0.1", pa["http"], ADMIN_KEY)
    key = admin.post("/v1/admin/users", {"name": "i"})[1]["api_key"]
    a, b = Client("127.0.0.1", pa["http"], key), Client("127.0.0.1", pb["http"], key)
    rows = {"rows": credit_rows()[:5]}
    status, first = a.post(PREDICT, rows, headers={"Idempotency-Key": "once"})
    assert status == 200
    status, again = b.post(PREDICT, rows, headers={"Idempotency-Key": "once"})
    assert status == 200 and again == first
    assert b.last_headers is not None and b.last_headers["Idempotent-Replayed"] == "true"
    assert b.post(PREDICT, {"rows": credit_rows()[:4]}, headers={"Idempotency-Key": "once"})[0] == 422

    # The same new key sent to both at once: charged once, both told the same answer (or,
    # for the one that lost the race while the other was committing, 409: retry).
    def send(c: Client, k: str) -> tuple[int, Any]:
        return c.post(PREDICT, rows, headers={"Idempotency-Key": k})

    for n in range(10):
        with ThreadPoolExecutor(2) as pool:
            ra, rb = pool.map(send, [Client("127.0.0.1", pa["http"], key), Client("127.0.0.1", pb["http"], key)],
                              [f"race-{n}"] * 2)  # fmt: skip
        assert {ra[0], rb[0]} <= {200, 409} and 200 in (ra[0], rb[0])
        if ra[0] == rb[0] == 200:
            assert ra[1] == rb[1]
    usage = admin.get("/v1/usage?user=i")[1]
    assert usage["queries"] == 11 and usage["rows"] == 55


def created_on_a_used_on_b(replicas: tuple[dict[str, Any], dict[str, Any]], name: str) -> tuple[Client, Client]:
    """The admin on replica A, and a user it creates there, querying replica B."""
    pa, pb = replicas
    admin_a = Client("127.0.0.1", pa["http"], ADMIN_KEY)
    status, body = admin_a.post("/v1/admin/users", {"name": name})
    assert status == 200, body
    return admin_a, Client("127.0.0.1", pb["http"], body["api_key"])


def test_a_key_created_rotated_or_revoked_on_one_replica_holds_on_the_other(
    two_replicas: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    admin_a, b = created_on_a_used_on_b(two_replicas, "k")
    assert b.post(PREDICT, {"rows": credit_rows()[:1]})[0] == 200  # created on A, served by B at once
    assert admin_a.post("/v1/admin/users/k/revoke")[0] == 200
    # B still has the key cached; the commit checks the user's row and refuses it.
    status, body = b.post(PREDICT, {"rows": credit_rows()[:1]})
    assert (status, body["error"]["code"]) == (401, "unauthenticated")
    assert admin_a.get("/v1/usage?user=k")[1]["rows"] == 1


def test_the_query_log_has_no_gaps_for_a_cursor_while_writers_append(pg_db: str) -> None:
    """Several connections append concurrently; a reader following events_after with a
    cursor must see every sequence number exactly once, in order, never skipping one that
    commits after a higher one was readable."""
    writers, per_writer = 4, 60
    stores = [Store(pg_db) for _ in range(writers)]
    reader = Store(pg_db)
    seen: list[int] = []
    done = threading.Event()

    def write(s: Store) -> None:
        x = np.zeros((1, 4))
        for i in range(per_writer):
            s.record_queries([QueryRecord(time.time(), f"u{i % 3}", "m", x, np.zeros(1, np.int64), None, None, 1)
                              for _ in range(1 + i % 3)])  # fmt: skip

    def follow() -> None:
        cursor = 0
        while True:
            finished = done.is_set()  # read before the page: the last page after the writers
            page = reader.events_after(cursor, None, 50)
            seen.extend(e.seq for e in page)
            if page:
                cursor = page[-1].seq
            elif finished:
                return

    follower = threading.Thread(target=follow)
    follower.start()
    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(write, stores))
    done.set()
    follower.join(scaled(60))
    total = writers * sum(1 + i % 3 for i in range(per_writer))
    assert seen == list(range(1, total + 1))
    assert reader.ledger_totals() == (total, total, total)
    for s in [*stores, reader]:
        s.close()


def test_workers_need_a_postgresql_store_and_the_monitor_service(tmp_path: Path) -> None:
    for args, problem in [(["--db", str(tmp_path / "s.db"), "--workers", "2", "--no-monitor"], "needs a PostgreSQL store"),
                          (["--db", str(tmp_path / "s.db"), "--workers", "2"], "needs a PostgreSQL store"),
                          (["--db", "postgresql://u@/x?host=/nonexistent", "--workers", "2"], "--no-monitor"),
                          (["--db", "mysql://u@h/x"], "expected a SQLite file path or a postgresql:// URL")]:  # fmt: skip
        r = subprocess.run([sys.executable, "-m", "analysim", "gateway", *args], capture_output=True, text=True,
                           env={**os.environ, "ANALYSIM_ADMIN_KEY": ADMIN_KEY}, timeout=scaled(60))  # fmt: skip
        assert r.returncode != 0 and problem in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


def test_an_unreachable_database_is_one_line_naming_it_without_its_password() -> None:
    with pytest.raises(UserError, match=r"postgresql://u:\*\*\*@/x\?host=/nonexistent: not a usable store") as e:
        Store("postgresql://u:secret@/x?host=/nonexistent")
    assert "secret" not in str(e.value)


def raw_connection(db: str) -> Any:
    """A plain driver connection to a store (autocommit), to make it look older."""
    if db.startswith("postgresql://"):
        import psycopg

        return psycopg.connect(db, autocommit=True)
    return sqlite3.connect(db, isolation_level=None)


def test_a_version_2_store_is_upgraded_in_place(store_db: str) -> None:
    """Version 2 had no per-user counters: the upgrade fills rows_used from the ledger, so
    that the quota counts what was charged before it. The same migration on both databases."""
    s = Store(store_db)
    s.add_model(credit_model())
    s.add_user("old", "h" * 64, 10, None)
    x = np.zeros((7, 4))
    s.record_queries([QueryRecord(time.time(), "old", "credit", x, np.zeros(7, np.int64), None, None, 70)])
    s.close()
    con = raw_connection(store_db)  # back to version 2's layout
    con.execute("DROP TABLE sequences")
    for col in ("rows_used", "bucket_tokens", "bucket_stamp"):
        con.execute(f"ALTER TABLE users DROP COLUMN {col}")
    con.execute("UPDATE meta SET value='2' WHERE key='schema_version'")
    con.close()
    s = Store(store_db)
    assert [u.rows_used for u in s.users()] == [7]
    assert s.record_queries([QueryRecord(time.time(), "old", "credit", np.zeros((1, 4)), np.zeros(1, np.int64),
                                         None, None, 10)]) == [2]  # fmt: skip
    assert [u.rows_used for u in s.users()] == [8]
    s.close()
    con = raw_connection(store_db)
    assert con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    con.close()


def test_workers_stop_when_their_supervisor_is_killed(store_with_model: str, tmp_path: Path) -> None:
    """A SIGKILLed supervisor cannot stop its workers; they notice and stop themselves
    (orphans would hold the ports)."""
    proc, ports = gateway(store_with_model, tmp_path / "ports.json", "--workers", "2")
    pids = [w["pid"] for w in ports["workers"]]
    proc.kill()
    proc.wait(scaled(30))

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A zombie until its parent (now init) reaps it: stopped all the same.
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"

    wait_until(lambda: all(gone(p) for p in pids), what="the orphaned workers to stop")


def test_model_commands_take_a_postgresql_url(pg_db: str) -> None:
    def analysim(*args: str) -> str:
        r = subprocess.run([sys.executable, "-m", "analysim", "model", *args, "--db", pg_db], capture_output=True,
                           text=True, timeout=scaled(120))  # fmt: skip
        assert r.returncode == 0, r.stderr
        return r.stdout

    analysim("train", "--dataset", "iris", "--max-depth", "3", "--name", "iris")
    assert "iris" in analysim("list")
    store = Store(pg_db)
    model = store.load_model("iris")
    store.close()
    assert model is not None and model.classes and model.tree.n_leaves <= 8


def test_limits_and_prices_changed_through_one_replica_hold_on_the_other(
    two_replicas: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    admin_a, b = created_on_a_used_on_b(two_replicas, "l")
    assert b.post(PREDICT, {"rows": credit_rows()[:3]})[0] == 200
    # A quota set through A binds B's very next request (the commit reads the user's row).
    assert admin_a.request("PATCH", "/v1/admin/users/l", {"quota_rows": 4})[0] == 200
    status, body = b.post(PREDICT, {"rows": credit_rows()[:2]})
    assert (status, body["error"]["code"]) == (429, "quota_exceeded") and "quota of 4" in body["error"]["message"]
    assert b.post(PREDICT, {"rows": credit_rows()[:1]})[0] == 200
    # A price set through A is charged by B once it has looked at the store again (each second).
    assert admin_a.request("PATCH", "/v1/admin/users/l", {"quota_rows": None})[0] == 200
    assert admin_a.request("PUT", "/v1/admin/models/credit/policy", {"price": 0.5})[0] == 200

    def charged_at_new_price() -> bool:
        status, body = b.post(PREDICT, {"rows": credit_rows()[:1]})
        assert status == 200, body
        return body["charged"] == 0.5

    wait_until(charged_at_new_price, what="replica B to charge the price set through A", poll_s=0.2)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    quota=st.integers(0, 30),
    batches=st.lists(st.lists(st.tuples(st.integers(0, 1), st.integers(1, 6)), min_size=1, max_size=5),
                     min_size=1, max_size=8),  # fmt: skip
)
def test_commits_through_two_connections_never_exceed_the_quota(store_db: str, quota: int,
                                                                 batches: list[list[tuple[int, int]]]) -> None:  # fmt: skip
    """Batches of queries of one user, committed alternately through two stores (two
    replicas' connections): what is admitted fits the quota, in full batches' order; the
    row counter equals the ledger; ids stay dense."""
    stores = [Store(store_db), Store(store_db)]
    try:
        user = f"u{next(_hypothesis_users)}"
        stores[0].add_user(user, user * 4, quota, None)
        first = stores[0].ledger_totals()[0] + 1
        used, ids = 0, []
        for batch in batches:
            for which in (0, 1):
                records = [QueryRecord(time.time(), user, "m", np.zeros((n, 2)), np.zeros(n, np.int64), None, None, n,
                                       admission=Admission(user * 4)) for w, n in batch if w == which]  # fmt: skip
                for r, outcome in zip(records, stores[which].commit_queries(records), strict=True):
                    n = r.features.shape[0]
                    if used + n <= quota:  # admitted exactly when it fits, in order
                        assert isinstance(outcome, int)
                        used += n
                        ids.append(outcome)
                    else:
                        assert isinstance(outcome, Refused) and outcome.reason == "quota_exceeded"
                        assert outcome.rows_used == used and outcome.limit == quota
        assert [u.rows_used for u in stores[1].users() if u.name == user] == [used]
        assert stores[1].rows_by_user().get(user, 0) == used
        assert ids == list(range(first, first + len(ids)))
    finally:
        for s in stores:
            s.close()


_hypothesis_users = itertools.count()
