"""The copy a subject can build from the leaf regions its answers revealed (how Tramèr et
al.'s path-finding reconstructs a tree), scored on the owner's validation set S. Pure.

A leaf identity (a leaf id, or (label, confidence) as on BigML) tells the subject which of
its queries share a leaf. The box of an identity is the bounding box of the subject's
queries with that identity: exactly the per-leaf query boxes of the coverage summary,
merged over the leaves that share an identity. The copy labels a row with the label of the
box whose predicates it violates least (a row inside a box: that box's label), as
path-finding's rebuild does. The copy is only as good as the boxes are wide: boundary
probes make them reach the leaf's thresholds (then the copy is the owner's tree), natural
rows make them the data's hull in each leaf.

Where leaves share an identity (equal label and rounded confidences), the bounding box of
an identity's queries spans several leaves and can hold most of S: path-finding does not
build that box. It explores each identity from the first query that showed it (its centre),
changing one feature at a time, and keeps along each feature the probes that kept the
identity. ``star_copy_fidelity`` rebuilds that box from the queries: per identity, the
bounding box of its queries that differ from its centre in at most one feature.

Where the policy reveals labels only, no identity finer than the label exists and this
copy is not built (the tree fitted on the answers is the reconstruction then).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from mlaas_monitor.monitor.coverage import Regions, Summary
from mlaas_monitor.monitor.infogain import balanced_agreement

MIN_BOX_QUERIES = 2  # the second copy keeps the boxes of identities with at least this many queries
ROWS_PER_CLASS = 1000  # rows of S per owner class the copy is scored on (balanced fidelity is a per-class mean)


@dataclass(frozen=True, eq=False)
class Identities:
    """Which leaves a subject cannot tell apart, and the rows of S the copy is scored on."""

    group: np.ndarray  # (L,) identity index of each leaf position
    label: np.ndarray  # (G,) the owner's label of each identity
    rows: np.ndarray  # (m, d) rows of S (at most ROWS_PER_CLASS per owner class)
    truth: np.ndarray  # (m,) the owner's labels of those rows
    span: np.ndarray  # (d,) each feature's domain range (distances outside a box are shares of it)
    dom_lo: np.ndarray  # (d,) the domain's edges: a box that reaches one is open beyond it
    dom_hi: np.ndarray  # (d,)
    categorical: np.ndarray  # (d,) bool: no distance, only the violated predicate

    @property
    def n_groups(self) -> int:
        return int(self.label.shape[0])


def identities(
    regions: Regions, leaf_labels: np.ndarray, leaf_answers: Sequence[Hashable] | None, S: np.ndarray,
    owner: np.ndarray, dom_lo: np.ndarray, dom_hi: np.ndarray, categorical: np.ndarray, seed: int = 0,
) -> Identities:  # fmt: skip
    """Identities by leaf (``leaf_answers`` None: leaf ids are revealed) or by (label, what
    else a row in the leaf is told: its confidence, or its top-k list, as revealed).
    ``leaf_labels``/``leaf_answers`` are per leaf position."""
    if leaf_answers is None:
        group = np.arange(regions.n_leaves)
        label = np.asarray(leaf_labels, np.int64)
    else:
        keys = list(zip(np.asarray(leaf_labels).tolist(), leaf_answers, strict=True))
        index: dict[tuple[int, Hashable], int] = {}
        group = np.array([index.setdefault(k, len(index)) for k in keys], np.int64)
        label = np.array([k[0] for k in index], np.int64)
    rng = np.random.default_rng(seed)
    keep = [rng.permutation(np.flatnonzero(owner == c))[:ROWS_PER_CLASS] for c in np.unique(owner)]
    pick = np.sort(np.concatenate(keep)) if keep else np.empty(0, np.int64)
    span = np.where(dom_hi > dom_lo, dom_hi - dom_lo, 1.0)
    return Identities(group, label, np.asarray(S, np.float64)[pick], np.asarray(owner)[pick], span,
                      np.asarray(dom_lo, np.float64), np.asarray(dom_hi, np.float64), np.asarray(categorical, bool))  # fmt: skip


def box_copy_fidelity(ids: Identities, summary: Summary, order: np.ndarray | None = None) -> float:
    """Balanced fidelity (on S) of the better of two copies made of the subject's identity
    boxes: every box, and only the boxes of identities seen more than once (a box of one
    query is a point: path-finding has found that leaf but not explored it yet, and the
    point would take every row it is nearest to). 0 without any box. Discrete features
    compare as the tree does (whole values inside the box). Boxes of merged identities
    overlap: a row inside several takes the first, by ``order`` (the arrival index of each
    identity's first query: the order an attacker found them) where given."""
    if ids.rows.shape[0] == 0 or not summary.counts.any():
        return 0.0
    g = ids.n_groups
    d = summary.lo.shape[1]
    lo = np.full((g, d), np.inf)
    hi = np.full((g, d), -np.inf)
    np.minimum.at(lo, ids.group, summary.lo)
    np.maximum.at(hi, ids.group, summary.hi)
    return _score_boxes(ids, lo, hi, np.bincount(ids.group, weights=summary.counts, minlength=g), order)


def found_order(states: Sequence[StarState]) -> np.ndarray | None:
    """Per identity, the earliest arrival index of its first query over these states (a
    pool's: each member's own indices, an approximation); None without any."""
    found = [st.found for st in states if st.found is not None]
    return np.minimum.reduce(found) if found else None


@dataclass(eq=False)
class StarState:
    """A user's star boxes (path-finding's box per identity, rebuilt from its queries), folded
    in as its queries arrive: per identity its centre (the first query that showed it), and
    the bounding box and count of its queries within one feature of that centre. A function
    of the ordered queries only; after a restart it is rebuilt from the logged queries."""

    done: int = 0  # queries folded so far
    centre: np.ndarray | None = None  # (G, d); NaN rows: identity not seen yet
    lo: np.ndarray | None = None  # (G, d), inf where unseen
    hi: np.ndarray | None = None  # (G, d), -inf where unseen
    counts: np.ndarray | None = None  # (G,)
    # (G,) the arrival index of each identity's centre (inf: not seen). Star boxes of merged
    # identities overlap, so which box a row inside several gets decides the copy: like
    # path-finding's rebuild, the box found first.
    found: np.ndarray | None = None

    def fold(self, ids: Identities, leaf_pos: np.ndarray, X: np.ndarray) -> None:
        """Take the next queries (``X``, in arrival order, and their leaf positions)."""
        g, d = ids.n_groups, X.shape[1]
        if self.centre is None or self.lo is None or self.hi is None or self.counts is None or self.found is None:
            self.centre = np.full((g, d), np.nan)
            self.lo, self.hi, self.counts = np.full((g, d), np.inf), np.full((g, d), -np.inf), np.zeros(g)
            self.found = np.full(g, np.inf)
        start = self.done
        self.done += X.shape[0]
        if X.shape[0] == 0:
            return
        X = np.asarray(X, np.float64)
        grp = ids.group[leaf_pos]
        present, first = np.unique(grp, return_index=True)
        new = np.isnan(self.centre[present, 0])
        self.centre[present[new]] = X[first[new]]
        self.found[present[new]] = start + first[new]
        star = (self.centre[grp] != X).sum(axis=1) <= 1
        np.minimum.at(self.lo, grp[star], X[star])
        np.maximum.at(self.hi, grp[star], X[star])
        self.counts += np.bincount(grp[star], minlength=g)


def star_copy_fidelity(ids: Identities, states: Sequence[StarState]) -> float:
    """Balanced fidelity on S of the copy made of these star boxes, by the rule of
    ``box_copy_fidelity``. Several states (a pool's members, each explored from its own
    centres) merge as coverage summaries do: boxes take min/max, counts add."""
    parts = [st for st in states if st.counts is not None]
    if ids.rows.shape[0] == 0 or not parts:
        return 0.0
    lo = np.minimum.reduce([st.lo for st in parts])
    hi = np.maximum.reduce([st.hi for st in parts])
    counts = np.sum([st.counts for st in parts], axis=0)
    if not counts.any():
        return 0.0
    return _score_boxes(ids, lo, hi, counts, found_order(parts))


def _score_boxes(ids: Identities, lo: np.ndarray, hi: np.ndarray, counts: np.ndarray,
                 order: np.ndarray | None = None) -> float:  # fmt: skip
    """The better of the two copies (every box; the boxes of identities with at least
    MIN_BOX_QUERIES queries) made of per-identity boxes (G, d) (lo = inf: not seen). A row
    equally close to several boxes takes the first: by identity index, or by ``order``."""
    d = lo.shape[1]
    seen = np.flatnonzero(np.isfinite(lo[:, 0]))
    if order is not None:
        seen = seen[np.argsort(order[seen], kind="stable")]
    repeated = counts[seen] >= MIN_BOX_QUERIES
    # A box that reaches the domain's edge is open beyond it (the subject probed the edge and
    # stayed in the leaf; path-finding's boxes are open there too): held-out rows may lie
    # outside the range the domain was taken from.
    lo = np.where(lo[seen] <= ids.dom_lo, -np.inf, lo[seen])
    hi = np.where(hi[seen] >= ids.dom_hi, np.inf, hi[seen])
    X = ids.rows
    # Per (row, box): violated predicates, ties broken by the distance outside the box (shares
    # of each numeric feature's range, scaled below one); accumulated per feature to keep
    # memory at m x G. The same rule as the attacks' BoxRebuild.
    key = np.zeros((X.shape[0], seen.shape[0]), np.float64)
    for j in range(d):
        xj = X[:, j : j + 1]
        below, above = lo[None, :, j] - xj, xj - hi[None, :, j]
        key += (below > 0) | (above > 0)
        if not ids.categorical[j]:
            key += np.maximum(np.maximum(below, above), 0.0) / (ids.span[j] * (d + 1))
    labels = ids.label[seen]
    best = balanced_agreement(labels[key.argmin(axis=1)], ids.truth)
    if repeated.any() and not repeated.all():
        best = max(best, balanced_agreement(labels[repeated][key[:, repeated].argmin(axis=1)], ids.truth))
    return best
