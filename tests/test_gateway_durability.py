"""Durability with real processes and real signals: the gateway is killed with SIGKILL
while clients hammer it; after a restart, and once each client has retried the request it
had in flight (with the same Idempotency-Key), the ledger equals exactly the rows the
clients saw answered. SIGTERM shuts down gracefully: in-flight requests finish and the
ledger matches exactly."""

from __future__ import annotations

import http.client
import signal
import sqlite3
import subprocess
import threading
from pathlib import Path

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
from tests.threads import CheckedThread

CLIENTS = 4
PREDICT = "/v1/models/credit/predict"


def start_gateway(db: Path, port_file: Path) -> tuple[subprocess.Popen[str], int]:
    proc, ports = start_module(
        ["mlaas_monitor", "gateway", "--db", str(db), "--port", "0", "--grpc-port", "0"], port_file,
        "the gateway's port file", stdout=subprocess.PIPE,
    )  # fmt: skip
    return proc, ports["http"]


class Hammer:
    """CLIENTS threads sending 1-3 row queries, each with its own Idempotency-Key, until
    the connection fails."""

    def __init__(self, port: int, key: str) -> None:
        self.port, self.key = port, key
        self.answered: dict[int, int] = {}  # query_id -> rows, as the clients saw them
        self.in_flight: list[tuple[str, list[list[object]]]] = []  # (key, rows) cut off by the signal
        self.lock = threading.Lock()
        self.threads = [CheckedThread(self.run, args=(i,), name=f"client{i}") for i in range(CLIENTS)]

    def run(self, i: int) -> None:
        client = Client("127.0.0.1", self.port, self.key)
        rows = credit_rows()
        n = 0
        while True:
            k = 1 + (n + i) % 3
            batch = rows[(n * 3 + i) % 200 : (n * 3 + i) % 200 + k]
            n += 1
            request_key = f"client{i}-{n}"
            try:
                status, body = client.post(PREDICT, {"rows": batch}, headers={"Idempotency-Key": request_key})
            except (OSError, http.client.HTTPException):
                with self.lock:
                    self.in_flight.append((request_key, batch))
                return
            self.saw(status, body)

    def saw(self, status: int, body: dict) -> None:
        assert status == 200, body
        with self.lock:
            assert body["query_id"] not in self.answered  # a new query, never one seen before
            self.answered[body["query_id"]] = len(body["predictions"])

    def retry_in_flight(self, port: int) -> int:
        """What a client does after an outage: resend the cut-off request with its key.
        Returns how many of them were replays (charged before the kill, never seen)."""
        client, replays = Client("127.0.0.1", port, self.key), 0
        for request_key, batch in self.in_flight:
            status, body = client.post(PREDICT, {"rows": batch}, headers={"Idempotency-Key": request_key})
            assert client.last_headers is not None
            replays += client.last_headers.get("Idempotent-Replayed") == "true"
            self.saw(status, body)
        return replays

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        """Wait for every client; a failed check in a client thread fails the test here."""
        for t in self.threads:
            t.join(scaled(30))


def ledger(db: Path) -> dict[int, int]:
    con = sqlite3.connect(db)  # a read-only peek at the ledger table itself
    try:
        return dict(con.execute("SELECT query_id, rows FROM ledger").fetchall())
    finally:
        con.close()


def setup_store(db: Path) -> None:
    store = Store(db)
    store.add_model(credit_model())
    store.close()


def test_sigkill_loses_nothing_that_was_answered(tmp_path: Path) -> None:
    db, port_file = tmp_path / "store.db", tmp_path / "ports.json"
    setup_store(db)
    proc, port = start_gateway(db, port_file)
    try:
        status, body = Client("127.0.0.1", port, ADMIN_KEY).post("/v1/admin/users", {"name": "victim"})
        assert status == 200
        key = body["api_key"]
        hammer = Hammer(port, key)
        hammer.start()
        wait_until(lambda: len(hammer.answered) >= 300, what="300 answered queries")
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(scaled(30)) == -signal.SIGKILL
        hammer.join()
    finally:
        proc.kill()
        proc.communicate()

    proc, port = start_gateway(db, port_file)
    try:
        before_retry = ledger(db)
        seen_before = dict(hammer.answered)
        # Nothing answered is lost...
        assert {q: before_retry.get(q) for q in seen_before} == seen_before
        # ...and a kill between a charge's commit and its response leaves at most one charge
        # per client that it has not seen yet: the request it had in flight.
        assert len(hammer.in_flight) == CLIENTS
        unseen = set(before_retry) - set(seen_before)
        assert len(unseen) <= CLIENTS
        # Exactly the charges the clients had not seen come back as replays.
        assert hammer.retry_in_flight(port) == len(unseen)
        # Retried with their keys, those are answered (a replay if charged before the kill,
        # fresh if not) and charged once: the ledger is exactly what the clients saw.
        charged = ledger(db)
        assert charged == hammer.answered
        # The restarted gateway serves the same users and reports the same ledger.
        user = Client("127.0.0.1", port, key)
        status, usage = user.get("/v1/usage")
        assert status == 200 and usage["rows"] == sum(charged.values()) and usage["queries"] == len(charged)
        assert user.post("/v1/models/credit/predict", {"rows": credit_rows()[:1]})[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(scaled(30)) == 0


def test_sigterm_finishes_in_flight_requests_and_the_ledger_matches_exactly(tmp_path: Path) -> None:
    db, port_file = tmp_path / "store.db", tmp_path / "ports.json"
    setup_store(db)
    proc, port = start_gateway(db, port_file)
    try:
        status, body = Client("127.0.0.1", port, ADMIN_KEY).post("/v1/admin/users", {"name": "calm"})
        hammer = Hammer(port, body["api_key"])
        hammer.start()
        wait_until(lambda: len(hammer.answered) >= 200, what="200 answered queries")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(scaled(30)) == 0
        hammer.join()
        _, err = proc.communicate()
        assert "gateway: stopped" in err and "Traceback" not in err
    finally:
        proc.kill()
    assert ledger(db) == hammer.answered
