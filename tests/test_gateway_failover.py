"""Failure drills of replicated gateways on PostgreSQL, with real processes and real signals:
a worker SIGKILLed under load, and the database stopped (pg_ctl stop -m fast) and started
again under load. Clients retry each request with its Idempotency-Key until it is answered,
as a client should; at the end the ledger holds exactly the queries the clients saw
answered: nothing lost, nothing charged twice. While the database is down the gateways
answer 503 with Retry-After, never 500."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from mlaas_monitor.store import Store
from mlaas_monitor.store_records import StoreUnavailable
from tests.pg import PgCluster, throwaway_cluster
from tests.polling import scaled
from tests.test_gateway_helpers import ADMIN_KEY, Client, credit_model, credit_rows, wait_until
from tests.test_gateway_http import PREDICT
from tests.test_gateway_replicas import gateway, stop
from tests.threads import CheckedThread

pytestmark = pytest.mark.timeout(300)
CLIENTS = 4
CLIENT_BACKOFF_S = 0.02  # how long a client waits before resending after a refusal or a broken connection


class RetryingClients:
    """CLIENTS threads sending 1-3 row queries, each with its own Idempotency-Key, resent
    (same key) after a broken connection, a 503 or a 409 until answered."""

    def __init__(self, port: int, key: str) -> None:
        self.port, self.key = port, key
        self.answered: dict[int, int] = {}  # query_id -> rows, as the clients saw them
        self.unavailable = 0  # 503s seen, each with Retry-After
        self.broken = 0  # connections that failed mid-request
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [CheckedThread(self.run, args=(i,), name=f"client{i}") for i in range(CLIENTS)]

    def run(self, i: int) -> None:
        client, rows, n = Client("127.0.0.1", self.port, self.key), credit_rows(), 0
        while not self.stopping.is_set():
            n += 1
            batch = rows[(n * 3 + i) % 200 : (n * 3 + i) % 200 + 1 + (n + i) % 3]
            while True:  # until answered, with the same key
                try:
                    status, body = client.post(PREDICT, {"rows": batch}, headers={"Idempotency-Key": f"c{i}-{n}"})
                except (OSError, http.client.HTTPException):
                    with self.lock:
                        self.broken += 1
                    time.sleep(CLIENT_BACKOFF_S)
                    continue
                if status == 200:
                    with self.lock:
                        assert body["query_id"] not in self.answered  # a new query, never one seen before
                        self.answered[body["query_id"]] = len(body["predictions"])
                    break
                assert status in (503, 409), body  # never a 500
                if status == 503:
                    assert body["error"]["code"] == "store_unavailable", body
                    assert client.last_headers is not None and int(client.last_headers["Retry-After"]) >= 1
                    with self.lock:
                        self.unavailable += 1
                time.sleep(CLIENT_BACKOFF_S)

    def count(self) -> int:
        with self.lock:
            return len(self.answered)

    def __enter__(self) -> RetryingClients:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(scaled(60))


def ledger(db: str) -> dict[int, int]:
    with psycopg.connect(db) as con:
        return dict(con.execute("SELECT query_id, rows FROM ledger").fetchall())


def new_user(port: int) -> str:
    status, body = Client("127.0.0.1", port, ADMIN_KEY).post("/v1/admin/users", {"name": "drill"})
    assert status == 200, body
    return body["api_key"]


def with_model(db: str) -> str:
    s = Store(db)
    s.add_model(credit_model())
    s.close()
    return db


def test_a_worker_sigkilled_under_load_loses_no_charge_and_charges_nothing_twice(pg_db: str, tmp_path: Path) -> None:
    port_file = tmp_path / "ports.json"
    proc, ports = gateway(with_model(pg_db), port_file, "--workers", "2")
    try:
        key = new_user(ports["http"])
        with RetryingClients(ports["http"], key) as clients:
            wait_until(lambda: clients.count() >= 200, what="200 answered queries")
            victim = ports["workers"][0]["pid"]
            os.kill(victim, signal.SIGKILL)

            def restarted() -> bool:
                pids = [w["pid"] for w in json.loads(port_file.read_text())["workers"]]
                return victim not in pids and len(pids) == 2

            wait_until(restarted, deadline_s=120, what="the supervisor to restart the killed worker")
            after = clients.count()
            wait_until(lambda: clients.count() >= after + 200, deadline_s=120, what="200 more answered queries")
    finally:
        stop(proc)
    assert ledger(pg_db) == clients.answered


@pytest.fixture
def own_cluster() -> Iterator[PgCluster]:
    """A cluster of this test's own: it is stopped and started mid-test."""
    with throwaway_cluster() as cluster:
        yield cluster


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_the_database_restarted_under_load_is_503_then_recovery_and_the_ledger_is_exact(
    own_cluster: PgCluster, tmp_path: Path, mode: str
) -> None:
    """``fast``: a clean restart. ``immediate``: a crash (no checkpoint; what was committed
    without waiting for the WAL flush is lost), which only the answered-after-durable rule
    survives: a charge a client saw, or a log entry a reader got, is never lost."""
    db = with_model(own_cluster.new_database())
    proc, ports = gateway(db, tmp_path / "ports.json", "--workers", "2")
    follower = LogFollower(db)
    try:
        key = new_user(ports["http"])
        with RetryingClients(ports["http"], key) as clients, follower:
            wait_until(lambda: clients.count() >= 200, what="200 answered queries")
            own_cluster.stop(mode)
            wait_until(lambda: clients.unavailable >= 20, what="503s while the database is down")
            down: dict[str, Any] = {"answered": clients.count()}
            own_cluster.start()
            wait_until(lambda: clients.count() >= down["answered"] + 200, deadline_s=120,
                       what="200 answered queries after the restart")  # fmt: skip
        # The gateways stayed up throughout (no worker died of it).
        assert proc.poll() is None
    finally:
        stop(proc)
    assert clients.unavailable >= 20
    assert ledger(db) == clients.answered
    # Every log entry the reader was handed before the restart is still there, unchanged.
    with psycopg.connect(db) as con:
        now = {i: (ts, u, n) for i, ts, u, n in con.execute('SELECT id, ts, "user", n_rows FROM query_log')}
    assert follower.seen and all(now.get(seq) == entry for seq, entry in follower.seen.items())


class LogFollower:
    """Follows the query log with events_after and a cursor, as the monitor does, through
    the outage (a failed read is retried)."""

    def __init__(self, db: str) -> None:
        self.store = Store(db)
        self.seen: dict[int, tuple[float, str, int]] = {}  # seq -> (ts, user, rows)
        self.stopping = threading.Event()
        self.thread = CheckedThread(self.run, name="follower")

    def run(self) -> None:
        cursor = 0
        while not self.stopping.is_set():
            try:
                page = self.store.events_after(cursor, None, 500)
            except StoreUnavailable:
                time.sleep(CLIENT_BACKOFF_S)
                continue
            for e in page:
                assert e.seq == cursor + 1, f"a gap after {cursor}: {e.seq}"  # no gaps, in order
                self.seen[e.seq] = (e.timestamp, e.user, e.n_rows)
                cursor = e.seq

    def __enter__(self) -> LogFollower:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(scaled(60))
        self.store.close()
