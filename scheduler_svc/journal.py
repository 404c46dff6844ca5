"""The scheduler's durable journal (SQLite): every submitted job with its spec and, once it
ends, its outcome; plus the virtual clock and the run's identity. A restarted scheduler reads
it back so that nothing submitted is lost.

Writes are grouped: submissions from clients are committed before the RPC answers (that is
the promise), the rest (trace arrivals, outcomes, the clock) at most every ``group_s`` wall
seconds, so that a lockstep replay is not paced by commits. A crash loses at most that much
progress, never a submitted job: trace jobs lost from the last group are re-read from the
trace on restart.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path

from analysim.core.job import JobSpec
from analysim.errors import UserError

TERMINAL = ("completed", "failed", "cancelled")

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


class Journal:
    def __init__(self, path: str | Path, group_s: float = 0.05) -> None:
        self.path = Path(path)
        self.group_s = group_s
        self._lock_fd = _lock(self.path)
        try:
            # isolation_level=None: we open and close transactions ourselves, one per group.
            self.db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as e:
            os.close(self._lock_fd)
            raise UserError(f"--journal {self.path}: not a usable SQLite journal ({e})") from None
        self._in_tx = False
        self._last_commit = time.monotonic()
        self._seq = self.db.execute("SELECT COALESCE(MAX(seq) + 1, 0) FROM jobs").fetchone()[0]

    def _begin(self) -> None:
        if not self._in_tx:
            self.db.execute("BEGIN")
            self._in_tx = True

    def commit(self) -> None:
        if self._in_tx:
            self.db.execute("COMMIT")
            self._in_tx = False
        self._last_commit = time.monotonic()

    def due(self) -> bool:
        """An open group is older than ``group_s``: time to commit it."""
        return self._in_tx and time.monotonic() - self._last_commit >= self.group_s

    # ---------------------------------------------------------------- writes

    def add_jobs(self, specs: Iterable[JobSpec], source: str) -> None:
        self._begin()
        rows = []
        for s in specs:
            rows.append((s.job_id, self._seq, source, spec_to_json(s), "pending"))
            self._seq += 1
        self.db.executemany("INSERT INTO jobs (job_id, seq, source, spec, status) VALUES (?, ?, ?, ?, ?)", rows)

    def ended(self, job_id: str, status: str, record: dict) -> None:
        self._begin()
        self.db.execute("UPDATE jobs SET status = ?, record = ? WHERE job_id = ?",
                        (status, json.dumps(record, separators=(",", ":")), job_id))

    def set_meta(self, key: str, value: object) -> None:
        self._begin()
        self.db.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
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

    def count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]

    def close(self) -> None:
        self.commit()
        self.db.close()
        os.close(self._lock_fd)  # after SQLite's own descriptors: closing one drops its POSIX locks


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
