"""``monitor-eval``'s report: the markdown tables (the goals, every method per strategy, the
adaptive, policies and attribution tables), curves.csv, summary.json and table.md."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from mlaas_monitor.monitor.curves import GOAL_BELOW, GOAL_CALIBRATION, GOAL_PRECISION, goals
from mlaas_monitor.monitor.pool import POOL


def cell(v: Any, nd: int = 3) -> str:
    """A table cell: – for none, a float to ``nd`` decimals, anything else as it prints."""
    if v is None:
        return "–"
    return f"{v:.{nd}f}" if isinstance(v, float) else str(v)


def one_line(strategy: str, res: dict[str, Any], method: str) -> str:
    """A strategy's result in one line (the log as the run goes; natural_sybil's in the table)."""
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


def format_adaptive(rows: list[dict[str, Any]], safety: float) -> list[str]:
    """The adaptive attacker's table: a row per run (per k, pool-aware or not)."""
    out = [f"Adaptive attacker (knows {rows[0]['method']} and its threshold {rows[0]['threshold']:.2f}; each account retires "
           f"{safety} below it): extent = balanced fidelity beyond a constant copy of its pooled copy", "",
           "| accounts k | queries | leaves found | accounts retired | groups formed | highest status | first warning at | "
           "extent then | pool warned at | extent then | pool status at the end | enforcement rule at | extent then | "
           "extent at the end (unwarned: stolen unseen) | pool response | accounts acted on (the attacker's) |",
           "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]  # fmt: skip
    for r in rows:
        out.append(f"| {r['accounts']}{' (pool-aware)' if r.get('pool_aware') else ''} | {r['queries_used']} | {r['leaves_found']} | {r['accounts_retired']} | "
                   f"{', '.join(r['groups']) or '–'} | {cell(r['max_subject_status'])} | {cell(r['warned_at'])} | "
                   f"{cell(r['extent_at_warning'])} | {cell(r.get('pool_warned_at'))} | {cell(r.get('extent_at_pool_warning'))} | "
                   f"{cell(r.get('pools', {}).get(POOL, {}).get('best_copy'))} | {cell(r['enforced_at'])} | "
                   f"{cell(r['extent_at_enforcement'])} | {cell(r['final_extent'])} | {r.get('response', 'none')} | "
                   f"{r.get('accounts_acted_on', 0)} ({r.get('accounts_acted_on_attacker', 0)}) |")  # fmt: skip
    return out


def format_policies(rows: list[dict[str, Any]], method: str) -> list[str]:
    """The response policies' table: a row per policy and attacker."""
    out = [f"Response policies as defences (the same tree; extent of the attacker's best copy, and {method} on it)", "",
           f"| policy | attacker | queries | leaves found | extent at the end | {method} at the end | calibration error | "
           "max below truth | first warning | queries to bf 0.9 |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        out.append(f"| {r['policy']} | {r['strategy']} | {r['queries']} | {cell(r['leaves_found'])} | {cell(r['final_extent'])} | "
                   f"{cell(r['final_status'])} | {cell(r['calibration_error'])} | {cell(r['max_below_truth'])} | "
                   f"{cell(r['first_warning'])} | {cell(r['queries_to_bf_090'])} |")  # fmt: skip
    return out


def format_table(summary: dict[str, Any]) -> str:
    """The evaluation as markdown: the goals (default method per strategy, with the intent
    signals PRADA, OOD and Quiring et al.'s closeness to the boundary on the same streams),
    then every extent method per strategy."""
    method = summary["default_method"]
    lines = [*_goals_table(summary, method), "", *_methods_table(summary)]
    for extra in ("adaptive", "policies", "attribution"):
        if summary["strategies"].get(extra):
            lines += ["", *summary["strategies"][extra]["table"]]
    lines += _notes(summary, method)
    lines.append("acceptance: " + ", ".join(f"{k}={v}" for k, v in summary["acceptance"].items()))
    return "\n".join(lines)


def _yes(v: bool) -> str:
    return "yes" if v else "**no**"


def _goals_table(summary: dict[str, Any], method: str) -> list[str]:
    """The model, then the default method per strategy against the goals."""
    m0 = summary["model"]
    lines = [f"{summary['dataset']}: {m0['leaves']} leaves, {m0['classes']} classes, {m0['held_out_rows']} held-out rows, "
             f"majority share {m0['majority_share']:.3f}; default method {method} at "
             f"{cell(summary['warning_threshold'], 2)}, margin {summary['margin']}", "",
             f"Goals ({method}): calibration error <= {GOAL_CALIBRATION}, never more than {GOAL_BELOW} below the truth, "
             f"warned before bf 0.9 (benign: warnings right >= {GOAL_PRECISION})", "",
             "| strategy | curves | calibration error | max below truth | first warning | queries to bf 0.9 | warning goal | "
             "PRADA alarms | OOD alarms | boundary alarms (first) |", "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]  # fmt: skip
    for s, g in goals(summary).items():
        ev = summary["strategies"][s]["evaluation"]
        n = ev["curves"]
        if s == "benign":
            mm = ev["methods"][method]
            warn, q90 = f"{mm['right_warnings']}/{mm['warnings']} right", f"{ev['reached_bf_090']}/{n} reach"
        else:
            warn, q90 = cell(g["first_warning"]), cell(g["queries_to_bf_090"])
        lines.append(f"| {s} | {n} | {cell(g['calibration_error'])} ({_yes(g['calibration_ok'])}) | {cell(g['max_below_truth'])} "
                     f"({_yes(g['below_ok'])}) | {warn} | {q90} | {_yes(g['warning_ok'])} | {ev['prada_alarms']}/{n} | "
                     f"{ev['ood_alarms']}/{n} | {ev['boundary_alarms']}/{n} ({cell(ev['first_boundary_alarm'])}) |")  # fmt: skip
    return lines


def _methods_table(summary: dict[str, Any]) -> list[str]:
    """Every extent method per strategy."""
    lines = ["| strategy | method | threshold | calibration error | max below truth | right / warnings | first warning | "
             "queries to bf 0.9 | lead |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for s, r in summary["strategies"].items():
        ev = r.get("evaluation")
        if not ev:
            continue
        q90 = ev["queries_to_bf_090"] if ev["curves"] == 1 else f"{ev['reached_bf_090']}/{ev['curves']} reach"
        for m, x in ev["methods"].items():
            lines.append(f"| {s} | {m} | {cell(summary['config']['thresholds'].get(m, 0.5), 2)} | {cell(x['calibration_error'])} | "
                         f"{cell(x['max_below_truth'])} | {x['right_warnings']}/{x['warnings']} | {cell(x['first_warning'])} | "
                         f"{cell(q90)} | {cell(x['lead'])} |")  # fmt: skip
    return lines


def _notes(summary: dict[str, Any], method: str) -> list[str]:
    """A line each on the sybil, the benign population's pools and the natural sybil."""
    lines = []
    sy = summary["strategies"].get("sybil")
    if sy:
        per = ", ".join(f"{m} {cell(v)}" for m, v in sy["max_account_status_by_method"].items())
        lines.append(f"\nsybil: {sy['accounts']} accounts of {sy['per_account_queries']} queries, highest single-account "
                     f"status {per}; grouped automatically as {cell(sy['grouped_as'])} ({sy['accounts_grouped']} accounts)")  # fmt: skip
    be = summary["strategies"].get("benign")
    if be and be.get("pools"):
        p = be["pools"]
        lines.append(f"\nbenign pools: auto:pool {cell(p['auto:pool']['best_copy'])} ({p['auto:pool']['n_queries']} rows, "
                     f"{'warned' if p['auto:pool']['warned'] else 'not warned'}), auto:young {cell(p['auto:young']['best_copy'])} "
                     f"({p['auto:young']['n_queries']} rows), exposure {cell(p['exposure'])}")  # fmt: skip
    ns = summary["strategies"].get("natural_sybil")
    if ns:
        lines.append("\n" + one_line("natural_sybil", ns, method))
    return lines


def write_outputs(out: Path, summary: dict[str, Any], rows: list[tuple[str, str, int, str, float]]) -> None:
    """curves.csv, summary.json and table.md into ``out``."""
    write_curves(out / "curves.csv", rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "table.md").write_text(format_table(summary) + "\n")


def write_curves(path: Path, rows: list[tuple[str, str, int, str, float]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["strategy", "subject", "n_queries", "metric", "value"])
        for row in rows:
            w.writerow([*row[:4], f"{row[4]:.6f}"])
