"""The durable store: models, users (hashed keys), the query log and the billing ledger, in
SQLite (a file path, the embedded default) or PostgreSQL (a ``postgresql://`` URL, the
shared store of gateway replicas). What differs between the two is in store_backends.

A query's log entry, its ledger charge and its user's quota and rate-limit accounting are
written in one transaction, committed before the gateway answers; ``commit_queries`` takes a
whole batch so the gateway can group-commit everything answered in one event-loop tick. The
user's row is locked for that transaction (SELECT ... FOR UPDATE; SQLite locks the whole
database), so that replicas sharing the store enforce one quota and one rate limit.

Query-log sequence numbers come from a counter row locked by every appending transaction
until it commits: appends are serialised, so a transaction holding seq k commits before any
holding k+1 starts, and a reader that has seen k+1 can never see k appear later. That is
what lets the extraction monitor follow the log with a cursor (``events_after``) and no gaps.

On PostgreSQL that lock would be held through each commit's WAL fsync (milliseconds), which
would serialise every replica's commits on the disk. So an appending transaction commits
without waiting for the fsync (synchronous_commit off, for it alone), releasing the lock at
once, and its caller then waits, lock-free, until the WAL is flushed past it (replicas'
waits share fsyncs) before anyone is answered; ``events_after`` waits the same way before it
returns rows. Nothing not yet durable is ever handed out, so a server crash can only lose
commits nobody saw (their sequence numbers are then used again, by commits nobody has seen).

SQLite in WAL mode with ``synchronous=NORMAL`` survives a killed process (SIGKILL) without
losing a committed transaction; ``FULL`` also survives power loss at the cost of an fsync
per commit. On PostgreSQL durability is the server's (synchronous_commit).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysim.errors import UserError
from mlaas_monitor.limits import TokenBucket, quota_allows
from mlaas_monitor.model import Model, Policy
from mlaas_monitor.store_backends import Backend, Connection, SqliteBackend, backend_for
from mlaas_monitor.store_records import (
    RETRY_AFTER_S,
    USER_COLUMNS,
    AnsweredRequest,
    AnswerUnreadable,
    ModelUnavailable,
    QueryRecord,
    QueryRefused,
    Refused,
    StoreUnavailable,
    UserRecord,
)
from mlaas_monitor.store_rows import answered_problem, logged_event, told
from mlaas_monitor.store_schema import (
    DDL,
    DDL_AFTER,
    MIGRATIONS,
    POLICY_COLUMNS,
    SCHEMA_VERSION,
    TABLES,
    damage,
    policy_of,
    policy_row,
    read_version,
)
from mlaas_monitor.stream import QueryEvent

log = logging.getLogger(__name__)

CHECKPOINT_INTERVAL_S = 0.5
# A WAL past this size is checkpointed and truncated (waiting for the commit in flight): under
# a steady stream of commits a passive checkpoint never finds the WAL idle to restart it, and
# one that grew while checkpoints failed (a full disk) would otherwise keep its size.
WAL_TRUNCATE_BYTES = 8 * 1024 * 1024

@dataclass
class _Account:
    """A user's row as read (and locked) by one commit, updated as its records are admitted."""

    key_hash: str | None  # None: no such user
    revoked: float | None  # when the user was revoked (None: not)
    quota_rows: int | None  # the user's own quota in rows (None: the gateway's default)
    rate_limit: float | None  # the user's own rate limit in requests/s (None: the gateway's default)
    rows_used: int  # rows charged over the ledger's lifetime, with this commit's admitted ones
    tokens: float | None  # the rate limit's bucket tokens (None: a full bucket)
    stamp: float | None  # wall-clock time of the bucket's last update (None: never)
    touched: bool = False  # an admitted record changed the row: written back at commit


