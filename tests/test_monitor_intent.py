"""Signals of intent and automatic grouping, on arrays: PRADA (Shapiro-Wilk over a user's
nearest-query distances), the out-of-distribution share, and the linkage that pools sybil
accounts. The end-to-end checks (through a gateway, against real attackers) are in
tests/test_monitor_acceptance.py."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mlaas_monitor.datasets import load_dataset
from mlaas_monitor.monitor.config import PRADA_DELTA
from mlaas_monitor.monitor.linkage import LINK_PREFIX, Linkage
from mlaas_monitor.monitor.ood import Ood, OodState
from mlaas_monitor.monitor.prada import Prada, PradaState, prada_status, shapiro_w
from mlaas_monitor.training import encode_dataset, holdout_split
from tests.test_attack_strategies import wine_model


def _prada() -> tuple[Prada, np.ndarray, np.ndarray]:
    m = wine_model()
    f = m.schema.features
    p = Prada(np.array([x.min for x in f]), np.array([x.max for x in f]), np.array([x.kind == "categorical" for x in f]))
    _, X, _, y = encode_dataset(load_dataset("wine"))
    return p, holdout_split(X, y, 0)[0], m.validation_X


def _status(p: Prada, X: np.ndarray, labels: np.ndarray) -> float:
    st = PradaState()
    p.fold(st, X, labels)
    return prada_status(st, 20)


def test_prada_is_silent_on_natural_rows_and_alarms_on_line_searches() -> None:
    p, train, _ = _prada()
    m = wine_model()
    natural = train[np.random.default_rng(0).permutation(train.shape[0])[:100]]
    assert _status(p, natural, m.answer(natural).labels) < 1 - PRADA_DELTA
    # Line searches: one feature halved toward an edge, again and again, from a few points.
    x0 = train[:5]
    probes = []
    for x in x0:
        for j in range(x.shape[0]):
            lo, hi = float(x[j]), float(train[:, j].max())
            for _ in range(15):  # a binary search, as path-finding runs on a continuous feature
                mid = (lo + hi) / 2
                q = x.copy()
                q[j] = mid
                probes.append(q)
                hi = mid
    P = np.array(probes)
    assert _status(p, P, m.answer(P).labels) >= 1 - PRADA_DELTA


def test_prada_needs_evidence_and_a_constant_stream_is_not_natural() -> None:
    assert shapiro_w([0.1, 0.2]) is None
    assert shapiro_w([0.5] * 10) == 0.0
    p, train, _ = _prada()
    st = PradaState()
    p.fold(st, train[:10], np.zeros(10, dtype=np.int64))
    assert prada_status(st, 50) == 0.0  # too few distances to say anything


def test_ood_share_separates_data_rows_from_uniform_ones() -> None:
    p, train, S = _prada()
    ood = Ood(S, p.scale, p.categorical)
    m = wine_model()
    lo, hi = np.array([f.min for f in m.schema.features]), np.array([f.max for f in m.schema.features])
    natural, uniform = OodState(), OodState()
    ood.fold(natural, train[:60])
    ood.fold(uniform, np.random.default_rng(1).uniform(lo, hi, size=(60, len(lo))))
    assert ood.status(natural, 30) < 0.5 <= ood.status(uniform, 30)
    assert ood.status(OodState(), 30) == 0.0


def _point(rng: np.random.Generator, d: int = 10) -> np.ndarray:
    return rng.uniform(0, 100, size=d)


def test_linkage_joins_accounts_probing_each_others_points() -> None:
    rng = np.random.default_rng(0)
    link = Linkage(10, min_links=3)
    shared = _point(rng)
    link.add("a", shared[None, :])
    probes = np.repeat(shared[None, :], 6, axis=0)
    probes[np.arange(6), np.arange(6)] += 1.0  # one feature changed each
    link.add("b", probes[:4])
    assert link.components() == {}  # four links: not yet (at least 3, and 20 % of max(25, rows))
    link.add("b", probes[4:])
    assert link.components() == {LINK_PREFIX + "a": ("a", "b")}
    assert link.subject_of("b") == LINK_PREFIX + "a" and link.subject_of("c") is None


def test_linkage_ignores_repeated_rows_and_unrelated_users() -> None:
    rng = np.random.default_rng(1)
    link = Linkage(10, min_links=3)
    row = _point(rng)
    link.add("a", row[None, :])
    link.add("b", np.repeat(row[None, :], 10, axis=0))  # the same question, ten times: no link
    near = row.copy()
    near[3] += 1
    link.add("c", np.repeat(near[None, :], 10, axis=0))  # one neighbour resent ten times: one link
    for u in "defg":
        link.add(u, np.array([_point(rng) for _ in range(30)]))
    assert link.components() == {}


def test_linkage_needs_a_share_of_the_rows_not_just_a_few_near_duplicates() -> None:
    """Adult has many rows one feature apart: two customers drawing from it share a few such
    pairs, a small share of their queries; sybil accounts share most of theirs."""
    rng = np.random.default_rng(2)
    link = Linkage(10, min_links=3, min_fraction=0.2)
    a_rows = np.array([_point(rng) for _ in range(100)])
    b_rows = np.array([_point(rng) for _ in range(100)])
    near = np.array([19, 39, 59, 79, 99])  # 5 near-duplicates of a's rows, spread: 5 % of b's
    b_rows[near] = a_rows[:5]
    b_rows[near, np.arange(5)] += 1.0
    link.add("a", a_rows)
    link.add("b", b_rows)
    assert link.components() == {}
    c_rows = a_rows[10:40].copy()
    c_rows[:, 7] += 1.0  # 30 rows, every one a's row with one feature changed
    link.add("c", c_rows)
    assert link.components() == {LINK_PREFIX + "a": ("a", "c")}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcde"), st.integers(0, 5), st.integers(0, 3)), min_size=1, max_size=60))
def test_linkage_is_a_function_of_the_query_sequence(events: list[tuple[str, int, int]]) -> None:
    """Replaying the same sequence (as after a restart) rebuilds the same components."""
    base = np.random.default_rng(7).uniform(0, 10, size=(6, 4)).round(1)

    def build() -> dict[str, tuple[str, ...]]:
        link = Linkage(4, min_links=2)
        for user, p, j in events:
            x = base[p].copy()
            x[j] += 1
            link.add(user, x[None, :])
        return link.components()

    assert build() == build()
