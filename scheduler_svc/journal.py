"""The scheduler's durable journal (SQLite): every submitted job with its spec and, once it
ends, its outcome; plus the virtual clock and the run's identity. A restarted scheduler reads
it back so that nothing submitted is lost.

Writes are grouped: submissions from clients are committed before the RPC answers (that is
the promise), the rest (trace arrivals, outcomes, the clock) at most every ``group_s`` wall
seconds, so that a lockstep replay is not paced by commits. A crash loses at most that much
progress, never a submitted job: trace jobs lost from the last group are re-read from the
trace on restart.

A journal that cannot be written (disk full, an I/O error) fails safe: the open group is rolled
back and kept in memory, a client's submission is refused before the engine sees it
(``JournalUnavailable``: the client's answer is the truth), and every later commit retries the
kept group (at most every ``RETRY_S``), so that the journal catches up when space returns.

A damaged journal is refused at start rather than resumed from whatever SQLite can still read:
an empty file where a journal was, a failed ``PRAGMA quick_check``, committed WAL frames that
SQLite's recovery dropped (a frame that fails its checksum ends the WAL for SQLite, silently: the
transactions after it are lost), a table missing or of another shape, a value no scheduler
writes (a clock of NaN, an unknown status or spec field), or fewer transactions than were
committed. SQLite cannot see the last: a WAL cut, emptied or deleted simply ends earlier. So
every transaction counts itself (``meta.transactions``), and the acknowledgement record
``<journal>-acks`` keeps the count outside the WAL: a fixed-size header (transactions, client
jobs acknowledged) rewritten in place after each commit, and a line per client job acknowledged
since the WAL was last folded into the file, appended before the commit under its number. A
journal that holds fewer transactions than its record is missing some, and the record names the
acknowledged jobs that went with them. The WAL is folded into the file and emptied (a TRUNCATE
checkpoint) by the journal itself, and the lines cut off with it, so that the list stays short.
``accept_loss`` (``--accept-journal-loss``) resumes anyway, and logs exactly what was lost.
A disk too full to open the journal is reported as such: nothing is lost, space is needed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysim.core.job import SPEC_FIELDS, JobSpec
from analysim.errors import UserError
from scheduler_svc.wal import wal_dropped

log = logging.getLogger("scheduler_svc")
TERMINAL = ("completed", "failed", "cancelled")
STATUSES = ("pending", *TERMINAL)  # what a job row's status may be
SOURCES = ("trace", "client")  # what a job row's source may be
RETRY_S = 1.0  # a journal that failed a write is tried again this often
CHECKPOINT_BYTES = 4 << 20  # the WAL is folded into the file past this size (SQLite's default, 1000 pages)
MIN_FREE_BYTES = 256 << 10  # less free space than this at start: the disk is full (SQLite needs its -shm and WAL)
# The files a journal is made of, by suffix of its path: the database, SQLite's WAL and shared
# memory, and the acknowledgement record. Copied, moved or removed together.
FILE_SUFFIXES = ("", "-wal", "-shm", "-acks")
TX_KEY = "transactions"
ACKS_HEADER_BYTES = 96  # the acknowledgement record's first line, padded: its counts  # meta key: how many transactions the journal committed
# Each table's columns, in order: a journal with other tables or columns is not one this reads.
COLUMNS = {"jobs": ("job_id", "seq", "source", "spec", "status", "record"), "meta": ("key", "value")}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    source TEXT NOT NULL,
    spec TEXT NOT NULL,
    status TEXT NOT NULL,
    record TEXT
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


_SET_META = "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value"
_FIELDS = SPEC_FIELDS


def spec_to_json(spec: JobSpec) -> str:
    # Not dataclasses.asdict: it deep-copies recursively and costs more than the INSERT.
    return json.dumps({f: getattr(spec, f) for f in _FIELDS}, separators=(",", ":"))


def spec_from_json(text: str) -> JobSpec:
    d = json.loads(text)
    d["gpu_models"] = tuple(d.get("gpu_models") or ())
    return JobSpec(**d)


def _finite(v: object, low: float = 0.0) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= low


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def spec_problem(job_id: str, text: str) -> str | None:
    """What in a journalled spec no scheduler writes (None: nothing): not a JSON object, a field
    JobSpec does not have, a value of the wrong type or out of range, another job's id."""
    try:
        d = json.loads(text)
    except ValueError as e:
        return f"its spec is not JSON ({e})"
    if not isinstance(d, dict):
        return "its spec is not a JSON object"
    unknown = sorted(set(d) - set(_FIELDS))
    if unknown:
        return f"its spec has unknown field(s) {', '.join(map(repr, unknown))}"
    checks = {"job_id": lambda v: v == job_id, "submit_s": _finite, "duration_s": lambda v: v is None or _finite(v),
              "num_gpus": _count, "gpu_milli": lambda v: _count(v) and 0 < v <= 1000, "cpu_milli": _count,
              "memory_mib": _count, "vc": lambda v: isinstance(v, str), "user": lambda v: isinstance(v, str),
              "qos": lambda v: isinstance(v, str),
              "gpu_models": lambda v: v is None or isinstance(v, list) and all(isinstance(m, str) for m in v)}
    for f in ("job_id", "submit_s", "duration_s", "num_gpus"):
        if f not in d:
            return f"its spec has no {f}"
    for f, ok in checks.items():
        if f in d and not ok(d[f]):
            return f"its spec's {f} is {d[f]!r}"
    return None


