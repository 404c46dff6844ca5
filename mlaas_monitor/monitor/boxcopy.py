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

Where the policy reveals labels only, no identity finer than the label exists and this
copy is not built (the tree fitted on the answers is the reconstruction then).
"""

from __future__ import annotations

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
    dom_hi: np.ndarray
    categorical: np.ndarray  # (d,) bool: no distance, only the violated predicate

    @property
    def n_groups(self) -> int:
        return int(self.label.shape[0])


def identities(
    regions: Regions, leaf_labels: np.ndarray, leaf_confidences: np.ndarray | None, S: np.ndarray, owner: np.ndarray,
    dom_lo: np.ndarray, dom_hi: np.ndarray, categorical: np.ndarray, seed: int = 0,
) -> Identities:  # fmt: skip
    """Identities by leaf (``leaf_confidences`` None: leaf ids are revealed) or by (label,
    confidence as revealed). ``leaf_labels``/``leaf_confidences`` are per leaf position."""
    if leaf_confidences is None:
        group = np.arange(regions.n_leaves)
        label = np.asarray(leaf_labels, np.int64)
    else:
        keys = list(zip(np.asarray(leaf_labels).tolist(), np.asarray(leaf_confidences).tolist(), strict=True))
        index: dict[tuple[int, float], int] = {}
        group = np.array([index.setdefault(k, len(index)) for k in keys], np.int64)
        label = np.array([k[0] for k in index], np.int64)
    rng = np.random.default_rng(seed)
    keep = [rng.permutation(np.flatnonzero(owner == c))[:ROWS_PER_CLASS] for c in np.unique(owner)]
    pick = np.sort(np.concatenate(keep)) if keep else np.empty(0, np.int64)
    span = np.where(dom_hi > dom_lo, dom_hi - dom_lo, 1.0)
    return Identities(group, label, np.asarray(S, np.float64)[pick], np.asarray(owner)[pick], span,
                      np.asarray(dom_lo, np.float64), np.asarray(dom_hi, np.float64), np.asarray(categorical, bool))  # fmt: skip


def box_copy_fidelity(ids: Identities, summary: Summary) -> float:
    """Balanced fidelity (on S) of the better of two copies made of the subject's identity
    boxes: every box, and only the boxes of identities seen more than once (a box of one
    query is a point: path-finding has found that leaf but not explored it yet, and the
    point would take every row it is nearest to). 0 without any box. Discrete features
    compare as the tree does (whole values inside the box)."""
    if ids.rows.shape[0] == 0 or not summary.counts.any():
        return 0.0
    g = ids.n_groups
    d = summary.lo.shape[1]
    lo = np.full((g, d), np.inf)
    hi = np.full((g, d), -np.inf)
    np.minimum.at(lo, ids.group, summary.lo)
    np.maximum.at(hi, ids.group, summary.hi)
    seen = np.flatnonzero(np.isfinite(lo[:, 0]))
    repeated = np.bincount(ids.group, weights=summary.counts, minlength=g)[seen] >= MIN_BOX_QUERIES
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
