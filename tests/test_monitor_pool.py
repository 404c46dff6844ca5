"""Subjects pooled by what the rows are (pool.py): the flags of hand-made rows, the pool and
the exposure fed from any account, the cap on raw rows, and two invariants (Hypothesis):
the pool covers at least what any account's flagged rows cover, and the exposure never falls."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlaas_monitor.model import Model, Policy
from mlaas_monitor.monitor.config import ConfigError, MonitorConfig
from mlaas_monitor.monitor.core import ModelMonitor
from mlaas_monitor.monitor.coverage import Summary, coverage, merge_all
from mlaas_monitor.monitor.linkage import Linkage
from mlaas_monitor.monitor.pool import (
    EXPOSURE,
    FLAG_MARGIN,
    FLAG_NEAR,
    FLAG_OOD,
    POOL,
    REPEATED,
    REPEATED_SHARE,
    YOUNG,
    Kept,
    flags,
    joins_pool,
)
from mlaas_monitor.monitor.subject import SubjectState
from tests.test_gateway_helpers import credit_model
from tests.test_monitor_core import queries


def labels(mon: ModelMonitor, X: np.ndarray) -> np.ndarray:
    return mon.tree.value[mon.tree.apply(X)].argmax(axis=1)


def send(mon: ModelMonitor, stream: list[tuple[str, np.ndarray]]) -> list[float]:
    """Feed the stream (seq = position) and return the exposure after each event."""
    out = []
    for seq, (user, X) in enumerate(stream, 1):
        mon.ingest(user, X, labels(mon, X), seq)
        mon.evaluate_due({user}, {}, float(seq))
        out.append(mon.exposure)
    return out


def test_near_flag_by_hand() -> None:
    """One feature from an earlier, different row of any account (the sender's own too);
    an exact repeat is not; two features apart is not."""
    link = Linkage(2)
    link.add("a", np.array([[0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [5.0, 5.0]]))
    link.add("b", np.array([[5.0, 6.0], [7.0, 8.0], [9.0, 9.0]]))
    found = link.flush()
    assert found.near.tolist() == [False, True, False, False, True, False, False]
    assert found.hashes[0] == found.hashes[2] and len(set(found.hashes)) == 6


def test_flag_bits_and_who_joins() -> None:
    far, close = np.array([1, 0, 0, 1, 0, 1, 0], bool), np.array([0, 1, 0, 1, 0, 0, 1], bool)
    near = np.array([0, 0, 1, 1, 0, 1, 1], bool)
    mask = flags(far, close, near)
    assert mask.tolist() == [FLAG_OOD, FLAG_MARGIN, FLAG_NEAR, FLAG_OOD | FLAG_MARGIN | FLAG_NEAR, 0,
                             FLAG_OOD | FLAG_NEAR, FLAG_MARGIN | FLAG_NEAR]  # fmt: skip
    assert joins_pool(mask).tolist() == [False, False, False, True, False, True, True]


def test_pool_takes_the_rows_that_look_like_extraction_from_any_account() -> None:
    """A row joins auto:pool when it is one feature from an earlier row (of any account)
    and also out of distribution or in a margin, once its account has shown that on
    REPEATED rows (its earlier ones wait and join with it); one sign alone does not count."""
    assert REPEATED == 3
    mon = ModelMonitor(credit_model())
    S = mon.S
    link = Linkage(S.shape[1])
    link.add("x", S)
    natural = S[~link.flush().near][:12]  # rows of S: none far, none in a margin, none one feature from another
    assert not mon.ood.far(natural).any() and not mon.boundary.close(natural)[1].any()
    edge = np.array([[100.0, 3.0, 18.0, 0.0]])  # a domain corner farther than tau from every row of S (0.81 > 0.60)
    steps = np.repeat(edge, 3, axis=0)
    steps[:, 2] = [19.0, 20.0, 21.0]  # each one feature from the corner, still far: they show the signs
    inside = natural[1:2].copy()
    inside[0, 3] = natural[0, 3] if natural[0, 3] != natural[1, 3] else (natural[1, 3] + 1) % 3
    assert not mon.ood.far(inside).any() and not mon.boundary.close(inside)[1].any()
    assert mon.ood.far(edge).all() and mon.ood.far(steps).all()
    # r: one feature from natural[1], in distribution and in no margin: never shows the signs
    stream = [(f"n{i}", natural[i : i + 1]) for i in range(12)] + [("p", edge), ("q", steps[:1]), ("r", inside), ("q", steps[1:2])]
    send(mon, stream)
    mon.evaluate_due(set(), {}, 99.0, force=True)
    pool = mon.pools[POOL]
    assert pool.n_queries == 0 and [len(mon.ledger.waiting["q"])] == [2] and "r" not in mon.ledger.shown
    send(mon, [("q", steps[2:])])
    mon.evaluate_due(set(), {}, 100.0, force=True)
    assert pool.n_queries == 3 and mon.kept[POOL].owners == ["q"] * 3 and "q" not in mon.ledger.waiting
    assert np.array_equal(pool.data(mon.n_features)[0], steps.astype(np.float32))  # in the order sent
    assert mon.pools[EXPOSURE].n_queries == len(stream) + 1
    assert mon.pools[YOUNG].n_queries == len(stream) + 1  # every account here sent fewer than first_eval rows


def test_exposure_is_every_account_as_one_and_raw_rows_are_capped() -> None:
    mon = ModelMonitor(credit_model())
    mon.kept[EXPOSURE] = Kept(max_rows=40)
    stream = [(f"u{i % 5}", queries(i, 1 + i % 3)) for i in range(60)]
    send(mon, stream)
    mon.evaluate_due(set(), {}, 99.0, force=True)
    expo = mon.pools[EXPOSURE]
    assert expo.n_queries == sum(X.shape[0] for _, X in stream)
    assert len(mon.kept[EXPOSURE].hashes) == 40 and expo.data(mon.n_features)[0].shape[0] == 40
    # Past the cap the rows still reach the summary: it is every account's merged.
    users = [mon.fold(u) for u in mon.users.values()]
    merged = merge_all([u for u in users if u is not None], mon.regions.n_leaves, mon.n_features)
    assert expo.summary is not None and expo.summary.equals(merged)


def _flagged_summary(mon: ModelMonitor, user: str) -> Summary:
    """The summary of one account's rows that joined the pool (kept raw: the stream is under the cap)."""
    rows, _ = mon.pools[POOL].data(mon.n_features)
    mine = np.asarray([o == user for o in mon.kept[POOL].owners], bool)
    out = Summary.empty(mon.regions.n_leaves, mon.n_features)
    X = rows[mine].astype(np.float64)
    out.add(mon.regions.leaf_index[mon.tree.apply(X)], X)
    return out


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10_000), st.integers(1, 4), st.booleans()), min_size=5, max_size=60))
def test_pool_covers_each_accounts_flagged_rows_and_exposure_never_falls(events: list[tuple[int, int, int, bool]]) -> None:
    mon = ModelMonitor(credit_model())
    stream = []
    for user, seed, n, walk in events:
        X = queries(seed, n)
        if walk and stream:  # a path-finding step: an earlier row with one feature changed
            X = np.repeat(stream[seed % len(stream)][1][:1], n, axis=0)
            X[:, seed % X.shape[1]] = queries(seed + 1, n)[:, seed % X.shape[1]]
        stream.append((f"a{user}", X))
    exposure = send(mon, stream)
    assert all(b >= a for a, b in zip(exposure, exposure[1:], strict=False))
    mon.evaluate_due(set(), {}, 0.0, force=True)
    pool = mon.pools[POOL]
    assert pool.summary is not None
    pooled = coverage(mon.regions, mon.fold(pool) or pool.summary)
    for user in {u for u, _ in stream}:
        alone = coverage(mon.regions, _flagged_summary(mon, user))
        assert pooled[0] >= alone[0] - 1e-12 and pooled[1] >= alone[1] - 1e-12
    assert mon.exposure >= exposure[-1]
    # An account's rows that show the signs wait until it has shown them on REPEATED rows
    # (and REPEATED_SHARE of its rows), then they are in the pool; at most REPEATED - 1 wait.
    ledger = mon.ledger
    for user in set(mon.kept[POOL].owners):
        assert user in ledger.extracting or ledger.shown[user] >= REPEATED
    for user, rows in ledger.waiting.items():
        assert 0 < len(rows) <= min(ledger.shown[user], REPEATED - 1)
        if ledger.shown[user] < REPEATED:
            assert user not in mon.kept[POOL].owners