def row_problem(job_id: object, source: object, spec: object, status: object, record: object) -> str | None:
    """What in a job row no scheduler writes (None: nothing)."""
    if not isinstance(job_id, str) or not job_id:
        return "its job_id is not a name"
    if source not in SOURCES:
        return f"its source is {source!r}, not one of {', '.join(SOURCES)}"
    if status not in STATUSES:
        return f"its status is {status!r}, not one of {', '.join(STATUSES)}"
    if not isinstance(spec, str):
        return "its spec is not text"
    if (status in TERMINAL) != (record is not None):  # an end is journalled with its record, at once
        return f"its status is {status!r} {'without' if record is None else 'with'} an end record"
    problem = spec_problem(job_id, spec)
    if problem is None and record is not None:
        try:
            ok = isinstance(record, str) and isinstance(json.loads(record), dict)
        except ValueError:
            ok = False
        problem = None if ok else "its record is not a JSON object"
    return problem


def meta_problem(key: str, value: object) -> str | None:
    """What in a meta row no scheduler writes (None: nothing): the clock, epoch and transaction
    count must be finite numbers >= 0."""
    if key in ("clock", "epoch", TX_KEY) and not (_finite(value) if key == "clock" else _count(value)):
        return f"meta {key} is {value!r}"
    return None


