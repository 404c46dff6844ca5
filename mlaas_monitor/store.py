"""The durable store: SQLite in WAL mode holding models, users (hashed keys), the query log
and the billing ledger.

A query's log entry and its ledger charge are written in one transaction, committed before
the gateway answers; ``record_queries`` takes a whole batch so the gateway can group-commit
everything answered in one event-loop tick. WAL with ``synchronous=NORMAL`` survives a
killed process (SIGKILL) without losing a committed transaction; ``FULL`` also survives
power loss at the cost of an fsync per commit.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from analysim.errors import UserError
from mlaas_monitor.model import Model, Policy
from mlaas_monitor.stream import QueryEvent

SCHEMA_VERSION = 2
CHECKPOINT_INTERVAL_S = 0.5

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS models (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    spec TEXT NOT NULL,                -- JSON: schema, classes, tree arrays, card, validation set
    reveal_confidence INTEGER NOT NULL,
    confidence_decimals INTEGER NOT NULL,
    reveal_leaf INTEGER NOT NULL,
    price_micros INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY,
    key_hash TEXT NOT NULL UNIQUE,     -- sha256 of the API key (the key itself is never stored)
    created REAL NOT NULL,
    revoked REAL,
    quota_rows INTEGER,
    rate_limit REAL
);
CREATE TABLE IF NOT EXISTS query_log (
    id INTEGER PRIMARY KEY,            -- assigned by record_queries, never reused (nothing is deleted)
    ts REAL NOT NULL,
    user TEXT NOT NULL,
    model TEXT NOT NULL,
    n_rows INTEGER NOT NULL,
    n_features INTEGER NOT NULL,
    features BLOB NOT NULL,            -- little-endian float64, row-major
    labels BLOB NOT NULL,              -- little-endian int32 class indices
    confidences BLOB,                  -- float64 as revealed, NULL when hidden
    leaves BLOB,                       -- int32, NULL when hidden
    request_key TEXT,                  -- the client's Idempotency-Key, if it sent one
    request_digest BLOB                -- sha256 of (model, encoded rows): a reused key must match
);
CREATE INDEX IF NOT EXISTS query_log_model ON query_log(model, id);
CREATE TABLE IF NOT EXISTS ledger (
    query_id INTEGER PRIMARY KEY REFERENCES query_log(id),
    ts REAL NOT NULL,
    user TEXT NOT NULL,
    model TEXT NOT NULL,
    rows INTEGER NOT NULL,
    amount_micros INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS ledger_user ON ledger(user, model);
"""
# After the tables exist (a version-1 store gains the columns first).
_DDL_INDEXES = """
CREATE UNIQUE INDEX IF NOT EXISTS query_log_request ON query_log(user, request_key) WHERE request_key IS NOT NULL;
"""
_MIGRATIONS = {
    # 1 -> 2: idempotency keys on the query log.
    1: ["ALTER TABLE query_log ADD COLUMN request_key TEXT", "ALTER TABLE query_log ADD COLUMN request_digest BLOB"],
}


class ModelUnavailable(Exception):
    """A stored model that cannot be served (unknown format, malformed spec): the reason,
    so that the gateway can isolate it and keep serving the others."""

    def __init__(self, model_id: str, reason: str) -> None:
        super().__init__(f"model {model_id!r} cannot be loaded: {reason}")
        self.model_id, self.reason = model_id, reason


@dataclass(frozen=True)
class UserRecord:
    name: str
    key_hash: str
    created: float
    revoked: float | None
    quota_rows: int | None
    rate_limit: float | None

    def public(self) -> dict[str, Any]:
        return {
            "user": self.name,
            "created": self.created,
            "revoked": self.revoked is not None,
            "quota_rows": self.quota_rows,
            "rate_limit": self.rate_limit,
        }


@dataclass(frozen=True, eq=False)
class QueryRecord:
    """One answered query: its log entry and its charge, committed together."""

    ts: float
    user: str
    model_id: str
    features: np.ndarray
    labels: np.ndarray
    confidences: np.ndarray | None
    leaves: np.ndarray | None
    amount_micros: int
    request_key: str | None = None
    request_digest: bytes | None = None


@dataclass(frozen=True, eq=False)
class AnsweredRequest:
    """A logged query found by its idempotency key: what the user was told, and charged."""

    query_id: int
    digest: bytes  # request_digest of what was sent: the model and the encoded rows
    labels: np.ndarray
    confidences: np.ndarray | None
    leaves: np.ndarray | None
    amount_micros: int


