"""Coverage summaries: hand-made boxes and regions, merges, and the merge laws (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlaas_monitor.monitor.coverage import (
    Summary,
    build_regions,
    coverage,
    leaf_bounds,
    leaf_fractions,
    merge_all,
)
from mlaas_monitor.schema import CATEGORICAL, NUMERIC, Feature, Schema
from mlaas_monitor.tree import Tree


def two_level_tree() -> Tree:
    """x0 <= 4 -> leaf 1; else x1 <= 5 -> leaf 3, else leaf 4."""
    return Tree(
        left=np.array([1, -1, 3, -1, -1], dtype=np.int32), right=np.array([2, -1, 4, -1, -1], dtype=np.int32),
        feature=np.array([0, -2, 1, -2, -2], dtype=np.int32), threshold=np.array([4.0, -2, 5.0, -2, -2]),
        value=np.full((5, 2), 0.5), n_samples=np.ones(5, dtype=np.int64),
    )  # fmt: skip


CONT = Schema((Feature("a", NUMERIC, 0.0, 10.0), Feature("b", NUMERIC, 0.0, 10.0)))
# Whole-valued: "a" integer 0..9, "b" a category with 10 codes.
DISC = Schema((Feature("a", NUMERIC, 0.0, 9.0, integer=True), Feature("b", CATEGORICAL, 0.0, 9.0, True, tuple("abcdefghij"))))


def summary_of(regions, tree: Tree, X: np.ndarray) -> Summary:  # type: ignore[no-untyped-def]
    s = Summary.empty(regions.n_leaves, regions.n_features)
    s.add(regions.leaf_index[tree.apply(X)], X)
    return s


def test_leaf_bounds_and_volumes_continuous() -> None:
    tree = two_level_tree()
    leaves, lo, hi = leaf_bounds(tree, 2)
    assert leaves.tolist() == [1, 3, 4]
    assert lo.tolist() == [[-np.inf, -np.inf], [4.0, -np.inf], [4.0, 5.0]]
    assert hi.tolist() == [[4.0, np.inf], [np.inf, 5.0], [np.inf, np.inf]]
    S = np.array([[1.0, 1.0], [2.0, 2.0], [6.0, 1.0], [6.0, 9.0]])
    r = build_regions(tree, CONT, S)
    assert r.volume_weight.tolist() == pytest.approx([0.4, 0.3, 0.3])
    assert r.mass_weight.tolist() == [0.5, 0.25, 0.25]


def test_coverage_of_hand_made_boxes() -> None:
    tree = two_level_tree()
    r = build_regions(tree, CONT, np.array([[1.0, 1.0], [2.0, 2.0], [6.0, 1.0], [6.0, 9.0]]))
    # Two queries in leaf 1 span [1, 3] x [2, 8]: (2/4) * (6/10) of the leaf.
    s = summary_of(r, tree, np.array([[1.0, 2.0], [3.0, 8.0]]))
    assert s.counts.tolist() == [2, 0, 0]
    assert leaf_fractions(r, s).tolist() == pytest.approx([0.3, 0.0, 0.0])
    vol, mass = coverage(r, s)
    assert vol == pytest.approx(0.4 * 0.3)
    assert mass == pytest.approx(0.5 * 0.3)
    # A single continuous point covers nothing (zero length); a box beyond the domain is
    # clipped to it: [4, 10] x [5, 10] is all of leaf 4.
    s2 = summary_of(r, tree, np.array([[4.5, 5.5], [30.0, 99.0], [4.0001, 5.0001]]))
    assert leaf_fractions(r, s2)[2] == pytest.approx(((10 - 4.0001) / 6) * ((10 - 5.0001) / 5), rel=1e-6)
    assert leaf_fractions(r, summary_of(r, tree, np.array([[6.0, 1.0]]))).tolist() == [0.0, 0.0, 0.0]


def test_coverage_counts_whole_values_on_discrete_features() -> None:
    tree = Tree(
        left=np.array([1, -1, -1], dtype=np.int32), right=np.array([2, -1, -1], dtype=np.int32),
        feature=np.array([0, -2, -2], dtype=np.int32), threshold=np.array([4.5, -2, -2]),
        value=np.full((3, 2), 0.5), n_samples=np.ones(3, dtype=np.int64),
    )  # fmt: skip
    r = build_regions(tree, DISC)
    # Leaf 1: a in 0..4 (5 values) x b in 0..9 (10 codes) = half the 100 cells.
    assert r.volume_weight.tolist() == [0.5, 0.5]
    assert r.a.tolist() == [[0, 0], [5, 0]] and r.b.tolist() == [[4, 9], [9, 9]]
    one = summary_of(r, tree, np.array([[2.0, 3.0]]))
    assert leaf_fractions(r, one).tolist() == [pytest.approx(1 / 5 * 1 / 10), 0.0]
    box = summary_of(r, tree, np.array([[0.0, 0.0], [4.0, 9.0], [7.0, 2.0]]))
    assert leaf_fractions(r, box).tolist() == [1.0, pytest.approx(1 / 5 * 1 / 10)]
    assert coverage(r, box)[0] == pytest.approx(0.5 + 0.5 / 50)


def test_merge_of_split_queries_is_the_summary_of_all() -> None:
    tree = two_level_tree()
    r = build_regions(tree, CONT)
    X = np.random.default_rng(1).uniform(0, 10, size=(60, 2))
    parts = [summary_of(r, tree, X[i::3]) for i in range(3)]
    merged = merge_all(parts, r.n_leaves, r.n_features)
    assert merged.equals(summary_of(r, tree, X))
    assert coverage(r, merged) == coverage(r, summary_of(r, tree, X))


def test_summary_bytes_round_trip() -> None:
    r = build_regions(two_level_tree(), CONT)
    s = summary_of(r, two_level_tree(), np.array([[1.0, 2.0], [7.0, 7.0]]))
    assert Summary.from_bytes(*s.to_bytes(), r.n_leaves, r.n_features).equals(s)


points = st.lists(st.tuples(st.floats(-2, 12, allow_nan=False), st.floats(-2, 12, allow_nan=False)), max_size=8)


@settings(max_examples=60, deadline=None)
@given(points, points, points)
def test_merge_laws(a: list[tuple[float, float]], b: list[tuple[float, float]], c: list[tuple[float, float]]) -> None:
    tree = two_level_tree()
    r = build_regions(tree, CONT)

    def summ(p: list[tuple[float, float]]) -> Summary:
        return summary_of(r, tree, np.array(p, dtype=np.float64).reshape(-1, 2))

    sa, sb, sc = summ(a), summ(b), summ(c)
    assert sa.merged(sb).equals(sb.merged(sa))  # commutative
    assert sa.merged(sb).merged(sc).equals(sa.merged(sb.merged(sc)))  # associative
    twice = sa.merged(sa)  # idempotent on the boxes (the counts add, by design)
    assert np.array_equal(twice.lo, sa.lo) and np.array_equal(twice.hi, sa.hi)
    assert coverage(r, twice) == coverage(r, sa)
    # monotone: merging never lowers any leaf's covered fraction, nor either status
    fa, fab = leaf_fractions(r, sa), leaf_fractions(r, sa.merged(sb))
    assert np.all(fab >= fa - 1e-12)
    assert all(x >= y - 1e-12 for x, y in zip(coverage(r, sa.merged(sb)), coverage(r, sa), strict=True))
    assert all(0.0 <= v <= 1.0 + 1e-12 for v in coverage(r, sa.merged(sb).merged(sc)))
    # the merge is the summary of all the queries
    assert sa.merged(sb).equals(summ(a + b))
