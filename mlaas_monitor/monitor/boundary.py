"""Closeness to the boundary (Quiring, Arp, Rieck, "Forgotten Siblings: Unifying Attacks on
Machine Learning and Digital Watermarking", EuroS&P 2018, §5): a defence against
decision-tree extraction carried over from oracle attacks on watermarks. Path-finding
locates each leaf's thresholds by line search, so its queries crowd into the thin strip
just inside a threshold where the data themselves rarely lie; natural queries do not.

Per leaf and per feature, a *security margin* lies inside the leaf next to each of its
bounds t (a threshold, or the domain's edge where the leaf has none, as in the paper's
code): its width is the gap from t to the nearest row of the owner's data in that leaf
along the feature, at most ``MARGIN_RATE`` of the leaf's extent along it (the paper's rule
with the training rows; here S, the owner's held-out rows, which is what the monitor
holds). On whole-valued features the gap to the data is often half a unit, and no query
can fall inside it: the detector was designed on continuous features. A query is *in the margin* when it lies in any margin of the leaf it
reached. Per leaf the ratio is in-margin queries / queries (0 until the leaf has more than
``MIN_LEAF_QUERIES``); the status is the mean ratio over all leaves, and the paper's alarm
is a status above 0.3. Not implemented: the paper's optional refinement of the margin by a
kernel density estimate of the data (the plain min-gap rule is its first option).
Pure: arrays in, numbers out; the state per subject is two counters per leaf.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mlaas_monitor.monitor.coverage import leaf_bounds
from mlaas_monitor.tree import Tree

MARGIN_RATE = 0.075  # the paper's code: a margin is at most this share of the leaf's width
MIN_LEAF_QUERIES = 5  # a leaf's ratio counts once more queries than this landed there
BOUNDARY_ALARM = 0.3  # the paper's blocking threshold on the mean ratio


@dataclass
class BoundaryState:
    """Per leaf position: queries folded, and how many were in a security margin."""

    counts: np.ndarray | None = None  # (L,) queries folded per leaf position (None: none yet)
    close: np.ndarray | None = None  # (L,) of those, queries in a security margin (None: none yet)
    done: int = 0  # queries folded so far


@dataclass(frozen=True, eq=False)
class Boundary:
    leaf_index: np.ndarray  # node id -> leaf position
    lo_t: np.ndarray  # (L, d) the leaf's lower bounds (thresholds, else the domain's minimum)
    lo_w: np.ndarray  # (L, d) width of the margin above them
    hi_t: np.ndarray  # (L, d) upper bounds (thresholds, else the domain's maximum)
    hi_w: np.ndarray  # (L, d) width of the margin below them
    tree: Tree = field(repr=False)  # the owner's tree: which leaf a query reaches

    @classmethod
    def build(cls, tree: Tree, dom_lo: np.ndarray, dom_hi: np.ndarray, S: np.ndarray) -> Boundary:
        d = dom_lo.shape[0]
        leaves, lo, hi = leaf_bounds(tree, d)
        leaf_index = np.full(tree.n_nodes, -1, np.int64)
        leaf_index[leaves] = np.arange(leaves.shape[0])
        # Domain edges stand in for missing thresholds (the paper's code does the same).
        lo, hi = np.maximum(lo, dom_lo), np.minimum(hi, dom_hi)
        cap = MARGIN_RATE * np.maximum(hi - lo, 0.0)
        lo_w, hi_w = cap.copy(), cap.copy()
        if S.shape[0]:
            pos = leaf_index[tree.apply(np.asarray(S, np.float64))]
            for k in range(leaves.shape[0]):
                rows = S[pos == k]
                if rows.shape[0]:
                    lo_w[k] = np.minimum(cap[k], rows.min(axis=0) - lo[k])
                    hi_w[k] = np.minimum(cap[k], hi[k] - rows.max(axis=0))
        return cls(leaf_index, lo, np.maximum(lo_w, 0.0), hi, np.maximum(hi_w, 0.0), tree)

    @property
    def n_leaves(self) -> int:
        return int(self.lo_t.shape[0])

    def fold(self, st: BoundaryState, X: np.ndarray) -> None:
        """Count new queries ``X`` (float32 or float64 rows) into the subject's state."""
        if st.counts is None or st.close is None:
            st.counts = np.zeros(self.n_leaves, np.int64)
            st.close = np.zeros(self.n_leaves, np.int64)
        if X.shape[0] == 0:
            return
        pos, close = self.close(X)
        np.add.at(st.counts, pos, 1)
        np.add.at(st.close, pos, close.astype(np.int64))
        st.done += X.shape[0]

    def close(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row: the leaf position it reached, and whether it lies in a margin of that leaf."""
        X = np.asarray(X, np.float64)
        pos = self.leaf_index[self.tree.apply(X)]
        lt, lw, ht, hw = self.lo_t[pos], self.lo_w[pos], self.hi_t[pos], self.hi_w[pos]
        # Strict comparisons, as the paper's: no margin where the data reach the bound.
        return pos, ((lt + lw > X) | (ht - hw < X)).any(axis=1)

    def status(self, st: BoundaryState) -> float:
        """The mean over all leaves of the in-margin ratio (leaves with too few queries: 0)."""
        if st.counts is None or st.close is None:
            return 0.0
        counted = st.counts > MIN_LEAF_QUERIES
        ratio = np.where(counted, st.close / np.maximum(st.counts, 1), 0.0)
        return float(ratio.mean()) if ratio.size else 0.0


def pooled(states: list[BoundaryState]) -> BoundaryState:
    """A group's counters: its members' summed (the group asks as one user would)."""
    have = [s for s in states if s.counts is not None and s.close is not None]
    if not have:
        return BoundaryState()
    return BoundaryState(sum(s.counts for s in have), sum(s.close for s in have), sum(s.done for s in have))  # type: ignore[misc]