class _Link:
    """One connection, used by one thread at a time, replaced on the next use after it failed
    (PostgreSQL), and not retried more than once per RETRY_AFTER_S while the database is down."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend  # how to connect, and which errors mean unavailable
        self.lock = threading.Lock()  # held while one thread uses the connection
        self.db: Connection | None = None  # the open connection (None: connect on the next use)
        self._retry_at = 0.0  # monotonic time before which a failed connect is not retried
        self._last_error: Exception | None = None  # the last connect's failure, raised again until _retry_at

    @contextmanager
    def use(self, doing: str) -> Iterator[Connection]:
        """The connection, alone; the backend's "unavailable" errors become StoreUnavailable."""
        with self.lock:
            try:
                if self.db is None:
                    self.db = self._connect()
                yield self.db
            except self.backend.unavailable_errors as e:
                if not isinstance(self.backend, SqliteBackend) and self.db is not None:
                    # The server may have gone away mid-transaction: start afresh next time.
                    with suppress(Exception):
                        self.db.close()
                    self.db = None
                raise StoreUnavailable(doing, e) from e

    def _connect(self) -> Connection:
        # Connecting blocks the caller (the gateway's event loop) for up to the connect
        # timeout; while the database is down every request would otherwise pay for it.
        now = time.monotonic()
        if now < self._retry_at and self._last_error is not None:
            raise self._last_error
        try:
            return self.backend.connect()
        except self.backend.unavailable_errors as e:
            self._retry_at, self._last_error = now + RETRY_AFTER_S, e
            raise

    def close(self) -> None:
        with self.lock:
            if self.db is not None:
                self.db.close()
                self.db = None


