"""The two databases a Store can live in, and everything in which they differ: how to
connect, the column types of the schema, placeholders, row locks, and which driver errors
mean "the database is unavailable, retry" or "a unique key was taken".

SQLite (a file path) is the embedded default: one gateway process, WAL, BEGIN IMMEDIATE
locking the whole database. PostgreSQL (a ``postgresql://`` URL, psycopg 3) is the shared
store of gateway replicas: row locks (SELECT ... FOR UPDATE) make the per-user quota and
rate limit and the query-log sequence correct across processes and machines.

Every SQL statement of the store is written once, with ``?`` placeholders and ``{INT}``,
``{REAL}``, ``{BLOB}`` column types; ``Backend.sql`` and ``Backend.ddl`` render it.
"""

from __future__ import annotations

import re
import sqlite3
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

from analysim.errors import UserError

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
# Serialises schema creation and migration of replicas starting at once (PostgreSQL's DDL is
# transactional, but two CREATE TABLE IF NOT EXISTS racing can still collide on the catalog).
_MIGRATION_LOCK_KEY = 0x616E_616C_7973  # "analys"


def is_postgres_url(db: str) -> bool:
    return db.startswith(POSTGRES_SCHEMES)


def redacted(db: str) -> str:
    """``db`` fit for messages and logs: a URL's password replaced by ***."""
    return re.sub(r"^(postgres(?:ql)?://[^:/@]*:)[^@]*@", r"\1***@", db)


class Connection(Protocol):
    def execute(self, sql: str, params: Any = ...) -> Any: ...
    def close(self) -> None: ...


class Backend:
    name: str  # "sqlite" or "postgresql"
    types: dict[str, str]  # the DDL's {INT}, {REAL}, {BLOB} placeholders -> this backend's types
    begin: str  # starts a write transaction
    for_update: str  # appended to a SELECT that must lock the rows it reads until commit
    integrity_errors: tuple[type[Exception], ...]  # the driver's errors for a broken constraint (a key taken)
    unavailable_errors: tuple[type[Exception], ...]  # retry later: 503 to a client

    def sql(self, stmt: str) -> str:
        return stmt

    def ddl(self, stmt: str) -> str:
        return stmt.format(**self.types)

    def connect(self) -> Connection:
        raise NotImplementedError

    def migration_lock(self, db: Connection) -> None:
        """Inside the schema transaction: wait for any other process migrating the store."""

    def pipeline(self, db: Connection) -> AbstractContextManager[object]:
        """Statements executed inside are sent without waiting for each one's result (one
        round trip for all, on PostgreSQL); a result read inside waits for what came before."""
        return nullcontext()

    # Whether commit_early defers durability, so that make_durable has something to wait for.
    defers_durability = False

    def commit_early(self, db: Connection) -> None:
        """Inside a log-appending transaction: let its COMMIT return (and release its locks)
        before its WAL is on disk; ``make_durable`` then waits for that, lock-free."""

    def make_durable(self, db: Connection) -> None:
        """Outside a transaction: return once everything committed so far is durable."""

    def columns(self, db: Connection, table: str) -> set[str]:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


class SqliteBackend(Backend):
    name = "sqlite"
    types = {"INT": "INTEGER", "REAL": "REAL", "BLOB": "BLOB"}
    begin = "BEGIN IMMEDIATE"  # takes the database's write lock now: the transaction is alone
    for_update = ""
    integrity_errors = (sqlite3.IntegrityError,)
    # "database is locked" after busy_timeout, I/O errors, a file that went away.
    unavailable_errors = (sqlite3.OperationalError,)

    def __init__(self, path: str, synchronous: str, busy_timeout: float) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise UserError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        # The database file, PRAGMA synchronous (NORMAL or FULL), and seconds a write waits for a lock
        self.path, self.synchronous, self.busy_timeout = path, synchronous, busy_timeout

    def connect(self) -> Connection:
        # busy_timeout: how long a write waits for another process's lock (e.g. `analysim
        # model train` registering a model) before the request fails with 503.
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=self.busy_timeout)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={self.synchronous}")
        db.execute("PRAGMA foreign_keys=ON")
        return db

    def columns(self, db: Connection, table: str) -> set[str]:
        return {r[1] for r in db.execute(f"PRAGMA table_info({table})")}

    def describe(self) -> str:
        return self.path


