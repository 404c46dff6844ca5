"""Trees as flat arrays: identical to scikit-learn's predictions, JSON round trip, and
validation that makes a corrupt or hostile stored tree fail to load instead of looping."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.datasets import load_breast_cancer, load_digits, load_wine
from sklearn.tree import DecisionTreeClassifier

from mlaas_monitor.tree import SMALL_BATCH, Tree, TreeFormatError, from_sklearn


@pytest.mark.parametrize("loader", [load_wine, load_breast_cancer, load_digits])
@pytest.mark.parametrize("max_leaf_nodes", [None, 20])
def test_apply_and_probabilities_equal_sklearn(loader: object, max_leaf_nodes: int | None) -> None:
    X, y = loader(return_X_y=True)  # type: ignore[operator]
    est = DecisionTreeClassifier(max_leaf_nodes=max_leaf_nodes, random_state=0).fit(X, y)
    tree = from_sklearn(est)
    # Both code paths: the per-row Python walk and the vectorised one.
    for batch in (X[:SMALL_BATCH], X):
        np.testing.assert_array_equal(tree.apply(batch), est.apply(batch))
        np.testing.assert_allclose(tree.value[tree.apply(batch)], est.predict_proba(batch))
    assert tree.n_leaves == est.get_n_leaves() and tree.depth() == est.get_depth()


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(2, 200),
    d=st.integers(1, 6),
    scale=st.sampled_from([1e-3, 1.0, 1e6]),
)
def test_random_trees_agree_with_sklearn_including_float32_edge_values(seed: int, n: int, d: int, scale: float) -> None:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * scale
    y = rng.integers(0, 3, size=n)
    est = DecisionTreeClassifier(random_state=seed).fit(X, y)
    tree = Tree.from_dict(json.loads(json.dumps(from_sklearn(est).to_dict())), d)
    # Probe exactly at, and one float64 ulp around, every threshold: where float32
    # rounding decides the branch.
    probes = np.repeat(X[:5], 3, axis=0).copy()
    internal = np.flatnonzero(tree.left != -1)
    for k, node in enumerate(internal[: len(probes)]):
        probes[k, tree.feature[node]] = np.nextafter(tree.threshold[node], [-np.inf, 0, np.inf][k % 3])
    for batch in (probes, np.vstack([X] * (1 + SMALL_BATCH // n))):
        np.testing.assert_array_equal(tree.apply(batch), est.apply(batch.astype(np.float32)))


def small_tree() -> dict[str, list]:
    return {
        "left": [1, -1, -1],
        "right": [2, -1, -1],
        "feature": [0, -2, -2],
        "threshold": [0.5, -2.0, -2.0],
        "value": [[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]],
        "n_samples": [4, 2, 2],
    }


@pytest.mark.parametrize(
    ("patch", "problem"),
    [
        ({"left": [0, -1, -1]}, "out of order"),  # a cycle back to the root
        ({"left": [1, -1, -1], "right": [1, -1, -1]}, "single binary tree"),
        ({"left": [5, -1, -1]}, "out of range"),
        ({"right": [-1, -1, -1]}, "exactly one child"),
        ({"feature": [3, -2, -2]}, "feature index"),
        ({"threshold": [float("nan"), -2.0, -2.0]}, "non-finite"),
        ({"value": [[0.5, 0.5], [1.0, 0.0]]}, "shape"),
        ({"left": []}, "no nodes"),
        ({"left": [1, -1]}, "shape"),
        ({"left": "abc"}, "malformed"),
        ({"n_samples": None}, "malformed"),
    ],
)
def test_corrupt_trees_are_refused(patch: dict[str, object], problem: str) -> None:
    with pytest.raises(TreeFormatError, match=problem):
        Tree.from_dict({**small_tree(), **patch}, n_features=2)


def test_a_valid_tree_routes_rows() -> None:
    tree = Tree.from_dict(small_tree(), n_features=2)
    assert tree.apply(np.array([[0.4, 9], [0.5, 9], [0.6, 9]])).tolist() == [1, 1, 2]
    assert tree.depth() == 1 and tree.n_leaves == 2
