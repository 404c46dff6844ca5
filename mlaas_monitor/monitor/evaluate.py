"""``analysim monitor-eval``: train a model, serve it on loopback with the monitor, run each
attack strategy through real HTTP, and record the monitor's statuses and each attacker's
true fidelity against the number of queries.

Writes DIR/curves.csv (long format: strategy, subject, n_queries, metric, value), PNG plots
and DIR/summary.json.
"""

from __future__ import annotations

import csv
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from analysim.errors import UserError
from mlaas_monitor.datasets import load_dataset
from mlaas_monitor.model import Policy
from mlaas_monitor.monitor.attacks import (
    STRATEGIES,
    ApiClient,
    BoxRebuild,
    Oracle,
    Pathfinding,
    agreement,
    rebuild_from_log,
    run_benign,
    run_random,
)
from mlaas_monitor.monitor.core import METHODS
from mlaas_monitor.monitor.service import monitor_extension
from mlaas_monitor.server import GatewayThread
from mlaas_monitor.service import Gateway
from mlaas_monitor.store import Store
from mlaas_monitor.training import train_model

EVAL_STRATEGIES = (*STRATEGIES, "colluding")
MODEL_ID = "target"
GROUP = "colluders"
TRAMER = {"dataset": "german credit", "leaves": 26, "pathfinding_queries": 1722, "top_down_queries": 1150}


@dataclass(frozen=True)
class EvalOptions:
    dataset: str
    out: Path
    strategies: tuple[str, ...] = EVAL_STRATEGIES
    accounts: int = 3
    max_leaf_nodes: int | None = 26
    max_depth: int | None = None
    target: str | None = None
    seed: int = 0
    budget: int = 2000  # for benign and random; pathfinding runs until its queue is empty
    pathfinding_budget: int = 20000
    benign_budget: int | None = None
    collude_base: str = "pathfinding"
    oracle: str = "leaf"  # leaf: the policy reveals leaf ids; confidence: label + confidence only


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


