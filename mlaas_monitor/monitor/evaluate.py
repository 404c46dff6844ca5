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

This module drives the run; the strategies are eval_strategies.py, eval_adaptive.py and
attribution.py, the figures computed from the recorded curves curves.py, the tables and
files eval_report.py and the plots eval_plots.py.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from analysim.errors import UserError
from mlaas_monitor.datasets import load_dataset
from mlaas_monitor.model import Model, Policy
from mlaas_monitor.monitor.attacks import ApiClient
from mlaas_monitor.monitor.attribution import ATTRIBUTION_MODELS, run_attribution
from mlaas_monitor.monitor.client import local_monitor_extension
from mlaas_monitor.monitor.config import EXTENT_METHODS
from mlaas_monitor.monitor.curves import acceptance, aggregate, analyse_curve, sweep
from mlaas_monitor.monitor.eval_adaptive import run_adaptive_all
from mlaas_monitor.monitor.eval_report import format_table, one_line, write_outputs
from mlaas_monitor.monitor.eval_run import (
    EVAL_STRATEGIES,
    MODEL_ID,
    NATURAL_SYBIL_MODEL,
    RESPONSE_POLICIES,
    EvalOptions,
    EvalRun,
    adaptive_model,
)
from mlaas_monitor.monitor.eval_strategies import run_attack, run_benign, run_natural_sybil, run_policies
from mlaas_monitor.server import GatewayThread
from mlaas_monitor.service import Gateway
from mlaas_monitor.store import Store
from mlaas_monitor.training import encode_dataset, holdout_split, train_model

__all__ = ["EVAL_STRATEGIES", "EvalOptions", "format_table", "run_eval"]


@dataclass(frozen=True)
class Target:
    """The model every strategy attacks, and the truth it is measured against."""

    model: Model  # the tree trained on the table, served as MODEL_ID (and its copies)
    train_X: np.ndarray  # (n, d) the training rows: what benign users and natural sampling send
    held_X: np.ndarray  # (m, d) the held-out rows S every copy is scored on
    truth: list[str]  # (m,) the model's own labels of held_X: what a copy should say
    k: int  # the model's number of classes (extent's 1/K is a constant guess)
    majority: float  # share of held_X with the commonest label, in [1/k, 1]


@dataclass(frozen=True)
class Levels:
    """The monitor's own thresholds and alarm levels, read from its config: what each curve is
    analysed against."""

    thresholds: dict[str, float]  # extent method -> its warning threshold (0.5 where unset)
    delta: float  # PRADA's alarm: Shapiro-Wilk W below this (status prada >= 1 - delta)
    ood_alarm: float  # the out-of-distribution status's alarm level
    boundary_alarm: float  # Quiring et al.'s alarm on the mean in-margin ratio