class Store:
    """Thread-safe: a connection for writes, one for reads and one for durability waits, each
    behind its own lock, so that a read (an idempotency key's lookup, a replica's refresh)
    never waits for a commit in flight on another thread, nor a commit for a flush. On
    PostgreSQL a connection that failed is replaced on the next call."""

    def __init__(
        self,
        path: str | Path,
        synchronous: str = "NORMAL",
        background_checkpoint: bool = False,
        busy_timeout: float = 10.0,
    ) -> None:
        self.path = str(path)  # the SQLite file or the PostgreSQL URL, as given
        # What differs between SQLite and PostgreSQL
        self._backend: Backend = backend_for(self.path, synchronous, busy_timeout)
        self._sql = self._backend.sql  # a statement in the backend's placeholders
        # The third connection waits for WAL flushes while the writer commits the next batch.
        self._writer, self._reader, self._flusher = _Link(self._backend), _Link(self._backend), _Link(self._backend)
        try:
            self._writer.db = self._backend.connect()
            self._migrate()
        except UserError:
            raise
        except (sqlite3.DatabaseError, StoreUnavailable, *self._backend.unavailable_errors) as e:
            raise UserError(f"{self._backend.describe()}: not a usable store: {e}") from e
        except Exception as e:
            if type(e).__module__.startswith("psycopg"):  # e.g. permission denied on a table
                raise UserError(f"{self._backend.describe()}: not a usable store: {e}") from e
            raise
        self._stop_checkpoints = threading.Event()  # set at close: the checkpoint thread stops
        self._checkpointer: threading.Thread | None = None  # the background WAL checkpointer (None: not started)
        self.checkpoint_failures = 0  # WAL checkpoints the background thread tried and failed
        if background_checkpoint and isinstance(self._backend, SqliteBackend):
            # A WAL checkpoint fsyncs the database file: milliseconds, at unpredictable
            # commits. Moving it off the serving connection into a thread (its own
            # connection; sqlite releases the GIL) keeps commit latency flat.
            self._writer.db.execute("PRAGMA wal_autocheckpoint=0")
            self._checkpointer = threading.Thread(target=self._checkpoint_loop, name="wal-checkpoint", daemon=True)
            self._checkpointer.start()

    @property
    def backend(self) -> str:
        """"sqlite" or "postgresql"."""
        return self._backend.name

    def describe(self) -> str:
        """The store for messages: its path, or its URL without the password."""
        return self._backend.describe()

    def _migrate(self) -> None:
        b = self._backend
        with self._write("migrated") as db:
            b.migration_lock(db)
            # Whatever meta says, an existing store must have every table and column its version
            # had: one re-created empty would lose its rows in silence (a ledger billed from zero).
            # (An older store is migrated: the columns its version lacks are added.)
            present = {t: b.columns(db, t) for t in TABLES}
            if any(present.values()):
                lacking = damage(present, read_version(db) if present["meta"] else None)
                if lacking:
                    raise UserError(f"{b.describe()}: {lacking}")
            for stmt in DDL.split(";"):
                if stmt.strip():
                    db.execute(b.ddl(stmt))
            row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            version = SCHEMA_VERSION if row is None else int(row[0])
            if version > SCHEMA_VERSION:
                raise UserError(f"{b.describe()}: store schema version {version} is newer than this AnalySIM ({SCHEMA_VERSION})")
            for v in range(version, SCHEMA_VERSION):
                for step in MIGRATIONS[v]:
                    if isinstance(step, str):
                        db.execute(b.ddl(step))
                    elif step[1] not in b.columns(db, step[0]):  # (table, column, declaration)
                        # (A table DDL has just created has its columns already.)
                        db.execute(b.ddl(f"ALTER TABLE {step[0]} ADD COLUMN {step[1]} {step[2]}"))
            for stmt in DDL_AFTER:
                db.execute(stmt)
            db.execute(self._sql("INSERT INTO meta (key, value) VALUES ('schema_version', ?)"
                                 " ON CONFLICT (key) DO UPDATE SET value = excluded.value"), (str(SCHEMA_VERSION),))  # fmt: skip

    @property
    def checkpoints_in_background(self) -> bool:
        """Whether a thread of this store checkpoints the WAL (so no other connection should)."""
        return self._checkpointer is not None

    def _checkpoint_loop(self, interval: float = CHECKPOINT_INTERVAL_S) -> None:
        """Checkpoint every INTERVAL until the store closes (truncating a WAL past
        WAL_TRUNCATE_BYTES). One that fails (a full disk, an I/O error) is logged once and tried
        again each interval on a new connection: were the thread to die, the WAL would grow with
        every commit for as long as the gateway runs."""
        db: sqlite3.Connection | None = None
        failing = False
        while not self._stop_checkpoints.wait(interval):
            try:
                if db is None:
                    db = sqlite3.connect(self.path, isolation_level=None, timeout=10.0)
                wal = Path(f"{self.path}-wal")
                big = wal.exists() and wal.stat().st_size > WAL_TRUNCATE_BYTES
                db.execute(f"PRAGMA wal_checkpoint({'TRUNCATE' if big else 'PASSIVE'})").fetchone()
            except Exception as e:  # noqa: BLE001 (whatever it is, the next interval tries again)
                self.checkpoint_failures += 1
                if not failing:
                    log.error("store %s: WAL checkpoint failed, retrying every %g s (the WAL grows meanwhile): %s",
                              self.describe(), interval, e)  # fmt: skip
                failing = True
                if db is not None:
                    with suppress(Exception):
                        db.close()
                    db = None
                continue
            if failing:
                log.warning("store %s: WAL checkpoints work again", self.describe())
                failing = False
        if db is not None:
            db.close()

    def _conn(self, doing: str = "read") -> AbstractContextManager[Connection]:
        """The read connection (autocommit: each statement sees what is committed)."""
        return self._reader.use(doing)

    @property
    def commits_off_loop(self) -> bool:
        """Whether a commit should run in a thread rather than on the caller's event loop:
        PostgreSQL's waits on the network and on the server's WAL flush (milliseconds, with
        fsync), during which the loop can serve the requests that will make the next batch.
        SQLite's is a local write of tens of microseconds: a thread hand-off costs more."""
        return not isinstance(self._backend, SqliteBackend)

    @contextmanager
    def _write(self, doing: str = "written") -> Iterator[Connection]:
        """One transaction: committed if the block returns, rolled back if it raises."""
        with self._writer.use(doing) as db:
            db.execute(self._backend.begin)
            try:
                yield db
            except BaseException:
                with suppress(*self._backend.unavailable_errors):
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def close(self) -> None:
        if self._checkpointer is not None:
            self._stop_checkpoints.set()
            self._checkpointer.join()
        self._reader.close()
        self._flusher.close()
        self._writer.close()  # SQLite: the last connection to close checkpoints the WAL

    def _bump_config(self, db: Connection) -> None:
        db.execute("UPDATE sequences SET next = next + 1 WHERE name = 'config'")

    def config_generation(self) -> int:
        """Changes whenever a model, a policy or a user changes: replicas poll it to reload."""
        with self._conn() as db:
            return int(db.execute("SELECT next FROM sequences WHERE name = 'config'").fetchone()[0])

    # ---- models ----

    def add_model(self, model: Model, replace: bool = False) -> None:
        p = model.policy
        sql = f"INSERT INTO models (id, created, spec, {POLICY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        if replace:
            sql += " ON CONFLICT (id) DO UPDATE SET created = excluded.created, spec = excluded.spec, " + ", ".join(
                f"{c} = excluded.{c}" for c in POLICY_COLUMNS.split(", "))
        try:
            with self._write() as db:
                db.execute(
                    self._sql(sql),
                    (model.id, time.time(), json.dumps(model.spec()), *policy_row(p)),
                )  # fmt: skip
                self._bump_config(db)
        except self._backend.integrity_errors as e:
            raise UserError(f"model {model.id!r} already exists (use --replace to overwrite)") from e

    def model_ids(self) -> list[str]:
        with self._conn() as db:
            return [r[0] for r in db.execute("SELECT id FROM models ORDER BY id")]

    def model_created(self, model_id: str) -> float | None:
        """When the model's row was last written (cheap: the spec is not read); None if absent.
        ModelUnavailable when the row's created column is not a number."""
        with self._conn() as db:
            row = db.execute(self._sql("SELECT created FROM models WHERE id=?"), (model_id,)).fetchone()
        if row is None:
            return None
        if type(row[0]) not in (int, float):
            raise ModelUnavailable(model_id, f"its created column is not a number: {str(row[0])[:40]!r}")
        return float(row[0])

    def load_model(self, model_id: str) -> Model | None:
        with self._conn() as db:
            row = db.execute(
                self._sql(f"SELECT spec, {POLICY_COLUMNS} FROM models WHERE id=?"),
                (model_id,),
            ).fetchone()
        if row is None:
            return None
        try:
            policy = policy_of(row[1:])
            return Model.from_spec(model_id, json.loads(row[0]), policy)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as e:
            # Whatever a damaged or foreign row makes the decoder raise (JSONDecodeError and
            # TreeFormatError are ValueErrors; a missing key or a wrong type the others).
            raise ModelUnavailable(model_id, f"{type(e).__name__}: {str(e)[:200]}") from e

    def policies(self) -> dict[str, Policy]:
        """Every stored model's policy that can be served (what a replica refreshes when the
        config changes); a model whose row cannot be served is left out."""
        with self._conn() as db:
            rows = db.execute(f"SELECT id, {POLICY_COLUMNS} FROM models").fetchall()
        out = {}
        for r in rows:
            with suppress(ValueError, TypeError):
                out[r[0]] = policy_of(r[1:])
        return out

    def set_policy(self, model_id: str, p: Policy) -> None:
        with self._write() as db:
            db.execute(
                self._sql("UPDATE models SET " + ", ".join(f"{c}=?" for c in POLICY_COLUMNS.split(", ")) + " WHERE id=?"),
                (*policy_row(p), model_id),
            )
            self._bump_config(db)

    # ---- users ----

    def add_user(self, name: str, key_hash: str, quota_rows: int | None, rate_limit: float | None) -> bool:
        """False if the name is taken."""
        try:
            with self._write() as db:
                db.execute(
                    self._sql("INSERT INTO users (name, key_hash, created, revoked, quota_rows, rate_limit)"
                              " VALUES (?, ?, ?, NULL, ?, ?)"),
                    (name, key_hash, time.time(), quota_rows, rate_limit),
                )  # fmt: skip
                self._bump_config(db)
        except self._backend.integrity_errors:
            return False
        return True

    def update_user(self, name: str, **fields: Any) -> None:
        allowed = {"key_hash", "revoked", "quota_rows", "rate_limit"}
        assert set(fields) <= allowed, fields
        sets = ", ".join(f"{k}=?" for k in fields)
        with self._write() as db:
            db.execute(self._sql(f"UPDATE users SET {sets} WHERE name=?"), (*fields.values(), name))
            self._bump_config(db)

    def users(self) -> list[UserRecord]:
        with self._conn() as db:
            rows = db.execute(f"SELECT {USER_COLUMNS} FROM users ORDER BY name").fetchall()
        return [UserRecord(*r) for r in rows]

    def user_by_key_hash(self, key_hash: str) -> UserRecord | None:
        """The user whose key hashes to ``key_hash`` (revoked or not), e.g. one another
        replica created."""
        with self._conn() as db:
            row = db.execute(self._sql(f"SELECT {USER_COLUMNS} FROM users WHERE key_hash=?"), (key_hash,)).fetchone()
        return None if row is None else UserRecord(*row)

    # ---- query log + ledger ----

    def record_queries(self, records: list[QueryRecord]) -> list[int]:
        """Log and charge every record in ONE transaction; returns their sequence numbers.
        Raises QueryRefused (and commits nothing) if the store refuses any of them."""
        outcomes = self.commit_queries(records, all_or_nothing=True)
        return [o for o in outcomes if isinstance(o, int)]

    _LOG_INSERT = (
        'INSERT INTO query_log (id, ts, "user", model, n_rows, n_features, features, labels, confidences, leaves,'
        " request_key, request_digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )

    def commit_queries(
        self, records: list[QueryRecord], all_or_nothing: bool = False, durable: bool = True
    ) -> list[int | Refused]:
        """Log and charge, in ONE transaction, every record the store admits; returns each
        one's sequence number, or why it was refused (then nothing of it is written).
        ``durable=False``: return once committed; the caller calls ``make_durable`` before it
        tells anyone (the group committer overlaps one batch's flush with the next commit)."""
        if not records:
            return []
        with self._write() as db:
            self._backend.commit_early(db)
            # First: the sequence's row lock serialises appends (see the module's docstring).
            # The users' rows are locked after it, so two commits never wait for each other
            # in a cycle.
            lock = self._backend.for_update
            next_id = int(db.execute(f"SELECT next FROM sequences WHERE name = 'query_log'{lock}").fetchone()[0])
            accounts: dict[str, _Account] = {}
            keys: set[tuple[str, str]] = set()
            outcomes: list[int | Refused] = []
            admitted: list[tuple[int, QueryRecord]] = []
            for r in records:
                outcome = self._admit(db, r, accounts, keys)
                if outcome is None:
                    outcome = next_id
                    admitted.append((next_id, r))
                    next_id += 1
                elif all_or_nothing:
                    raise QueryRefused(f"query of {r.user!r} refused by the store: {outcome.reason}")
                outcomes.append(outcome)
            with self._backend.pipeline(db):
                self._write_admitted(db, admitted, accounts, next_id)
        if admitted and durable:
            self.make_durable()
        return outcomes

    def make_durable(self) -> None:
        """Return once every commit made so far is on disk (at once where commits wait for
        that themselves, as on SQLite)."""
        if self._backend.defers_durability:
            with self._flusher.use("made durable") as db:
                self._backend.make_durable(db)

    def _write_admitted(self, db: Connection, admitted: list[tuple[int, QueryRecord]], accounts: dict[str, _Account],
                        next_id: int) -> None:  # fmt: skip
        """The log entries, charges and counters of what a commit admitted."""
        q = self._sql
        # One execute per record: for the one to a few records of a group commit, that is
        # cheaper than executemany's per-call setup (and on PostgreSQL they are pipelined).
        log, ledger = q(self._LOG_INSERT), q("INSERT INTO ledger VALUES (?, ?, ?, ?, ?, ?)")
        for qid, r in admitted:
            n, f = r.features.shape
            db.execute(
                log,
                (qid, r.ts, r.user, r.model_id, n, f,
                 r.features.astype("<f8").tobytes(), r.labels.astype("<i4").tobytes(),
                 None if r.confidences is None else r.confidences.astype("<f8").tobytes(),
                 None if r.leaves is None else r.leaves.astype("<i4").tobytes(),
                 r.request_key, r.request_digest),
            )  # fmt: skip
            db.execute(ledger, (qid, r.ts, r.user, r.model_id, n, r.amount_micros))
        for name, a in accounts.items():
            if a.touched:
                db.execute(q("UPDATE users SET rows_used=?, bucket_tokens=?, bucket_stamp=? WHERE name=?"),
                           (a.rows_used, a.tokens, a.stamp, name))  # fmt: skip
        # Records charged without admission keep their user's rows_used in step too (after
        # the absolute updates above, which counted only the admitted ones).
        for _, r in admitted:
            if r.admission is None:
                db.execute(q("UPDATE users SET rows_used = rows_used + ? WHERE name=?"), (r.features.shape[0], r.user))
        if admitted:
            db.execute(q("UPDATE sequences SET next = ? WHERE name = 'query_log'"), (next_id,))

    def _admit(self, db: Connection, r: QueryRecord, accounts: dict[str, _Account], keys: set[tuple[str, str]]) -> Refused | None:
        """Whether the commit may log and charge ``r`` (None) or not (why)."""
        q = self._sql
        if r.request_key is not None:
            key = (r.user, r.request_key)
            if key in keys or db.execute(q('SELECT 1 FROM query_log WHERE "user"=? AND request_key=?'), key).fetchone():
                return Refused("duplicate")
            keys.add(key)
        adm = r.admission
        if adm is None:
            return None
        a = accounts.get(r.user)
        if a is None:
            row = db.execute(q("SELECT key_hash, revoked, quota_rows, rate_limit, rows_used, bucket_tokens, bucket_stamp"
                               " FROM users WHERE name=?" + self._backend.for_update), (r.user,)).fetchone()  # fmt: skip
            a = accounts[r.user] = _Account(None, None, None, None, 0, None, None) if row is None else _Account(*row)
        if a.key_hash != adm.key_hash or a.revoked is not None:
            return Refused("revoked")
        n = r.features.shape[0]
        quota = a.quota_rows if a.quota_rows is not None else adm.default_quota_rows
        if not quota_allows(a.rows_used, 0, quota, n):
            return Refused("quota_exceeded", quota, rows_used=a.rows_used)
        rate = a.rate_limit if a.rate_limit is not None else adm.default_rate_limit
        if rate is not None:
            burst = max(1.0, rate)
            # Replicas' clocks may differ a little: never let time run backwards.
            stamp = r.ts if a.stamp is None else min(a.stamp, r.ts)
            bucket = TokenBucket(rate, burst, burst if a.tokens is None else a.tokens, stamp)
            if not bucket.take(r.ts):
                return Refused("rate_limited", rate, retry_after=bucket.wait_seconds())
            a.tokens, a.stamp = bucket.tokens, bucket.stamp
        a.rows_used += n
        a.touched = True
        return None

    def answered_request(self, user: str, request_key: str, classes: int) -> AnsweredRequest | None:
        """The query ``user`` sent with this idempotency key, if it was answered (to a model of
        CLASSES classes); AnswerUnreadable if its logged row is damaged."""
        with self._conn() as db:
            row = db.execute(
                self._sql("SELECT q.id, q.request_digest, q.n_rows, q.labels, q.confidences, q.leaves,"
                          ' l.amount_micros FROM query_log q JOIN ledger l ON l.query_id = q.id'
                          ' WHERE q."user"=? AND q.request_key=?'),
                (user, request_key),
            ).fetchone()  # fmt: skip
            if row is not None:  # told to the client as answered: durable first
                self._backend.make_durable(db)
        if row is None:
            return None
        qid, digest, n, labels, conf, leaves, amount = row
        problem = answered_problem(digest, n, labels, conf, leaves, amount)
        answer = None if problem else AnsweredRequest(qid, bytes(digest), *told(labels, conf, leaves), amount)
        problem = problem or answer.problem(classes)
        if problem is not None:
            log.warning("query %s: the answer logged for its idempotency key cannot be sent again: %s", qid, problem)
            raise AnswerUnreadable(qid, problem)
        return answer

    def usage(self, user: str) -> list[tuple[str, int, int, int]]:
        """(model, queries, rows, amount_micros) per model for one user."""
        with self._conn() as db:
            rows = db.execute(
                self._sql('SELECT model, COUNT(*), SUM(rows), SUM(amount_micros) FROM ledger WHERE "user"=?'
                          " GROUP BY model ORDER BY model"),
                (user,),
            ).fetchall()  # fmt: skip
        # int(): PostgreSQL's SUM of BIGINT is a NUMERIC (a Decimal to Python).
        return [(m, int(c), int(r), int(a)) for m, c, r, a in rows]

    def rows_by_user(self) -> dict[str, int]:
        with self._conn() as db:
            return {u: int(r) for u, r in db.execute('SELECT "user", SUM(rows) FROM ledger GROUP BY "user"')}

    def ledger_totals(self) -> tuple[int, int, int]:
        """(charged queries, charged rows, amount_micros) over the whole ledger."""
        with self._conn() as db:
            q, r, a = db.execute("SELECT COUNT(*), SUM(rows), SUM(amount_micros) FROM ledger").fetchone()
        return int(q), int(r or 0), int(a or 0)

    def events_after(self, after_seq: int, model_id: str | None = None, limit: int = 1000) -> list[QueryEvent]:
        """Logged queries with seq > after_seq, oldest first (the monitor's replay). No gaps:
        a query logged later always has a higher seq than every one already readable."""
        sql = 'SELECT id, ts, "user", model, n_rows, n_features, features, labels, confidences, leaves FROM query_log WHERE id > ?'
        args: list[Any] = [after_seq]
        if model_id:
            sql += " AND model = ?"
            args.append(model_id)
        sql += " ORDER BY id LIMIT ?"
        args.append(limit)
        with self._conn() as db:
            rows = db.execute(self._sql(sql), args).fetchall()
            if rows:  # (see the module's docstring)
                self._backend.make_durable(db)
        return [logged_event(r) for r in rows]