class Store:
    """Thread-safe (one connection behind a lock): the gateway commits from its event loop."""

    def __init__(
        self,
        path: str | Path,
        synchronous: str = "NORMAL",
        background_checkpoint: bool = False,
        busy_timeout: float = 10.0,
    ) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise UserError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        self.path = str(path)
        try:
            # busy_timeout: how long a write waits for another process's lock (e.g. `analysim
            # model train` registering a model) before the request fails with 503.
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=busy_timeout)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.execute("PRAGMA foreign_keys=ON")
            with self._tx():
                for stmt in _DDL.split(";"):
                    if stmt.strip():
                        self._db.execute(stmt)
                row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
                version = SCHEMA_VERSION if row is None else int(row[0])
                if version > SCHEMA_VERSION:
                    raise UserError(f"{self.path}: store schema version {version} is newer than this AnalySIM ({SCHEMA_VERSION})")
                for v in range(version, SCHEMA_VERSION):
                    for stmt in _MIGRATIONS[v]:
                        self._db.execute(stmt)
                self._db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                self._db.execute(_DDL_INDEXES)
        except sqlite3.DatabaseError as e:
            raise UserError(f"{self.path}: not a usable store: {e}") from e
        self._lock = threading.Lock()
        self._next_id: int | None = None  # of the next query_log row; read once, then counted
        self._stop_checkpoints = threading.Event()
        self._checkpointer: threading.Thread | None = None
        if background_checkpoint:
            # A WAL checkpoint fsyncs the database file: milliseconds, at unpredictable
            # commits. Moving it off the serving connection into a thread (its own
            # connection; sqlite releases the GIL) keeps commit latency flat.
            self._db.execute("PRAGMA wal_autocheckpoint=0")
            self._checkpointer = threading.Thread(target=self._checkpoint_loop, name="wal-checkpoint", daemon=True)
            self._checkpointer.start()

    @property
    def checkpoints_in_background(self) -> bool:
        """Whether a thread of this store checkpoints the WAL (so no other connection should)."""
        return self._checkpointer is not None

    def _checkpoint_loop(self, interval: float = CHECKPOINT_INTERVAL_S) -> None:
        db = sqlite3.connect(self.path, isolation_level=None, timeout=10.0)
        try:
            while not self._stop_checkpoints.wait(interval):
                db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        finally:
            db.close()

    def _tx(self) -> _Transaction:
        return _Transaction(self._db)

    def close(self) -> None:
        if self._checkpointer is not None:
            self._stop_checkpoints.set()
            self._checkpointer.join()
        with self._lock:
            self._db.close()  # the last connection to close checkpoints the WAL

    # ---- models ----

    def add_model(self, model: Model, replace: bool = False) -> None:
        p = model.policy
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        with self._lock, self._tx():
            try:
                self._db.execute(
                    f"{verb} INTO models VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (model.id, time.time(), json.dumps(model.spec()), int(p.reveal_confidence),
                     p.confidence_decimals, int(p.reveal_leaf), p.price_micros),
                )  # fmt: skip
            except sqlite3.IntegrityError as e:
                raise UserError(f"model {model.id!r} already exists (use --replace to overwrite)") from e

    def model_ids(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT id FROM models ORDER BY id")]

    def load_model(self, model_id: str) -> Model | None:
        with self._lock:
            row = self._db.execute(
                "SELECT spec, reveal_confidence, confidence_decimals, reveal_leaf, price_micros FROM models WHERE id=?",
                (model_id,),
            ).fetchone()
        if row is None:
            return None
        try:
            policy = Policy(bool(row[1]), int(row[2]), bool(row[3]), int(row[4]))
            return Model.from_spec(model_id, json.loads(row[0]), policy)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as e:
            # Whatever a damaged or foreign row makes the decoder raise (JSONDecodeError and
            # TreeFormatError are ValueErrors; a missing key or a wrong type the others).
            raise ModelUnavailable(model_id, f"{type(e).__name__}: {str(e)[:200]}") from e

    def set_policy(self, model_id: str, p: Policy) -> None:
        with self._lock, self._tx():
            self._db.execute(
                "UPDATE models SET reveal_confidence=?, confidence_decimals=?, reveal_leaf=?, price_micros=? WHERE id=?",
                (int(p.reveal_confidence), p.confidence_decimals, int(p.reveal_leaf), p.price_micros, model_id),
            )

    # ---- users ----

    def add_user(self, name: str, key_hash: str, quota_rows: int | None, rate_limit: float | None) -> bool:
        """False if the name is taken."""
        with self._lock, self._tx():
            try:
                self._db.execute(
                    "INSERT INTO users VALUES (?, ?, ?, NULL, ?, ?)", (name, key_hash, time.time(), quota_rows, rate_limit)
                )
            except sqlite3.IntegrityError:
                return False
        return True

    def update_user(self, name: str, **fields: Any) -> None:
        allowed = {"key_hash", "revoked", "quota_rows", "rate_limit"}
        assert set(fields) <= allowed, fields
        sets = ", ".join(f"{k}=?" for k in fields)
        with self._lock, self._tx():
            self._db.execute(f"UPDATE users SET {sets} WHERE name=?", (*fields.values(), name))

    def users(self) -> list[UserRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM users ORDER BY name").fetchall()
        return [UserRecord(*r) for r in rows]

    # ---- query log + ledger ----

    def record_queries(self, records: list[QueryRecord]) -> list[int]:
        """Log and charge every record in ONE transaction; returns their sequence numbers."""
        if not records:
            return []
        with self._lock:
            try:
                return self._record(records)
            except sqlite3.IntegrityError:
                # Another writer took the ids this connection expected (one gateway per
                # store is the rule, but not one to lose a query over): ask SQLite again.
                self._next_id = None
                return self._record(records)

    _LOG_INSERT = (
        "INSERT INTO query_log (id, ts, user, model, n_rows, n_features, features, labels, confidences, leaves,"
        " request_key, request_digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )

    def _record(self, records: list[QueryRecord]) -> list[int]:
        db = self._db
        with self._tx():
            # Ids are assigned here rather than by SQLite: both tables are filled without
            # reading any back. BEGIN IMMEDIATE holds the write lock, so the ids are ours.
            if self._next_id is None:
                self._next_id = db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM query_log").fetchone()[0]
            first = self._next_id
            # One execute per record: for the one to a few records of a group commit, that
            # is cheaper than executemany's per-call setup.
            for qid, r in enumerate(records, first):
                db.execute(
                    self._LOG_INSERT,
                    (qid, r.ts, r.user, r.model_id, r.features.shape[0], r.features.shape[1],
                     r.features.astype("<f8").tobytes(), r.labels.astype("<i4").tobytes(),
                     None if r.confidences is None else r.confidences.astype("<f8").tobytes(),
                     None if r.leaves is None else r.leaves.astype("<i4").tobytes(),
                     r.request_key, r.request_digest),
                )  # fmt: skip
                db.execute(
                    "INSERT INTO ledger VALUES (?, ?, ?, ?, ?, ?)",
                    (qid, r.ts, r.user, r.model_id, r.features.shape[0], r.amount_micros),
                )
        self._next_id = first + len(records)  # only once committed: a rollback reuses them
        return list(range(first, first + len(records)))

    def answered_request(self, user: str, request_key: str) -> AnsweredRequest | None:
        """The query ``user`` sent with this idempotency key, if it was answered."""
        with self._lock:
            row = self._db.execute(
                "SELECT q.id, q.request_digest, q.labels, q.confidences, q.leaves, l.amount_micros"
                " FROM query_log q JOIN ledger l ON l.query_id = q.id WHERE q.user=? AND q.request_key=?",
                (user, request_key),
            ).fetchone()
        if row is None:
            return None
        qid, digest, labels, conf, leaves, amount = row
        return AnsweredRequest(qid, digest, *_told(labels, conf, leaves), amount)

    def usage(self, user: str) -> list[tuple[str, int, int, int]]:
        """(model, queries, rows, amount_micros) per model for one user."""
        with self._lock:
            return self._db.execute(
                "SELECT model, COUNT(*), SUM(rows), SUM(amount_micros) FROM ledger WHERE user=? GROUP BY model ORDER BY model",
                (user,),
            ).fetchall()

    def rows_by_user(self) -> dict[str, int]:
        with self._lock:
            return dict(self._db.execute("SELECT user, SUM(rows) FROM ledger GROUP BY user").fetchall())

    def ledger_totals(self) -> tuple[int, int, int]:
        """(charged queries, charged rows, amount_micros) over the whole ledger."""
        with self._lock:
            q, r, a = self._db.execute("SELECT COUNT(*), SUM(rows), SUM(amount_micros) FROM ledger").fetchone()
        return int(q), int(r or 0), int(a or 0)

    def events_after(self, after_seq: int, model_id: str | None = None, limit: int = 1000) -> list[QueryEvent]:
        """Logged queries with seq > after_seq, oldest first (the monitor's replay)."""
        sql = "SELECT id, ts, user, model, n_rows, n_features, features, labels, confidences, leaves FROM query_log WHERE id > ?"
        args: list[Any] = [after_seq]
        if model_id:
            sql += " AND model = ?"
            args.append(model_id)
        sql += " ORDER BY id LIMIT ?"
        args.append(limit)
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [_event(r) for r in rows]


def _told(labels: bytes, conf: bytes | None, leaves: bytes | None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """A logged answer's blobs as arrays: class indices, and the confidences and leaf ids
    when they were revealed."""
    return (
        np.frombuffer(labels, dtype="<i4").astype(np.int64),
        None if conf is None else np.frombuffer(conf, dtype="<f8").astype(np.float64),
        None if leaves is None else np.frombuffer(leaves, dtype="<i4").astype(np.int64),
    )


def _event(r: Iterable[Any]) -> QueryEvent:
    qid, ts, user, model, n, f, feats, labels, conf, leaves = r
    features = np.frombuffer(feats, dtype="<f8").reshape(n, f).astype(np.float64)
    return QueryEvent(qid, ts, user, model, features, *_told(labels, conf, leaves))


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception (autocommit connection)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self._db.execute("COMMIT")
        else:
            self._db.execute("ROLLBACK")
