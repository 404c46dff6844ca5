"""What the monitor keeps per subject (a user, a group, a pooled subject) and what an
evaluation of one produces: its ``Evaluation`` (the statuses, recorded in its history) and
any ``ExtractionWarning``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mlaas_monitor.monitor.boundary import BoundaryState
from mlaas_monitor.monitor.boxcopy import StarState
from mlaas_monitor.monitor.config import METHODS
from mlaas_monitor.monitor.coverage import Summary
from mlaas_monitor.monitor.ood import OodState
from mlaas_monitor.monitor.prada import PradaState


@dataclass(frozen=True)
class Evaluation:
    model: str  # the model the subject asked
    subject: str  # the subject: an account, "group:NAME", a link group or a pooled subject
    n_queries: int  # its queries (rows) when evaluated
    seq: int  # last query event folded in
    ts: float  # wall-clock time of the event that made it due
    status: dict[str, float]  # method -> status, each in [0, 1]
    members: tuple[str, ...] = ()  # a group's or pool's members then (empty: an account)


@dataclass(frozen=True)
class ExtractionWarning:
    model: str  # the model the subject asked
    subject: str  # the subject warned about
    method: str  # the status method that reached its threshold
    threshold: float  # that method's threshold, in [0, 1]
    status: float  # the status that reached it (>= threshold)
    n_queries: int  # the subject's queries (rows) then
    seq: int  # the last query event folded in then
    ts: float  # wall-clock time of the evaluation

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "subject": self.subject, "method": self.method, "threshold": self.threshold,
            "status": self.status, "n_queries": self.n_queries, "seq": self.seq, "ts": self.ts,
        }  # fmt: skip


@dataclass(eq=False)
class SubjectState:
    """What is kept per subject. Users also keep their queries (float32: the trees compare
    float32, so nothing is lost) in chunks, concatenated only when refitting."""

    name: str  # an account, "group:NAME", a link group, "auto:topK" or a pooled subject
    summary: Summary | None  # users only; a group's is the merge of its members'
    n_queries: int = 0  # rows it sent (a group's: its members' together)
    next_eval: int = 1  # query count at which it is next evaluated (schedule.py)
    next_refit: int = 1  # query count at which T_u is next refitted (schedule.py)
    evaluated_at: int = 0  # query count at its last evaluation (0: never evaluated)
    # Method -> status as last evaluated, in [0, 1]
    status: dict[str, float] = field(default_factory=lambda: dict.fromkeys(METHODS, 0.0))
    warned: set[str] = field(default_factory=set)  # methods it was warned about (a warning is raised once)
    members: tuple[str, ...] = ()  # a group's or pool's member accounts (empty: an account)
    prada: PradaState | None = None  # users only
    ood: OodState | None = None  # users only
    boundary: BoundaryState | None = None  # users only
    star: StarState | None = None  # users only, with the summary (not persisted: rebuilt from the logged queries)
    # (G,) the leaf identities its answers have shown (users and pools; rebuilt from the
    # logged queries): an answer that shows a new one makes an evaluation due at once.
    revealed: np.ndarray | None = None
    # Users and pools: the queries, in chunks, in order (float32 once compacted)
    _X: list[np.ndarray] = field(default_factory=list)
    _y: list[np.ndarray] = field(default_factory=list)  # the labels answered, chunked as _X
    _unfolded: int = 0  # trailing chunks of _X not yet in the summary

    def append(self, X: np.ndarray, y: np.ndarray, fold_later: bool = True) -> None:
        self._X.append(X)
        self._y.append(y)
        if fold_later:
            self._unfolded += 1

    def data(self, n_features: int) -> tuple[np.ndarray, np.ndarray]:
        """All the subject's queries (float32) and labels, compacted into one chunk (after
        ``ModelMonitor.fold``: compaction would lose track of the unfolded chunks)."""
        assert not self._unfolded, "fold the summary before compacting"
        self._compact(n_features)
        return self._X[0], self._y[0]

    def _compact(self, n_features: int) -> None:
        if len(self._X) == 1 and self._X[0].dtype == np.float32:
            return
        X = np.concatenate(self._X).astype(np.float32) if self._X else np.empty((0, n_features), dtype=np.float32)
        y = np.concatenate(self._y).astype(np.int32) if self._y else np.empty(0, dtype=np.int32)
        self._X, self._y = [X], [y]  # one chunk each

    def unfolded_rows(self) -> np.ndarray | None:
        """The queries added since the summary was last brought up to date (then marks
        them folded). Queries are folded in batches: one tree walk and one scatter per
        evaluation instead of per event."""
        if not self._unfolded:
            return None
        chunks = self._X[-self._unfolded :]
        self._unfolded = 0
        return np.concatenate(chunks).astype(np.float64) if len(chunks) > 1 else np.asarray(chunks[0], np.float64)

    def public(self) -> dict[str, Any]:
        d: dict[str, Any] = {"subject": self.name, "n_queries": self.n_queries, "evaluated_at": self.evaluated_at,
                             "status": dict(self.status), "warned": sorted(self.warned)}  # fmt: skip
        if self.members:
            d["members"] = list(self.members)
        return d