class FidelityTracker:
    """The attacker's true fidelity (its rebuilt model vs the owner's labels on held-out
    rows) recorded as the attack goes: after each request for pathfinding (cheap: only when
    a leaf was added), every ~2 % of queries for the tree rebuilders."""

    def __init__(self, X: np.ndarray, truth: list[Any]) -> None:
        self.X, self.truth = X, truth
        self.curve: list[tuple[int, float]] = []
        self._next = 1
        self._leaves = -1
        self.box: BoxRebuild | None = None

    def __call__(self, oracle: Oracle) -> None:
        if self.box is not None:
            if len(self.box.leaves) != self._leaves:
                self._leaves = len(self.box.leaves)
                self.curve.append((oracle.queries, agreement(self.box, self.X, self.truth)))
            return
        if oracle.queries >= self._next:
            self.curve.append((oracle.queries, agreement(rebuild_from_log(oracle), self.X, self.truth)))
            self._next = oracle.queries + max(10, oracle.queries // 50)

    def finish(self, oracle: Oracle, rebuilt: Any) -> float:
        f = agreement(rebuilt, self.X, self.truth)
        if not self.curve or self.curve[-1][0] != oracle.queries:
            self.curve.append((oracle.queries, f))
        else:
            self.curve[-1] = (oracle.queries, f)
        return f


def run_eval(opts: EvalOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    for s in opts.strategies:
        if s not in EVAL_STRATEGIES:
            raise UserError(f"--strategies: unknown strategy {s!r} (expected {', '.join(EVAL_STRATEGIES)})")
    if opts.accounts < 2 and "colluding" in opts.strategies:
        raise UserError("--accounts: colluding needs at least 2 accounts")
    if opts.oracle not in ("leaf", "confidence"):
        raise UserError("--oracle: expected leaf or confidence")
    ds = load_dataset(opts.dataset, opts.target)
    policy = Policy(reveal_leaf=opts.oracle == "leaf", price_micros=0)
    model = train_model(ds, MODEL_ID, max_depth=opts.max_depth, max_leaf_nodes=opts.max_leaf_nodes, seed=opts.seed,
                        policy=policy)  # fmt: skip
    log(f"model: {model.tree.n_leaves} leaves, depth {model.tree.depth()}, "
        f"{model.validation_X.shape[0]} held-out rows, accuracy {model.card['validation_accuracy']:.3f}")  # fmt: skip
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    db = out / "store.db"
    for suffix in ("", "-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    store = Store(db, background_checkpoint=True)
    store.add_model(model)
    admin_key = secrets.token_urlsafe(24)
    held_X = model.validation_X
    truth = [str(model.classes[i]) for i in model.answer(held_X).labels.tolist()]
    summary: dict[str, Any] = {
        "dataset": opts.dataset,
        "model": {"leaves": model.tree.n_leaves, "depth": model.tree.depth(), "nodes": model.tree.n_nodes,
                  "features": len(model.schema), "held_out_rows": int(held_X.shape[0]),
                  "validation_accuracy": model.card["validation_accuracy"]},
        "oracle": opts.oracle,
        "accounts": opts.accounts,
        "tramer_et_al": TRAMER,
        "strategies": {},
    }  # fmt: skip
    curves: list[tuple[str, str, int, str, float]] = []
    gw = Gateway(store, admin_key)
    try:
        with GatewayThread(gw, extensions=[monitor_extension()]) as t:
            admin = ApiClient(t.url, admin_key)
            config = admin.call("GET", f"/v1/admin/monitor/{MODEL_ID}/config")
            method = config["default_method"]
            threshold = config["thresholds"].get(method, 0.5)
            summary["default_method"], summary["warning_threshold"] = method, threshold
            summary["config"] = config
            for strategy in opts.strategies:
                t0 = time.perf_counter()
                res = _run_one(strategy, opts, t.url, admin, held_X, truth, method, curves)
                res["seconds"] = round(time.perf_counter() - t0, 2)
                summary["strategies"][strategy] = res
                log(f"{strategy}: {res['queries_used']} queries, true fidelity {res['final_true_fidelity']:.3f}, "
                    f"{method} status {res['final_status'][method]:.3f}, first warning at {res['first_warning_query']}")  # fmt: skip
            admin.close()
    finally:
        store.close()
    summary["acceptance"] = _acceptance(summary)
    _write_curves(out / "curves.csv", curves)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    from analysim.report import can_plot

    if can_plot():
        _plot(out, curves, [*METHODS, "true_fidelity"])
    return summary


def _run_one(
    strategy: str, opts: EvalOptions, url: str, admin: ApiClient, held_X: np.ndarray, truth: list[str], method: str,
    curves: list[tuple[str, str, int, str, float]],
) -> dict[str, Any]:  # fmt: skip
    colluding = strategy == "colluding"
    base = opts.collude_base if colluding else strategy
    names = [f"colluder-{i + 1}" for i in range(opts.accounts)] if colluding else [strategy]
    keys = [admin.call("POST", "/v1/admin/users", {"name": n})["api_key"] for n in names]
    if colluding:
        admin.call("POST", "/v1/admin/groups", {"name": GROUP, "members": names})
    # benign: each held-out row once (unless --budget says otherwise)
    budget = {"pathfinding": opts.pathfinding_budget, "benign": opts.benign_budget}.get(base, opts.budget)
    oracle = Oracle.connect(url, keys, MODEL_ID, budget)
    tracker = FidelityTracker(held_X, truth)
    oracle.on_request = tracker
    if base == "pathfinding":
        pf = Pathfinding(oracle, opts.seed)
        tracker.box = pf.rebuild
        rebuilt: Any = pf.run()
    elif base == "benign":
        rebuilt = run_benign(oracle, held_X, opts.seed)
    elif base == "random":
        rebuilt = run_random(oracle, opts.seed)
    else:
        raise UserError(f"--collude-base: unknown strategy {base!r}")
    final_fid = tracker.finish(oracle, rebuilt)
    subject = f"group:{GROUP}" if colluding else strategy
    _settle(admin, names, oracle.queries)
    hist = admin.call("GET", f"/v1/admin/monitor/{MODEL_ID}/subjects/{subject}")
    warnings = admin.call("GET", f"/v1/admin/warnings?model={MODEL_ID}&subject={subject}")["warnings"]
    for p in hist["history"]:
        for m in METHODS:
            curves.append((strategy, subject, p["n_queries"], m, p[m]))
    for n, f in tracker.curve:
        curves.append((strategy, "attacker", n, "true_fidelity", f))
    warn = next((w for w in warnings if w["method"] == method), None)
    res: dict[str, Any] = {
        "subject": subject,
        "accounts": len(names),
        "queries_used": oracle.queries,
        "queries_to_fidelity_099": first_at_least(tracker.curve, 0.99),
        "queries_to_fidelity_090": first_at_least(tracker.curve, 0.9),
        "first_warning_query": warn["n_queries"] if warn else None,
        "status_at_warning": warn["status"] if warn else None,
        "true_fidelity_at_warning": value_at(tracker.curve, warn["n_queries"]) if warn else None,
        "final_true_fidelity": final_fid,
        "warned_before_fidelity_090": warn is not None
        and (first_at_least(tracker.curve, 0.9) is None or warn["n_queries"] < first_at_least(tracker.curve, 0.9)),
        "final_status": hist["status"],
        "warnings": [{k: w[k] for k in ("method", "n_queries", "status")} for w in warnings],
    }
    if base == "pathfinding" and isinstance(rebuilt, BoxRebuild):
        res["leaves_found"] = len(rebuilt.leaves)
    if colluding:
        res["group_status"] = hist["status"]
        res["member_status"] = hist.get("member_status", {})
        single = _replay_as_one(url, admin, oracle)
        res["single_user_status"] = single["status"]
        res["group_vs_single_max_difference"] = max(abs(hist["status"][m] - single["status"][m]) for m in METHODS)
        gh = {p["n_queries"]: p for p in hist["history"]}
        diffs = [abs(gh[p["n_queries"]][m] - p[m]) for p in single["history"] if p["n_queries"] in gh for m in METHODS]
        res["history_points_compared"] = len([p for p in single["history"] if p["n_queries"] in gh])
        res["history_max_difference"] = max(diffs) if diffs else None
        for p in single["history"]:
            for m in METHODS:
                curves.append((strategy, "single-user", p["n_queries"], m, p[m]))
    oracle.close()
    return res


def _settle(admin: ApiClient, names: list[str], sent: int, timeout: float = 60.0) -> dict[str, Any]:
    """Wait (polling, with a deadline) until the monitor has folded in every query these
    accounts sent, then have it evaluate every subject at the final count."""
    deadline = time.monotonic() + timeout
    while True:
        users = admin.call("GET", f"/v1/admin/monitor/{MODEL_ID}")["users"]
        if sum(u["n_queries"] for u in users if u["subject"] in names) >= sent:
            break
        if time.monotonic() > deadline:
            raise UserError("the monitor did not catch up with the queries sent")
        time.sleep(0.02)
    return admin.call("POST", f"/v1/admin/monitor/{MODEL_ID}/evaluate", {})


def _replay_as_one(url: str, admin: ApiClient, oracle: Oracle) -> dict[str, Any]:
    """Send every colluder's query again, in the same order and requests, from one account."""
    key = admin.call("POST", "/v1/admin/users", {"name": "single-user"})["api_key"]
    one = Oracle.connect(url, [key], MODEL_ID, None)
    for X in oracle.log_X:
        one.ask(X)
    _settle(admin, ["single-user"], one.queries)
    view = admin.call("GET", f"/v1/admin/monitor/{MODEL_ID}/users/single-user")
    one.close()
    return view


def _acceptance(summary: dict[str, Any]) -> dict[str, Any]:
    """The issue's acceptance checks, on this run: pathfinding reaches 0.99 true fidelity
    within the order of Tramèr et al.'s query count; the monitor warns (default method)
    before the attacker (pathfinding, and the colluding group) reaches 0.9 true fidelity;
    the group's status equals, within 0.02, that of one user sending all its queries."""
    st = summary["strategies"]
    acc: dict[str, Any] = {}
    pf = st.get("pathfinding")
    if pf:
        q = pf["queries_to_fidelity_099"]
        acc["pathfinding_queries_to_099"] = q
        acc["pathfinding_same_order_as_tramer"] = q is not None and q < 10 * TRAMER["pathfinding_queries"]
    for name in ("pathfinding", "colluding"):
        if name in st:
            acc[f"{name}_warned_before_fidelity_090"] = st[name]["warned_before_fidelity_090"]
    col = st.get("colluding")
    if col:
        acc["collusion_group_equals_single_within_002"] = col["group_vs_single_max_difference"] <= 0.02
    return acc


def _write_curves(path: Path, curves: list[tuple[str, str, int, str, float]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["strategy", "subject", "n_queries", "metric", "value"])
        for row in curves:
            w.writerow([*row[:4], f"{row[4]:.6f}"])


def _plot(out: Path, curves: list[tuple[str, str, int, str, float]], metrics: list[str]) -> None:
    from analysim.report import pyplot

    plt = pyplot()

    strategies = sorted({c[0] for c in curves})
    # One figure per strategy: a line per method, and the attacker's true fidelity.
    for s in strategies:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for m in metrics:
            pts = sorted((n, v) for st, subj, n, mm, v in curves if st == s and mm == m and subj != "single-user")
            if pts:
                ax.plot(*zip(*pts, strict=True), label=m, linestyle="--" if m == "true_fidelity" else "-")
        ax.axhline(0.5, color="grey", linewidth=0.6)
        ax.set(xlabel="queries", ylabel="status", ylim=(-0.02, 1.02), title=f"{s}: monitor status vs queries")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / f"status_{s}.png", dpi=110)
        plt.close(fig)
    # One panel per method: a line per strategy.
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.6), sharey=True)
    for ax, m in zip(np.atleast_1d(axes), metrics, strict=True):
        for s in strategies:
            pts = sorted((n, v) for st, subj, n, mm, v in curves if st == s and mm == m and subj != "single-user")
            if pts:  # colluding retraces pathfinding exactly: dashed, so both show
                ax.plot(*zip(*pts, strict=True), label=s, linestyle="--" if s == "colluding" else "-")
        ax.set(title=m, xlabel="queries", ylim=(-0.02, 1.02))
    np.atleast_1d(axes)[0].set_ylabel("status")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "status_vs_queries.png", dpi=110)
    plt.close(fig)


