"""Coverage of the feature space by a subject's queries, per leaf region of the owner's tree.

The owner's tree partitions the model card's feature domain into hyper-rectangles, one per
leaf. A subject's summary holds, per leaf, the count of its queries that landed there and
their axis-aligned bounding box: flat arrays ``counts (L,)``, ``lo (L, d)``, ``hi (L, d)``
(+inf / -inf where empty). Summaries merge by union (sum counts, min lo, max hi), which is
how a colluding group is measured: the merge of its members' summaries is exactly the
summary of one user who sent all of their queries.

Measure per dimension: integer and categorical features count the whole values in an
interval (a single query covers one value of each); continuous ones use length. A leaf's
covered fraction is the product over dimensions of (covered measure / leaf measure); the
status weights leaves by their share of the domain's volume, or by their share of S.
Pure: arrays in, numbers out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlaas_monitor.schema import CATEGORICAL, Schema
from mlaas_monitor.tree import Tree


@dataclass(frozen=True, eq=False)
class Regions:
    """The owner's leaf regions, clipped to the domain: closed boxes [a, b] per leaf."""

    leaf_nodes: np.ndarray  # (L,) node ids of the leaves
    leaf_index: np.ndarray  # (n_nodes,) node id -> leaf position (-1 for internal nodes)
    a: np.ndarray  # (L, d) lower bounds (for discrete dims: the first whole value inside)
    b: np.ndarray  # (L, d) upper bounds (for discrete dims: the last whole value inside)
    discrete: np.ndarray  # (d,) bool
    measure: np.ndarray  # (L, d) measure of the leaf per dim (> 0)
    volume_weight: np.ndarray  # (L,) leaf volume / domain volume (sums to 1)
    mass_weight: np.ndarray  # (L,) share of the validation set S in the leaf

    @property
    def n_leaves(self) -> int:
        return int(self.leaf_nodes.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.discrete.shape[0])


def _measure(a: np.ndarray, b: np.ndarray, discrete: np.ndarray) -> np.ndarray:
    return np.where(discrete, np.maximum(b - a + 1.0, 0.0), np.maximum(b - a, 0.0))