class JournalUnavailable(Exception):
    """The journal cannot be written now (``reason``: "disk_full" or "io_error"): what was to be
    made durable is not, and nothing new may be accepted until it is."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason  # "disk_full" or "io_error" (analysim_jobs_rejected_total's reason)


class Journal:
    """One run's journal file, its lock and its acknowledgement record (module docstring)."""

    def __init__(self, path: str | Path, group_s: float = 0.05, accept_loss: bool = False) -> None:
        self.path = Path(path)  # the SQLite file
        self.group_s = group_s  # wall seconds a group of non-client writes may stay open
        self.wal = self.path.with_name(self.path.name + "-wal")  # SQLite's write-ahead log beside it
        self.acks_path = self.path.with_name(self.path.name + "-acks")  # the acknowledgement record
        existed = self.path.exists()
        empty = existed and self.path.stat().st_size == 0 and not (self.wal.exists() and self.wal.stat().st_size)
        self._lock_fd = _lock(self.path)  # held for the journal's life: one scheduler per journal
        damage = None
        try:
            found = self._found(existed, empty)
            damage = found.problem
            if damage is not None and not accept_loss:
                raise UserError(f"--journal {self.path} is damaged: {damage}; resuming would lose "
                                f"{found.lost.brief()}; pass --accept-journal-loss to resume from what it still "
                                "holds (the loss is logged), or give a fresh --journal")
            self._open(found)
        except UserError:
            os.close(self._lock_fd)
            if not existed:  # left as it was: without the file the lock made
                self.path.unlink(missing_ok=True)
            raise
        except (sqlite3.DatabaseError, TypeError, ValueError) as e:
            os.close(self._lock_fd)
            if _disk_full(e, self.path):
                raise _full_disk_error(self.path) from None
            what = f"damaged ({damage}) and cannot be read even accepting the loss ({e})" if damage else \
                f"not a usable SQLite journal ({e})"
            raise UserError(f"--journal {self.path}: {what}") from None
        self._in_tx = False  # a transaction (the open group) is open in SQLite
        self._last_commit = time.monotonic()  # wall (monotonic) time of the last commit
        # The open group's statements, kept until committed: replayed after a failed write.
        self._group: list[tuple[str, Any, bool]] = []
        self._group_clients: list[str] = []  # the open group's client jobs (acknowledged once it commits)
        # Client jobs in the journal (the acknowledgement record's count).
        self._client_jobs = self.db.execute("SELECT COUNT(*) FROM jobs WHERE source = 'client'").fetchone()[0]
        self.failure: JournalUnavailable | None = None  # set while the journal cannot be written
        # The next job's sequence number (jobs are read back in the order they were journalled).
        self._seq = self.db.execute("SELECT COALESCE(MAX(seq) + 1, 0) FROM jobs").fetchone()[0]
        # The record, open for the run: its header rewritten in place after each commit, the
        # acknowledged jobs appended before it. Made anew now, for what the journal holds.
        self._acks_fd = os.open(self.acks_path, os.O_RDWR | os.O_CREAT, 0o600)
        self._acks_size = ACKS_HEADER_BYTES  # where the next acknowledged job's line goes
        os.ftruncate(self._acks_fd, 0)
        os.pwrite(self._acks_fd, self._acks_header(), 0)
        self._checkpoint()  # what was read is in the file now: the record's list starts empty


    def _found(self, existed: bool, empty: bool) -> Found:
        """What the files hold: the first problem (the record's, the file's or its WAL's, an
        empty file, a file removed without its record) and what resuming would lose."""
        _refuse_unusable(self.path, self.wal)
        acks, damage = _read_acks(self.acks_path)
        found = _damage(self.path, self.wal, acks)
        damage = damage or found.problem
        if empty:
            damage = "the file is empty (0 bytes), where a journal was expected"
        if not existed and acks is not None:  # removed without its record (a fresh start removes all of them)
            damage = (f"the file is missing, but its acknowledgement record {self.acks_path} says it committed "
                      f"{acks[TX_KEY]} transaction(s)")
        return Found(damage, found.lost, found.fresh)

    def _open(self, found: Found) -> None:
        """The connection, with the schema on a fresh (or accepted damaged) file; a damaged one is
        read whole now (and its loss logged), or refused after all."""
        damage = found.problem
        # isolation_level=None: we open and close transactions ourselves, one per group. A
        # checkpoint waits at most timeout seconds for an outside reader (a backup).
        self.db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False, timeout=0.5)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA wal_autocheckpoint=0")  # ours (_checkpoint): it empties the WAL too
        if found.fresh or damage is not None:
            self.db.executescript(_SCHEMA)
        self._accepted = damage is not None  # rows and values that fail their checks are then skipped
        if damage is not None:  # accepted: read all of it now, or refuse it after all
            clock, kept, ended = self.meta().get("clock", 0.0), len(self.jobs()), self.count(ended=True)
            log.error("--accept-journal-loss: journal %s is damaged (%s); resuming from what it still holds: "
                      "clock t=%s, %d job(s), %d ended; whatever was journalled after that is lost, with %s",
                      self.path, damage, clock, kept, ended, found.lost.full())
        self._tx = int(self.meta().get(TX_KEY, 0))  # transactions committed
    def _begin(self) -> None:
        if not self._in_tx:
            self.db.execute("BEGIN")
            self._in_tx = True

    def commit(self) -> None:
        """Make the open group durable; JournalUnavailable if it cannot be (it is then kept,
        and the next commit tries again)."""
        self._last_commit = time.monotonic()
        if self.failure is not None:
            self._replay()
        if self._in_tx:
            # The group's client jobs go into the record before the commit, under the number the
            # commit will have (a full disk fails them first, and the group is rolled back); the
            # header's count follows the commit. A restart takes a line only up to the header's
            # count: the record never claims more than the journal committed.
            mark = self._acks_size
            try:
                self._append_acks(self._tx + 1, self._group_clients)
                self.db.execute(_SET_META, (TX_KEY, json.dumps(self._tx + 1)))
                self.db.execute("COMMIT")
            except (sqlite3.OperationalError, OSError) as e:
                with contextlib.suppress(OSError):  # lines of a group that is not committed: gone
                    os.ftruncate(self._acks_fd, mark)
                self._acks_size = mark
                raise self._fail(e) from None
            self._in_tx = False
            self._tx += 1
            self._client_jobs += len(self._group_clients)
            self._group_clients = []
            try:
                os.pwrite(self._acks_fd, self._acks_header(), 0)
            except OSError as e:  # the record is behind the journal: nothing is lost, a restart accepts it
                log.error("journal %s: cannot update its acknowledgement record %s (%s)", self.path, self.acks_path, e)
            if _size(self.wal) >= CHECKPOINT_BYTES:
                self._checkpoint()
        self._group.clear()

    def _acks_header(self) -> bytes:
        """The record's header: how many transactions were committed and client jobs acknowledged,
        in a fixed-size first line (rewritten in place: one small write, whole or not at all)."""
        text = json.dumps({TX_KEY: self._tx, "client_jobs": self._client_jobs}, separators=(",", ":"))
        return text.encode().ljust(ACKS_HEADER_BYTES - 1) + b"\n"

    def _append_acks(self, tx: int, job_ids: list[str]) -> None:
        if job_ids:
            data = "".join(f"{tx} {json.dumps(i)}\n" for i in job_ids).encode()
            os.pwrite(self._acks_fd, data, self._acks_size)
            self._acks_size += len(data)

    def _checkpoint(self) -> None:
        """Fold the WAL into the file and empty it: what it held can no longer be lost with it,
        so the record's list of acknowledged jobs starts again. Not done while an outside reader
        holds the WAL (tried again after the next commit), nor on a full disk (the WAL stays)."""
        try:
            busy = self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        except sqlite3.OperationalError as e:
            log.warning("journal %s: cannot fold its WAL into the file (%s); kept as it is", self.path, e)
            return
        if not busy:
            try:
                os.ftruncate(self._acks_fd, ACKS_HEADER_BYTES)
                self._acks_size = ACKS_HEADER_BYTES
            except OSError as e:  # the list only grows: a restart checks jobs that are safe anyway
                log.warning("journal %s: cannot shorten its acknowledgement record (%s)", self.path, e)

    def due(self) -> bool:
        """An open group is older than ``group_s`` (a failed one: older than ``RETRY_S``)."""
        if self.failure is not None:
            return time.monotonic() - self._last_commit >= RETRY_S
        return self._in_tx and time.monotonic() - self._last_commit >= self.group_s

    def _write(self, sql: str, args: Any, many: bool = False) -> None:
        self._group.append((sql, args, many))
        if self.failure is not None:
            return  # kept for the next commit's retry
        try:
            self._begin()
            (self.db.executemany if many else self.db.execute)(sql, args)
        except sqlite3.OperationalError as e:
            self._fail(e)

    def _fail(self, e: sqlite3.OperationalError | OSError) -> JournalUnavailable:
        """Roll the group back (it stays in memory) and remember why."""
        if self.db.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back by itself
                self.db.execute("ROLLBACK")
        self._in_tx = False
        full = _disk_full(e)
        reason = "disk_full" if full else "io_error"
        first = self.failure is None
        self.failure = JournalUnavailable(f"the journal {self.path} cannot be written "
                                          f"({'disk full' if full else 'I/O error'}: {e})", reason)
        if first:
            log.error("journal %s cannot be written (%s): new submissions are refused; %d pending write(s) kept "
                      "in memory and retried every %g s", self.path, e, len(self._group), RETRY_S)
        return self.failure

    def _replay(self) -> None:
        """The kept group, written again (the journal failed a write earlier)."""
        try:
            self.db.execute("BEGIN")
            self._in_tx = True
            for sql, args, many in self._group:
                (self.db.executemany if many else self.db.execute)(sql, args)
        except sqlite3.OperationalError as e:
            raise self._fail(e) from None
        log.warning("journal %s writable again: %d kept write(s) replayed; submissions accepted", self.path,
                    len(self._group))
        self.failure = None

    def add_client_job(self, spec: JobSpec) -> None:
        """A client's job, durable when this returns; JournalUnavailable: not recorded at all
        (the rest of the open group is kept for the retry)."""
        if self.failure is not None:
            self.commit()  # space may be back: catch up first, or refuse now
        mark = len(self._group)
        self.add_jobs([spec], "client")
        self._group_clients.append(spec.job_id)
        try:
            self.commit()
        except JournalUnavailable:
            del self._group[mark:]
            self._group_clients.pop()
            raise

    # ---------------------------------------------------------------- writes

    def add_jobs(self, specs: Iterable[JobSpec], source: str) -> None:
        rows = []
        for s in specs:
            rows.append((s.job_id, self._seq, source, spec_to_json(s), "pending"))
            self._seq += 1
        if rows:
            self._write("INSERT INTO jobs (job_id, seq, source, spec, status) VALUES (?, ?, ?, ?, ?)", rows, many=True)

    def ended(self, job_id: str, status: str, record: dict) -> None:
        self._write("UPDATE jobs SET status = ?, record = ? WHERE job_id = ?",
                    (status, json.dumps(record, separators=(",", ":")), job_id))

    def set_meta(self, key: str, value: object) -> None:
        self._write(_SET_META, (key, json.dumps(value)))

    # ----------------------------------------------------------------- reads

    def meta(self) -> dict[str, object]:
        """The meta rows; on an accepted damaged journal, without the values that fail their checks."""
        out = {}
        for k, v in self.db.execute("SELECT key, value FROM meta"):
            value, problem = _meta_value(k, v)
            if problem is None:  # a journal with others is refused at open, unless its loss was accepted
                out[k] = value
        return out

    def jobs(self) -> list[tuple[str, str, JobSpec, str, dict | None]]:
        """(job_id, source, spec, status, record) in submission order; on an accepted damaged
        journal, without the rows that fail their checks (each logged)."""
        out = []
        for job_id, source, spec, status, record in self.db.execute(
                "SELECT job_id, source, spec, status, record FROM jobs ORDER BY seq"):
            if self._accepted:
                problem = row_problem(job_id, source, spec, status, record)
                if problem is not None:
                    log.error("--accept-journal-loss: job %.80r dropped from journal %s: %s", job_id, self.path,
                              problem)
                    continue
            out.append((job_id, source, spec_from_json(spec), status, json.loads(record) if record else None))
        return out

    def count(self, ended: bool = False) -> int:
        where = f" WHERE status IN {TERMINAL}" if ended else ""
        return self.db.execute(f"SELECT COUNT(*) FROM jobs{where}").fetchone()[0]

    def close(self) -> None:
        try:
            self.commit()
        except JournalUnavailable as e:
            # No client's job is among them (those are refused unless durable): trace arrivals
            # are re-read from the trace on restart, and the agents report the ends again.
            log.error("%s: %d write(s) of the last group are not journalled", e, len(self._group))
        self.db.close()
        os.close(self._acks_fd)
        os.close(self._lock_fd)  # after SQLite's own descriptors: closing one drops its POSIX locks