def run_eval(opts: EvalOptions, log: Callable[[str], None] = print, progress: bool = False) -> dict[str, Any]:
    """The whole evaluation. ``progress``: a tqdm bar on stderr (the CLI passes it on a
    terminal unless --no-progress), one step per strategy, the queries sent as it goes."""
    check_options(opts)
    target = train_target(opts, log)
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    db = out / "store.db"
    for suffix in ("", "-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    store = Store(db, background_checkpoint=True)
    serve_copies(store, target.model, opts.strategies, opts)
    admin_key = secrets.token_urlsafe(24)
    summary = summary_head(opts, target)
    try:
        with GatewayThread(Gateway(store, admin_key), extensions=[local_monitor_extension()]) as t:
            # The owner's calls wait longer than an attacker's: forcing an evaluation of every
            # subject (POST .../evaluate) takes seconds on a loaded machine.
            admin = ApiClient(t.url, admin_key, timeout=300.0)
            config = admin.call("GET", f"/v1/admin/monitor/{MODEL_ID}/config")
            method = config["default_method"]
            summary["default_method"], summary["warning_threshold"] = method, config["thresholds"].get(method)
            summary["config"] = config
            levels = Levels({m: config["thresholds"].get(m, 0.5) for m in EXTENT_METHODS}, config["prada_delta"],
                            config["ood_alarm"], config["boundary_alarm"])  # fmt: skip
            run = EvalRun(t.url, admin, opts, target.held_X, target.truth, target.train_X)
            run_strategies(run, target.k, levels, summary, log, progress)
            summary["sweep"] = sweep(run.curves, opts.margin, target.k, levels.delta)
            admin.close()
    finally:
        store.close()
        # The monitor the gateway started has exited with it; its lock file is no output.
        Path(f"{db}.monitor-lock").unlink(missing_ok=True)
    summary["acceptance"] = acceptance(summary)
    write_outputs(out, summary, run.rows)
    from analysim.report import can_plot

    if can_plot() and run.curves:
        from mlaas_monitor.monitor.eval_plots import plot_status

        alarms = {"prada": 1.0 - levels.delta, "ood": levels.ood_alarm, "boundary": levels.boundary_alarm}
        plot_status(out, run.curves, target.k, levels.thresholds, method, alarms)
    return summary


def check_options(opts: EvalOptions) -> None:
    """Options the command line cannot check alone, each as a one-line error naming its flag."""
    for s in opts.strategies:
        if s not in EVAL_STRATEGIES:
            raise UserError(f"--strategies: unknown strategy {s!r} (expected {', '.join(EVAL_STRATEGIES)})")
    if opts.accounts < 2 and "colluding" in opts.strategies:
        raise UserError("--accounts: colluding needs at least 2 accounts")
    if opts.oracle not in ("leaf", "confidence"):
        raise UserError("--oracle: expected leaf or confidence")
    if not 0 <= opts.margin < 1:
        raise UserError("--margin: expected a number from 0 to 1")


def train_target(opts: EvalOptions, log: Callable[[str], None]) -> Target:
    """Load the table, train the tree under the chosen oracle's policy, and read the truth."""
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
    return Target(model, train_X, held_X, truth, k, float(share.max()))


def serve_copies(store: Store, model: Model, strategies: tuple[str, ...], opts: EvalOptions) -> None:
    """The model, and a copy of it per run that needs a model of its own (a pool of its rows
    alone, or a response policy of its own)."""
    store.add_model(model)
    if "adaptive" in strategies:
        for accounts in opts.adaptive_accounts:
            store.add_model(replace(model, id=adaptive_model(accounts)))
        for accounts in opts.adaptive_pool_aware:
            store.add_model(replace(model, id=adaptive_model(accounts, pool_aware=True)))
    if "natural_sybil" in strategies:
        store.add_model(replace(model, id=NATURAL_SYBIL_MODEL))
    if "attribution" in strategies:
        for attribution_model in ATTRIBUTION_MODELS.values():
            store.add_model(replace(model, id=attribution_model))
    if "policies" in strategies:  # the same tree under each response policy
        for i, pol in enumerate(RESPONSE_POLICIES.values()):
            store.add_model(replace(model, id=f"{MODEL_ID}-p{i}"))
            store.set_policy(f"{MODEL_ID}-p{i}", pol)


def summary_head(opts: EvalOptions, target: Target) -> dict[str, Any]:
    """summary.json's opening keys: the dataset, the model and the run's settings."""
    model = target.model
    return {
        "dataset": opts.dataset,
        "model": {"leaves": model.tree.n_leaves, "depth": model.tree.depth(), "nodes": model.tree.n_nodes,
                  "features": len(model.schema), "classes": target.k, "held_out_rows": int(target.held_X.shape[0]),
                  "validation_accuracy": model.card["validation_accuracy"],
                  "majority_share": target.majority},
        "oracle": opts.oracle,
        "accounts": opts.accounts,
        "margin": opts.margin,
        "reference_queries": opts.reference_queries,
        "strategies": {},
    }  # fmt: skip


def run_strategies(run: EvalRun, k: int, levels: Levels, summary: dict[str, Any], log: Callable[[str], None],
                   progress: bool) -> None:  # fmt: skip
    """Each strategy in turn, its result (with its curves analysed) into ``summary``."""
    opts = run.opts
    method = summary["default_method"]
    bar = _progress_bar(len(opts.strategies)) if progress else None
    run.on_queries = (lambda s, n: bar.set_postfix_str(f"{s}: {n} queries", refresh=False)) if bar else None
    for i, strategy in enumerate(opts.strategies):
        if bar is not None:
            bar.set_description(strategy)
        t0 = time.perf_counter()
        seed = opts.seed + 1000 * (i + 1)  # distinct starts: attackers must not share probes by chance
        before = len(run.curves)
        res = run_strategy(run, strategy, seed, k, levels)
        if strategy == "attribution":
            summary["attribution"] = res["runs"]
        res["seconds"] = round(time.perf_counter() - t0, 2)
        per = [analyse_curve(c, levels.thresholds, opts.margin, k, levels.delta, levels.ood_alarm, levels.boundary_alarm)
               for c in run.curves[before:]]  # fmt: skip
        res["evaluation"] = aggregate(per) if per else None
        if len(per) == 1:
            res["curve"] = per[0]
        summary["strategies"][strategy] = res
        if bar is not None:
            bar.update(1)
            bar.clear()
        log(one_line(strategy, res, method))
    if bar is not None:
        bar.close()


def run_strategy(run: EvalRun, strategy: str, seed: int, k: int, levels: Levels) -> dict[str, Any]:
    if strategy == "benign":
        return run_benign(run, seed)
    if strategy == "adaptive":
        return run_adaptive_all(run, seed, k)
    if strategy == "natural_sybil":
        return run_natural_sybil(run, seed, k)
    if strategy == "policies":
        return run_policies(run, seed, k, levels.thresholds, levels.delta)
    if strategy == "attribution":
        return run_attribution(run, seed, k)
    return run_attack(run, strategy, seed)


def _progress_bar(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="strategy", leave=False, mininterval=0.5)
