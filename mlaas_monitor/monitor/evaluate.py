"""``analysim monitor-eval``: train a model on any table, serve it on loopback with the
monitor, send a benign population and every attacker through real HTTP, and measure how
well each status method estimates what each subject truly holds.

Truth is *balanced fidelity* (mean over the owner's labels of the share of held-out rows
with that label the subject's copy labels alike: a constant copy scores 1/K however skewed
the labels), read on the status scale as *extent* = (bf − 1/K) / (1 − 1/K), the share of
the model held beyond a constant guess. Per method and curve: calibration error (mean
|status − extent| over the monitor's evaluation points), the first warning (the first
point at or above the method's threshold), whether it was right (the subject's extent then
was at least threshold − margin: *warning precision*), and the *lead* (queries from the
first warning to balanced fidelity 0.9). PRADA (intent) is reported as alarms.

Writes DIR/curves.csv (strategy, subject, n_queries, metric, value), DIR/summary.json,
DIR/table.md and PNG plots (status vs queries per method with the truth overlaid).
"""

from __future__ import annotations

import csv
import json
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from analysim.errors import UserError
from mlaas_monitor.datasets import TableOptions, load_dataset
from mlaas_monitor.model import Policy
from mlaas_monitor.monitor.adaptive import AccountOracle, AdaptivePathfinding, Checkpoint
from mlaas_monitor.monitor.attacks import (
    ApiClient,
    BoxRebuild,
    Oracle,
    PacedOracle,
    Pathfinding,
    SybilOracle,
    TreeRebuild,
    agreement,
    balanced_fidelity,
    box_copies,
    boxes_from_oracle,
    confidence_identity,
    rebuild_from_log,
    rounding_identity,
    run_natural,
    run_random,
)
from mlaas_monitor.monitor.attribution import ATTRIBUTION_MODELS, run_attribution
from mlaas_monitor.monitor.boundary import BOUNDARY_ALARM
from mlaas_monitor.monitor.client import local_monitor_extension
from mlaas_monitor.monitor.core import EXTENT_METHODS, METHODS
from mlaas_monitor.monitor.linkage import LINK_PREFIX
from mlaas_monitor.monitor.pool import POOL
from mlaas_monitor.server import GatewayThread
from mlaas_monitor.service import Gateway
from mlaas_monitor.store import Store
from mlaas_monitor.training import encode_dataset, holdout_split, train_model

ATTACKERS = ("random", "pathfinding", "colluding", "sybil", "natural", "confidence", "slow")
# adaptive: path-finding that knows the monitor and stays under its threshold over k
# accounts (adaptive.py), once per k in --adaptive-accounts; reported in a table of its own.
# policies: the same tree served under each response policy of RESPONSE_POLICIES (output
# post-processing as a defence), attacked by path-finding and natural sampling.
# natural_sybil: k accounts each sending fewer than first_eval rows of the data (none is ever
# evaluated alone), on a model copy of its own; what they hold pooled offline, against what
# the monitor's pools (auto:young, auto:pool) and the exposure say.
# attribution: an adaptive coalition and a benign population on one model at once, with the
# pool response on; whose accounts the monitor acted on (attribution.py).
EVAL_STRATEGIES = ("benign", *ATTACKERS, "adaptive", "natural_sybil", "policies", "attribution")
RESPONSE_POLICIES = {
    "leaf ids + confidence (2 decimals)": Policy(reveal_leaf=True, price_micros=0),
    "confidence, 2 decimals (BigML)": Policy(price_micros=0),
    "confidence, 1 decimal": Policy(confidence_decimals=1, price_micros=0),
    "label only": Policy(reveal_confidence=False, price_micros=0),
    # Appended, so that the rows above keep their seeds (seed + 10 * index).
    "top-2 confidences (2 decimals)": Policy(top_k=2, price_micros=0),
    "noise on confidences (sd 0.05, 2 decimals)": Policy(confidence_noise=0.05, noise_seed=1, price_micros=0),
}
# How the attackers read leaf identities under a policy (default: the leaf id, else label and
# confidence as revealed). Under noise, read as they are, every answer is a new leaf and
# path-finding never finishes one; the attacker rounds the noise away to one decimal.
POLICY_IDENTITY = {"noise on confidences (sd 0.05, 2 decimals)": rounding_identity(1)}
POLICY_ATTACKERS = ("pathfinding", "natural")
MODEL_ID = "target"
GROUP = "colluders"
SWEEP = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
PATHFINDING_BASED = ("pathfinding", "colluding", "sybil", "confidence", "slow")


@dataclass(frozen=True)
class EvalOptions:
    dataset: str
    out: Path
    strategies: tuple[str, ...] = EVAL_STRATEGIES
    accounts: int = 3
    max_leaf_nodes: int | None = 26
    max_depth: int | None = None
    target: str | None = None
    table: TableOptions = field(default_factory=TableOptions)
    seed: int = 0
    budget: int = 2000  # random and natural; pathfinding runs until its queue is empty
    pathfinding_budget: int = 20000
    collude_base: str = "pathfinding"
    oracle: str = "leaf"  # leaf: the policy reveals leaf ids; confidence: label + confidence only
    benign_users: int = 50
    benign_median_queries: int = 40  # per-user volumes: log-normal around this, sigma 1
    margin: float = 0.1
    reference_queries: int | None = None  # a published path-finding count to compare with
    sybil_queries: int = 100  # per sybil account
    slow_pause_s: float = 0.001
    adaptive_accounts: tuple[int, ...] = (1, 4, 16)
    adaptive_safety: float = 0.1  # an adaptive account retires this far below the threshold
    natural_sybil_accounts: int = 100  # accounts of the natural sybil, each first_eval - 1 rows
    # adaptive runs that also know the pool: each probe moved by a hair in a continuous feature
    adaptive_pool_aware: tuple[int, ...] = ()
    adaptive_response: str = "none"  # the pool response (labels only: degrade; refuse) on the adaptive runs' models
    attribution_accounts: int = 16  # the coalition's accounts in the attribution experiment


# ---- curves and their analysis (pure) ----


def first_at_least(curve: list[tuple[int, float]], level: float) -> int | None:
    for n, v in curve:
        if v >= level:
            return n
    return None


def value_at(curve: list[tuple[int, float]], n: int) -> float | None:
    """The last recorded value at or before query n."""
    best = None
    for k, v in curve:
        if k > n:
            break
        best = v
    return best