def test_a_new_leaf_identity_makes_an_evaluation_due() -> None:
    """After its first evaluation, a user whose answer shows a leaf it had not seen is
    evaluated off the query-count schedule, REVEAL_GAP queries after its last evaluation at
    the earliest; rows of leaves it has seen do not bring one forward."""
    model = replace(credit_model(), policy=Policy(reveal_leaf=True))
    for reveal in (True, False):
        mon = ModelMonitor(model, MonitorConfig(reveal_eval=reveal))
        leaves = mon.regions.leaf_index[mon.tree.apply(mon.S)]
        first, other = leaves[0], next(v for v in leaves if v != leaves[0])
        same = mon.S[leaves == first]
        assert same.shape[0] >= 16, "the test needs 16 held-out rows in one leaf"
        stream = [same[i : i + 1] for i in range(11)] + [mon.S[leaves == other][:1]] + [same[i : i + 1] for i in range(11, 16)]
        evals = []
        for seq, X in enumerate(stream, 1):  # the new leaf at query 12
            mon.ingest("u", X, labels(mon, X), seq)
            evals += [e.n_queries for e in mon.evaluate_due({"u"}, {}, float(seq))[0] if e.subject == "u"]
        assert evals == ([10, 15] if reveal else [10])  # 15 = 10 + REVEAL_GAP; the schedule's next is 25


