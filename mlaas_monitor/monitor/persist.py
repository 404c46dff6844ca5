"""The monitor's durable state, in its own tables of the gateway's SQLite store.

Per model a checkpoint (the last query-log seq folded in) and, per subject, its summary
arrays, query count, schedule, status and warned methods, all written in one transaction;
history points and warnings are appended in the same transaction. After a restart the
monitor loads this and replays the query log: rows up to the checkpoint only give back the
users' raw queries (needed to refit T_u, and kept once, in the query log), rows after it
are folded in as new. Our own connection (WAL lets it share the file with the gateway's).
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlaas_monitor.monitor.config import METHODS, MonitorConfig
from mlaas_monitor.monitor.core import ModelMonitor
from mlaas_monitor.monitor.coverage import Summary
from mlaas_monitor.monitor.subject import Evaluation, ExtractionWarning, SubjectState

_DDL = """
CREATE TABLE IF NOT EXISTS monitor_config (model TEXT PRIMARY KEY, config TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS monitor_groups (name TEXT PRIMARY KEY, members TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS monitor_checkpoint (model TEXT PRIMARY KEY, seq INTEGER NOT NULL,
    total_queries INTEGER NOT NULL, next_auto INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS monitor_subjects (
    model TEXT NOT NULL, subject TEXT NOT NULL,
    n_queries INTEGER NOT NULL, next_eval INTEGER NOT NULL, next_refit INTEGER NOT NULL, evaluated_at INTEGER NOT NULL,
    status TEXT NOT NULL, warned TEXT NOT NULL, members TEXT NOT NULL,
    counts BLOB, lo BLOB, hi BLOB,          -- users' per-leaf summaries (little-endian)
    PRIMARY KEY (model, subject)
);
CREATE TABLE IF NOT EXISTS monitor_history (
    model TEXT NOT NULL, subject TEXT NOT NULL, n_queries INTEGER NOT NULL, seq INTEGER NOT NULL,
    ts REAL NOT NULL, status TEXT NOT NULL, members TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS monitor_history_subject ON monitor_history(model, subject, n_queries);
CREATE TABLE IF NOT EXISTS monitor_warnings (
    id INTEGER PRIMARY KEY AUTOINCREMENT, model TEXT NOT NULL, subject TEXT NOT NULL,
    method TEXT NOT NULL, threshold REAL NOT NULL, status REAL NOT NULL,
    n_queries INTEGER NOT NULL, seq INTEGER NOT NULL, ts REAL NOT NULL,
    UNIQUE (model, subject, method)
);
CREATE TABLE IF NOT EXISTS monitor_actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, model TEXT NOT NULL, user TEXT NOT NULL, action TEXT NOT NULL,
    reason TEXT NOT NULL, seq INTEGER NOT NULL, ts REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS monitor_quarantine (
    seq INTEGER PRIMARY KEY, model TEXT NOT NULL, user TEXT NOT NULL, reason TEXT NOT NULL,
    detail TEXT NOT NULL, ts REAL NOT NULL
);
"""


@dataclass(frozen=True)
class Checkpoint:
    seq: int  # the last query event folded into the checkpoint
    total_queries: int  # the model's answered rows then (the automatic pool's clock)
    next_auto: int  # total_queries at which the automatic pool was next due


class MonitorDB:
    def __init__(self, path: str | Path, autocheckpoint: bool = True) -> None:
        """``autocheckpoint=False`` when the file is a gateway's store whose WAL is
        checkpointed by its own background thread: otherwise a monitor save that finds the
        WAL past SQLite's threshold runs the checkpoint itself, an fsync on the event loop
        (about 6 ms a save under load, measured)."""
        # One connection, shared by the service's threads (autocommit)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=10.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        if not autocheckpoint:
            self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for stmt in _DDL.split(";"):
                if stmt.strip():
                    self._db.execute(stmt)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._db.close()

    # ---- config and groups ----

    def configs(self) -> dict[str, MonitorConfig]:
        return {m: MonitorConfig.from_dict(json.loads(c)) for m, c in self._db.execute("SELECT model, config FROM monitor_config")}

    def save_config(self, model: str, config: MonitorConfig) -> None:
        self._db.execute("INSERT OR REPLACE INTO monitor_config VALUES (?, ?)", (model, json.dumps(config.to_dict())))

    def groups(self) -> dict[str, tuple[str, ...]]:
        return {n: tuple(json.loads(m)) for n, m in self._db.execute("SELECT name, members FROM monitor_groups ORDER BY name")}

    def save_group(self, name: str, members: tuple[str, ...]) -> None:
        self._db.execute("INSERT OR REPLACE INTO monitor_groups VALUES (?, ?, ?)", (name, json.dumps(list(members)), time.time()))

    def delete_group(self, name: str) -> None:
        self._db.execute("DELETE FROM monitor_groups WHERE name=?", (name,))

    # ---- enforcement actions ----

    def record_actions(self, rows: list[tuple[str, str, str, str, int, float]]) -> None:
        """(model, user, action, reason, seq, ts) of each decision that changed (action
        'none': lifted)."""
        self._db.executemany("INSERT INTO monitor_actions (model, user, action, reason, seq, ts) VALUES (?, ?, ?, ?, ?, ?)", rows)

    def actions(self, model: str) -> list[dict[str, Any]]:
        keys = ("id", "model", "user", "action", "reason", "seq", "ts")
        sql = "SELECT id, model, user, action, reason, seq, ts FROM monitor_actions WHERE model=? ORDER BY id"
        return [dict(zip(keys, r, strict=True)) for r in self._db.execute(sql, (model,))]

    # ---- rows the monitor could not fold ----

    def quarantine(self, seq: int, model: str, user: str, reason: str, detail: str) -> bool:
        """Record a log row the monitor skipped (``rows.row_problem``); True the first time."""
        cur = self._db.execute("INSERT OR IGNORE INTO monitor_quarantine VALUES (?, ?, ?, ?, ?, ?)",
                               (seq, model, user, reason, detail, time.time()))  # fmt: skip
        return cur.rowcount == 1

    def quarantined(self) -> list[tuple[int, str, str, str, str]]:
        """(seq, model, user, reason, detail) of every quarantined row, by seq."""
        return self._db.execute("SELECT seq, model, user, reason, detail FROM monitor_quarantine ORDER BY seq").fetchall()

    # ---- checkpoint ----

    def save(
        self, mon: ModelMonitor, dirty: list[SubjectState], history: list[Evaluation], warnings: list[ExtractionWarning]
    ) -> None:
        """One transaction: the dirty subjects, the checkpoint, new history and warnings."""
        for s in dirty:
            mon.fold(s)  # the stored summary must include every query up to the checkpoint
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany(
                "INSERT OR REPLACE INTO monitor_subjects VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(mon.model_id, s.name, s.n_queries, s.next_eval, s.next_refit, s.evaluated_at, json.dumps(s.status),
                  json.dumps(sorted(s.warned)), json.dumps(list(s.members)),
                  *(s.summary.to_bytes() if s.name in mon.users and s.summary is not None else (None, None, None)))
                 for s in dirty],
            )  # fmt: skip
            db.execute(
                "INSERT OR REPLACE INTO monitor_checkpoint VALUES (?, ?, ?, ?)",
                (mon.model_id, mon.last_seq, mon.schedule.total_queries, mon.schedule.next_auto),
            )
            db.executemany(
                "INSERT INTO monitor_history VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(e.model, e.subject, e.n_queries, e.seq, e.ts, json.dumps(e.status), json.dumps(list(e.members)))
                 for e in history],
            )  # fmt: skip
            db.executemany(
                "INSERT OR IGNORE INTO monitor_warnings (model, subject, method, threshold, status, n_queries, seq, ts)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(w.model, w.subject, w.method, w.threshold, w.status, w.n_queries, w.seq, w.ts) for w in warnings],
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def load(self, mon: ModelMonitor) -> Checkpoint | None:
        """Restore a model's subjects; None if it was never checkpointed."""
        row = self._db.execute(
            "SELECT seq, total_queries, next_auto FROM monitor_checkpoint WHERE model=?", (mon.model_id,)
        ).fetchone()
        if row is None:
            return None
        cp = Checkpoint(*row)
        mon.last_seq, mon.schedule.total_queries, mon.schedule.next_auto = cp.seq, cp.total_queries, cp.next_auto
        L, d = mon.regions.n_leaves, mon.n_features
        for r in self._db.execute(
            "SELECT subject, n_queries, next_eval, next_refit, evaluated_at, status, warned, members, counts, lo, hi"
            " FROM monitor_subjects WHERE model=?",
            (mon.model_id,),
        ):
            subject, n, next_eval, next_refit, evaluated_at, status, warned, members, counts, lo, hi = r
            if subject in mon.pools:
                # A pooled subject's rows, count and summary are rebuilt from the replayed log
                # (pool.py: a function of it); its schedule, status and warnings come back.
                s = mon.pools[subject]
                n = s.n_queries
            elif counts is not None:
                s = mon.user(subject)
                s.summary = Summary.from_bytes(counts, lo, hi, L, d)
            else:
                s = mon.group(subject, tuple(json.loads(members)))
            s.n_queries, s.next_eval, s.next_refit, s.evaluated_at = n, next_eval, next_refit, evaluated_at
            # A state written before a method existed has no value for it: 0 until evaluated.
            s.status, s.warned = {**dict.fromkeys(METHODS, 0.0), **json.loads(status)}, set(json.loads(warned))
            s.members = tuple(json.loads(members))
        return cp

    # ---- reads for the admin API ----

    def history(self, model: str, subject: str) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT n_queries, seq, ts, status, members FROM monitor_history WHERE model=? AND subject=? ORDER BY rowid",
            (model, subject),
        ).fetchall()
        out = []
        for n, seq, ts, status, members in rows:
            d: dict[str, Any] = {"n_queries": n, "seq": seq, "ts": ts, **json.loads(status)}
            if members != "[]":
                d["members"] = json.loads(members)
            out.append(d)
        return out

    def warnings(self, model: str | None = None, subject: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT id, model, subject, method, threshold, status, n_queries, seq, ts FROM monitor_warnings WHERE 1=1"
        args: list[Any] = []
        if model:
            sql += " AND model=?"
            args.append(model)
        if subject:
            sql += " AND subject=?"
            args.append(subject)
        keys = ("id", "model", "subject", "method", "threshold", "status", "n_queries", "seq", "ts")
        return [dict(zip(keys, r, strict=True)) for r in self._db.execute(sql + " ORDER BY id", args)]