@dataclass
class Lost:
    """What resuming a damaged journal would lose: the acknowledged client jobs it lacks, by
    name where the acknowledgement record names them, and how many in all."""

    ids: list[str] = field(default_factory=list)  # acknowledged client jobs the journal lacks, named
    count: int = 0  # how many acknowledged client jobs it lacks in all (named or not)

    def brief(self) -> str:
        if not self.count:
            return "no acknowledged client job, only progress journalled after its last good transaction"
        some = ", ".join(self.ids[:3]) + (", ..." if len(self.ids) > 3 else "")
        return f"{self.count} acknowledged client job(s)" + (f" ({some})" if self.ids else "")

    def full(self) -> str:
        if not self.count:
            return "no acknowledged client job"
        unnamed = self.count - len(self.ids)
        return (f"{self.count} acknowledged client job(s): {', '.join(self.ids) or '-'}"
                + (f" and {unnamed} acknowledged before the last checkpoint" if unnamed > 0 else ""))


@dataclass
class Found:
    """What reading a journal at start found."""

    problem: str | None = None  # what is wrong (None: nothing)
    lost: Lost = field(default_factory=Lost)  # what resuming it would lose
    fresh: bool = False  # no journal yet: nothing written, nothing acknowledged


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _disk_full(e: BaseException, path: Path | None = None) -> bool:
    """A write refused for want of space (SQLite's SQLITE_FULL, ENOSPC), or, at open, an error on a
    filesystem with almost no space left (SQLite then fails to make its -shm as an I/O error)."""
    if getattr(e, "sqlite_errorname", "").startswith("SQLITE_FULL") or getattr(e, "errno", None) == errno.ENOSPC:
        return True
    return path is not None and _free_bytes(path) < MIN_FREE_BYTES


