"""The per-model monitor state machine: determinism, collusion as merged summaries, the
automatic top-k pool, warnings, enforcement decisions and config validation."""

from __future__ import annotations

import numpy as np
import pytest

from mlaas_monitor.monitor.config import EXTENT_METHODS, ConfigError, MonitorConfig
from mlaas_monitor.monitor.core import ModelMonitor
from tests.test_gateway_helpers import credit_model


def queries(seed: int, n: int) -> np.ndarray:
    """Uniform queries over the credit model's domain (encoded)."""
    m = credit_model()
    rng = np.random.default_rng(seed)
    lo = np.array([f.min for f in m.schema.features])
    hi = np.array([f.max for f in m.schema.features])
    return np.floor(rng.uniform(lo, hi + 1, size=(n, len(lo))))


def feed(mon: ModelMonitor, stream: list[tuple[str, np.ndarray]], groups: dict[str, tuple[str, ...]] | None = None) -> list:  # type: ignore[type-arg]
    out = []
    for seq, (user, X) in enumerate(stream, 1):
        mon.ingest(user, X, mon.tree.value[mon.tree.apply(X)].argmax(axis=1), seq)
        evals, _ = mon.evaluate_due({user}, groups or {}, float(seq))
        out += evals
    return out


def test_same_events_same_history() -> None:
    stream = [(f"u{i % 3}", queries(i, 1 + i % 4)) for i in range(120)]
    a = feed(ModelMonitor(credit_model()), stream)
    b = feed(ModelMonitor(credit_model()), stream)
    assert [(e.subject, e.n_queries, e.status) for e in a] == [(e.subject, e.n_queries, e.status) for e in b]
    assert len(a) > 6


def test_group_status_equals_one_user_with_all_the_queries() -> None:
    batches = [queries(100 + i, 3) for i in range(90)]
    colluders = ModelMonitor(credit_model())
    evals = feed(colluders, [(f"c{i % 3}", X) for i, X in enumerate(batches)], {"g": ("c0", "c1", "c2")})
    single = ModelMonitor(credit_model())
    one = feed(single, [("solo", X) for X in batches])
    # Extent (how much is held) pools exactly; intent is the most attack-like member's.
    def extent(st: dict[str, float]) -> dict[str, float]:
        return {m: st[m] for m in EXTENT_METHODS}

    group_hist = {e.n_queries: extent(e.status) for e in evals if e.subject == "group:g"}
    solo_hist = {e.n_queries: extent(e.status) for e in one if e.subject == "solo"}
    assert group_hist == solo_hist  # same schedule, same statuses, exactly
    g = colluders.groups["group:g"]
    assert extent(g.status) == extent(single.users["solo"].status)
    colluders.evaluate_due({"c0", "c1", "c2"}, {"g": ("c0", "c1", "c2")}, 0.0, force=True)
    assert g.status["prada"] == max(colluders.users[m].status["prada"] for m in ("c0", "c1", "c2"))
    assert g.members == ("c0", "c1", "c2")
    # each member alone covers less than the group
    for m in ("c0", "c1", "c2"):
        assert colluders.users[m].status["coverage_volume"] <= g.status["coverage_volume"]


def test_automatic_mode_pools_the_top_k() -> None:
    mon = ModelMonitor(credit_model(), MonitorConfig(auto_k=2, min_refit=5))
    stream = [("big", queries(i, 5)) for i in range(30)] + [("mid", queries(50 + i, 2)) for i in range(10)]
    stream += [("small", queries(90, 1))]
    evals = feed(mon, stream)
    auto = [e for e in evals if e.subject == "auto:top2"]
    assert auto, "the automatic pool was never evaluated"
    last = mon.groups["auto:top2"]
    ranked = sorted(mon.users.values(), key=lambda u: (-u.status["coverage_mass"], u.name))
    assert set(last.members) == {u.name for u in ranked[:2]}


def test_warnings_fire_once_per_subject_and_method() -> None:
    mon = ModelMonitor(credit_model(), MonitorConfig(thresholds={"coverage_mass": 0.05, "ig": 0.05}, min_refit=5))
    warns = []
    for seq in range(1, 80):
        X = queries(seq, 4)
        mon.ingest("u", X, mon.tree.value[mon.tree.apply(X)].argmax(axis=1), seq)
        warns += mon.evaluate_due({"u"}, {}, float(seq))[1]
    assert sorted(w.method for w in warns if w.subject == "u") == ["coverage_mass", "ig"]
    assert all(w.status >= 0.05 for w in warns)
    # The pools (the same rows, pooled by what they are) warn too, each once per method.
    assert len({(w.subject, w.method) for w in warns}) == len(warns)
    assert {w.subject for w in warns} <= {"u", "auto:pool", "auto:young"}


