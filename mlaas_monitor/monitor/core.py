"""Per-model monitor state: every subject's (user's, group's) query summary, queries, status
and warnings, updated from query events. Pure: events in, evaluations and warnings out; the
service persists them and the store replays them after a restart.

A subject is re-evaluated (T_u refitted, coverage and fidelity recomputed) when its query
count reaches ``next_eval``; the next one is ``max(min_refit, refit_fraction * n)`` queries
later, so a refit costs O(n log n) every Θ(n) queries and the amortised cost per query
stays flat. Because the schedule depends only on query counts and T_u only on the multiset
of queries, a replay reproduces the same statuses and history.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from mlaas_monitor.model import Answer, Model
from mlaas_monitor.monitor.boundary import BOUNDARY_ALARM, Boundary, BoundaryState, pooled
from mlaas_monitor.monitor.boxcopy import (
    StarState,
    box_copy_fidelity,
    found_order,
    identities,
    star_copy_fidelity,
)
from mlaas_monitor.monitor.coverage import Regions, Summary, build_regions, coverage, merge_all
from mlaas_monitor.monitor.infogain import entropy, fit_subject_tree, score_tree
from mlaas_monitor.monitor.linkage import Linkage
from mlaas_monitor.monitor.ood import Ood, OodState
from mlaas_monitor.monitor.pool import EXPOSURE, POOL, POOLED, YOUNG, Kept, flags, joins_pool
from mlaas_monitor.monitor.prada import Prada, PradaState, prada_status

# How much of the model a subject holds (extent), and whether its queries look like an
# attack (intent: PRADA's 1 - W, and the share of queries outside the data distribution).
# ``best_copy`` is the status with a stated meaning: the extent (balanced fidelity beyond a
# constant copy) of the best reconstruction the suite knows how to build from exactly what the
# subject was answered; the others are its ingredients and the published signals.
# ``boundary``: Quiring et al.'s closeness to the boundary (boundary.py), reported beside PRADA.
EXTENT_METHODS = ("ig", "coverage_volume", "coverage_mass", "fidelity", "combined", "best_copy")
INTENT_METHODS = ("prada", "ood", "boundary")
METHODS = (*EXTENT_METHODS, *INTENT_METHODS)
ACTIONS = ("none", "degrade", "refuse")
GROUP_PREFIX = "group:"
PRADA_DELTA = 0.78
LINK_BATCH = 512  # rows waiting for the link index before it is brought up to date anyway
AUTO_PREFIX = "auto:top"
# An account whose pooled rows reach this many, and this share of its linked rows, is
# extracting: all its rows join auto:pool. A customer's rows rarely join at all (none of
# German credit's benign rows; Adult's near-duplicates in a margin or far from S are a few
# per cent of its rows); a path-finder's nearly all do.
EXTRACTING_MIN = 3
EXTRACTING_SHARE = 0.2
REVEAL_GAP = 5  # queries between two evaluations, at least, when a new leaf identity brings one forward
ATTRIBUTED = 16  # accounts (those with the most pooled rows) whose share of auto:pool is measured


class ConfigError(ValueError):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


@dataclass(frozen=True)
class Enforcement:
    action: str = "none"  # none | degrade (drop confidence and leaf id) | refuse
    method: str = "best_copy"  # the status with a stated meaning (docs/monitor.md)
    threshold: float = 0.8
    # Act only on a subject whose query stream is also attack-like (PRADA alarm): a benign
    # customer who has learnt the model by natural use is warned about, not cut off.
    intent: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "method": self.method, "threshold": self.threshold, "intent": self.intent}


@dataclass(frozen=True)
class PoolResponse:
    """What enforcement does while auto:pool's warning stands (pool.py): ``action`` for the
    ``top`` accounts whose rows the pool's extent falls most without (attribution), and, with
    ``new_accounts``, for every account first seen since the warning (a coalition whose
    contributors are cut off moves to fresh accounts)."""

    action: str = "none"  # none | degrade (labels only) | refuse
    top: int = 3  # accounts ranked by how much the pool's extent falls without their rows
    # and every extracting account (most of its rows join the pool: EXTRACTING_*), however
    # little its removal alone lowers the extent: a coalition spreads its leaves over many
    extracting: bool = True
    new_accounts: bool = True
    # The warning stands while the pool keeps growing: it took a row within this many of the
    # model's latest answered rows (the pool's status is a running maximum and never falls).
    hold: int = 1000

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "top": self.top, "extracting": self.extracting, "new_accounts": self.new_accounts,
                "hold": self.hold}  # fmt: skip


@dataclass(frozen=True)
class MonitorConfig:
    """Per model. ``thresholds``: a warning per subject and method when its status reaches it."""

    # best_copy estimates what a subject holds (docs/monitor.md, "What the status means"), so
    # its threshold is a share of the model: at 0.5 a warning comes when the subject could
    # copy half of what separates the model from a constant guess, well before it holds
    # 0.9 balanced fidelity (monitor-eval's goals table, docs/monitor.md).
    thresholds: dict[str, float] = field(default_factory=lambda: {"best_copy": 0.5})
    default_method: str = "best_copy"
    # A subject's first evaluation: after 10 queries, then at min_refit and on the schedule.
    # On an easy model a customer's first rows already make a copy (breast_cancer's natural
    # sampler held bf 0.9 after 21 queries, before the first evaluation at 25); one more
    # small evaluation per account is the cost (docs/monitor.md, "Cost").
    first_eval: int = 10
    min_refit: int = 25  # evaluate (coverage, warnings) at most every this many queries...
    refit_fraction: float = 0.05  # ... or this fraction of the subject's queries, whichever is more
    # T_u (the costly part) is refitted every max(min_refit, this * n) queries. 0.05, as the
    # evaluations: best_copy is then the subject's tree copy as of each evaluation, never a
    # stale one (0.5 before: random queries on Adult were warned 49 queries after bf 0.9;
    # 0.1 left best_copy up to 0.2 below the truth between refits).
    ig_refit_fraction: float = 0.05
    auto_k: int = 0  # >= 2: also pool the k users with the highest status (automatic collusion)
    auto_link: bool = True  # pool accounts whose queries differ from each other's in one feature (linkage.py)
    link_min: int = 3  # linking queries that join two accounts
    # Pool rows by what they look like, from any account (pool.py): auto:pool (rows out of
    # distribution, in a boundary margin or one feature from an earlier row), auto:young (rows
    # of accounts before their first evaluation) and auto:model (every row: the exposure).
    pool: bool = True
    # Evaluate (and refit) a subject when an answer shows it a leaf identity it had not seen
    # (at most one evaluation per identity beyond the schedule).
    reveal_eval: bool = True
    # auto:young (every row an account sent before its first evaluation) is warned when its
    # default-method status reaches this: the owner's budget for what accounts too young to
    # be evaluated hold together. None (the default): reported, not warned, because ordinary
    # customers' first rows together copy an easy model (German credit: 50 benign users'
    # first rows held 0.76 after 221 of them; docs/monitor.md).
    young_budget: float | None = None
    # auto:pool is warned when its default-method status reaches this, lower than a
    # customer's threshold: none of the four evaluation datasets' benign rows joined the pool,
    # and a coalition's extent jumps by a leaf at a time (0.15-0.3 on wine's 7 leaves), so a
    # warning at 0.5 came when it held 0.77-0.93 there.
    pool_threshold: float = 0.25
    prada_delta: float = PRADA_DELTA  # PRADA alarm when Shapiro-Wilk W < delta (status prada >= 1 - delta)
    prada_min_queries: int = 50  # distances before PRADA says anything
    ood_alarm: float = 0.5  # intent alarm when the out-of-distribution status reaches this
    ood_min_queries: int = 30  # queries before it says anything
    boundary_alarm: float = BOUNDARY_ALARM  # Quiring et al.'s alarm on the mean in-margin ratio (reported, not acted on)
    enforcement: Enforcement = Enforcement()
    pool_response: PoolResponse = PoolResponse()

    def to_dict(self) -> dict[str, Any]:
        return {
            "thresholds": dict(self.thresholds),
            "default_method": self.default_method,
            "first_eval": self.first_eval,
            "min_refit": self.min_refit,
            "refit_fraction": self.refit_fraction,
            "ig_refit_fraction": self.ig_refit_fraction,
            "auto_k": self.auto_k,
            "auto_link": self.auto_link,
            "link_min": self.link_min,
            "pool": self.pool,
            "reveal_eval": self.reveal_eval,
            "young_budget": self.young_budget,
            "pool_threshold": self.pool_threshold,
            "prada_delta": self.prada_delta,
            "prada_min_queries": self.prada_min_queries,
            "ood_alarm": self.ood_alarm,
            "ood_min_queries": self.ood_min_queries,
            "boundary_alarm": self.boundary_alarm,
            "enforcement": self.enforcement.to_dict(),
            "pool_response": self.pool_response.to_dict(),
        }

    def updated(self, patch: Any) -> MonitorConfig:
        """Apply a JSON patch; raises ConfigError naming the field."""
        if type(patch) is not dict:
            raise ConfigError("body", "expected a JSON object")
        kw: dict[str, Any] = {}
        for key, v in patch.items():
            if key == "thresholds":
                if type(v) is not dict:
                    raise ConfigError("thresholds", "expected an object of method: threshold")
                th = {}
                for m, t in v.items():
                    if m not in METHODS:
                        raise ConfigError(f"thresholds.{str(m)[:40]}", f"unknown method (expected one of {', '.join(METHODS)})")
                    if t is not None:
                        th[m] = _unit(t, f"thresholds.{m}")
                kw["thresholds"] = th
            elif key == "default_method":
                if v not in METHODS:
                    raise ConfigError(key, f"expected one of {', '.join(METHODS)}")
                kw[key] = v
            elif key in ("min_refit", "first_eval"):
                if type(v) is not int or not 1 <= v <= 1_000_000:
                    raise ConfigError(key, "expected an integer from 1 to 1000000")
                kw[key] = v
            elif key in ("refit_fraction", "ig_refit_fraction"):
                if type(v) not in (int, float) or not 0 <= v <= 10:
                    raise ConfigError(key, "expected a number from 0 to 10")
                kw[key] = float(v)
            elif key == "auto_k":
                if type(v) is not int or not (v == 0 or 2 <= v <= 1000):
                    raise ConfigError(key, "expected 0 (off) or an integer from 2 to 1000")
                kw[key] = v
            elif key in ("auto_link", "pool", "reveal_eval"):
                if type(v) is not bool:
                    raise ConfigError(key, "expected true or false")
                kw[key] = v
            elif key in ("link_min", "prada_min_queries", "ood_min_queries"):
                if type(v) is not int or not 1 <= v <= 1_000_000:
                    raise ConfigError(key, "expected an integer from 1 to 1000000")
                kw[key] = v
            elif key == "young_budget":
                kw[key] = None if v is None else _unit(v, key)
            elif key in ("prada_delta", "ood_alarm", "boundary_alarm", "pool_threshold"):
                kw[key] = _unit(v, key)
            elif key == "enforcement":
                kw[key] = _enforcement(v, self.enforcement)
            elif key == "pool_response":
                kw[key] = _pool_response(v, self.pool_response)
            else:
                raise ConfigError(str(key)[:40], "unknown field")
        return replace(self, **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MonitorConfig:
        return cls().updated(d)


def _unit(v: Any, where: str) -> float:
    if type(v) not in (int, float) or not 0 <= v <= 1:
        raise ConfigError(where, "expected a number from 0 to 1")
    return float(v)


def _enforcement(v: Any, old: Enforcement) -> Enforcement:
    if type(v) is not dict:
        raise ConfigError("enforcement", "expected an object with action, method, threshold")
    kw: dict[str, Any] = {}
    for key, x in v.items():
        if key == "action":
            if x not in ACTIONS:
                raise ConfigError("enforcement.action", f"expected one of {', '.join(ACTIONS)}")
            kw[key] = x
        elif key == "method":
            if x not in METHODS:
                raise ConfigError("enforcement.method", f"expected one of {', '.join(METHODS)}")
            kw[key] = x
        elif key == "threshold":
            kw[key] = _unit(x, "enforcement.threshold")
        elif key == "intent":
            if type(x) is not bool:
                raise ConfigError("enforcement.intent", "expected true or false")
            kw[key] = x
        else:
            raise ConfigError(f"enforcement.{str(key)[:40]}", "unknown field")
    return replace(old, **kw)


def _pool_response(v: Any, old: PoolResponse) -> PoolResponse:
    if type(v) is not dict:
        raise ConfigError("pool_response", "expected an object with action, top, extracting, new_accounts, hold")
    kw: dict[str, Any] = {}
    for key, x in v.items():
        where = f"pool_response.{str(key)[:40]}"
        if key == "action":
            if x not in ACTIONS:
                raise ConfigError(where, f"expected one of {', '.join(ACTIONS)}")
        elif key in ("top", "hold"):
            if type(x) is not int or not 0 <= x <= 1_000_000:
                raise ConfigError(where, "expected an integer from 0 to 1000000")
        elif key in ("new_accounts", "extracting"):
            if type(x) is not bool:
                raise ConfigError(where, "expected true or false")
        else:
            raise ConfigError(where, "unknown field")
        kw[key] = x
    return replace(old, **kw)


@dataclass(frozen=True)
class Evaluation:
    model: str
    subject: str
    n_queries: int
    seq: int  # last query event folded in
    ts: float
    status: dict[str, float]
    members: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExtractionWarning:
    model: str
    subject: str
    method: str
    threshold: float
    status: float
    n_queries: int
    seq: int
    ts: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "subject": self.subject, "method": self.method, "threshold": self.threshold,
            "status": self.status, "n_queries": self.n_queries, "seq": self.seq, "ts": self.ts,
        }  # fmt: skip


@dataclass(eq=False)
class SubjectState:
    """What is kept per subject. Users also keep their queries (float32: the trees compare
    float32, so nothing is lost) in chunks, concatenated only when refitting."""

    name: str
    summary: Summary | None  # users only; a group's is the merge of its members'
    n_queries: int = 0
    next_eval: int = 1
    next_refit: int = 1
    evaluated_at: int = 0
    status: dict[str, float] = field(default_factory=lambda: dict.fromkeys(METHODS, 0.0))
    warned: set[str] = field(default_factory=set)
    members: tuple[str, ...] = ()
    prada: PradaState | None = None  # users only
    ood: OodState | None = None  # users only
    boundary: BoundaryState | None = None  # users only
    star: StarState | None = None  # users only, with the summary (not persisted: rebuilt from the logged queries)
    # (G,) the leaf identities its answers have shown (users and pools; rebuilt from the
    # logged queries): an answer that shows a new one makes an evaluation due at once.
    revealed: np.ndarray | None = None
    _X: list[np.ndarray] = field(default_factory=list)
    _y: list[np.ndarray] = field(default_factory=list)
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
        self._X, self._y = [X], [y]

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


def _next(n: int, min_refit: int, fraction: float) -> int:
    """The query count of the next evaluation (or refit) after one at n: min_refit while an
    early first evaluation (first_eval) came before it, then max(min_refit, fraction * n) later."""
    return min_refit if n < min_refit else n + max(min_refit, math.ceil(fraction * n))


def _leaf_answers(model: Model, nodes: np.ndarray) -> list[Any]:
    """Per node, what a row landing there is told beyond its label, under the model's policy:
    its confidence, or with top-k its confidence and ranked list (the gateway's own rendering,
    so that the monitor's identities are exactly the answers')."""
    labels, conf = model.node_answers
    ans = Answer(labels[nodes], conf[nodes], nodes)
    told, _ = model.revealed(ans)
    assert told is not None
    top = model.revealed_top(ans)
    if top is None:
        return told.tolist()
    return [(c, tuple(zip(cs, ps, strict=True))) for c, cs, ps in zip(told.tolist(), top[0].tolist(), top[1].tolist(), strict=True)]


class ModelMonitor:
    def __init__(self, model: Model, config: MonitorConfig | None = None) -> None:
        self.model_id = model.id
        self.config = config or MonitorConfig()
        self.tree = model.tree
        self.n_features = len(model.schema)
        self.S = np.asarray(model.validation_X, dtype=np.float64)
        self.owner_labels = model.answer(self.S).labels if self.S.shape[0] else np.empty(0, dtype=np.int64)
        # The owner's leaves are pure in its own labels, so IG(S, T_owner) = H(S).
        self.ig_owner = entropy(self.owner_labels)
        self.regions: Regions = build_regions(model.tree, model.schema, self.S)
        feats = model.schema.features
        dom_lo, dom_hi = np.array([f.min for f in feats], np.float64), np.array([f.max for f in feats], np.float64)
        self.prada = Prada(dom_lo, dom_hi, np.array([f.kind == "categorical" for f in feats], bool))
        self.ood = Ood(self.S, self.prada.scale, self.prada.categorical)
        self.boundary = Boundary.build(model.tree, dom_lo, dom_hi, self.S)
        # What the subject can tell apart, under the model's policy: leaf ids, (label,
        # confidence or top-k list) as revealed, or labels only (then no box copy: the tree
        # refit is the copy). Under noise on confidences (without leaf ids) no two answers in
        # a leaf are alike: no identity finer than the label is revealed to an attacker that
        # reads answers as they are (one that de-noises is a blind spot, docs/monitor.md).
        pol = model.policy
        leaf_nodes = self.regions.leaf_nodes
        node_labels, _ = model.node_answers
        self.identities = None
        if pol.reveal_leaf or (pol.reveal_confidence and not model.per_row):
            told = None if pol.reveal_leaf else _leaf_answers(model, leaf_nodes)
            self.identities = identities(self.regions, node_labels[leaf_nodes], told, self.S, self.owner_labels,
                                         dom_lo, dom_hi, self.prada.categorical)  # fmt: skip
        self.n_classes = max(2, int(np.unique(self.owner_labels).size)) if self.owner_labels.size else 2
        self.linkage = Linkage(self.n_features, self.config.link_min)
        self.users: dict[str, SubjectState] = {}
        self.groups: dict[str, SubjectState] = {}  # keyed by subject name ("group:x", "auto:topk")
        # The subjects pooled by what the rows are (pool.py), and the rows each keeps raw.
        self.pools: dict[str, SubjectState] = {}
        self.kept: dict[str, Kept] = {}
        for name in POOLED:
            first = min(self.config.first_eval, self.config.min_refit)
            self.pools[name] = SubjectState(name, Summary.empty(self.regions.n_leaves, self.n_features),
                                            next_eval=first, next_refit=first)  # fmt: skip
            self.kept[name] = Kept()
        # Rows waiting for the link index, in log order, with whether their account was
        # still young (before its first evaluation) when it sent them: pooled at each link.
        self._pool_pending: list[tuple[str, np.ndarray, np.ndarray, bool]] = []
        self._sent: Counter[str] = Counter()  # rows per account as the pools saw them (ingested or restored)
        self.rows_seen = 0  # answered rows of the model, in log order (ingested or restored)
        self.first_seen: dict[str, int] = {}  # account -> rows_seen before its first row
        self.pool_grew_at = 0  # rows_seen when auto:pool last took a row
        self.pooled_by: Counter[str] = Counter()  # account -> its rows auto:pool took (past the cap too)
        self._linked: Counter[str] = Counter()  # account -> its rows linked and pooled so far
        self.extracting: set[str] = set()  # accounts whose every row joins auto:pool (EXTRACTING_*)
        self.pool_warned_at: int | None = None  # rows_seen when auto:pool was warned (None: not since start)
        # While auto:pool is warned: per account (the ATTRIBUTED with the most pooled rows), how
        # much the pool's extent falls without its rows, largest first (attribute()).
        self.attribution: list[tuple[str, float, int]] = []
        self.total_queries = 0
        self.next_auto = 0
        self.last_seq = 0
        self.last_restored = 0  # after a restart: the last logged query restored (restore_queries)

    # ---- state ----

    def user(self, name: str) -> SubjectState:
        s = self.users.get(name)
        if s is None:
            # First evaluation after first_eval queries, not at the first one: most accounts
            # send few queries, and their statuses would be noise anyway.
            first = min(self.config.first_eval, self.config.min_refit)
            s = self.users[name] = SubjectState(name, Summary.empty(self.regions.n_leaves, self.n_features),
                                                next_eval=first, next_refit=first, prada=PradaState(), ood=OodState(),
                                                boundary=BoundaryState())  # fmt: skip
        return s

    def group(self, subject: str, members: tuple[str, ...]) -> SubjectState:
        s = self.groups.get(subject)
        if s is None:
            first = min(self.config.first_eval, self.config.min_refit)
            s = self.groups[subject] = SubjectState(subject, None, next_eval=first, next_refit=first)
        s.members = members
        return s

    def ingest(self, user: str, X: np.ndarray, labels: np.ndarray, seq: int) -> SubjectState:
        """Take one answered query (a batch of rows); it reaches the user's summary at the
        next ``fold`` (every evaluation does one)."""
        s = self.user(user)
        s.append(X, labels)
        self._index(user, X, labels)
        s.n_queries += X.shape[0]
        self._reveal(s, self.regions.leaf_index[self.tree.apply(X)])
        self.total_queries += X.shape[0]
        self.last_seq = max(self.last_seq, seq)
        return s

    def fold(self, s: SubjectState) -> Summary | None:
        """Bring a user's summary (and star boxes) up to date with its queries; returns it."""
        X = s.unfolded_rows()
        if X is not None:
            self._fold_rows(s, X)
        return s.summary

    def _fold_rows(self, s: SubjectState, X: np.ndarray) -> None:
        if s.summary is not None:
            pos = self.regions.leaf_index[self.tree.apply(X)]
            s.summary.add(pos, X)
            self._fold_star(s, pos, X)

    def _fold_star(self, s: SubjectState, pos: np.ndarray, X: np.ndarray) -> None:
        # The rows as sent (float64), not T_u's float32 copy: the boxes are scored on S by
        # distances, where float32 rounding would move a box's edge off a data value.
        if self.identities is not None:
            if s.star is None:
                s.star = StarState()
            s.star.fold(self.identities, pos, X)

    def restore_queries(self, user: str, X: np.ndarray, labels: np.ndarray) -> None:
        """After a restart: the user's summary and counts are loaded; only its raw queries
        (needed to refit T_u) come back from the query log; the links between accounts and
        PRADA's distances, functions of the query sequence, are rebuilt from them."""
        s = self.user(user)
        s.append(X, labels, fold_later=False)
        # The star boxes are not persisted: rebuilt from the logged queries, in their order.
        pos = self.regions.leaf_index[self.tree.apply(X)]
        self._fold_star(s, pos, np.asarray(X, np.float64))
        self._seen(s, pos)
        self._index(user, X, labels)

    def _index(self, user: str, X: np.ndarray, labels: np.ndarray) -> None:
        """Queue a query for the link index and the pools (linked and pooled together, in
        log order, at the next ``link``)."""
        c = self.config
        self.first_seen.setdefault(user, self.rows_seen)
        self.rows_seen += X.shape[0]
        if c.auto_link or c.pool:
            self.linkage.add(user, X)
        if c.pool:
            young = self._sent[user] < c.first_eval
            self._sent[user] += X.shape[0]
            self._pool_pending.append((user, X, labels, young))

    def _seen(self, s: SubjectState, pos: np.ndarray) -> bool:
        """Mark the identities of these leaf positions seen; True when one is new."""
        if self.identities is None:
            return False
        if s.revealed is None:
            s.revealed = np.zeros(self.identities.n_groups, bool)
        g = self.identities.group[pos]
        new = not s.revealed[g].all()
        s.revealed[g] = True
        return new

    def _reveal(self, s: SubjectState, pos: np.ndarray) -> None:
        """Evaluation when information is revealed: an answer showing a leaf identity the
        subject had not seen makes its evaluation due now, not only on the query-count
        schedule (path-finding reveals leaves in bursts). After its first evaluation (before
        it the status is noise); at most once per identity, so at most one evaluation (and
        tree refit) per leaf identity more than the schedule's, and at least REVEAL_GAP
        queries after the previous evaluation (a burst of new leaves costs one). The refit too: a copy scored
        with a stale tree would sit below what the answers give (monitor-eval measured 0.41
        below on German credit's benign users without it)."""
        if self._seen(s, pos) and s.evaluated_at and self.config.reveal_eval:
            at = max(s.n_queries, s.evaluated_at + REVEAL_GAP)
            s.next_eval = min(s.next_eval, at)
            s.next_refit = min(s.next_refit, at)

    def link(self) -> None:
        """Link the waiting rows and pool those that look like extraction (pool.py)."""
        found = self.linkage.flush()
        pending, self._pool_pending = self._pool_pending, []
        if not pending or not found.hashes:
            return
        users = [u for u, X, _, _ in pending for _ in range(X.shape[0])]
        X = np.concatenate([np.asarray(x, np.float64) for _, x, _, _ in pending])
        y = np.concatenate([lab for _, _, lab, _ in pending])
        young = np.concatenate([np.full(x.shape[0], yg) for _, x, _, yg in pending])
        flagged = joins_pool(flags(self.ood.far(X), self.boundary.close(X)[1], found.near))
        # An extracting account's every row joins, not only its flagged ones: what it holds is
        # what all its answers give (its starting points, the probes inside a leaf).
        flagged |= np.fromiter((u in self.extracting for u in users), bool, len(users))
        for name, take in ((POOL, flagged), (YOUNG, young), (EXPOSURE, np.ones(X.shape[0], bool))):
            idx = np.flatnonzero(take)
            if idx.size:
                self._pool_add(name, [users[i] for i in idx], X[idx], y[idx], [found.hashes[i] for i in idx])
        self._linked.update(users)
        for u in sorted(set(users) - self.extracting):
            if self.pooled_by[u] >= max(EXTRACTING_MIN, EXTRACTING_SHARE * self._linked[u]):
                self._extracting(u)

    def _extracting(self, user: str) -> None:
        """The account's rows are mostly extraction-like: from now on all its rows join
        auto:pool, and its earlier ones (as far as they are linked) join now."""
        self.extracting.add(user)
        s = self.users.get(user)
        if s is None:
            return
        self.fold(s)
        X, y = s.data(self.n_features)
        n = self._linked[user]
        X, y = np.asarray(X[:n], np.float64), y[:n]
        self._pool_add(POOL, [user] * n, X, y, Linkage.hashes(X), repeats=False)

    def _pool_add(self, name: str, users: list[str], X: np.ndarray, y: np.ndarray, hashes: list[int],
                  repeats: bool = True) -> None:  # fmt: skip
        """Rows join a pooled subject (counted with their repeats, unless ``repeats`` is off:
        rows that may be in it already)."""
        s = self.pools[name]
        kept, past = self.kept[name].select(users, hashes)
        s.n_queries += X.shape[0] if repeats else int(kept.sum() + past.sum())
        if name == POOL:
            self.pool_grew_at = self.rows_seen
            self.pooled_by.update(u for u, k, p in zip(users, kept, past, strict=True) if repeats or k or p)
        self._reveal(s, self.regions.leaf_index[self.tree.apply(X)])
        if kept.any():
            s.append(X[kept], y[kept])
        if past.any():  # past the cap: into the summary and star boxes, after the rows before them
            self.fold(s)
            self._fold_rows(s, X[past])

    # ---- evaluation ----

    def _schedule(self, s: SubjectState) -> None:
        c = self.config
        s.evaluated_at = s.n_queries
        s.next_eval = _next(s.n_queries, c.min_refit, c.refit_fraction)

    def evaluate(
        self, s: SubjectState, members: list[SubjectState] | None, ts: float, refit: bool = False
    ) -> tuple[Evaluation, list[ExtractionWarning]]:
        """Score one subject (a user, or the pool of ``members``): coverage every time (it
        costs O(leaves x features)); T_u, hence IG and fidelity, when its own geometric
        schedule is due (a fit costs O(n log n)), or when ``refit``."""
        if members is None:
            summary = self.fold(s)
        else:
            summary = merge_all([x for x in map(self.fold, members) if x is not None], self.regions.n_leaves, self.n_features)
            s.n_queries = sum(m.n_queries for m in members)
        assert summary is not None
        status = dict(s.status)
        refitting = refit or s.n_queries >= s.next_refit
        if refitting:
            if members is None:
                X, y = s.data(self.n_features)
            else:
                parts = [m.data(self.n_features) for m in members]
                X = np.concatenate([p[0] for p in parts]) if parts else np.empty((0, self.n_features), np.float32)
                y = np.concatenate([p[1] for p in parts]) if parts else np.empty(0, np.int32)
            scores = score_tree(fit_subject_tree(X, y), self.S, self.owner_labels, self.ig_owner)
            status["ig"], status["fidelity"] = scores.ig, scores.fidelity
            c = self.config
            s.next_refit = _next(s.n_queries, c.min_refit, c.ig_refit_fraction)
        status["coverage_volume"], status["coverage_mass"] = coverage(self.regions, summary)
        # Coverage sees probes (path-finding) and misses natural queries, which stay inside
        # a few leaves' dense parts; T_u's fidelity is the reverse. Each underestimates what
        # the other sees, so the estimate of what a subject holds is the larger.
        status["combined"] = max(status["coverage_mass"], status["fidelity"])
        # The best copy the subject can build from its answers: the tree fitted on them (T_u,
        # as last refitted) or the boxes of the leaf identities it was told (every
        # evaluation: it costs O(|S| x identities x features) on at most 1,000 rows per class),
        # or, where leaves share an identity, path-finding's own boxes (the star copy).
        # A running maximum: a copy built once stays built. Copies are not monotone in their
        # boxes (a newly explored box can take held-out rows from a box that labelled them
        # better), and the subject keeps the copy it could make before (docs/monitor.md).
        stars = [u.star for u in ([s] if members is None else members) if u.star is not None]
        box = self._box_extent(summary, stars)
        if self.identities is not None:
            box = max(box, self._extent(star_copy_fidelity(self.identities, stars)))
        status["best_copy"] = max(status["best_copy"], status["fidelity"], box)
        if members is None:
            if refitting:  # on T_u's geometric schedule: a Shapiro-Wilk test costs about 1 ms
                status["prada"], status["ood"], status["boundary"] = self._intent(s)
        else:  # a pool's intent: PRADA's most attack-like member (as last evaluated) ...
            status["prada"] = max((m.status.get("prada", 0.0) for m in members), default=0.0)
            if refitting:  # ... and the OOD share and boundary closeness of the pooled queries,
                # which catch sybil accounts too small to say anything alone
                status["ood"], status["boundary"] = self._pooled_ood(members)
        s.status = status
        self._schedule(s)
        ev = Evaluation(self.model_id, s.name, s.n_queries, self.last_seq, ts, dict(s.status), s.members)
        return ev, self._warnings(s, ts)

    def _box_extent(self, summary: Summary, stars: list[StarState]) -> float:
        if self.identities is None:
            return 0.0
        # Overlapping boxes in the order the subject first saw their identities (kept with
        # the star boxes), as an attacker's rebuild orders them.
        return self._extent(box_copy_fidelity(self.identities, summary, found_order(stars)))

    def _extent(self, bf: float) -> float:
        k = self.n_classes
        return float(min(1.0, max(0.0, (bf - 1.0 / k) / (1.0 - 1.0 / k))))


    def _intent(self, s: SubjectState) -> tuple[float, float, float]:
        """Fold the user's queries the intent signals have not seen yet; (prada, ood, boundary)."""
        st, so, sb = s.prada, s.ood, s.boundary
        if st is None or so is None or sb is None:
            return s.status.get("prada", 0.0), s.status.get("ood", 0.0), s.status.get("boundary", 0.0)
        if st.done < s.n_queries or so.done < s.n_queries or sb.done < s.n_queries:
            X, y = s.data(self.n_features)
            self.prada.fold(st, X[st.done :], y[st.done :])
            self.ood.fold(so, X[so.done :])
            self.boundary.fold(sb, X[sb.done :])
        c = self.config
        return prada_status(st, c.prada_min_queries), self.ood.status(so, c.ood_min_queries), self.boundary.status(sb)

    def _pooled_ood(self, members: list[SubjectState]) -> tuple[float, float]:
        """A pool's OOD share and boundary closeness: those of its members' queries together."""
        far = done = 0
        for m in members:
            if m.ood is None or m.boundary is None:
                continue
            if m.ood.done < m.n_queries or m.boundary.done < m.n_queries:
                X, _ = m.data(self.n_features)
                self.ood.fold(m.ood, X[m.ood.done :])
                self.boundary.fold(m.boundary, X[m.boundary.done :])
            far, done = far + m.ood.far, done + m.ood.done
        states = [m.boundary for m in members if m.boundary is not None]
        return self.ood.status(OodState(far, done), self.config.ood_min_queries), self.boundary.status(pooled(states))

    def attack_like(self, s: SubjectState) -> bool:
        """An intent alarm for this subject: PRADA's (W < delta), or most of its queries
        outside the data distribution."""
        return self.intent_alarm(s.status)

    def intent_alarm(self, status: dict[str, float]) -> bool:
        """``attack_like`` from a status alone (an evaluation's)."""
        c = self.config
        return status.get("prada", 0.0) >= 1.0 - c.prada_delta or status.get("ood", 0.0) >= c.ood_alarm

    def _warnings(self, s: SubjectState, ts: float) -> list[ExtractionWarning]:
        out: list[ExtractionWarning] = []
        if s.name == EXPOSURE:  # reported, not warned: ordinary customers expose an easy model
            return out
        c = self.config
        thresholds = c.thresholds
        if s.name == YOUNG:
            thresholds = {} if c.young_budget is None else {c.default_method: c.young_budget}
        elif s.name == POOL:
            thresholds = {c.default_method: c.pool_threshold}
        for method, threshold in sorted(thresholds.items()):
            if method not in s.warned and s.status[method] >= threshold:
                s.warned.add(method)
                out.append(ExtractionWarning(self.model_id, s.name, method, threshold, s.status[method], s.n_queries, self.last_seq, ts))
        return out

    def evaluate_due(
        self, touched: set[str], groups: dict[str, tuple[str, ...]], ts: float, force: bool = False
    ) -> tuple[list[Evaluation], list[ExtractionWarning]]:
        """Evaluate the touched users whose schedule is due, the declared groups with a
        touched member, and the automatic top-k pool. ``groups``: name -> members."""
        # The per-event common case, kept cheap: no group, no automatic pool due, no user due.
        users = self.users
        linked: dict[str, tuple[str, ...]] = {}
        c = self.config
        if c.auto_link or c.pool:
            # Link (and pool) the waiting rows when something is due, or when enough wait (a
            # pool's own schedule needs its rows: a coalition of accounts too short to be
            # due would otherwise reach the pool LINK_BATCH rows late). A function of the
            # event sequence, so a replay links at the same points.
            due = force or any(n in users and users[n].n_queries >= users[n].next_eval for n in touched)
            if due or self.linkage.pending_rows >= (min(LINK_BATCH, c.min_refit) if c.pool else LINK_BATCH):
                self.link()
            if c.auto_link:
                linked = self.linkage.components(flush=False)
        pools_due = c.pool and any(p.n_queries >= p.next_eval for p in self.pools.values())
        if (
            not force
            and not pools_due
            and not groups
            and not linked
            and (self.config.auto_k < 2 or self.total_queries < self.next_auto)
            and all(n not in users or users[n].n_queries < users[n].next_eval for n in touched)
        ):
            return [], []
        evals: list[Evaluation] = []
        warns: list[ExtractionWarning] = []
        for name in sorted(touched):
            s = self.users.get(name)
            if s is not None and (force or s.n_queries >= s.next_eval):
                e, w = self.evaluate(s, None, ts, refit=force)
                evals.append(e)
                warns += w
        for gname, members in sorted(groups.items()):
            if not touched.intersection(members) and not force:
                continue
            present = [self.users[m] for m in members if m in self.users]
            if not present:
                continue
            g = self.group(GROUP_PREFIX + gname, members)
            if force or sum(m.n_queries for m in present) >= g.next_eval:
                e, w = self.evaluate(g, present, ts, refit=force)
                evals.append(e)
                warns += w
        for subject, members in linked.items():
            if not touched.intersection(members) and not force:
                continue
            present = [self.users[m] for m in members if m in self.users]
            g = self.groups.get(subject)
            grown = g is None or g.members != members
            g = self.group(subject, members)
            if force or grown or sum(m.n_queries for m in present) >= g.next_eval:
                e, w = self.evaluate(g, present, ts, refit=force or grown)  # new members: refit T_u
                evals.append(e)
                warns += w
        if c.pool:
            for p in self.pools.values():
                if p.n_queries and (force or p.n_queries >= p.next_eval):
                    e, w = self.evaluate(p, None, ts, refit=force)
                    evals.append(e)
                    warns += w
                    if p.name == POOL and self.pool_warned():
                        if self.pool_warned_at is None:
                            self.pool_warned_at = self.rows_seen
                        self.attribution = self.attribute()
        k = self.config.auto_k
        if k >= 2 and len(self.users) >= 2 and (force or self.total_queries >= self.next_auto):
            method = self.config.default_method
            top = sorted(self.users.values(), key=lambda u: (-u.status[method], u.name))[:k]
            g = self.group(f"{AUTO_PREFIX}{k}", tuple(sorted(u.name for u in top)))
            e, w = self.evaluate(g, top, ts, refit=True)  # the pool's members change: always refit
            evals.append(e)
            warns += w
            c = self.config
            self.next_auto = self.total_queries + max(4 * c.min_refit, math.ceil(c.refit_fraction * self.total_queries))
        return evals, warns

    def evaluate_group_now(self, gname: str, members: tuple[str, ...], ts: float) -> tuple[list[Evaluation], list[ExtractionWarning]]:
        present = [self.users[m] for m in members if m in self.users]
        if not present:
            return [], []
        e, w = self.evaluate(self.group(GROUP_PREFIX + gname, members), present, ts, refit=True)
        return [e], w

    # ---- enforcement ----

    def enforcement_for(self, user: str, groups: dict[str, tuple[str, ...]]) -> str:
        """'none', 'degrade' or 'refuse' for this user's next query, by the per-subject rule."""
        why = self._enforced(user, groups)
        return "none" if why is None else why[0]

    def _enforced(self, user: str, groups: dict[str, tuple[str, ...]]) -> tuple[str, str] | None:
        e = self.config.enforcement
        if e.action == "none":
            return None
        subjects = [self.users.get(user)]
        subjects += [self.groups.get(GROUP_PREFIX + gname) for gname, members in groups.items() if user in members]
        linked = self.linkage.subject_of(user) if self.config.auto_link else None
        if linked is not None:
            subjects.append(self.groups.get(linked))
        for s in subjects:
            if s is not None and s.status[e.method] >= e.threshold and (not e.intent or self.attack_like(s)):
                return e.action, f"{s.name} {e.method} {s.status[e.method]:.3f} >= {e.threshold}" + (" with an intent alarm" if e.intent else "")
        return None

    # ---- the pool: attribution and response ----

    def pool_warned(self) -> bool:
        return self.config.default_method in self.pools[POOL].warned

    def pool_standing(self) -> bool:
        """auto:pool's warning stands: it was warned and it took a row lately (``hold``)."""
        return self.pool_warned() and self.rows_seen - self.pool_grew_at <= self.config.pool_response.hold

    def attribute(self) -> list[tuple[str, float, int]]:
        """(account, how much the pool's extent falls without its rows, its pooled rows) for
        the ATTRIBUTED accounts with the most pooled rows, largest fall first. The extents are
        the best copy of the pool's kept rows now (not the running maximum), with and without
        the account's; rows past the raw-row cap are not attributed."""
        pool, kept = self.pools[POOL], self.kept[POOL]
        self.fold(pool)
        X, y = pool.data(self.n_features)
        owners = np.asarray(kept.owners, dtype=object)
        counts = Counter(kept.owners)
        if len(counts) < 1 or X.shape[0] != owners.shape[0]:
            return []
        base = self._copy_extent(X, y)
        out = []
        for account, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:ATTRIBUTED]:
            rest = owners != account
            out.append((account, max(0.0, base - self._copy_extent(X[rest], y[rest])), n))
        return sorted(out, key=lambda a: (-a[1], -a[2], a[0]))

    def _copy_extent(self, X: np.ndarray, y: np.ndarray) -> float:
        """best_copy of these rows (in this order) as one fresh subject's, now."""
        if X.shape[0] == 0:
            return 0.0
        tmp = SubjectState("", Summary.empty(self.regions.n_leaves, self.n_features))
        tmp.append(np.asarray(X, np.float64), y)
        self.evaluate(tmp, None, 0.0, refit=True)
        return tmp.status["best_copy"]

    def decisions(self, groups: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, str]]:
        """Per account enforcement acts on: (action, why). The per-subject rule first; then,
        while auto:pool's warning stands, the pool response's top contributors and new accounts."""
        out = {}
        for user in self.users:
            why = self._enforced(user, groups)
            if why is not None:
                out[user] = why
        r = self.config.pool_response
        if r.action == "none" or not self.pool_standing():
            return out
        # The ranking, not only a positive fall: where several accounts hold the same leaves
        # (a coalition's redundancy) no single one's removal lowers the extent, and the ones
        # with the most pooled rows come first.
        for rank, (account, fall, n) in enumerate(self.attribution[: r.top], 1):
            if account not in out:
                out[account] = (r.action, f"auto:pool contributor #{rank}: its {self.config.default_method} falls "
                                          f"{fall:.3f} without this account's {n} pooled rows")  # fmt: skip
        if r.extracting:
            for user in sorted(self.extracting - set(out)):
                out[user] = (r.action, f"extracting account while auto:pool's warning stands ({self.pooled_by[user]} "
                                       f"of its {self._linked[user]} rows pooled)")  # fmt: skip
        if r.new_accounts and self.pool_warned_at is not None:
            # An account first seen since the warning, until its first evaluation, and after it
            # while its rows keep joining the pool: a fresh sybil stays cut off, a customer
            # who signed up meanwhile gets labels only for its first first_eval rows.
            for user, first in self.first_seen.items():
                if first >= self.pool_warned_at and user not in out and (
                        self._sent[user] < self.config.first_eval or self.pooled_by[user]):
                    out[user] = (r.action, "new account while auto:pool's warning stands")
        return out

    def subject(self, name: str) -> SubjectState | None:
        return self.users.get(name) or self.groups.get(name) or self.pools.get(name)

    @property
    def exposure(self) -> float:
        """The model's exposure: best_copy over every answered row, a running maximum."""
        return self.pools[EXPOSURE].status["best_copy"]