def _free_bytes(path: Path) -> int:
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return MIN_FREE_BYTES
    return st.f_bavail * st.f_frsize


def _full_disk_error(path: Path) -> UserError:
    return UserError(f"--journal {path}: the disk is full ({_free_bytes(path)} bytes free in {path.parent}); "
                     "free some space and start again (the journal was not changed)")


def _refuse_unusable(path: Path, wal: Path) -> None:
    """What no loss accepted could get past: a WAL that is not a file, a disk too full to open on."""
    if wal.exists() and not wal.is_file():
        raise UserError(f"--journal {path}: its WAL {wal} is not a regular file; the journal cannot be read "
                        "until it is moved away (whatever it held would be lost)")
    if _free_bytes(path) < MIN_FREE_BYTES:
        raise _full_disk_error(path)


def _read_acks(path: Path) -> tuple[dict | None, str | None]:
    """The acknowledgement record (None when there is none) as {transactions, client_jobs,
    since_checkpoint: [job ids]}, and what is wrong with it. Lines under a number past the
    header's count belong to a commit that did not happen; a last line without its newline was
    being written when the scheduler stopped: neither was acknowledged."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except IsADirectoryError:
        return None, f"its acknowledgement record {path} is a directory"
    except OSError as e:
        return None, f"its acknowledgement record {path} is unreadable ({e.strerror})"
    if not data:  # made, its header not yet written: the scheduler stopped before its first commit
        return None, None
    bad = (None, f"its acknowledgement record {path} is not one a scheduler writes")
    try:
        header = json.loads(data[:ACKS_HEADER_BYTES])
        if not (isinstance(header, dict) and _count(header.get(TX_KEY)) and _count(header.get("client_jobs"))):
            return bad
        ids = []
        for line in data[ACKS_HEADER_BYTES:].split(b"\n")[:-1]:
            tx, _, job = line.partition(b" ")
            job_id = json.loads(job)
            if not isinstance(job_id, str):
                return bad
            if int(tx) <= header[TX_KEY]:
                ids.append(job_id)
    except ValueError:
        return bad
    return {TX_KEY: header[TX_KEY], "client_jobs": header["client_jobs"], "since_checkpoint": ids}, None


def _meta_value(key: str, text: object) -> tuple[object, str | None]:
    try:
        value = json.loads(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None, f"meta {key} is not JSON"
    return value, meta_problem(key, value)


def _damage(path: Path, wal: Path, acks: dict | None) -> Found:
    """What is wrong with an existing journal, and what resuming it would lose: its WAL's checksum
    chain, its pages (quick_check), its tables and columns, every value read back, and how many
    transactions it holds against its acknowledgement record. Read only: a refused journal is
    left exactly as it was (a read-write connection would checkpoint what SQLite recovered and
    delete the WAL on closing)."""
    problem = wal_dropped(wal.read_bytes()) if wal.exists() else None
    try:
        with contextlib.closing(sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)) as ro:
            found = _contents(ro, acks, wal)
            if found.problem is None:
                problems = [r[0] for r in ro.execute("PRAGMA quick_check(5)")]
                if problems != ["ok"]:
                    lines = [x.strip() for p in problems for x in str(p).splitlines()
                             if x.strip() and not x.startswith("***")]
                    found.problem = (f"its pages are damaged (quick_check: {'; '.join(lines[:3])}"
                                     f"{'; ...' if len(lines) > 3 else ''})")
    except sqlite3.DatabaseError as e:
        if str(e) == "file is not a database":  # not SQLite at all: no journal to recover
            raise UserError(f"--journal {path}: not a usable SQLite journal ({e})") from None
        if _disk_full(e, path):
            raise _full_disk_error(path) from None
        found = Found(f"its pages are damaged ({e})", _lost(acks, set()))
    found.problem = problem or found.problem
    return found


def _lost(acks: dict | None, clients: set[str], client_rows: int = 0) -> Lost:
    """The acknowledged client jobs a journal holding ``clients`` lacks, per its record."""
    if acks is None:
        return Lost()
    ids = [i for i in acks["since_checkpoint"] if i not in clients]
    return Lost(ids, max(len(ids), acks["client_jobs"] - client_rows))


def _contents(ro: sqlite3.Connection, acks: dict | None, wal: Path) -> Found:
    """Its tables and columns, every value, and its count of transactions against the record;
    the first problem found, and what resuming would lose: the acknowledged client jobs without
    a good row (the rows that fail their checks are dropped when the loss is accepted)."""
    tables = {name: tuple(c[1] for c in ro.execute(f"PRAGMA table_info({name})"))
              for (name,) in ro.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables and acks is None:
        return Found(fresh=True)
    problems = _table_problems(tables)
    meta = _meta_read(ro, problems) if tables.get("meta") == COLUMNS["meta"] else {}
    clients, client_rows = _client_rows(ro, problems) if tables.get("jobs") == COLUMNS["jobs"] else (set(), 0)
    lost = _lost(acks, clients, client_rows)
    problem = _count_problem(meta.get(TX_KEY, 0), acks, wal, lost)
    if problem is not None:
        problems.append(problem)
    return Found(problems[0] if problems else None, lost)


def _table_problems(tables: dict[str, tuple[str, ...]]) -> list[str]:
    """A table missing, or of another shape than ours."""
    problems = []
    for name, columns in COLUMNS.items():
        if name not in tables:
            problems.append(f"its table {name} is missing")
        elif tables[name] != columns:
            problems.append(f"its table {name} has columns ({', '.join(tables[name])}), not ({', '.join(columns)})")
    return problems


def _meta_read(ro: sqlite3.Connection, problems: list[str]) -> dict:
    """The meta values that pass their checks; the others' problems appended to ``problems``."""
    meta = {}
    for key, text in ro.execute("SELECT key, value FROM meta"):
        value, problem = _meta_value(key, text)
        if problem is None:
            meta[key] = value
        else:
            problems.append(problem)
    return meta