class PostgresBackend(Backend):
    name = "postgresql"
    # PostgreSQL's REAL is 4 bytes and INTEGER 4: the store's floats and ids need 8.
    types = {"INT": "BIGINT", "REAL": "DOUBLE PRECISION", "BLOB": "BYTEA"}
    begin = "BEGIN"
    for_update = " FOR UPDATE"
    defers_durability = True

    def __init__(self, url: str, lock_timeout: float, connect_timeout: float = 2.0) -> None:
        try:
            import psycopg
        except ImportError as e:
            raise UserError(f"{redacted(url)}: a PostgreSQL store needs psycopg: pip install 'analysim[postgres]'") from e
        self._psycopg = psycopg  # the driver, imported only when a PostgreSQL store is used
        # The server's URL (with credentials: never logged), seconds a statement waits for a lock, and seconds a connect may take
        self.url, self.lock_timeout, self.connect_timeout = url, lock_timeout, connect_timeout
        self.integrity_errors = (psycopg.IntegrityError,)  # the driver's errors for a broken constraint (a key taken)
        # OperationalError: the server went away, restarts, refuses connections, or cancelled
        # the statement; InterfaceError: the connection is already closed.
        self.unavailable_errors = (psycopg.OperationalError, psycopg.InterfaceError)

    def sql(self, stmt: str) -> str:
        # The store's statements hold no literal '?' or '%': a plain replacement is exact.
        return stmt.replace("?", "%s")

    def connect(self) -> Connection:
        # autocommit: transactions are the store's explicit BEGIN ... COMMIT, as on SQLite.
        db = self._psycopg.connect(self.url, autocommit=True, connect_timeout=max(1, round(self.connect_timeout)))
        # As SQLite's busy timeout: a lock held elsewhere (a stuck session) fails the request
        # with 503 after this long instead of hanging it.
        db.execute(f"SET lock_timeout = {round(self.lock_timeout * 1000)}")
        return db

    def migration_lock(self, db: Connection) -> None:
        db.execute(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK_KEY})")

    def pipeline(self, db: Connection) -> AbstractContextManager[object]:
        return db.pipeline()  # type: ignore[attr-defined]

    def commit_early(self, db: Connection) -> None:
        db.execute("SET LOCAL synchronous_commit TO OFF")

    def make_durable(self, db: Connection) -> None:
        # A transaction of its own that writes WAL (a transactional logical-decoding
        # message: no table, no row lock) commits synchronously (the session's default): it
        # returns once the WAL up to its commit record, which follows every commit before
        # it, is flushed. Concurrent callers share fsyncs. (A transaction that only takes an
        # xid, e.g. SELECT pg_current_xact_id(), writes no WAL of its own and commits
        # asynchronously: it would not wait.)
        db.execute("SELECT pg_logical_emit_message(true, 'analysim', '')")

    def columns(self, db: Connection, table: str) -> set[str]:
        rows = db.execute("SELECT column_name FROM information_schema.columns"
                          " WHERE table_schema = current_schema() AND table_name = %s", (table,))  # fmt: skip
        return {r[0] for r in rows}

    def describe(self) -> str:
        return redacted(self.url)


def backend_for(db: str, synchronous: str, busy_timeout: float) -> Backend:
    if is_postgres_url(db):
        return PostgresBackend(db, busy_timeout)
    if "://" in db:
        raise UserError(f"--db {redacted(db)}: expected a SQLite file path or a postgresql:// URL")
    return SqliteBackend(db, synchronous, busy_timeout)