def test_young_accounts_budget_is_the_owners() -> None:
    """auto:young is reported; it is warned only against a budget the owner set."""
    stream = [(f"short{i}", queries(i, 3)) for i in range(40)]  # 40 accounts of 3 rows: none ever evaluated
    quiet, budget = ModelMonitor(credit_model()), ModelMonitor(credit_model(), MonitorConfig().updated({"young_budget": 0.01}))
    for mon in (quiet, budget):
        send(mon, stream)
        assert not any(u.evaluated_at for u in mon.users.values())
        # No account was due: the rows reached the pools in batches of min_refit (25) waiting rows
        assert mon.pools[YOUNG].n_queries + mon.linkage.pending_rows == 120 and mon.linkage.pending_rows < 25
        mon.evaluate_due(set(), {}, 0.0, force=True)
        assert mon.pools[YOUNG].n_queries == 120
    assert quiet.pools[YOUNG].status["best_copy"] > 0.01 and not quiet.pools[YOUNG].warned
    assert budget.pools[YOUNG].warned == {"best_copy"}
    assert MonitorConfig().updated({"young_budget": None}).young_budget is None
    with pytest.raises(ConfigError, match="young_budget"):
        MonitorConfig().updated({"young_budget": 2})


def line_searches(model: Model, n: int, seed: int = 0) -> list[np.ndarray]:
    """Path-finding's probes in miniature: from a corner of the domain, one feature moved
    across its range (one feature from each other; corners lie far from the data)."""
    lo = np.array([f.min for f in model.schema.features])
    hi = np.array([f.max for f in model.schema.features])
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        X = np.repeat(np.where(rng.random(lo.shape[0]) < 0.5, lo, hi)[None], 6, axis=0)
        j = i % lo.shape[0]
        X[:, j] = np.linspace(lo[j], hi[j], 6).round()
        out.append(X)
    return out


def test_attribution_and_response_while_the_pool_is_warned() -> None:
    model = replace(credit_model(), policy=Policy(reveal_leaf=True))
    cfg = MonitorConfig().updated({"pool_response": {"action": "degrade", "top": 1, "extracting": False, "hold": 200}})
    mon = ModelMonitor(model, cfg)
    probes = line_searches(model, 40)
    # Two accounts share the searches (m0 three in four), then the pool is warned.
    send(mon, [("m0" if i % 4 else "m1", X) for i, X in enumerate(probes[:30])])
    mon.evaluate_due(set(), {}, 0.0, force=True)
    assert mon.pool_warned() and mon.pool_standing() and mon.ledger.warned_at is not None
    ranked = [a for a, _, _ in mon.attribution]
    assert set(ranked) == {"m0", "m1"} and all(0.0 <= fall <= 1.0 for _, fall, _ in mon.attribution)
    assert {a: n for a, _, n in mon.attribution} == {a: mon.kept[POOL].owners.count(a) for a in ("m0", "m1")}
    top = ranked[0]
    # A customer who signs up during the warning (rows of S): never acted on, from its first
    # row on, for none of its rows joins the pool.
    for i in range(12):
        send(mon, [("shopper", mon.S[i : i + 1])])
        mon.link()
        assert "shopper" not in mon.decisions({})
    assert mon.ledger.pooled_by["shopper"] == 0 and mon.pool_standing()
    # A fresh account that keeps probing: acted on once the pool has taken one of its rows.
    send(mon, [("fresh", probes[30][:1])])
    assert "fresh" not in mon.decisions({})  # one row, one feature from none: not pooled
    send(mon, [("fresh", X) for X in probes[31:]])
    mon.link()
    decided = mon.decisions({})
    assert decided[top][0] == "degrade" and decided[top][1].startswith("auto:pool contributor #1")
    assert mon.ledger.pooled_by["fresh"] > 0
    assert decided["fresh"] == ("degrade", "new account whose rows join auto:pool while its warning stands "
                                           f"({mon.ledger.pooled_share('fresh')})")  # fmt: skip
    assert "shopper" not in decided
    assert ({"m0", "m1"} - {top}).isdisjoint(decided)  # top=1, extracting accounts not acted on
    mon.config = MonitorConfig().updated({"pool_response": {"action": "degrade", "top": 1, "hold": 200}})
    other = ({"m0", "m1"} - {top}).pop()
    assert mon.decisions({})[other][1].startswith("extracting account while auto:pool's warning stands")
    # The warning lapses once the pool has taken no row for `hold` of the model's rows.
    send(mon, [(f"later{i}", mon.S[i : i + 1]) for i in range(12, 60)] * 5)
    assert not mon.pool_standing() and mon.decisions({}) == {}