def leaf_bounds(tree: Tree, n_features: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per leaf the threshold box (lo, hi]: (leaf node ids, lo (L, d), hi (L, d)).

    A row reaches a leaf iff lo < x <= hi in every dimension (float32 thresholds, as the
    tree compares them); unbounded sides are -inf / +inf."""
    n = tree.n_nodes
    lo = np.full((n, n_features), -np.inf)
    hi = np.full((n, n_features), np.inf)
    # Children come after their parent, so one forward pass narrows every node's box.
    for i in range(n):
        left = int(tree.left[i])
        if left == -1:
            continue
        right, f, t = int(tree.right[i]), int(tree.feature[i]), float(tree.threshold[i])
        lo[left], hi[left] = lo[i], hi[i]
        lo[right], hi[right] = lo[i], hi[i]
        hi[left, f] = min(hi[i, f], t)
        lo[right, f] = max(lo[i, f], t)
    leaves = tree.leaves
    return leaves, lo[leaves], hi[leaves]


def build_regions(tree: Tree, schema: Schema, S: np.ndarray | None = None) -> Regions:
    d = len(schema)
    dom_lo = np.array([f.min for f in schema.features], dtype=np.float64)
    dom_hi = np.array([f.max for f in schema.features], dtype=np.float64)
    # Categorical codes and integer features are whole values; a continuous feature whose
    # training range is a single point is also counted as one value (zero length).
    discrete = np.array([f.kind == CATEGORICAL or f.integer for f in schema.features], dtype=bool) | (dom_hi <= dom_lo)
    leaves, lo, hi = leaf_bounds(tree, d)
    # Discrete: the whole values v with lo < v <= hi inside the domain.
    a_disc = np.maximum(dom_lo, np.floor(lo) + 1.0)
    b_disc = np.minimum(dom_hi, np.floor(hi))
    a = np.where(discrete, a_disc, np.maximum(dom_lo, lo))
    b = np.where(discrete, b_disc, np.minimum(dom_hi, hi))
    measure = _measure(a, b, discrete)
    dom_measure = _measure(dom_lo, dom_hi, discrete)
    frac = np.where(dom_measure > 0, measure / np.where(dom_measure > 0, dom_measure, 1.0), 0.0)
    volume = np.prod(frac, axis=1)
    volume_weight = volume / volume.sum() if volume.sum() > 0 else np.full(len(leaves), 1.0 / len(leaves))
    leaf_index = np.full(tree.n_nodes, -1, dtype=np.int64)
    leaf_index[leaves] = np.arange(len(leaves))
    if S is not None and S.shape[0] > 0:
        # Class-balanced: each class the owner predicts on S weighs the same, so a leaf of a
        # rare class counts as much as its class does, not as little as its rows. On skewed
        # labels, covering the majority class's leaves alone is then half the status for two
        # classes, as a constant copy is half the balanced fidelity, not 85 %.
        nodes = tree.apply(S)
        cls = tree.value[nodes].argmax(axis=1)
        per_class = np.bincount(cls).astype(np.float64)
        w = 1.0 / (np.count_nonzero(per_class) * per_class[cls])
        mass = np.bincount(leaf_index[nodes], weights=w, minlength=len(leaves))
        mass_weight = mass / mass.sum()
    else:
        mass_weight = np.full(len(leaves), 1.0 / len(leaves))
    return Regions(leaves, leaf_index, a, b, discrete, measure, volume_weight, mass_weight)


@dataclass(eq=False)
class Summary:
    """Per leaf: how many of a subject's queries landed there, and their bounding box."""

    counts: np.ndarray  # (L,) int64
    lo: np.ndarray  # (L, d) float64, +inf where empty
    hi: np.ndarray  # (L, d) float64, -inf where empty

    @classmethod
    def empty(cls, n_leaves: int, n_features: int) -> Summary:
        return cls(
            np.zeros(n_leaves, dtype=np.int64),
            np.full((n_leaves, n_features), np.inf),
            np.full((n_leaves, n_features), -np.inf),
        )

    def copy(self) -> Summary:
        return Summary(self.counts.copy(), self.lo.copy(), self.hi.copy())

    def add(self, leaf_pos: np.ndarray, X: np.ndarray) -> None:
        """Fold queries ``X`` that landed in leaves ``leaf_pos`` (positions, not node ids)."""
        if X.shape[0] == 0:
            return
        np.add.at(self.counts, leaf_pos, 1)
        np.minimum.at(self.lo, leaf_pos, X)
        np.maximum.at(self.hi, leaf_pos, X)

    def merged(self, other: Summary) -> Summary:
        return Summary(self.counts + other.counts, np.minimum(self.lo, other.lo), np.maximum(self.hi, other.hi))

    def equals(self, other: Summary) -> bool:
        return (
            np.array_equal(self.counts, other.counts)
            and np.array_equal(self.lo, other.lo)
            and np.array_equal(self.hi, other.hi)
        )

    def to_bytes(self) -> tuple[bytes, bytes, bytes]:
        return self.counts.astype("<i8").tobytes(), self.lo.astype("<f8").tobytes(), self.hi.astype("<f8").tobytes()

    @classmethod
    def from_bytes(cls, counts: bytes, lo: bytes, hi: bytes, n_leaves: int, n_features: int) -> Summary:
        return cls(
            np.frombuffer(counts, dtype="<i8").astype(np.int64).reshape(n_leaves),
            np.frombuffer(lo, dtype="<f8").astype(np.float64).reshape(n_leaves, n_features),
            np.frombuffer(hi, dtype="<f8").astype(np.float64).reshape(n_leaves, n_features),
        )


def merge_all(summaries: list[Summary], n_leaves: int, n_features: int) -> Summary:
    out = Summary.empty(n_leaves, n_features)
    for s in summaries:
        out = out.merged(s)
    return out


def leaf_fractions(regions: Regions, summary: Summary) -> np.ndarray:
    """Covered fraction of each leaf region (L,), in [0, 1]."""
    disc = regions.discrete
    # Whole values inside a discrete box: ceil(lo) .. floor(hi).
    qlo = np.where(disc, np.ceil(summary.lo), summary.lo)
    qhi = np.where(disc, np.floor(summary.hi), summary.hi)
    lo = np.maximum(qlo, regions.a)
    hi = np.minimum(qhi, regions.b)
    covered = _measure(lo, hi, disc)  # 0 where empty (inf/-inf give a negative extent)
    covered = np.where(np.isfinite(covered), covered, 0.0)
    ratio = np.where(regions.measure > 0, covered / np.where(regions.measure > 0, regions.measure, 1.0), 1.0)
    frac = np.prod(np.clip(ratio, 0.0, 1.0), axis=1)
    return np.where(summary.counts > 0, frac, 0.0)


def coverage(regions: Regions, summary: Summary) -> tuple[float, float]:
    """(volume-weighted, S-mass-weighted) covered fraction of the feature space."""
    f = leaf_fractions(regions, summary)
    return float(np.dot(regions.volume_weight, f)), float(np.dot(regions.mass_weight, f))