def running_max(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Each point's value raised to the largest so far: what a subject holds, since a copy
    built once stays built (the subject keeps the copy it made from fewer answers)."""
    out, best = [], -math.inf
    for n, v in points:
        best = max(best, v)
        out.append((n, best))
    return out


def extent(bf: float, k: int) -> float:
    """Balanced fidelity on the status scale: 0 for a constant copy, 1 for an exact one."""
    return float(min(1.0, max(0.0, (bf - 1.0 / k) / (1.0 - 1.0 / k))))


@dataclass
class SubjectCurve:
    """One subject's monitor history and the truth about it."""

    strategy: str
    subject: str
    status: list[tuple[int, dict[str, float]]]  # (queries, status per method) at each evaluation
    truth: list[tuple[int, float]]  # (queries, balanced fidelity of its copy), as the attack went
    # The same truth computed at each status point from exactly the queries the monitor had
    # folded by then (None: read ``truth`` at or before the point).
    aligned: list[tuple[int, float]] | None = None
    pointwise: list[tuple[int, float]] | None = field(default=None, init=False)  # ``aligned`` before the running maximum

    def __post_init__(self) -> None:
        # What the subject holds is the best copy it has built so far (the status, best_copy,
        # is a running maximum for the same reason: docs/monitor.md). At the status points:
        # the best over the same points the status saw (a copy between two evaluations is
        # not one the monitor can score; curves.csv keeps each point's own copy too).
        self.pointwise = self.aligned
        self.truth = running_max(self.truth)
        if self.aligned is not None:
            self.aligned = running_max(self.aligned)

    def truth_at(self, n: int) -> float | None:
        if self.aligned is not None:
            return dict(self.aligned).get(n, value_at(self.truth, n))
        return value_at(self.truth, n)

    def method(self, m: str) -> list[tuple[int, float]]:
        return [(n, s.get(m, 0.0)) for n, s in self.status]


def analyse_curve(
    c: SubjectCurve, thresholds: dict[str, float], margin: float, k: int, delta: float, ood_alarm: float = 0.5,
    boundary_alarm: float = BOUNDARY_ALARM,
) -> dict[str, Any]:
    q90 = first_at_least(c.truth, 0.9)
    out: dict[str, Any] = {"queries": c.status[-1][0] if c.status else 0, "queries_to_bf_090": q90,
                           "queries_to_bf_099": first_at_least(c.truth, 0.99),
                           "final_bf": c.truth[-1][1] if c.truth else None, "methods": {}}  # fmt: skip
    for m in EXTENT_METHODS:
        pts = c.method(m)
        signed = [v - extent(c.truth_at(n) or 1.0 / k, k) for n, v in pts]
        errs = [abs(e) for e in signed]
        t = thresholds.get(m, 0.5)
        w = first_at_least(pts, t)
        ext_w = extent(c.truth_at(w) or 1.0 / k, k) if w is not None else None
        out["methods"][m] = {
            "calibration_error": float(np.mean(errs)) if errs else None,
            # How far the status ever fell below the truth (0 if never).
            "max_below_truth": float(max(0.0, -min(signed))) if signed else None,
            "threshold": t,
            "first_warning": w,
            "extent_at_warning": ext_w,
            "warning_right": None if w is None else bool(ext_w is not None and ext_w >= t - margin - 1e-9),
            "lead": None if w is None or q90 is None else q90 - w,
            "final_status": pts[-1][1] if pts else 0.0,
        }
    prada = c.method("prada")
    out["prada_alarm_at"] = first_at_least(prada, 1.0 - delta)
    out["prada_final"] = prada[-1][1] if prada else 0.0
    out["ood_alarm_at"] = first_at_least(c.method("ood"), ood_alarm)
    # Quiring et al.'s alarm: the mean in-margin ratio above their threshold.
    out["boundary_alarm_at"] = next((n for n, v in c.method("boundary") if v > boundary_alarm), None)
    out["boundary_final"] = c.method("boundary")[-1][1] if c.status else 0.0
    return out


def aggregate(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per method over a strategy's curves: calibration error, warnings, right ones, lead."""
    agg: dict[str, Any] = {"curves": len(results), "methods": {}}
    for m in EXTENT_METHODS:
        rs = [r["methods"][m] for r in results]
        errs = [r["calibration_error"] for r in rs if r["calibration_error"] is not None]
        warned = [r for r in rs if r["first_warning"] is not None]
        right = [r for r in warned if r["warning_right"]]
        leads = [r["lead"] for r in rs if r["lead"] is not None]
        agg["methods"][m] = {
            "calibration_error": float(np.mean(errs)) if errs else None,
            "max_below_truth": max((r["max_below_truth"] for r in rs if r["max_below_truth"] is not None), default=None),
            "warnings": len(warned),
            "right_warnings": len(right),
            "warning_precision": len(right) / len(warned) if warned else None,
            "first_warning": min((r["first_warning"] for r in warned), default=None),
            "lead": min(leads) if leads else None,
        }
    agg["prada_alarms"] = sum(r["prada_alarm_at"] is not None for r in results)
    agg["ood_alarms"] = sum(r["ood_alarm_at"] is not None for r in results)
    agg["boundary_alarms"] = sum(r["boundary_alarm_at"] is not None for r in results)
    agg["first_boundary_alarm"] = min((r["boundary_alarm_at"] for r in results if r["boundary_alarm_at"] is not None), default=None)
    agg["queries_to_bf_090"] = results[0]["queries_to_bf_090"] if len(results) == 1 else None
    agg["reached_bf_090"] = sum(r["queries_to_bf_090"] is not None for r in results)
    return agg


def sweep(curves: list[SubjectCurve], margin: float, k: int, delta: float) -> dict[str, Any]:
    """Per method and threshold: warning precision over every curve, and the attackers not
    warned before balanced fidelity 0.9 (what the defaults are chosen from)."""
    out: dict[str, Any] = {}
    for m in EXTENT_METHODS:
        out[m] = {}
        for t in SWEEP:
            rs = [(c.strategy, analyse_curve(c, dict.fromkeys(EXTENT_METHODS, t), margin, k, delta)) for c in curves]
            warned = [r["methods"][m] for _, r in rs if r["methods"][m]["first_warning"] is not None]
            late = sorted({s for s, r in rs if s != "benign" and not _warned_in_time(r, m)})
            benign_wrong = sum(1 for s, r in rs if s == "benign" and r["methods"][m]["warning_right"] is False)
            out[m][str(t)] = {
                "warning_precision": sum(bool(r["warning_right"]) for r in warned) / len(warned) if warned else None,
                "warnings": len(warned),
                "benign_false_alarms": benign_wrong,
                "attackers_late": late,
            }
    return out


def _warned_in_time(r: dict[str, Any], m: str) -> bool:
    """Warned before balanced fidelity 0.9 — or never reached it (then no warning is due)."""
    w, q90 = r["methods"][m]["first_warning"], r["queries_to_bf_090"]
    return q90 is None or (w is not None and w < q90)


# ---- running it ----


def best_copy(copies: list[Any], X: np.ndarray, truth: list[Any]) -> tuple[float, float]:
    """(balanced fidelity, plain agreement) of the best of these copies (None: not built)."""
    return max((balanced_fidelity(c, X, truth), agreement(c, X, truth)) for c in copies if c is not None)


class FidelityTracker:
    """What the attacker truly holds, as the attack goes: the balanced fidelity of the best
    of the copies the suite knows how to build from its answers — the leaf boxes
    path-finding discovered, the boxes of the leaf identities it was told (whatever it
    queried), path-finding's reading of those answers (star boxes) and a tree fitted on every
    answer it got. Recorded after each request that added a leaf for path-finding, and every
    ~2 % of queries; each point is the best copy so far (a copy built once stays built)."""

    def __init__(self, X: np.ndarray, truth: list[Any]) -> None:
        self.X, self.truth = X, truth
        self.curve: list[tuple[int, float]] = []  # balanced
        self.raw: list[tuple[int, float]] = []  # plain agreement
        self._next = 1
        self._leaves = -1
        self.box: BoxRebuild | None = None
        self.explored: list[tuple[int, int]] = []  # (queries, leaves path-finding had explored by then)

    def _record(self, n: int, rebuilt: Any, oracle: Oracle) -> None:
        best = best_copy([rebuilt, rebuild_from_log(oracle), *boxes_from_oracle(oracle)], self.X, self.truth)
        # The best copy so far: the attacker keeps the copies it built from fewer answers.
        self.curve.append((n, max(best[0], self.curve[-1][1]) if self.curve else best[0]))
        self.raw.append((n, best[1]))

    def __call__(self, oracle: Oracle) -> None:
        if self.box is not None:
            if not self.explored or self.explored[-1][1] != len(self.box.leaves):
                self.explored.append((oracle.queries, len(self.box.leaves)))
            # When a leaf is added (the box copy changes), and as the answers pile up (the
            # tree copy changes).
            if len(self.box.leaves) != self._leaves or oracle.queries >= self._next:
                self._leaves = len(self.box.leaves)
                self._record(oracle.queries, self.box, oracle)
                self._next = oracle.queries + max(10, oracle.queries // 50)
            return
        if oracle.queries >= self._next:
            self._record(oracle.queries, None, oracle)
            self._next = oracle.queries + max(10, oracle.queries // 50)

    def truth_at(self, oracle: Oracle, points: list[int]) -> list[tuple[int, float]]:
        """The balanced fidelity of the best copy from exactly the first n queries, for each
        n in ``points`` (the monitor's evaluation points): what its status is compared with."""
        X = np.concatenate(oracle.log_X) if oracle.log_X else np.empty((0, oracle.domain.d))
        out = []
        for n in points:
            copies: list[Any] = [TreeRebuild(X[:n], oracle.log_labels[:n]),
                                 *box_copies(oracle.domain, X[:n], oracle.log_labels[:n], oracle.log_ident[:n])]  # fmt: skip
            if self.box is not None:
                done = max((c for q, c in self.explored if q <= n), default=0)
                copies.append(BoxRebuild(self.box.domain, self.box.leaves[:done]))
            out.append((n, best_copy(copies, self.X, self.truth)[0]))
        return out

    def finish(self, oracle: Oracle, rebuilt: Any) -> float:
        if self.curve and self.curve[-1][0] == oracle.queries:
            self.curve.pop()
            self.raw.pop()
        self._record(oracle.queries, rebuilt, oracle)
        return self.curve[-1][1]


@dataclass
class _Run:
    url: str
    admin: ApiClient
    opts: EvalOptions
    held_X: np.ndarray
    truth: list[str]
    train_X: np.ndarray
    rows: list[tuple[str, str, int, str, float]] = field(default_factory=list)  # curves.csv
    curves: list[SubjectCurve] = field(default_factory=list)
    on_queries: Callable[[str, int], None] | None = None  # progress: (strategy, queries sent so far)
    _users: int = 0

    def new_key(self, name: str | None = None) -> str:
        self._users += 1
        name = name or f"acct-{self._users}"
        return str(self.admin.call("POST", "/v1/admin/users", {"name": name})["api_key"])

    def history(self, subject: str, model_id: str = MODEL_ID) -> dict[str, Any]:
        return self.admin.call("GET", f"/v1/admin/monitor/{model_id}/subjects/{subject}")  # type: ignore[no-any-return]

    def add_curve(self, strategy: str, subject: str, hist: dict[str, Any], truth: list[tuple[int, float]],
                  raw: list[tuple[int, float]] | None = None,
                  aligned: list[tuple[int, float]] | None = None) -> SubjectCurve:  # fmt: skip
        pts = [(p["n_queries"], {m: float(p.get(m, 0.0)) for m in METHODS}) for p in hist["history"]]
        c = SubjectCurve(strategy, subject, pts, truth, aligned)
        for n, v in c.aligned or []:
            self.rows.append((strategy, subject, n, "balanced_fidelity_at_status", v))
        for n, v in c.pointwise or []:
            self.rows.append((strategy, subject, n, "balanced_fidelity_at_status_pointwise", v))
        self.curves.append(c)
        for n, st in pts:
            for m, v in st.items():
                self.rows.append((strategy, subject, n, m, v))
        for n, v in c.truth:
            self.rows.append((strategy, subject, n, "balanced_fidelity", v))
        for n, v in raw or []:
            self.rows.append((strategy, subject, n, "true_fidelity", v))
        return c


def run_eval(opts: EvalOptions, log: Callable[[str], None] = print, progress: bool = False) -> dict[str, Any]:
    """The whole evaluation. ``progress``: a tqdm bar on stderr (the CLI passes it on a
    terminal unless --no-progress), one step per strategy, the queries sent as it goes."""
    for s in opts.strategies:
        if s not in EVAL_STRATEGIES:
            raise UserError(f"--strategies: unknown strategy {s!r} (expected {', '.join(EVAL_STRATEGIES)})")
    if opts.accounts < 2 and "colluding" in opts.strategies:
        raise UserError("--accounts: colluding needs at least 2 accounts")
    if opts.oracle not in ("leaf", "confidence"):
        raise UserError("--oracle: expected leaf or confidence")
    if not 0 <= opts.margin < 1:
        raise UserError("--margin: expected a number from 0 to 1")
    ds = load_dataset(opts.dataset, opts.target, opts.table)
    for note in ds.notes:
        log(f"{opts.dataset}: {note}")
    policy = Policy(reveal_leaf=opts.oracle == "leaf", price_micros=0)
    model = train_model(ds, MODEL_ID, max_depth=opts.max_depth, max_leaf_nodes=opts.max_leaf_nodes, seed=opts.seed,
                        policy=policy)  # fmt: skip
    _, X_all, _, y_all = encode_dataset(ds)
    train_X = holdout_split(X_all, y_all, opts.seed)[0]
    k = len(model.classes)
    held_X = model.validation_X
    owner = model.answer(held_X).labels
    truth = [str(model.classes[i]) for i in owner.tolist()]
    share = np.bincount(owner, minlength=k) / max(1, owner.size)
    log(f"model: {model.tree.n_leaves} leaves, depth {model.tree.depth()}, {held_X.shape[0]} held-out rows, "
        f"accuracy {model.card['validation_accuracy']:.3f}, majority label {share.max():.3f} of held-out rows")  # fmt: skip
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    db = out / "store.db"
    for suffix in ("", "-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    store = Store(db, background_checkpoint=True)
    store.add_model(model)
    if "adaptive" in opts.strategies:  # each coalition on a copy of its own: a pool of its rows alone
        for accounts in opts.adaptive_accounts:
            store.add_model(replace(model, id=_adaptive_model(accounts)))
        for accounts in opts.adaptive_pool_aware:
            store.add_model(replace(model, id=_adaptive_model(accounts, pool_aware=True)))
    if "natural_sybil" in opts.strategies:
        store.add_model(replace(model, id=NATURAL_SYBIL_MODEL))
    if "attribution" in opts.strategies:
        for attribution_model in ATTRIBUTION_MODELS.values():
            store.add_model(replace(model, id=attribution_model))
    if "policies" in opts.strategies:  # the same tree under each response policy
        for i, pol in enumerate(RESPONSE_POLICIES.values()):
            store.add_model(replace(model, id=f"{MODEL_ID}-p{i}"))
            store.set_policy(f"{MODEL_ID}-p{i}", pol)
    admin_key = secrets.token_urlsafe(24)
    summary: dict[str, Any] = {
        "dataset": opts.dataset,
        "model": {"leaves": model.tree.n_leaves, "depth": model.tree.depth(), "nodes": model.tree.n_nodes,
                  "features": len(model.schema), "classes": k, "held_out_rows": int(held_X.shape[0]),
                  "validation_accuracy": model.card["validation_accuracy"],
                  "majority_share": float(share.max())},
        "oracle": opts.oracle,
        "accounts": opts.accounts,
        "margin": opts.margin,
        "reference_queries": opts.reference_queries,
        "strategies": {},
    }  # fmt: skip
    gw = Gateway(store, admin_key)
    try:
        with GatewayThread(gw, extensions=[local_monitor_extension()]) as t:
            # The owner's calls wait longer than an attacker's: forcing an evaluation of every
            # subject (POST .../evaluate) takes seconds on a loaded machine.
            admin = ApiClient(t.url, admin_key, timeout=300.0)
            config = admin.call("GET", f"/v1/admin/monitor/{MODEL_ID}/config")
            method = config["default_method"]
            summary["default_method"], summary["warning_threshold"] = method, config["thresholds"].get(method)
            summary["config"] = config
            run = _Run(t.url, admin, opts, held_X, truth, train_X)
            thresholds = {m: config["thresholds"].get(m, 0.5) for m in EXTENT_METHODS}
            delta, ood_alarm = config["prada_delta"], config["ood_alarm"]
            bar = _progress_bar(len(opts.strategies)) if progress else None
            run.on_queries = (lambda s, n: bar.set_postfix_str(f"{s}: {n} queries", refresh=False)) if bar else None
            for i, strategy in enumerate(opts.strategies):
                if bar is not None:
                    bar.set_description(strategy)
                t0 = time.perf_counter()
                seed = opts.seed + 1000 * (i + 1)  # distinct starts: attackers must not share probes by chance
                before = len(run.curves)
                if strategy == "benign":
                    res = _benign(run, seed)
                elif strategy == "adaptive":
                    res = _adaptive_all(run, seed, k)
                elif strategy == "natural_sybil":
                    res = _natural_sybil(run, seed, k)
                elif strategy == "policies":
                    res = _policies(run, seed, k, thresholds, delta)
                elif strategy == "attribution":
                    res = run_attribution(run, seed, k)
                    summary["attribution"] = res["runs"]
                else:
                    res = _attack(run, strategy, seed)
                res["seconds"] = round(time.perf_counter() - t0, 2)
                per = [analyse_curve(c, thresholds, opts.margin, k, delta, ood_alarm, config["boundary_alarm"])
                       for c in run.curves[before:]]  # fmt: skip
                res["evaluation"] = aggregate(per) if per else None
                if len(per) == 1:
                    res["curve"] = per[0]
                summary["strategies"][strategy] = res
                if bar is not None:
                    bar.update(1)
                    bar.clear()
                log(_one_line(strategy, res, method))
            if bar is not None:
                bar.close()
            summary["sweep"] = sweep(run.curves, opts.margin, k, delta)
            admin.close()
    finally:
        store.close()
        # The monitor the gateway started has exited with it; its lock file is no output.
        Path(f"{db}.monitor-lock").unlink(missing_ok=True)
    summary["acceptance"] = _acceptance(summary)
    _write_curves(out / "curves.csv", run.rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "table.md").write_text(format_table(summary) + "\n")
    from analysim.report import can_plot

    if can_plot() and run.curves:
        _plot(out, run.curves, k, thresholds, method, {"prada": 1.0 - delta, "ood": ood_alarm, "boundary": config["boundary_alarm"]})
    return summary


def _progress_bar(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="strategy", leave=False, mininterval=0.5)


def _one_line(strategy: str, res: dict[str, Any], method: str) -> str:
    if "pooled_extent_offline" in res:  # natural_sybil
        p = res["pools"]
        return (f"{strategy}: {res['accounts']} accounts x {res['rows_per_account']} rows; pooled offline extent "
                f"{res['pooled_extent_offline']:.3f}; highest account status {res['max_account_status']:.3f} "
                f"({res['accounts_evaluated']} evaluated); auto:young {p['auto:young']['best_copy']:.3f}, "
                f"auto:pool {p['auto:pool']['best_copy']:.3f} ({p['auto:pool']['n_queries']} rows), exposure {p['exposure']:.3f}")  # fmt: skip
    if "runs" in res:  # adaptive, policies, attribution: a table of their own
        return f"{strategy}: {len(res['runs'])} runs, {res['queries_used']} queries over {res['accounts']} account(s) (table below)"
    ev = res.get("evaluation") or {}
    m = ev.get("methods", {}).get(method, {})
    w = m.get("first_warning")
    return (f"{strategy}: {res['queries_used']} queries over {res['accounts']} account(s); {method}: "
            f"{'no warning' if w is None else f'first warning at {w}'}, "
            f"{m.get('right_warnings', 0)}/{m.get('warnings', 0)} warnings right; "
            f"PRADA alarms {ev.get('prada_alarms', 0)}/{ev.get('curves', 0)}, OOD alarms {ev.get('ood_alarms', 0)}")  # fmt: skip


def _settle(admin: ApiClient, names: list[str], sent: int, timeout: float = 120.0, model_id: str = MODEL_ID,
            force: bool = True) -> dict[str, Any]:  # fmt: skip
    """Wait (polling, with a deadline) until the monitor has folded in every query these
    accounts sent, then have it evaluate every subject at the final count (``force``; else
    the view as the monitor's own schedule left it)."""
    deadline = time.monotonic() + timeout
    want = set(names)
    while True:
        view = admin.call("GET", f"/v1/admin/monitor/{model_id}")
        if sum(u["n_queries"] for u in view["users"] if u["subject"] in want) >= sent:
            if not force:
                return view  # type: ignore[no-any-return]
            break
        if time.monotonic() > deadline:
            raise UserError("the monitor did not catch up with the queries sent")
        time.sleep(0.02)
    return admin.call("POST", f"/v1/admin/monitor/{model_id}/evaluate", {})  # type: ignore[no-any-return]


def _benign(run: _Run, seed: int) -> dict[str, Any]:
    """A population of users sending rows of the data distribution (the training rows, not
    the held-out S), each its own log-normal volume, interleaved in a random order."""
    rng = np.random.default_rng(seed)
    names, vols, oracles, picks = benign_population(run, rng, "benign", MODEL_ID)
    n_users = len(names)
    order = rng.permutation(np.repeat(np.arange(n_users), vols))
    pos = np.zeros(n_users, dtype=int)
    for u in order.tolist():
        oracles[u].ask(picks[u][pos[u] : pos[u] + 1])
        pos[u] += 1
    _settle(run.admin, names, int(vols.sum()))
    for name, o in zip(names, oracles, strict=True):
        hist = run.history(name)
        X = np.concatenate(o.log_X)
        truth = []
        for p in hist["history"]:
            n = p["n_queries"]
            copies = [TreeRebuild(X[:n], o.log_labels[:n]), *box_copies(o.domain, X[:n], o.log_labels[:n], o.log_ident[:n])]
            truth.append((n, best_copy(copies, run.held_X, run.truth)[0]))
        run.add_curve("benign", name, hist, truth, aligned=truth)
        o.close()
    return {"accounts": n_users, "queries_used": int(vols.sum()),
            "volumes": {"median": float(np.median(vols)), "max": int(vols.max()), "min": int(vols.min())},
            "pools": _pools(run.admin)}  # fmt: skip


def benign_population(run: _Run, rng: np.random.Generator, prefix: str,
                      model_id: str) -> tuple[list[str], np.ndarray, list[Oracle], list[np.ndarray]]:  # fmt: skip
    """``benign_users`` accounts of ``model_id``: (names, per-user volumes, one oracle each,
    the rows each will send). Volumes are log-normal around ``benign_median_queries``; rows
    are distinct per user (with replacement only beyond the training set's size): people
    rarely ask the same question twice."""
    opts = run.opts
    vols = np.clip(np.round(rng.lognormal(math.log(opts.benign_median_queries), 1.0, opts.benign_users)), 5,
                   opts.budget).astype(int)  # fmt: skip
    names = [f"{prefix}-{i + 1:03d}" for i in range(opts.benign_users)]
    oracles = [Oracle.connect(run.url, [run.new_key(n)], model_id, int(v)) for n, v in zip(names, vols, strict=True)]
    picks = [run.train_X[_draw(rng, run.train_X.shape[0], int(v))] for v in vols]
    return names, vols, oracles, picks


def _pools(admin: ApiClient, model_id: str = MODEL_ID) -> dict[str, Any]:
    """The model's pooled subjects (pool.py) as they stand: per subject its rows, best_copy
    and whether it was warned; and the model's exposure."""
    view = admin.call("GET", f"/v1/admin/monitor/{model_id}")
    out: dict[str, Any] = {p["subject"]: {"n_queries": p["n_queries"], "best_copy": p["status"]["best_copy"],
                                          "warned": "best_copy" in p["warned"]} for p in view["pools"]}  # fmt: skip
    out["exposure"] = view["exposure"]
    return out


NATURAL_SYBIL_MODEL = f"{MODEL_ID}-ns"


def _natural_sybil(run: _Run, seed: int, k: int) -> dict[str, Any]:
    """``natural_sybil_accounts`` accounts, each sending first_eval - 1 distinct rows of the
    data (too few for any to be evaluated), on a model copy of their own. The truth is the
    best copy of all their answers pooled offline; beside it what the monitor says: the
    highest account status, auto:young, auto:pool and the model's exposure."""
    opts, admin = run.opts, run.admin
    config = admin.call("GET", f"/v1/admin/monitor/{NATURAL_SYBIL_MODEL}/config")
    per = max(1, config["first_eval"] - 1)
    rng = np.random.default_rng(seed)
    names = [f"nsybil-{i + 1:03d}" for i in range(opts.natural_sybil_accounts)]
    rows = run.train_X[_draw(rng, run.train_X.shape[0], per * len(names))]
    X, labels, ident = [], [], []
    domain = None
    for i, name in enumerate(names):
        o = Oracle.connect(run.url, [run.new_key(name)], NATURAL_SYBIL_MODEL, per)
        o.ask(rows[i * per : (i + 1) * per])
        X.append(np.concatenate(o.log_X))
        labels += o.log_labels
        ident += o.log_ident
        domain = o.domain
        o.close()
    sent = per * len(names)
    view = _settle(admin, names, sent, model_id=NATURAL_SYBIL_MODEL, force=False)  # the accounts as the schedule left them
    _settle(admin, names, sent, model_id=NATURAL_SYBIL_MODEL)  # then the pools at the final count
    allX = np.concatenate(X)
    copies = [TreeRebuild(allX, labels), *box_copies(domain, allX, labels, ident)]
    pooled = extent(best_copy(copies, run.held_X, run.truth)[0], k)
    users = [u for u in view["users"] if u["subject"] in set(names)]
    return {"accounts": len(names), "queries_used": sent, "rows_per_account": per,
            "pooled_extent_offline": pooled,
            "max_account_status": max((u["status"]["best_copy"] for u in users), default=0.0),
            "accounts_evaluated": sum(1 for u in users if u["evaluated_at"]),
            "pools": _pools(admin, NATURAL_SYBIL_MODEL)}  # fmt: skip


def _draw(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    return np.concatenate([rng.permutation(n) for _ in range(-(-k // n))])[:k]


def _attack(run: _Run, strategy: str, seed: int) -> dict[str, Any]:
    opts, admin = run.opts, run.admin
    base = opts.collude_base if strategy == "colluding" else strategy
    names = [f"colluder-{i + 1}" for i in range(opts.accounts)] if strategy == "colluding" else [strategy]
    keys = [run.new_key(n) for n in names]
    if strategy == "colluding":
        admin.call("POST", "/v1/admin/groups", {"name": GROUP, "members": names})
    budget = opts.budget if base in ("random", "natural") else opts.pathfinding_budget
    first = Oracle.connect(run.url, keys, MODEL_ID, budget)
    oracle: Oracle = first
    if strategy == "sybil":
        oracle = SybilOracle(first.clients[0], MODEL_ID, first.domain, budget, opts.sybil_queries,
                             lambda: run.new_key(f"sybil-{len(oracle.clients) + 1}"), run.url)  # fmt: skip
        names = []  # filled in below: every account it opened
    elif strategy == "slow":
        oracle = PacedOracle(first.clients, MODEL_ID, first.domain, budget, opts.slow_pause_s)
    tracker = FidelityTracker(run.held_X, run.truth)
    oracle.on_request = tracker if run.on_queries is None else _reporting(tracker, strategy, run.on_queries)
    if base in PATHFINDING_BASED:
        ident = confidence_identity if strategy == "confidence" else None
        pf = Pathfinding(oracle, seed, identity=ident) if ident else Pathfinding(oracle, seed)
        tracker.box = pf.rebuild
        rebuilt: Any = pf.run()
    elif base == "random":
        rebuilt = run_random(oracle, seed)
    elif base == "natural":
        rebuilt = run_natural(oracle, run.train_X, seed)
    else:
        raise UserError(f"--collude-base: unknown strategy {base!r}")
    tracker.finish(oracle, rebuilt)
    if strategy == "sybil":
        names = [strategy] + [f"sybil-{i}" for i in range(2, len(oracle.clients) + 1)]
    _settle(admin, names, oracle.queries)
    res: dict[str, Any] = {"accounts": len(names), "queries_used": oracle.queries,
                           "final_balanced_fidelity": tracker.curve[-1][1], "final_true_fidelity": tracker.raw[-1][1]}  # fmt: skip
    if isinstance(rebuilt, BoxRebuild):
        res["leaves_found"] = len(rebuilt.leaves)
    if strategy == "colluding":
        subject = f"group:{GROUP}"
    elif strategy == "sybil":
        subject = _linked_subject(admin, names) or names[0]
        res["grouped_as"] = subject if subject.startswith(LINK_PREFIX) else None
        res["accounts_grouped"] = len(run.history(subject).get("members", [])) if res["grouped_as"] else 0
        config = admin.call("GET", f"/v1/admin/monitor/{MODEL_ID}/config")
        member = [run.history(n)["status"] for n in names]
        res["max_account_status"] = max(x[config["default_method"]] for x in member)
        # Per warning method: the highest status any single account reached, and whether
        # every account stayed under that method's threshold (what the sybil is after).
        res["accounts_under_threshold"] = {m: max(x[m] for x in member) < t for m, t in config["thresholds"].items()}
        res["max_account_status_by_method"] = {m: max(x[m] for x in member) for m in config["thresholds"]}
        res["per_account_queries"] = opts.sybil_queries
    else:
        subject = names[0]
    hist = run.history(subject)
    res["subject"] = subject
    aligned = tracker.truth_at(oracle, [p["n_queries"] for p in hist["history"]])
    run.add_curve(strategy, subject, hist, tracker.curve, tracker.raw, aligned)
    if strategy == "colluding":
        res["member_status"] = hist.get("member_status", {})
        res["group_status"] = hist["status"]
    oracle.close()
    return res


def _reporting(tracker: FidelityTracker, strategy: str, report: Callable[[str, int], None]) -> Callable[[Oracle], None]:
    def on_request(oracle: Oracle) -> None:
        tracker(oracle)
        report(strategy, oracle.queries)

    return on_request


def _then(first: Callable[[Oracle], None], then: Callable[[Oracle], None]) -> Callable[[Oracle], None]:
    def on_request(oracle: Oracle) -> None:
        first(oracle)
        then(oracle)

    return on_request


def _adaptive_all(run: _Run, seed: int, k: int) -> dict[str, Any]:
    rows = [_adaptive(run, accounts, seed + accounts, k) for accounts in run.opts.adaptive_accounts]
    rows += [_adaptive(run, accounts, seed + accounts, k, pool_aware=True) for accounts in run.opts.adaptive_pool_aware]
    return {"accounts": sum(r["accounts"] for r in rows), "queries_used": sum(r["queries_used"] for r in rows),
            "runs": rows, "table": format_adaptive(rows, run.opts.adaptive_safety)}  # fmt: skip


def _adaptive_model(accounts: int, pool_aware: bool = False) -> str:
    return f"{MODEL_ID}-a{accounts}{'p' if pool_aware else ''}"


def _adaptive(run: _Run, accounts: int, seed: int, k: int, pool_aware: bool = False, model_id: str | None = None,
              prefix: str = "adaptive", between: Callable[[Oracle], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """Path-finding over ``accounts`` accounts that knows the monitor (adaptive.py), on a
    copy of the model of its own (so that the model's pool holds its rows alone; or
    ``model_id``). The fidelity it holds when it is first warned (one of its accounts or
    groups; the pool), when the enforcement rule would first act on it, and at the end: how
    much can be stolen unseen. ``between``: called after each of its requests (other
    traffic sent meanwhile: attribution.py)."""
    admin, opts = run.admin, run.opts
    model_id = model_id or _adaptive_model(accounts, pool_aware)
    if opts.adaptive_response != "none":
        admin.call("PUT", f"/v1/admin/monitor/{model_id}/config", {"pool_response": {"action": opts.adaptive_response}})
    config = admin.call("GET", f"/v1/admin/monitor/{model_id}/config")
    method, threshold = config["default_method"], config["thresholds"][config["default_method"]]
    enf = config["enforcement"]
    names = [f"{prefix}{accounts}{'p' if pool_aware else ''}-{i + 1}" for i in range(accounts)]
    keys = [run.new_key(n) for n in names]
    first = Oracle.connect(run.url, keys[:1], model_id, opts.pathfinding_budget)
    oracle = AccountOracle([ApiClient(run.url, key) for key in keys], model_id, first.domain, opts.pathfinding_budget)
    first.close()
    tracker = FidelityTracker(run.held_X, run.truth)
    oracle.on_request = tracker if run.on_queries is None else _reporting(tracker, f"{prefix} k={accounts}", run.on_queries)
    if between is not None:
        oracle.on_request = _then(oracle.on_request, between)

    def subjects() -> list[dict[str, Any]]:
        mine = set(names)
        view = admin.call("GET", f"/v1/admin/monitor/{model_id}")
        return [u for u in view["users"] if u["subject"] in mine] + [
            g for g in view["groups"] if mine.intersection(g.get("members", []))] + [
            p for p in view["pools"] if p["subject"] == POOL]  # fmt: skip

    def intent(st: dict[str, float]) -> bool:
        return st.get("prada", 0.0) >= 1.0 - config["prada_delta"] or st.get("ood", 0.0) >= config["ood_alarm"]

    def look(account: int) -> Checkpoint:
        # What the monitor says once it has folded every row this account sent.
        want = {names[i]: oracle.sent[i] for i in range(accounts)}
        deadline = time.monotonic() + 60
        while True:
            subs = subjects()
            got = {u["subject"]: u["n_queries"] for u in subs}
            if all(got.get(n, 0) >= c for n, c in want.items()) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        name = names[account]
        own = [x for x in subs if x["subject"] == name or name in x.get("members", [])]
        accts = [x for x in subs if x["subject"] != POOL]
        return Checkpoint(oracle.queries, max((x["status"][method] for x in own), default=0.0),
                          any(x.get("warned") for x in accts),
                          any(x["status"][enf["method"]] >= enf["threshold"] and (not enf["intent"] or intent(x["status"]))
                              for x in accts),
                          any(x["subject"] == POOL and method in x.get("warned", []) for x in subs))  # fmt: skip

    pf = AdaptivePathfinding(oracle, seed, threshold, opts.adaptive_safety, look, pool_aware=pool_aware)
    tracker.box = pf.rebuild
    rebuilt = pf.run()
    tracker.finish(oracle, rebuilt)
    _settle(admin, names, oracle.queries, model_id=model_id)
    final = look(0)
    cps = [*pf.result.checkpoints, final]
    # When the first warning about the coalition came: the seq each warning names, as the
    # attacker's row count then (not the next look, which comes once per leaf explored).
    found = [w for w in admin.call("GET", f"/v1/admin/warnings?model={model_id}")["warnings"] if w["method"] == method]
    mine = set(names)

    def at(ws: list[dict[str, Any]]) -> int | None:
        return min((oracle.rows_by(w["seq"]) for w in ws), default=None)

    groups = {g["subject"] for g in subjects() if g.get("members")}
    warned_at = at([w for w in found if w["subject"] in mine or w["subject"] in groups])
    pool_at = at([w for w in found if w["subject"] == POOL])
    enforced_at = next((c.queries for c in cps if c.enforced), None)
    subs = [x for x in subjects() if x["subject"] != POOL]
    ext = lambda q: extent(value_at(tracker.curve, q) or 1.0 / k, k)  # noqa: E731
    oracle.close()
    pools = _pools(admin, model_id)
    acted = {a["user"] for a in admin.call("GET", f"/v1/admin/monitor/{model_id}/actions")["actions"] if a["action"] != "none"}
    return {
        "accounts": accounts, "pool_aware": pool_aware, "queries_used": oracle.queries, "leaves_found": len(rebuilt.leaves),
        "accounts_retired": len(pf.result.retired),
        "groups": sorted(g["subject"] for g in subs if g.get("members")),
        "max_subject_status": max((x["status"][method] for x in subs), default=0.0),
        "warned_at": warned_at, "extent_at_warning": None if warned_at is None else ext(warned_at),
        "enforced_at": enforced_at, "extent_at_enforcement": None if enforced_at is None else ext(enforced_at),
        "final_extent": extent(tracker.curve[-1][1], k), "final_balanced_fidelity": tracker.curve[-1][1],
        "method": method, "threshold": threshold,
        "pool_warned_at": pool_at, "extent_at_pool_warning": None if pool_at is None else ext(pool_at),
        "first_coalition_warning_extent": min((x for x in (None if warned_at is None else ext(warned_at),
                                                           None if pool_at is None else ext(pool_at)) if x is not None),
                                              default=None),
        "pools": pools, "response": config["pool_response"]["action"], "accounts_acted_on": len(acted),
        "accounts_acted_on_attacker": len(acted & set(names)), "account_names": names,
    }  # fmt: skip


def format_adaptive(rows: list[dict[str, Any]], safety: float) -> list[str]:
    def f(v: Any) -> str:
        return "–" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))

    out = [f"Adaptive attacker (knows {rows[0]['method']} and its threshold {rows[0]['threshold']:.2f}; each account retires "
           f"{safety} below it): extent = balanced fidelity beyond a constant copy of its pooled copy", "",
           "| accounts k | queries | leaves found | accounts retired | groups formed | highest status | first warning at | "
           "extent then | pool warned at | extent then | pool status at the end | enforcement rule at | extent then | "
           "extent at the end (unwarned: stolen unseen) | pool response | accounts acted on (the attacker's) |",
           "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]  # fmt: skip
    for r in rows:
        out.append(f"| {r['accounts']}{' (pool-aware)' if r.get('pool_aware') else ''} | {r['queries_used']} | {r['leaves_found']} | {r['accounts_retired']} | "
                   f"{', '.join(r['groups']) or '–'} | {f(r['max_subject_status'])} | {f(r['warned_at'])} | "
                   f"{f(r['extent_at_warning'])} | {f(r.get('pool_warned_at'))} | {f(r.get('extent_at_pool_warning'))} | "
                   f"{f(r.get('pools', {}).get(POOL, {}).get('best_copy'))} | {f(r['enforced_at'])} | "
                   f"{f(r['extent_at_enforcement'])} | {f(r['final_extent'])} | {r.get('response', 'none')} | "
                   f"{r.get('accounts_acted_on', 0)} ({r.get('accounts_acted_on_attacker', 0)}) |")  # fmt: skip
    return out


def _policies(run: _Run, seed: int, k: int, thresholds: dict[str, float], delta: float) -> dict[str, Any]:
    """Each response policy as a defence: what path-finding and natural sampling extract
    from the same tree served under it, and what the monitor's status says about them."""
    rows = []
    method = run.admin.call("GET", f"/v1/admin/monitor/{MODEL_ID}/config")["default_method"]
    for i, (label, _) in enumerate(RESPONSE_POLICIES.items()):
        model_id = f"{MODEL_ID}-p{i}"
        for j, strategy in enumerate(POLICY_ATTACKERS):
            name = f"policy{i}-{strategy}"
            budget = run.opts.budget if strategy == "natural" else run.opts.pathfinding_budget
            oracle = Oracle.connect(run.url, [run.new_key(name)], model_id, budget)
            oracle.identity = POLICY_IDENTITY.get(label, oracle.identity)
            tracker = FidelityTracker(run.held_X, run.truth)
            oracle.on_request = tracker
            if strategy == "pathfinding":
                pf = Pathfinding(oracle, seed + 10 * i + j, identity=oracle.identity)
                tracker.box = pf.rebuild
                rebuilt: Any = pf.run()
            else:
                rebuilt = run_natural(oracle, run.train_X, seed + 10 * i + j)
            tracker.finish(oracle, rebuilt)
            _settle(run.admin, [name], oracle.queries, model_id=model_id)
            hist = run.history(name, model_id)
            pts = [(p["n_queries"], {m: float(p.get(m, 0.0)) for m in METHODS}) for p in hist["history"]]
            c = SubjectCurve(f"policy:{label}", name, pts, tracker.curve, tracker.truth_at(oracle, [n for n, _ in pts]))
            r = analyse_curve(c, thresholds, run.opts.margin, k, delta)
            m = r["methods"][method]
            rows.append({"policy": label, "strategy": strategy, "queries": oracle.queries,
                         "leaves_found": len(rebuilt.leaves) if isinstance(rebuilt, BoxRebuild) else None,
                         "final_extent": extent(tracker.curve[-1][1], k), "final_status": m["final_status"],
                         "calibration_error": m["calibration_error"], "max_below_truth": m["max_below_truth"],
                         "first_warning": m["first_warning"], "queries_to_bf_090": r["queries_to_bf_090"]})  # fmt: skip
            oracle.close()
    return {"accounts": len(rows), "queries_used": sum(r["queries"] for r in rows), "runs": rows,
            "table": format_policies(rows, method)}  # fmt: skip


def format_policies(rows: list[dict[str, Any]], method: str) -> list[str]:
    def f(v: Any) -> str:
        return "–" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))

    out = [f"Response policies as defences (the same tree; extent of the attacker's best copy, and {method} on it)", "",
           f"| policy | attacker | queries | leaves found | extent at the end | {method} at the end | calibration error | "
           "max below truth | first warning | queries to bf 0.9 |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        out.append(f"| {r['policy']} | {r['strategy']} | {r['queries']} | {f(r['leaves_found'])} | {f(r['final_extent'])} | "
                   f"{f(r['final_status'])} | {f(r['calibration_error'])} | {f(r['max_below_truth'])} | "
                   f"{f(r['first_warning'])} | {f(r['queries_to_bf_090'])} |")  # fmt: skip
    return out


def _linked_subject(admin: ApiClient, names: list[str]) -> str | None:
    """The automatic link group holding the most of these accounts, if any."""
    groups = admin.call("GET", f"/v1/admin/monitor/{MODEL_ID}")["groups"]
    best = max(((len(set(g.get("members", [])) & set(names)), g["subject"]) for g in groups
                if g["subject"].startswith(LINK_PREFIX)), default=(0, None))  # fmt: skip
    return best[1] if best[0] else None


def _acceptance(summary: dict[str, Any]) -> dict[str, Any]:
    """This run's checks: path-finding finds every leaf; the default method's warnings are
    right (precision >= 0.95) and come before each attacker's balanced fidelity 0.9; PRADA
    stays silent on the benign population and alarms on path-finding and random; the sybil
    accounts are grouped automatically; with --reference-queries, path-finding reaches
    0.99 within ten times the published count."""
    st, method = summary["strategies"], summary["default_method"]
    acc: dict[str, Any] = {}
    pf = st.get("pathfinding")
    if pf:
        acc["pathfinding_found_every_leaf"] = pf.get("leaves_found") == summary["model"]["leaves"]
        ref = summary.get("reference_queries")
        if ref:
            q = (pf.get("curve") or {}).get("queries_to_bf_099")
            acc["pathfinding_within_10x_reference"] = q is not None and q < 10 * ref
    warned = [(s, r["evaluation"]["methods"][method]) for s, r in st.items() if r.get("evaluation")]
    n_w = sum(m["warnings"] for _, m in warned)
    n_right = sum(m["right_warnings"] for _, m in warned)
    acc["default_method_warning_precision"] = round(n_right / n_w, 4) if n_w else None
    acc["default_method_precision_at_least_095"] = n_w == 0 or n_right / n_w >= 0.95
    warning_methods = sorted(summary["config"]["thresholds"])
    for s, r in st.items():
        if s != "benign" and r.get("curve"):
            # By any warning the monitor raises; the default method's own timing beside it.
            acc[f"{s}_warned_before_bf_090"] = any(_warned_in_time(r["curve"], m) for m in warning_methods if m in EXTENT_METHODS)
            acc[f"{s}_default_method_before_bf_090"] = _warned_in_time(r["curve"], method)
    if "benign" in st:
        acc["prada_silent_on_benign"] = st["benign"]["evaluation"]["prada_alarms"] == 0
    for s in ("pathfinding", "random"):
        if s in st:
            acc[f"prada_alarms_on_{s}"] = st[s]["evaluation"]["prada_alarms"] == 1
    if "sybil" in st:
        acc["sybil_grouped_automatically"] = st["sybil"]["grouped_as"] is not None
    return acc


GOAL_CALIBRATION = 0.05  # mean |status - extent| along the curve
GOAL_BELOW = 0.15  # never further below the truth than this
GOAL_PRECISION = 0.95  # warnings right on the benign population


def goals(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per strategy, the default method against the issue's goals: calibration error <=
    0.05, never more than 0.15 below the truth, warned before balanced fidelity 0.9 (an
    attacker; a colluding or sybil group as a group), benign warnings right >= 95 %."""
    method = summary["default_method"]
    out: dict[str, dict[str, Any]] = {}
    for s, r in summary["strategies"].items():
        ev = r.get("evaluation")
        if not ev:
            continue
        m = ev["methods"][method]
        g: dict[str, Any] = {"calibration_error": m["calibration_error"], "max_below_truth": m["max_below_truth"]}
        g["calibration_ok"] = m["calibration_error"] is not None and m["calibration_error"] <= GOAL_CALIBRATION
        g["below_ok"] = m["max_below_truth"] is not None and m["max_below_truth"] <= GOAL_BELOW
        if s == "benign":
            g["precision"] = m["warning_precision"]
            g["warning_ok"] = m["warning_precision"] is None or m["warning_precision"] >= GOAL_PRECISION
        else:
            c = r.get("curve") or {}
            w, q90 = c.get("methods", {}).get(method, {}).get("first_warning"), c.get("queries_to_bf_090")
            g["first_warning"], g["queries_to_bf_090"] = w, q90
            g["warning_ok"] = q90 is None or (w is not None and w < q90)
        out[s] = g
    return out


def format_table(summary: dict[str, Any]) -> str:
    """The evaluation as markdown: the goals (default method per strategy, with the intent
    signals PRADA, OOD and Quiring et al.'s closeness to the boundary on the same streams),
    then every extent method per strategy."""

    def f(v: Any, nd: int = 3) -> str:
        if v is None:
            return "–"
        return f"{v:.{nd}f}" if isinstance(v, float) else str(v)

    def ok(v: bool) -> str:
        return "yes" if v else "**no**"

    m0 = summary["model"]
    method = summary["default_method"]
    lines = [f"{summary['dataset']}: {m0['leaves']} leaves, {m0['classes']} classes, {m0['held_out_rows']} held-out rows, "
             f"majority share {m0['majority_share']:.3f}; default method {method} at "
             f"{f(summary['warning_threshold'], 2)}, margin {summary['margin']}", "",
             f"Goals ({method}): calibration error <= {GOAL_CALIBRATION}, never more than {GOAL_BELOW} below the truth, "
             f"warned before bf 0.9 (benign: warnings right >= {GOAL_PRECISION})", "",
             "| strategy | curves | calibration error | max below truth | first warning | queries to bf 0.9 | warning goal | "
             "PRADA alarms | OOD alarms | boundary alarms (first) |", "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]  # fmt: skip
    gs = goals(summary)
    for s, g in gs.items():
        ev = summary["strategies"][s]["evaluation"]
        n = ev["curves"]
        if s == "benign":
            mm = ev["methods"][method]
            warn, q90 = f"{mm['right_warnings']}/{mm['warnings']} right", f"{ev['reached_bf_090']}/{n} reach"
        else:
            warn, q90 = f(g["first_warning"]), f(g["queries_to_bf_090"])
        lines.append(f"| {s} | {n} | {f(g['calibration_error'])} ({ok(g['calibration_ok'])}) | {f(g['max_below_truth'])} "
                     f"({ok(g['below_ok'])}) | {warn} | {q90} | {ok(g['warning_ok'])} | {ev['prada_alarms']}/{n} | "
                     f"{ev['ood_alarms']}/{n} | {ev['boundary_alarms']}/{n} ({f(ev['first_boundary_alarm'])}) |")  # fmt: skip
    lines += ["", "| strategy | method | threshold | calibration error | max below truth | right / warnings | first warning | "
              "queries to bf 0.9 | lead |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for s, r in summary["strategies"].items():
        ev = r.get("evaluation")
        if not ev:
            continue
        q90 = ev["queries_to_bf_090"] if ev["curves"] == 1 else f"{ev['reached_bf_090']}/{ev['curves']} reach"
        for m, x in ev["methods"].items():
            lines.append(f"| {s} | {m} | {f(summary['config']['thresholds'].get(m, 0.5), 2)} | {f(x['calibration_error'])} | "
                         f"{f(x['max_below_truth'])} | {x['right_warnings']}/{x['warnings']} | {f(x['first_warning'])} | "
                         f"{f(q90)} | {f(x['lead'])} |")  # fmt: skip
    for extra in ("adaptive", "policies", "attribution"):
        if summary["strategies"].get(extra):
            lines += ["", *summary["strategies"][extra]["table"]]
    sy = summary["strategies"].get("sybil")
    if sy:
        per = ", ".join(f"{m} {f(v)}" for m, v in sy["max_account_status_by_method"].items())
        lines.append(f"\nsybil: {sy['accounts']} accounts of {sy['per_account_queries']} queries, highest single-account "
                     f"status {per}; grouped automatically as {f(sy['grouped_as'])} ({sy['accounts_grouped']} accounts)")  # fmt: skip
    be = summary["strategies"].get("benign")
    if be and be.get("pools"):
        p = be["pools"]
        lines.append(f"\nbenign pools: auto:pool {f(p['auto:pool']['best_copy'])} ({p['auto:pool']['n_queries']} rows, "
                     f"{'warned' if p['auto:pool']['warned'] else 'not warned'}), auto:young {f(p['auto:young']['best_copy'])} "
                     f"({p['auto:young']['n_queries']} rows), exposure {f(p['exposure'])}")  # fmt: skip
    ns = summary["strategies"].get("natural_sybil")
    if ns:
        lines.append("\n" + _one_line("natural_sybil", ns, method))
    lines.append("acceptance: " + ", ".join(f"{k}={v}" for k, v in summary["acceptance"].items()))
    return "\n".join(lines)


def _write_curves(path: Path, rows: list[tuple[str, str, int, str, float]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["strategy", "subject", "n_queries", "metric", "value"])
        for row in rows:
            w.writerow([*row[:4], f"{row[4]:.6f}"])


def _plot(
    out: Path, curves: list[SubjectCurve], k: int, thresholds: dict[str, float], method: str, alarms: dict[str, float]
) -> None:
    from analysim.report import pyplot

    plt = pyplot()

    strategies = list(dict.fromkeys(c.strategy for c in curves))
    # One figure per strategy: a grid of panels, one per method, status vs queries with the
    # truth overlaid (the extent: balanced fidelity on the status scale); the benign
    # population as thin lines. Three columns, so that each panel is large enough to read.
    cols = 3
    rows = -(-len(METHODS) // cols)
    for s in strategies:
        cs = [c for c in curves if c.strategy == s]
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), sharey=True, squeeze=False)
        lw, alpha = (0.7, 0.5) if len(cs) > 1 else (1.6, 1.0)
        for ax, m in zip(axes.flat, METHODS, strict=False):
            for c in cs:
                pts = c.method(m)
                if pts:
                    ax.plot(*zip(*pts, strict=True), color="tab:blue", linewidth=lw, alpha=alpha)
                if m in EXTENT_METHODS and c.truth:  # intent has no truth to overlay
                    ax.plot([n for n, _ in c.truth], [extent(v, k) for _, v in c.truth], color="tab:orange",
                            linewidth=lw, alpha=alpha, linestyle="--")  # fmt: skip
            level = thresholds.get(m, 0.5) if m in EXTENT_METHODS else alarms.get(m, 0.5)
            ax.axhline(level, color="grey", linewidth=0.8, linestyle=":")
            kind = "extent" if m in EXTENT_METHODS else "intent"
            ax.set_title(f"{m} ({kind}){'  default' if m == method else ''}", fontsize=11)
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=9)
        for ax in axes.flat[len(METHODS):]:
            ax.set_visible(False)
        for ax in axes[-1]:
            ax.set_xlabel("queries", fontsize=10)
        for ax in axes[:, 0]:
            ax.set_ylabel("status", fontsize=10)
        fig.suptitle(f"{s}: each method's status (blue) against the true extent (orange, dashed); "
                     "grey: warning threshold or alarm level", fontsize=11)  # fmt: skip
        fig.tight_layout()
        fig.savefig(out / f"status_{s}.png", dpi=100)
        plt.close(fig)
    # The default method for every attacker, with each one's truth. Log x axis from the first
    # evaluation on (queries are positive; the statuses start at min_refit).
    fig, ax = plt.subplots(figsize=(8, 4.8))
    first = []
    for i, s in enumerate(x for x in strategies if x != "benign"):
        for c in (c for c in curves if c.strategy == s):
            color = f"C{i}"
            pts = c.method(method)
            if pts:
                ax.plot(*zip(*pts, strict=True), color=color, label=s)
                first.append(pts[0][0])
            # The truth from the monitor's first evaluation on (before it there is no status).
            start = pts[0][0] if pts else 1
            tr = [(n, v) for n, v in c.truth if n >= start]
            if tr:
                ax.plot([n for n, _ in tr], [extent(v, k) for _, v in tr], color=color, linestyle="--", linewidth=0.8)
    ax.axhline(thresholds.get(method, 0.5), color="grey", linewidth=0.8, linestyle=":")
    ax.set_xscale("log")
    if first:
        lo = max(1.0, 0.9 * min(first))
        ax.set_xlim(left=lo)
        hi = ax.get_xlim()[1]
        # Plain numbers at 1-2-5 steps: a reader should not have to decode 10^3.
        ticks = [m * 10**e for e in range(0, 8) for m in (1, 2, 5) if lo <= m * 10**e <= hi]
        ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
        ax.minorticks_off()
    ax.set(xlabel="queries (log scale)", ylabel=f"{method} (solid), true extent (dashed)", ylim=(-0.02, 1.02),
           title=f"Default method ({method}) for each attacker, truth dashed")  # fmt: skip
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=9, loc="upper left")
    fig.tight_layout()
    fig.savefig(out / "status_vs_queries.png", dpi=110)
    plt.close(fig)