def test_coincidences_one_per_account_wait_and_a_coalition_is_warned() -> None:
    """A benign population's coincidences (rows one feature from another account's row and
    far from S, one per account, among ordinary rows) never reach auto:pool: each account
    shows the signs once, and a heavy customer on under REPEATED_SHARE of its rows. The same
    rows from one account are pooled and warned; path-finding spread over eight accounts shows
    them on nearly every row and is warned."""
    model = replace(credit_model(), policy=Policy(reveal_leaf=True))
    probes = line_searches(model, 8)  # 8 searches of 6 rows, one feature apart, far from S

    def pool_after(stream: list[tuple[str, np.ndarray]]) -> tuple[ModelMonitor, SubjectState]:
        mon = ModelMonitor(model)
        send(mon, stream)
        mon.evaluate_due(set(), {}, 0.0, force=True)
        return mon, mon.pools[POOL]

    S = ModelMonitor(model).S
    customers: list[tuple[str, np.ndarray]] = []
    for i, X in enumerate(probes):  # b_i's row is one feature from a_i's, both far from S
        customers += [(f"c{i}", S[3 * i : 3 * i + 3]), (f"a{i}", X[:1]), (f"b{i}", X[1:2]), (f"b{i}", S[30 + i : 31 + i])]
    # A heavy customer: 60 ordinary rows, then three that show the signs (under 5 % of its rows)
    customers += [("heavy", S)] + [("heavy", probes[i][3:4]) for i in (2, 4, 7)]
    mon, pool = pool_after(customers)
    shown = mon.ledger.shown
    assert shown["heavy"] == REPEATED and REPEATED_SHARE * (S.shape[0] + 3) > REPEATED
    assert sum(shown.values()) >= 8 and max(n for u, n in shown.items() if u != "heavy") < REPEATED
    assert pool.n_queries == 0 and not pool.warned
    _, alone = pool_after([("one", X) for _, X in customers])
    assert alone.warned == {"best_copy"}
    mon, pool = pool_after([(f"k{i}", X) for i, X in enumerate(probes)])
    assert pool.warned == {"best_copy"} and pool.n_queries >= 30
    assert len(set(mon.kept[POOL].owners)) >= 6


def test_link_index_memory_is_bounded() -> None:
    """Past max_keys the oldest keys are forgotten: a row one feature from a forgotten row
    is not flagged, one from a recent row is."""
    link = Linkage(2, max_keys=40)
    link.add("a", np.array([[float(i), 1000.0 + i] for i in range(30)]))  # 60 keys: the oldest quarter-plus goes
    link.flush()
    assert len(link._first) <= 40
    link.add("b", np.array([[0.0, 5.0], [29.0, 5.0]]))  # one feature from row 0 (forgotten) and row 29 (kept)
    assert link.flush().near.tolist() == [False, True]


def test_an_extracting_accounts_every_row_joins_the_pool() -> None:
    """An account with at least EXTRACTING_MIN pooled rows, EXTRACTING_SHARE of its rows,
    brings all its rows (earlier and later natural ones too); a customer's do not join."""
    model = credit_model()
    mon = ModelMonitor(model)
    S = mon.S
    probes = line_searches(model, 4)  # 24 rows, most of them one feature apart and far from S
    send(mon, [("shop", S[:5]), ("p", S[5:10])] + [("p", X) for X in probes] + [("p", S[10:15]), ("shop", S[15:20])])
    mon.evaluate_due(set(), {}, 0.0, force=True)
    owners = mon.kept[POOL].owners
    assert "p" in mon.ledger.extracting and "shop" not in mon.ledger.extracting
    assert owners.count("shop") == 0
    # p's natural rows, before and after its probes, are in the pool with its probes
    rows = {tuple(r) for r in mon.pools[POOL].data(mon.n_features)[0].tolist()}
    assert {tuple(r) for r in S[5:15].astype(np.float32).tolist()} <= rows