def test_enforcement_decision_covers_groups() -> None:
    cfg = MonitorConfig().updated({"enforcement": {"action": "refuse", "method": "coverage_mass", "threshold": 0.2,
                                                   "intent": False}})  # fmt: skip
    mon = ModelMonitor(credit_model(), cfg)
    groups = {"g": ("a", "b")}
    feed(mon, [("a", queries(i, 6)) if i % 2 else ("b", queries(i, 6)) for i in range(40)], groups)
    assert mon.groups["group:g"].status["coverage_mass"] >= 0.2
    assert mon.enforcement_for("a", groups) == "refuse"
    assert mon.enforcement_for("nobody", groups) == "none"
    assert ModelMonitor(credit_model()).enforcement_for("a", groups) == "none"


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"thresholds": {"magic": 0.5}}, "thresholds.magic"),
        ({"thresholds": {"ig": 2}}, "thresholds.ig"),
        ({"thresholds": []}, "thresholds"),
        ({"default_method": "vibes"}, "default_method"),
        ({"min_refit": 0}, "min_refit"),
        ({"refit_fraction": "x"}, "refit_fraction"),
        ({"auto_k": 1}, "auto_k"),
        ({"enforcement": {"action": "ban"}}, "enforcement.action"),
        ({"enforcement": {"threshold": -1}}, "enforcement.threshold"),
        ({"enforcement": {"colour": 1}}, "enforcement.colour"),
        ({"nope": 1}, "nope"),
        ([], "body"),
    ],
)
def test_config_errors_name_the_field(patch: object, field: str) -> None:
    with pytest.raises(ConfigError) as e:
        MonitorConfig().updated(patch)
    assert e.value.field == field


def test_config_round_trips() -> None:
    cfg = MonitorConfig().updated({"thresholds": {"ig": 0.7}, "auto_k": 3, "enforcement": {"action": "degrade"}})
    assert MonitorConfig.from_dict(cfg.to_dict()) == cfg


def test_enforcement_acts_on_extent_and_intent_together() -> None:
    """Warn on extraction, act on extraction with an attack-like stream: a subject over the
    threshold whose queries are rows of the data is left alone; one whose queries are
    uniform over the domain (out of the data distribution) is refused."""
    from tests.test_attack_strategies import wine_model

    model = wine_model()
    cfg = MonitorConfig().updated({"enforcement": {"action": "refuse", "method": "combined", "threshold": 0.3},
                                   "min_refit": 5})  # fmt: skip
    mon = ModelMonitor(model, cfg)
    natural = model.validation_X
    lo, hi = np.array([f.min for f in model.schema.features]), np.array([f.max for f in model.schema.features])
    uniform = np.random.default_rng(3).uniform(lo, hi, size=(natural.shape[0], len(lo)))
    labels = mon.tree.value[mon.tree.apply(natural)].argmax(axis=1)
    for i, x in enumerate(natural):
        mon.ingest("shopper", x[None, :], labels[i : i + 1], 2 * i + 1)
        ux = uniform[i : i + 1]
        mon.ingest("scraper", ux, mon.tree.value[mon.tree.apply(ux)].argmax(axis=1), 2 * i + 2)
    mon.evaluate_due({"shopper", "scraper"}, {}, 1.0, force=True)
    shopper, scraper = mon.users["shopper"], mon.users["scraper"]
    assert shopper.status["combined"] >= 0.3 and scraper.status["combined"] >= 0.3
    assert shopper.status["ood"] < cfg.ood_alarm <= scraper.status["ood"]
    assert mon.enforcement_for("shopper", {}) == "none"
    assert mon.enforcement_for("scraper", {}) == "refuse"


def test_a_pool_of_small_accounts_is_out_of_distribution_together() -> None:
    """Sybil accounts too small for any intent signal alone (10 queries each, below
    ood_min_queries) are out of the data distribution as a pool."""
    from tests.test_attack_strategies import wine_model

    model = wine_model()
    mon = ModelMonitor(model, MonitorConfig(min_refit=5))
    lo, hi = np.array([f.min for f in model.schema.features]), np.array([f.max for f in model.schema.features])
    X = np.random.default_rng(5).uniform(lo, hi, size=(80, len(lo)))
    members = tuple(f"s{i}" for i in range(8))
    for i in range(80):
        mon.ingest(members[i // 10], X[i : i + 1], mon.tree.value[mon.tree.apply(X[i : i + 1])].argmax(axis=1), i + 1)
    mon.evaluate_due(set(members), {"ring": members}, 0.0, force=True)
    assert all(mon.users[m].status["ood"] == 0.0 for m in members)  # 10 queries: no evidence alone
    pool = mon.groups["group:ring"]
    assert pool.status["ood"] >= mon.config.ood_alarm and mon.attack_like(pool)
