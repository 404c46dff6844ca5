"""A fitted decision tree as flat arrays, like scikit-learn's ``tree_``: pure data, no pickle.

Node ``i`` is a leaf when ``left[i] == -1``; otherwise a row goes left when
``float32(x[feature[i]]) <= threshold[i]`` (scikit-learn compares float32 inputs, so we do
too, which keeps our predictions identical to the estimator's). ``value[i]`` holds the class
distribution at node ``i`` (fractions summing to 1). Leaf ids are node indices.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

SMALL_BATCH = 128  # up to this many rows, apply() walks the tree in plain Python


class TreeFormatError(ValueError):
    """A serialised tree that is not a well-formed binary tree."""


@dataclass(frozen=True, eq=False)
class Tree:
    left: np.ndarray  # int32, -1 at leaves
    right: np.ndarray  # int32, -1 at leaves
    feature: np.ndarray  # int32, -2 at leaves (scikit-learn's convention)
    threshold: np.ndarray  # float64
    value: np.ndarray  # float64 (n_nodes, n_classes)
    n_samples: np.ndarray  # int64, training rows that reached each node

    @property
    def n_nodes(self) -> int:
        return int(self.left.shape[0])

    @property
    def n_classes(self) -> int:
        return int(self.value.shape[1])

    @property
    def leaves(self) -> np.ndarray:
        return np.flatnonzero(self.left == -1)

    @property
    def n_leaves(self) -> int:
        return int(self.leaves.shape[0])

    def depth(self) -> int:
        depths = np.zeros(self.n_nodes, dtype=np.int64)
        # Children always have larger indices than their parent (checked on load), so one
        # forward pass assigns every depth.
        for i in range(self.n_nodes):
            if self.left[i] != -1:
                depths[self.left[i]] = depths[self.right[i]] = depths[i] + 1
        return int(depths.max())

    def __post_init__(self) -> None:
        # Plain-list copies for the per-row path: for a handful of rows, walking the tree
        # in Python beats a dozen numpy calls per level.
        object.__setattr__(self, "_lists", (self.left.tolist(), self.right.tolist(),
                                            self.feature.tolist(), self.threshold.tolist()))  # fmt: skip

    def apply(self, X: np.ndarray) -> np.ndarray:
        """Leaf id of every row of the (n, n_features) matrix ``X``."""
        X = np.asarray(X, dtype=np.float32)
        n = X.shape[0]
        if n <= SMALL_BATCH:
            left, right, feature, threshold = self._lists  # type: ignore[attr-defined]
            leaves = []
            for row in X.tolist():  # float32 values as Python floats: same comparisons as sklearn
                i = 0
                while left[i] != -1:
                    i = left[i] if row[feature[i]] <= threshold[i] else right[i]
                leaves.append(i)
            return np.array(leaves, dtype=np.int64)
        # Matrix products would hand small batches to multithreaded BLAS, whose thread
        # wake-ups cost milliseconds; a few vectorised gathers per level are predictable.
        left, right, feature, threshold, depth = self._level_tables
        X64 = X.astype(np.float64)  # float32 values widened exactly: scikit-learn's comparison
        rows = np.arange(n)
        node = np.zeros(n, dtype=np.int64)
        for _ in range(depth):
            node = np.where(X64[rows, feature[node]] <= threshold[node], left[node], right[node])
        return node

    @cached_property
    def _level_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        """Children with leaves as fixed points (a leaf's children are itself), so every
        row can take exactly depth() steps with no masking."""
        idx = np.arange(self.n_nodes)
        leaf = self.left == -1
        left = np.where(leaf, idx, self.left).astype(np.int64)
        right = np.where(leaf, idx, self.right).astype(np.int64)
        feature = np.where(leaf, 0, self.feature).astype(np.int64)
        return left, right, feature, self.threshold, self.depth()

    def to_dict(self) -> dict[str, Any]:
        return {
            "left": self.left.tolist(),
            "right": self.right.tolist(),
            "feature": self.feature.tolist(),
            "threshold": self.threshold.tolist(),
            "value": self.value.tolist(),
            "n_samples": self.n_samples.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], n_features: int) -> Tree:
        """Rebuild and validate: a corrupt tree must fail here, not loop or index out of range."""
        try:
            tree = cls(
                left=np.asarray(d["left"], dtype=np.int32),
                right=np.asarray(d["right"], dtype=np.int32),
                feature=np.asarray(d["feature"], dtype=np.int32),
                threshold=np.asarray(d["threshold"], dtype=np.float64),
                value=np.asarray(d["value"], dtype=np.float64),
                n_samples=np.asarray(d["n_samples"], dtype=np.int64),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise TreeFormatError(f"malformed tree: {e}") from e
        tree.validate(n_features)
        return tree

    def validate(self, n_features: int) -> None:
        """Raise TreeFormatError unless the arrays are one binary tree over ``n_features``
        features that apply() walks to a leaf for any row."""
        self._check_shapes()
        self._check_structure(n_features)

    def _check_shapes(self) -> None:
        n = self.n_nodes
        if n == 0:
            raise TreeFormatError("tree has no nodes")
        for name in ("right", "feature", "threshold", "n_samples"):
            if getattr(self, name).shape != (n,):
                raise TreeFormatError(f"tree array {name!r} has the wrong shape")
        if self.value.ndim != 2 or self.value.shape[0] != n or self.value.shape[1] < 1:
            raise TreeFormatError("tree array 'value' has the wrong shape")

    def _check_structure(self, n_features: int) -> None:
        n = self.n_nodes
        internal = self.left != -1
        if np.any(internal != (self.right != -1)):
            raise TreeFormatError("a node has exactly one child")
        idx = np.arange(n)
        # Children after their parent: rules out cycles and makes apply() terminate.
        for child in (self.left[internal], self.right[internal]):
            if np.any(child <= idx[internal]) or np.any(child >= n):
                raise TreeFormatError("child index out of order or out of range")
        feats = self.feature[internal]
        if np.any(feats < 0) or np.any(feats >= n_features):
            raise TreeFormatError("split on a feature index out of range")
        if not np.all(np.isfinite(self.threshold[internal])) or not np.all(np.isfinite(self.value)):
            raise TreeFormatError("non-finite threshold or value")
        # Every node except the root has exactly one parent.
        parents = np.zeros(n, dtype=np.int64)
        np.add.at(parents, self.left[internal], 1)
        np.add.at(parents, self.right[internal], 1)
        if parents[0] != 0 or np.any(parents[1:] != 1):
            raise TreeFormatError("nodes are not a single binary tree")


def from_sklearn(estimator: Any) -> Tree:
    """Copy a fitted DecisionTreeClassifier's arrays (single output only)."""
    t = estimator.tree_
    if t.n_outputs != 1:
        raise ValueError("only single-output trees are supported")
    value = np.asarray(t.value[:, 0, :], dtype=np.float64)
    # Older scikit-learn stores counts, newer stores fractions; normalise to fractions.
    value = value / value.sum(axis=1, keepdims=True)
    return Tree(
        left=np.asarray(t.children_left, dtype=np.int32),
        right=np.asarray(t.children_right, dtype=np.int32),
        feature=np.asarray(t.feature, dtype=np.int32),
        threshold=np.asarray(t.threshold, dtype=np.float64),
        value=value,
        n_samples=np.asarray(t.n_node_samples, dtype=np.int64),
    )