def _client_rows(ro: sqlite3.Connection, problems: list[str]) -> tuple[set[str], int]:
    """The client jobs with a good row, and how many client rows there are; the bad rows'
    problems appended to ``problems``."""
    clients = set()
    for row in ro.execute("SELECT job_id, source, spec, status, record FROM jobs ORDER BY seq"):
        problem = row_problem(*row)
        if problem is not None:
            problems.append(f"job {str(row[0])[:80]!r}: {problem}")
        elif row[1] == "client":
            clients.add(row[0])
    return clients, ro.execute("SELECT COUNT(*) FROM jobs WHERE source = 'client'").fetchone()[0]


def _count_problem(tx: int, acks: dict | None, wal: Path, lost: Lost) -> str | None:
    """The journal's count of transactions (and client jobs) against its acknowledgement record."""
    if acks is None:
        if tx:  # counted transactions, so it had a record: it was removed
            return (f"its acknowledgement record {wal.with_name(wal.name.removesuffix('-wal') + '-acks')} "
                    "is missing, so what it acknowledged cannot be checked")
        return None
    if tx < acks[TX_KEY]:
        how = "missing" if not wal.exists() else "empty" if _size(wal) == 0 else \
            "cut to its header" if _size(wal) <= 32 else "cut short"
        return (f"it holds {tx} of the {acks[TX_KEY]} transactions it committed (its WAL is {how}: "
                "SQLite reads what is left as if nothing were missing)")
    if lost.count:
        return f"{lost.count} acknowledged client job(s) are missing from its table jobs"
    return None


def _lock(path: Path) -> int:
    """One scheduler per journal: an exclusive flock on the journal file, held while it runs and
    released by the kernel however the process ends (so a SIGKILLed scheduler leaves no stale
    lock). flock and SQLite's POSIX record locks do not interact on Linux; readers (sqlite3,
    backups) are not blocked."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise UserError(f"--journal {path}: cannot open ({e.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UserError(f"--journal {path} is in use by another scheduler (one scheduler per journal)") from None
    return fd
