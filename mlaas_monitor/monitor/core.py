"""Per-model monitor state: every subject's (user's, group's, pool's) query summary,
queries, status and warnings, updated from query events. Pure: events in, evaluations and
warnings out; the service persists them and the store replays them after a restart.

When a subject is evaluated is the schedule's (schedule.py): a function of query counts and
revealed leaf identities only, and T_u a function of the multiset of queries, so a replay
reproduces the same statuses and history. What is kept per subject is subject.py; the
settings config.py; which rows join the pools, and the per-account ledger the pool response
reads, pool.py.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from mlaas_monitor.model import Answer, Model
from mlaas_monitor.monitor.boundary import Boundary, BoundaryState, pooled
from mlaas_monitor.monitor.boxcopy import (
    StarState,
    box_copy_fidelity,
    found_order,
    identities,
    star_copy_fidelity,
)
from mlaas_monitor.monitor.config import MonitorConfig
from mlaas_monitor.monitor.coverage import Regions, Summary, build_regions, coverage, merge_all
from mlaas_monitor.monitor.infogain import entropy, extent, fit_subject_tree, score_tree
from mlaas_monitor.monitor.linkage import Linkage
from mlaas_monitor.monitor.ood import Ood, OodState
from mlaas_monitor.monitor.pool import EXPOSURE, POOL, POOLED, YOUNG, Kept, PoolLedger, flags, joins_pool
from mlaas_monitor.monitor.prada import Prada, PradaState, prada_status
from mlaas_monitor.monitor.schedule import EvaluationSchedule, next_point
from mlaas_monitor.monitor.subject import Evaluation, ExtractionWarning, SubjectState

GROUP_PREFIX = "group:"
AUTO_PREFIX = "auto:top"
ATTRIBUTED = 16  # accounts (those with the most pooled rows) whose share of auto:pool is measured
# Attribution costs ATTRIBUTED + 1 evaluations of the pool's rows (a tree refit each). Where
# the pool response acts on it, it is taken at each of the pool's evaluations while warned (the
# ranking decides whom enforcement degrades: a stale one lets a new contributor run, measured
# on Adult's 64-account coalition). Where it only informs (the response's action 'none', the
# default), it is taken again once auto:pool has grown by this fraction (at least min_refit
# rows), so that it costs about as much as the pool's own evaluations (17 x 5 % / 25 %: 3.4 of
# them) instead of 17 times as much.
ATTRIBUTION_FRACTION = 0.25
# How the reasons of the pool response's decisions begin (decisions()), one per rule: new
# accounts, ranked contributors, extracting accounts. Any other reason is the per-subject rule's.
POOL_REASONS = ("new account", "auto:pool contributor", "extracting account")


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
    """One model's monitor: its subjects' states, the pools, the link index and the
    evaluation schedule, updated from the model's answered queries in log order."""

    def __init__(self, model: Model, config: MonitorConfig | None = None) -> None:
        self.model_id = model.id  # the model watched
        # When each subject is evaluated and refitted; holds the model's settings (``config``).
        self.schedule = EvaluationSchedule(config or MonitorConfig())
        self.tree = model.tree  # the owner's tree: which leaf each query reaches
        self.n_features = len(model.schema)  # d: columns of every query row
        self.S = np.asarray(model.validation_X, dtype=np.float64)  # (m, d) held-out rows every copy is scored on
        # (m,) the owner's labels of S (its own answers, so its copy scores 1)
        self.owner_labels = model.answer(self.S).labels if self.S.shape[0] else np.empty(0, dtype=np.int64)
        # The owner's leaves are pure in its own labels, so IG(S, T_owner) = H(S).
        self.ig_owner = entropy(self.owner_labels)
        self.regions: Regions = build_regions(model.tree, model.schema, self.S)  # the leaves' boxes and S's rows in each
        feats = model.schema.features
        dom_lo, dom_hi = np.array([f.min for f in feats], np.float64), np.array([f.max for f in feats], np.float64)
        # PRADA's test on the distances between a user's queries (intent)
        self.prada = Prada(dom_lo, dom_hi, np.array([f.kind == "categorical" for f in feats], bool))
        self.ood = Ood(self.S, self.prada.scale, self.prada.categorical)  # the out-of-distribution test (intent)
        self.boundary = Boundary.build(model.tree, dom_lo, dom_hi, self.S)  # Quiring et al.'s margins (intent)
        # What the subject can tell apart, under the model's policy: leaf ids, (label,
        # confidence or top-k list) as revealed, or labels only (then no box copy: the tree
        # refit is the copy). Under noise on confidences (without leaf ids) no two answers in
        # a leaf are alike: no identity finer than the label is revealed to an attacker that
        # reads answers as they are (one that de-noises is a blind spot, docs/monitor.md).
        pol = model.policy
        leaf_nodes = self.regions.leaf_nodes
        node_labels, _ = model.node_answers
        self.identities = None  # the leaf identities a subject can tell apart (None: labels only, no box copy)
        if pol.reveal_leaf or (pol.reveal_confidence and not model.per_row):
            told = None if pol.reveal_leaf else _leaf_answers(model, leaf_nodes)
            self.identities = identities(self.regions, node_labels[leaf_nodes], told, self.S, self.owner_labels,
                                         dom_lo, dom_hi, self.prada.categorical)  # fmt: skip
        # K: the owner's labels on S (at least 2: extent's constant copy scores 1/K)
        self.n_classes = max(2, int(np.unique(self.owner_labels).size)) if self.owner_labels.size else 2
        self.linkage = Linkage(self.n_features, self.config.link_min)  # accounts linked by near-identical queries
        self.users: dict[str, SubjectState] = {}  # account name -> its state
        self.groups: dict[str, SubjectState] = {}  # keyed by subject name ("group:x", "auto:topk")
        # The subjects pooled by what the rows are (pool.py), and the rows each keeps raw.
        self.pools: dict[str, SubjectState] = {}
        self.kept: dict[str, Kept] = {}  # pooled subject -> which of its rows are kept raw, and whose
        for name in POOLED:
            first = self.schedule.first()
            self.pools[name] = SubjectState(name, Summary.empty(self.regions.n_leaves, self.n_features),
                                            next_eval=first, next_refit=first)  # fmt: skip
            self.kept[name] = Kept()
        # Rows waiting for the link index, in log order, with whether their account was
        # still young (before its first evaluation) when it sent them: pooled at each link.
        self._pool_pending: list[tuple[str, np.ndarray, np.ndarray, bool]] = []
        self.ledger = PoolLedger()  # per account, how its rows reached the pools; when auto:pool grew and was warned
        # While auto:pool is warned: per account (the ATTRIBUTED with the most pooled rows), how
        # much the pool's extent falls without its rows, largest first (attribute()).
        self.attribution: list[tuple[str, float, int]] = []
        self.next_attribution = 0  # auto:pool's query count at which attribute() is taken again (while warned)
        self.last_seq = 0  # the last query event folded in (its seq in the store's log)
        self.last_restored = 0  # after a restart: the last logged query restored (restore_queries)

    @property
    def config(self) -> MonitorConfig:
        """The model's monitor settings (the schedule's: one copy)."""
        return self.schedule.config

    @config.setter
    def config(self, config: MonitorConfig) -> None:
        self.schedule.config = config


    # ---- state ----

    def user(self, name: str) -> SubjectState:
        s = self.users.get(name)
        if s is None:
            first = self.schedule.first()
            s = self.users[name] = SubjectState(name, Summary.empty(self.regions.n_leaves, self.n_features),
                                                next_eval=first, next_refit=first, prada=PradaState(), ood=OodState(),
                                                boundary=BoundaryState())  # fmt: skip
        return s

    def group(self, subject: str, members: tuple[str, ...]) -> SubjectState:
        s = self.groups.get(subject)
        if s is None:
            first = self.schedule.first()
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
        self.schedule.ingested(X.shape[0])
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
        self.ledger.arrived(user, X.shape[0])
        if c.auto_link or c.pool:
            self.linkage.add(user, X)
        if c.pool:
            young = self.ledger.young(user, X.shape[0], c.first_eval)
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
        """An answer showing a leaf identity the subject had not seen brings its evaluation
        forward (the schedule's rule); at most once per identity, so at most one evaluation
        (and tree refit) per leaf identity more than the query-count schedule's."""
        if self._seen(s, pos):
            self.schedule.revealed(s)

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
        signs = joins_pool(flags(self.ood.far(X), self.boundary.close(X)[1], found.near))
        # An extracting account's every row joins, not only its flagged ones: what it holds is
        # what all its answers give (its starting points, the probes inside a leaf).
        extracting = np.fromiter((u in self.ledger.extracting for u in users), bool, len(users))
        # Other accounts' rows that show the signs join once their account has shown them on
        # REPEATED rows (a coincidence falls on one row); its earlier ones join first.
        flagged, (wu, wX, wy, wh) = self.ledger.repeated(users, X, y, found.hashes, signs & ~extracting)
        if wu:
            self._pool_add(POOL, wu, wX, wy, wh)
        flagged |= extracting
        for name, take in ((POOL, flagged), (YOUNG, young), (EXPOSURE, np.ones(X.shape[0], bool))):
            idx = np.flatnonzero(take)
            if idx.size:
                self._pool_add(name, [users[i] for i in idx], X[idx], y[idx], [found.hashes[i] for i in idx])
        for u in self.ledger.newly_extracting(users):
            self._extracting(u)

    def _extracting(self, user: str) -> None:
        """The account's rows are mostly extraction-like: from now on all its rows join
        auto:pool, and its earlier ones (as far as they are linked) join now."""
        self.ledger.extracting.add(user)
        s = self.users.get(user)
        if s is None:
            return
        self.fold(s)
        X, y = s.data(self.n_features)
        n = self.ledger.linked[user]
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
            self.ledger.pool_took(u for u, k, p in zip(users, kept, past, strict=True) if repeats or k or p)
        self._reveal(s, self.regions.leaf_index[self.tree.apply(X)])
        if kept.any():
            s.append(X[kept], y[kept])
        if past.any():  # past the cap: into the summary and star boxes, after the rows before them
            self.fold(s)
            self._fold_rows(s, X[past])

    # ---- evaluation ----

    def evaluate(
        self, s: SubjectState, members: list[SubjectState] | None, ts: float, refit: bool = False
    ) -> tuple[Evaluation, list[ExtractionWarning]]:
        """Score one subject (a user, or the pool of ``members``): coverage every time (it
        costs O(leaves x features)); T_u, hence IG and fidelity, when its own geometric
        schedule is due (a fit costs O(n log n)), or when ``refit``."""
        summary = self._folded(s, members)
        status = dict(s.status)
        refitting = self.schedule.refit_due(s, refit)
        if refitting:
            scores = score_tree(fit_subject_tree(*self._queries(s, members)), self.S, self.owner_labels, self.ig_owner)
            status["ig"], status["fidelity"] = scores.ig, scores.fidelity
            self.schedule.refitted(s)
        status["coverage_volume"], status["coverage_mass"] = coverage(self.regions, summary)
        # Coverage sees probes (path-finding) and misses natural queries, which stay inside
        # a few leaves' dense parts; T_u's fidelity is the reverse. Each underestimates what
        # the other sees, so the estimate of what a subject holds is the larger.
        status["combined"] = max(status["coverage_mass"], status["fidelity"])
        status["best_copy"] = max(status["best_copy"], status["fidelity"], self._box_copy(s, members, summary))
        self._intent_status(s, members, refitting, status)
        s.status = status
        self.schedule.evaluated(s)
        ev = Evaluation(self.model_id, s.name, s.n_queries, self.last_seq, ts, dict(s.status), s.members)
        return ev, self._warnings(s, ts)

    def _folded(self, s: SubjectState, members: list[SubjectState] | None) -> Summary:
        """The subject's summary brought up to date (a pool's: its members' merged, and its
        query count theirs)."""
        if members is None:
            summary = self.fold(s)
        else:
            summary = merge_all([x for x in map(self.fold, members) if x is not None], self.regions.n_leaves, self.n_features)
            s.n_queries = sum(m.n_queries for m in members)
        assert summary is not None
        return summary

    def _queries(self, s: SubjectState, members: list[SubjectState] | None) -> tuple[np.ndarray, np.ndarray]:
        """Every query the subject (or its members together) sent, and the labels answered."""
        if members is None:
            return s.data(self.n_features)
        parts = [m.data(self.n_features) for m in members]
        X = np.concatenate([p[0] for p in parts]) if parts else np.empty((0, self.n_features), np.float32)
        y = np.concatenate([p[1] for p in parts]) if parts else np.empty(0, np.int32)
        return X, y

    def _box_copy(self, s: SubjectState, members: list[SubjectState] | None, summary: Summary) -> float:
        """The extent of the best box copy the subject can build from its answers: the boxes
        of the leaf identities it was told (every evaluation: it costs O(|S| x identities x
        features) on at most 1,000 rows per class), or, where leaves share an identity,
        path-finding's own boxes (the star copy). best_copy keeps a running maximum of it
        with T_u's fidelity: a copy built once stays built. Copies are not monotone in their
        boxes (a newly explored box can take held-out rows from a box that labelled them
        better), and the subject keeps the copy it could make before (docs/monitor.md)."""
        stars = [u.star for u in ([s] if members is None else members) if u.star is not None]
        box = self._box_extent(summary, stars)
        if self.identities is not None:
            box = max(box, extent(star_copy_fidelity(self.identities, stars), self.n_classes))
        return box

    def _intent_status(self, s: SubjectState, members: list[SubjectState] | None, refitting: bool,
                       status: dict[str, float]) -> None:  # fmt: skip
        """The intent signals into ``status``, on T_u's geometric schedule (a Shapiro-Wilk
        test costs about 1 ms)."""
        if members is None:
            if refitting:
                status["prada"], status["ood"], status["boundary"] = self._intent(s)
        else:  # a pool's intent: PRADA's most attack-like member (as last evaluated) ...
            status["prada"] = max((m.status.get("prada", 0.0) for m in members), default=0.0)
            if refitting:  # ... and the OOD share and boundary closeness of the pooled queries,
                # which catch sybil accounts too small to say anything alone
                status["ood"], status["boundary"] = self._pooled_ood(members)

    def _box_extent(self, summary: Summary, stars: list[StarState]) -> float:
        if self.identities is None:
            return 0.0
        # Overlapping boxes in the order the subject first saw their identities (kept with
        # the star boxes), as an attacker's rebuild orders them.
        return extent(box_copy_fidelity(self.identities, summary, found_order(stars)), self.n_classes)

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
        """Evaluate the touched users whose schedule is due, the declared and linked groups
        with a touched member, the pooled subjects and the automatic top-k pool that are due
        (every one of them, ``force``). ``groups``: name -> members."""
        linked = self._link_if_due(touched, force)
        if not force and self._nothing_due(touched, groups, linked):  # the per-event common case, kept cheap
            return [], []
        done: list[tuple[Evaluation, list[ExtractionWarning]]] = []
        done += self._due_users(touched, ts, force)
        done += self._due_declared(touched, groups, ts, force)
        done += self._due_linked(touched, linked, ts, force)
        if self.config.pool:
            done += self._due_pools(ts, force)
        if self.schedule.auto_due(len(self.users), force):
            done.append(self._evaluate_auto(ts))
        return [e for e, _ in done], [w for _, ws in done for w in ws]

    def _link_if_due(self, touched: set[str], force: bool) -> dict[str, tuple[str, ...]]:
        """Link (and pool) the waiting rows when the schedule says so; the link groups."""
        c = self.config
        if not (c.auto_link or c.pool):
            return {}
        users = self.users
        something_due = force or any(n in users and self.schedule.due(users[n]) for n in touched)
        if self.schedule.link_due(self.linkage.pending_rows, something_due):
            self.link()
        return self.linkage.components(flush=False) if c.auto_link else {}

    def _nothing_due(self, touched: set[str], groups: dict[str, tuple[str, ...]], linked: dict[str, tuple[str, ...]]) -> bool:
        """No subject can be due on this event: no group, no pool or automatic pool due, no
        touched user due."""
        if groups or linked or not self.schedule.auto_idle():
            return False
        if self.config.pool and self.schedule.any_due(self.pools.values()):
            return False
        return not any(n in self.users and self.schedule.due(self.users[n]) for n in touched)

    def _due_users(self, touched: set[str], ts: float, force: bool) -> list[tuple[Evaluation, list[ExtractionWarning]]]:
        out = []
        for name in sorted(touched):
            s = self.users.get(name)
            if s is not None and (force or self.schedule.due(s)):
                out.append(self.evaluate(s, None, ts, refit=force))
        return out

    def _due_declared(self, touched: set[str], groups: dict[str, tuple[str, ...]], ts: float,
                      force: bool) -> list[tuple[Evaluation, list[ExtractionWarning]]]:  # fmt: skip
        """The owner's declared groups with a touched member, due on their members' total."""
        out = []
        for gname, members in sorted(groups.items()):
            if not touched.intersection(members) and not force:
                continue
            present = [self.users[m] for m in members if m in self.users]
            if not present:
                continue
            g = self.group(GROUP_PREFIX + gname, members)
            if force or self.schedule.due(g, sum(m.n_queries for m in present)):
                out.append(self.evaluate(g, present, ts, refit=force))
        return out

    def _due_linked(self, touched: set[str], linked: dict[str, tuple[str, ...]], ts: float,
                    force: bool) -> list[tuple[Evaluation, list[ExtractionWarning]]]:  # fmt: skip
        """The link groups with a touched member: due on their members' total, or at once
        (and refitted) when their membership changed."""
        out = []
        for subject, members in linked.items():
            if not touched.intersection(members) and not force:
                continue
            present = [self.users[m] for m in members if m in self.users]
            g = self.groups.get(subject)
            grown = g is None or g.members != members
            g = self.group(subject, members)
            if force or grown or self.schedule.due(g, sum(m.n_queries for m in present)):
                out.append(self.evaluate(g, present, ts, refit=force or grown))  # new members: refit T_u
        return out

    def _due_pools(self, ts: float, force: bool) -> list[tuple[Evaluation, list[ExtractionWarning]]]:
        """The pooled subjects that are due; a warned auto:pool's accounts re-attributed."""
        out = []
        for p in self.pools.values():
            if p.n_queries and (force or self.schedule.due(p)):
                out.append(self.evaluate(p, None, ts, refit=force))
                if p.name == POOL and self.pool_warned():
                    self.ledger.warned()
                    acts = self.config.pool_response.action != "none"
                    if force or acts or p.n_queries >= self.next_attribution:
                        self.attribution = self.attribute()
                        self.next_attribution = next_point(p.n_queries, self.config.min_refit, ATTRIBUTION_FRACTION)
        return out

    def _evaluate_auto(self, ts: float) -> tuple[Evaluation, list[ExtractionWarning]]:
        """The automatic pool of the auto_k users with the highest status."""
        k = self.config.auto_k
        method = self.config.default_method
        top = sorted(self.users.values(), key=lambda u: (-u.status[method], u.name))[:k]
        g = self.group(f"{AUTO_PREFIX}{k}", tuple(sorted(u.name for u in top)))
        done = self.evaluate(g, top, ts, refit=True)  # the pool's members change: always refit
        self.schedule.auto_evaluated()
        return done

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
        return self.pool_warned() and self.ledger.standing(self.config.pool_response.hold)

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
        while auto:pool's warning stands, the pool response's top contributors, extracting
        accounts and new accounts whose rows join the pool."""
        out = {}
        if self.config.enforcement.action != "none":  # (asked at each decision: no scan of every user for nothing)
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
        ledger = self.ledger
        if r.extracting:
            for user in sorted(ledger.extracting - set(out)):
                out[user] = (r.action, f"extracting account while auto:pool's warning stands ({ledger.pooled_share(user)})")
        if r.new_accounts:
            for user in ledger.new_pooled_since_warning():
                out.setdefault(user, (r.action, f"new account whose rows join auto:pool while its warning stands "
                                                f"({ledger.pooled_share(user)})"))  # fmt: skip
        return out

    def subject(self, name: str) -> SubjectState | None:
        return self.users.get(name) or self.groups.get(name) or self.pools.get(name)

    @property
    def exposure(self) -> float:
        """The model's exposure: best_copy over every answered row, a running maximum."""
        return self.pools[EXPOSURE].status["best_copy"]
