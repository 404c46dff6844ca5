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
an empty file where a journal was, a failed ``PRAGMA quick_check``, or committed WAL frames
that SQLite's recovery dropped (a frame that fails its checksum ends the WAL for SQLite,
silently: the transactions after it are lost). ``accept_loss`` (``--accept-journal-loss``)
resumes anyway, and logs what was lost.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sqlite3
import struct
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from analysim.core.job import JobSpec
from analysim.errors import UserError

log = logging.getLogger("scheduler_svc")
TERMINAL = ("completed", "failed", "cancelled")
RETRY_S = 1.0  # a journal that failed a write is tried again this often

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


_FIELDS = tuple(JobSpec.__dataclass_fields__)


def spec_to_json(spec: JobSpec) -> str:
    # Not dataclasses.asdict: it deep-copies recursively and costs more than the INSERT.
    return json.dumps({f: getattr(spec, f) for f in _FIELDS}, separators=(",", ":"))


def spec_from_json(text: str) -> JobSpec:
    d = json.loads(text)
    d["gpu_models"] = tuple(d.get("gpu_models") or ())
    return JobSpec(**d)


class JournalUnavailable(Exception):
    """The journal cannot be written now (``reason``: "disk_full" or "io_error"): what was to be
    made durable is not, and nothing new may be accepted until it is."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class Journal:
    def __init__(self, path: str | Path, group_s: float = 0.05, accept_loss: bool = False) -> None:
        self.path = Path(path)
        self.group_s = group_s
        wal = self.path.with_name(self.path.name + "-wal")
        empty = self.path.exists() and self.path.stat().st_size == 0 and not (wal.exists() and wal.stat().st_size)
        self._lock_fd = _lock(self.path)
        damage = None
        try:
            if empty:
                damage = "the file is empty (0 bytes), where a journal was expected"
            elif self.path.stat().st_size:
                damage = _damage(self.path, wal)
            if damage is not None and not accept_loss:
                raise UserError(f"--journal {self.path} is damaged: {damage}; pass --accept-journal-loss to resume "
                                "from what it still holds (the loss is logged), or give a fresh --journal")
            # isolation_level=None: we open and close transactions ourselves, one per group.
            self.db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(_SCHEMA)
            if damage is not None:  # accepted: read all of it now, or refuse it after all
                clock, kept, ended = self.meta().get("clock", 0.0), len(self.jobs()), self.count(ended=True)
                log.error("--accept-journal-loss: journal %s is damaged (%s); resuming from what it still holds: "
                          "clock t=%s, %d job(s), %d ended; whatever was journalled after that is lost", self.path,
                          damage, clock, kept, ended)
        except UserError:
            os.close(self._lock_fd)
            raise
        except (sqlite3.DatabaseError, TypeError, ValueError) as e:
            os.close(self._lock_fd)
            what = f"damaged ({damage}) and cannot be read even accepting the loss ({e})" if damage else \
                f"not a usable SQLite journal ({e})"
            raise UserError(f"--journal {self.path}: {what}") from None
        self._in_tx = False
        self._last_commit = time.monotonic()
        # The open group's statements, kept until committed: replayed after a failed write.
        self._group: list[tuple[str, Any, bool]] = []
        self.failure: JournalUnavailable | None = None  # set while the journal cannot be written
        self._seq = self.db.execute("SELECT COALESCE(MAX(seq) + 1, 0) FROM jobs").fetchone()[0]

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
            try:
                self.db.execute("COMMIT")
            except sqlite3.OperationalError as e:
                raise self._fail(e) from None
            self._in_tx = False
        self._group.clear()

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

    def _fail(self, e: sqlite3.OperationalError) -> JournalUnavailable:
        """Roll the group back (it stays in memory) and remember why."""
        if self.db.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back by itself
                self.db.execute("ROLLBACK")
        self._in_tx = False
        full = getattr(e, "sqlite_errorname", "").startswith("SQLITE_FULL")
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
        try:
            self.commit()
        except JournalUnavailable:
            del self._group[mark:]
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
        self._write("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (key, json.dumps(value)))

    # ----------------------------------------------------------------- reads

    def meta(self) -> dict[str, object]:
        return {k: json.loads(v) for k, v in self.db.execute("SELECT key, value FROM meta")}

    def jobs(self) -> list[tuple[str, str, JobSpec, str, dict | None]]:
        """(job_id, source, spec, status, record) in submission order."""
        out = []
        for job_id, source, spec, status, record in self.db.execute(
                "SELECT job_id, source, spec, status, record FROM jobs ORDER BY seq"):
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
        os.close(self._lock_fd)  # after SQLite's own descriptors: closing one drops its POSIX locks


WAL_MAGIC_LE, WAL_MAGIC_BE = 0x377F0682, 0x377F0683  # checksums in little- or big-endian words


def _damage(path: Path, wal: Path) -> str | None:
    """What is wrong with an existing journal (None: nothing): its WAL, then its pages
    (quick_check). Read only: a refused journal is left exactly as it was (a read-write
    connection would checkpoint what SQLite recovered and delete the WAL on closing)."""
    if wal.exists():
        problem = _wal_dropped(wal.read_bytes())
        if problem is not None:
            return problem
    try:
        with contextlib.closing(sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)) as ro:
            problems = [r[0] for r in ro.execute("PRAGMA quick_check(5)")]
    except sqlite3.DatabaseError as e:
        if str(e) == "file is not a database":  # not SQLite at all: no journal to recover
            raise UserError(f"--journal {path}: not a usable SQLite journal ({e})") from None
        return f"its pages are damaged ({e})"
    if problems != ["ok"]:
        lines = [x.strip() for p in problems for x in str(p).splitlines() if x.strip() and not x.startswith("***")]
        return f"its pages are damaged (quick_check: {'; '.join(lines[:3])}{'; ...' if len(lines) > 3 else ''})"
    return None


def _wal_checksum(b: bytes, magic: int, s0: int = 0, s1: int = 0) -> tuple[int, int]:
    words = struct.unpack(f"{'<' if magic == WAL_MAGIC_LE else '>'}{len(b) // 4}I", b)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def _wal_dropped(wal: bytes) -> str | None:
    """Committed transactions that SQLite's recovery would drop: it follows the WAL's checksum
    chain (frames with the header's salts, each checksum over the previous one) and stops at
    the first frame that breaks it. Frames after that with the header's salts that end a
    transaction were committed, and are lost. (Frames of an older generation, left after a
    checkpoint restarted the WAL, carry other salts; trailing frames without a commit frame
    were never committed.)"""
    if len(wal) < 32:
        return "its WAL header is damaged (a short file)" if any(wal) else None
    magic, _version, page_size, _ckpt, salt1, salt2, c1, c2 = struct.unpack(">8I", wal[:32])
    if magic not in (WAL_MAGIC_LE, WAL_MAGIC_BE) or _wal_checksum(wal[:24], magic) != (c1, c2):
        return "its WAL header is damaged, so SQLite would ignore every transaction in the WAL" if any(wal) else None
    frame = 24 + page_size
    n = (len(wal) - 32) // frame
    s, used = (c1, c2), 0
    while used < n:
        off = 32 + used * frame
        _pgno, _commit, s1, s2, k1, k2 = struct.unpack(">6I", wal[off:off + 24])
        if (s1, s2) != (salt1, salt2):
            break
        s = _wal_checksum(wal[off + 24:off + frame], magic, *_wal_checksum(wal[off:off + 8], magic, *s))
        if s != (k1, k2):
            break
        used += 1
    commits = 0
    for i in range(used, n):
        off = 32 + i * frame
        _pgno, commit, s1, s2 = struct.unpack(">4I", wal[off:off + 16])
        if (s1, s2) == (salt1, salt2) and commit:
            commits += 1
    if commits:
        return (f"its WAL is damaged after frame {used} of {n}: SQLite's recovery stops there, dropping "
                f"{commits} committed transaction(s) after it")
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
