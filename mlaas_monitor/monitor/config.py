"""A model's monitor settings (``MonitorConfig``, with its enforcement rule and pool
response), what the status methods and actions are called, and the one place a JSON patch
of the settings is checked: each bad field a ``ConfigError`` naming it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from mlaas_monitor.monitor.boundary import BOUNDARY_ALARM

# How much of the model a subject holds (extent), and whether its queries look like an
# attack (intent: PRADA's 1 - W, and the share of queries outside the data distribution).
# ``best_copy`` is the status with a stated meaning: the extent (balanced fidelity beyond a
# constant copy) of the best reconstruction the suite knows how to build from exactly what the
# subject was answered; the others are its ingredients and the published signals.
# ``boundary``: Quiring et al.'s closeness to the boundary (boundary.py), reported beside PRADA.
EXTENT_METHODS = ("ig", "coverage_volume", "coverage_mass", "fidelity", "combined", "best_copy")
INTENT_METHODS = ("prada", "ood", "boundary")
METHODS = (*EXTENT_METHODS, *INTENT_METHODS)
ACTIONS = ("none", "degrade", "refuse")
PRADA_DELTA = 0.78


class ConfigError(ValueError):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        # The field's name as the API spells it, and what is wrong with its value
        self.field, self.problem = field, problem


@dataclass(frozen=True)
class Enforcement:
    action: str = "none"  # none | degrade (drop confidence and leaf id) | refuse
    method: str = "best_copy"  # the status with a stated meaning (docs/monitor.md)
    threshold: float = 0.8  # acts when the subject's status reaches this, in [0, 1]
    # Act only on a subject whose query stream is also attack-like (PRADA alarm): a benign
    # customer who has learnt the model by natural use is warned about, not cut off.
    intent: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "method": self.method, "threshold": self.threshold, "intent": self.intent}


@dataclass(frozen=True)
class PoolResponse:
    """What enforcement does while auto:pool's warning stands (pool.py): ``action`` for the
    ``top`` accounts whose rows the pool's extent falls most without (attribution), and, with
    ``new_accounts``, for every account first seen since the warning once the pool has taken
    one of its rows (a coalition whose contributors are cut off moves to fresh accounts; a
    customer signing up meanwhile, whose rows do not join the pool, is left alone)."""

    action: str = "none"  # none | degrade (labels only) | refuse
    top: int = 3  # accounts ranked by how much the pool's extent falls without their rows
    # and every extracting account (most of its rows join the pool: EXTRACTING_*), however
    # little its removal alone lowers the extent: a coalition spreads its leaves over many
    extracting: bool = True
    new_accounts: bool = True  # and every account first seen since the warning with a row in the pool
    # The warning stands while the pool keeps growing: it took a row within this many of the
    # model's latest answered rows (the pool's status is a running maximum and never falls).
    hold: int = 1000

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "top": self.top, "extracting": self.extracting, "new_accounts": self.new_accounts,
                "hold": self.hold}  # fmt: skip


@dataclass(frozen=True)
class MonitorConfig:
    """Per model. ``thresholds``: a warning per subject and method when its status reaches it."""

    # best_copy estimates what a subject holds (docs/monitor.md, "What the status means"), so
    # its threshold is a share of the model: at 0.5 a warning comes when the subject could
    # copy half of what separates the model from a constant guess, well before it holds
    # 0.9 balanced fidelity (monitor-eval's goals table, docs/monitor.md).
    thresholds: dict[str, float] = field(default_factory=lambda: {"best_copy": 0.5})
    default_method: str = "best_copy"  # one of METHODS: the status the pools, the admin views and monitor-eval read
    # A subject's first evaluation: after 10 queries, then at min_refit and on the schedule.
    # On an easy model a customer's first rows already make a copy (breast_cancer's natural
    # sampler held bf 0.9 after 21 queries, before the first evaluation at 25); one more
    # small evaluation per account is the cost (docs/monitor.md, "Cost").
    first_eval: int = 10
    min_refit: int = 25  # evaluate (coverage, warnings) at most every this many queries...
    refit_fraction: float = 0.05  # ... or this fraction of the subject's queries, whichever is more
    # T_u (the costly part) is refitted every max(min_refit, this * n) queries. 0.05, as the
    # evaluations: best_copy is then the subject's tree copy as of each evaluation, never a
    # stale one (at 0.5 random queries on Adult were warned 49 queries after bf 0.9; 0.1
    # left best_copy up to 0.2 below the truth between refits).
    ig_refit_fraction: float = 0.05
    auto_k: int = 0  # >= 2: also pool the k users with the highest status (automatic collusion)
    auto_link: bool = True  # pool accounts whose queries differ from each other's in one feature (linkage.py)
    link_min: int = 3  # linking queries that join two accounts
    # Pool rows by what they look like, from any account (pool.py): auto:pool (rows out of
    # distribution, in a boundary margin or one feature from an earlier row), auto:young (rows
    # of accounts before their first evaluation) and auto:model (every row: the exposure).
    pool: bool = True
    # Evaluate (and refit) a subject when an answer shows it a leaf identity it had not seen
    # (at most one evaluation per identity beyond the schedule).
    reveal_eval: bool = True
    # auto:young (every row an account sent before its first evaluation) is warned when its
    # default-method status reaches this: the owner's budget for what accounts too young to
    # be evaluated hold together. None (the default): reported, not warned, because ordinary
    # customers' first rows together copy an easy model (German credit: 50 benign users'
    # first rows held 0.76 after 221 of them; docs/monitor.md).
    young_budget: float | None = None
    # auto:pool is warned when its default-method status reaches this, lower than a
    # customer's threshold: none of the four evaluation datasets' benign rows joined the pool,
    # and a coalition's extent jumps by a leaf at a time (0.15-0.3 on wine's 7 leaves), so a
    # warning at 0.5 came when it held 0.77-0.93 there.
    pool_threshold: float = 0.25
    prada_delta: float = PRADA_DELTA  # PRADA alarm when Shapiro-Wilk W < delta (status prada >= 1 - delta)
    prada_min_queries: int = 50  # distances before PRADA says anything
    ood_alarm: float = 0.5  # intent alarm when the out-of-distribution status reaches this
    ood_min_queries: int = 30  # queries before it says anything
    boundary_alarm: float = BOUNDARY_ALARM  # Quiring et al.'s alarm on the mean in-margin ratio (reported, not acted on)
    enforcement: Enforcement = Enforcement()  # the per-subject rule: what is done to a subject past its threshold
    pool_response: PoolResponse = PoolResponse()  # what is done while auto:pool's warning stands

    def to_dict(self) -> dict[str, Any]:
        return {
            "thresholds": dict(self.thresholds),
            "default_method": self.default_method,
            "first_eval": self.first_eval,
            "min_refit": self.min_refit,
            "refit_fraction": self.refit_fraction,
            "ig_refit_fraction": self.ig_refit_fraction,
            "auto_k": self.auto_k,
            "auto_link": self.auto_link,
            "link_min": self.link_min,
            "pool": self.pool,
            "reveal_eval": self.reveal_eval,
            "young_budget": self.young_budget,
            "pool_threshold": self.pool_threshold,
            "prada_delta": self.prada_delta,
            "prada_min_queries": self.prada_min_queries,
            "ood_alarm": self.ood_alarm,
            "ood_min_queries": self.ood_min_queries,
            "boundary_alarm": self.boundary_alarm,
            "enforcement": self.enforcement.to_dict(),
            "pool_response": self.pool_response.to_dict(),
        }

    def updated(self, patch: Any) -> MonitorConfig:
        """Apply a JSON patch; raises ConfigError naming the field."""
        if type(patch) is not dict:
            raise ConfigError("body", "expected a JSON object")
        kw: dict[str, Any] = {}
        for key, v in patch.items():
            check = FIELD_CHECKS.get(key)
            if check is None:
                raise ConfigError(str(key)[:40], "unknown field")
            kw[key] = check(key, v, self)
        return replace(self, **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MonitorConfig:
        return cls().updated(d)


def _unit(v: Any, where: str) -> float:
    if type(v) not in (int, float) or not 0 <= v <= 1:
        raise ConfigError(where, "expected a number from 0 to 1")
    return float(v)


def _enforcement(v: Any, old: Enforcement) -> Enforcement:
    if type(v) is not dict:
        raise ConfigError("enforcement", "expected an object with action, method, threshold")
    kw: dict[str, Any] = {}
    for key, x in v.items():
        if key == "action":
            if x not in ACTIONS:
                raise ConfigError("enforcement.action", f"expected one of {', '.join(ACTIONS)}")
            kw[key] = x
        elif key == "method":
            if x not in METHODS:
                raise ConfigError("enforcement.method", f"expected one of {', '.join(METHODS)}")
            kw[key] = x
        elif key == "threshold":
            kw[key] = _unit(x, "enforcement.threshold")
        elif key == "intent":
            if type(x) is not bool:
                raise ConfigError("enforcement.intent", "expected true or false")
            kw[key] = x
        else:
            raise ConfigError(f"enforcement.{str(key)[:40]}", "unknown field")
    return replace(old, **kw)


def _pool_response(v: Any, old: PoolResponse) -> PoolResponse:
    if type(v) is not dict:
        raise ConfigError("pool_response", "expected an object with action, top, extracting, new_accounts, hold")
    kw: dict[str, Any] = {}
    for key, x in v.items():
        where = f"pool_response.{str(key)[:40]}"
        if key == "action":
            if x not in ACTIONS:
                raise ConfigError(where, f"expected one of {', '.join(ACTIONS)}")
        elif key in ("top", "hold"):
            if type(x) is not int or not 0 <= x <= 1_000_000:
                raise ConfigError(where, "expected an integer from 0 to 1000000")
        elif key in ("new_accounts", "extracting"):
            if type(x) is not bool:
                raise ConfigError(where, "expected true or false")
        else:
            raise ConfigError(where, "unknown field")
        kw[key] = x
    return replace(old, **kw)


def _thresholds(key: str, v: Any, old: MonitorConfig) -> dict[str, float]:
    if type(v) is not dict:
        raise ConfigError("thresholds", "expected an object of method: threshold")
    th = {}
    for m, t in v.items():
        if m not in METHODS:
            raise ConfigError(f"thresholds.{str(m)[:40]}", f"unknown method (expected one of {', '.join(METHODS)})")
        if t is not None:
            th[m] = _unit(t, f"thresholds.{m}")
    return th


def _method(key: str, v: Any, old: MonitorConfig) -> str:
    if v not in METHODS:
        raise ConfigError(key, f"expected one of {', '.join(METHODS)}")
    return str(v)


def _count(key: str, v: Any, old: MonitorConfig) -> int:
    if type(v) is not int or not 1 <= v <= 1_000_000:
        raise ConfigError(key, "expected an integer from 1 to 1000000")
    return v


def _fraction(key: str, v: Any, old: MonitorConfig) -> float:
    if type(v) not in (int, float) or not 0 <= v <= 10:
        raise ConfigError(key, "expected a number from 0 to 10")
    return float(v)


def _auto_k(key: str, v: Any, old: MonitorConfig) -> int:
    if type(v) is not int or not (v == 0 or 2 <= v <= 1000):
        raise ConfigError(key, "expected 0 (off) or an integer from 2 to 1000")
    return v


def _switch(key: str, v: Any, old: MonitorConfig) -> bool:
    if type(v) is not bool:
        raise ConfigError(key, "expected true or false")
    return v


def _share(key: str, v: Any, old: MonitorConfig) -> float:
    return _unit(v, key)


def _share_or_none(key: str, v: Any, old: MonitorConfig) -> float | None:
    return None if v is None else _unit(v, key)


# MonitorConfig's fields as a JSON patch may set them -> each one's check: (field, value,
# the config patched) -> the value to set, or ConfigError naming the field.
FIELD_CHECKS: dict[str, Callable[[str, Any, MonitorConfig], Any]] = {
    "thresholds": _thresholds,
    "default_method": _method,
    "min_refit": _count, "first_eval": _count,
    "refit_fraction": _fraction, "ig_refit_fraction": _fraction,
    "auto_k": _auto_k,
    "auto_link": _switch, "pool": _switch, "reveal_eval": _switch,
    "link_min": _count, "prada_min_queries": _count, "ood_min_queries": _count,
    "young_budget": _share_or_none,
    "prada_delta": _share, "ood_alarm": _share, "boundary_alarm": _share, "pool_threshold": _share,
    "enforcement": lambda key, v, old: _enforcement(v, old.enforcement),
    "pool_response": lambda key, v, old: _pool_response(v, old.pool_response),
}  # fmt: skip
