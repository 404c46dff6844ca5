"""``monitor-eval``'s figures, computed from recorded runs (no I/O): each subject's status
curve against the truth about it, per method the calibration error, the first warning,
whether it was right and its lead, aggregated per strategy and swept over thresholds; and
the run's acceptance checks and goals read from the summary.

Truth is *balanced fidelity* (mean over the owner's labels of the share of held-out rows
with that label the subject's copy labels alike: a constant copy scores 1/K however skewed
the labels), read on the status scale as *extent* = (bf − 1/K) / (1 − 1/K), the share of
the model held beyond a constant guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mlaas_monitor.monitor.boundary import BOUNDARY_ALARM
from mlaas_monitor.monitor.config import EXTENT_METHODS
from mlaas_monitor.monitor.infogain import extent

SWEEP = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


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


@dataclass
class SubjectCurve:
    """One subject's monitor history and the truth about it."""

    strategy: str  # the strategy that produced it
    subject: str  # the monitor's subject: an account, a group or a link group
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
    """One curve against its truth: per extent method its calibration and first warning,
    then when each intent signal alarmed."""
    q90 = first_at_least(c.truth, 0.9)
    out: dict[str, Any] = {"queries": c.status[-1][0] if c.status else 0, "queries_to_bf_090": q90,
                           "queries_to_bf_099": first_at_least(c.truth, 0.99),
                           "final_bf": c.truth[-1][1] if c.truth else None, "methods": {}}  # fmt: skip
    for m in EXTENT_METHODS:
        out["methods"][m] = _analyse_method(c, m, thresholds.get(m, 0.5), margin, k, q90)
    prada = c.method("prada")
    out["prada_alarm_at"] = first_at_least(prada, 1.0 - delta)
    out["prada_final"] = prada[-1][1] if prada else 0.0
    out["ood_alarm_at"] = first_at_least(c.method("ood"), ood_alarm)
    # Quiring et al.'s alarm: the mean in-margin ratio above their threshold.
    out["boundary_alarm_at"] = next((n for n, v in c.method("boundary") if v > boundary_alarm), None)
    out["boundary_final"] = c.method("boundary")[-1][1] if c.status else 0.0
    return out


def _analyse_method(c: SubjectCurve, m: str, t: float, margin: float, k: int, q90: int | None) -> dict[str, Any]:
    """One extent method's status along the curve against the truth, with threshold ``t``."""
    pts = c.method(m)
    signed = [v - extent(c.truth_at(n) or 1.0 / k, k) for n, v in pts]
    errs = [abs(e) for e in signed]
    w = first_at_least(pts, t)
    ext_w = extent(c.truth_at(w) or 1.0 / k, k) if w is not None else None
    return {
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


def aggregate(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per method over a strategy's curves: calibration error, warnings, right ones, lead."""
    agg: dict[str, Any] = {"curves": len(results), "methods": {}}
    for m in EXTENT_METHODS:
        agg["methods"][m] = _aggregate_method([r["methods"][m] for r in results])
    agg["prada_alarms"] = sum(r["prada_alarm_at"] is not None for r in results)
    agg["ood_alarms"] = sum(r["ood_alarm_at"] is not None for r in results)
    agg["boundary_alarms"] = sum(r["boundary_alarm_at"] is not None for r in results)
    agg["first_boundary_alarm"] = min((r["boundary_alarm_at"] for r in results if r["boundary_alarm_at"] is not None), default=None)
    agg["queries_to_bf_090"] = results[0]["queries_to_bf_090"] if len(results) == 1 else None
    agg["reached_bf_090"] = sum(r["queries_to_bf_090"] is not None for r in results)
    return agg


def _aggregate_method(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """One method's analyses (``_analyse_method``) over a strategy's curves."""
    errs = [r["calibration_error"] for r in rs if r["calibration_error"] is not None]
    warned = [r for r in rs if r["first_warning"] is not None]
    right = [r for r in warned if r["warning_right"]]
    leads = [r["lead"] for r in rs if r["lead"] is not None]
    return {
        "calibration_error": float(np.mean(errs)) if errs else None,
        "max_below_truth": max((r["max_below_truth"] for r in rs if r["max_below_truth"] is not None), default=None),
        "warnings": len(warned),
        "right_warnings": len(right),
        "warning_precision": len(right) / len(warned) if warned else None,
        "first_warning": min((r["first_warning"] for r in warned), default=None),
        "lead": min(leads) if leads else None,
    }


def sweep(curves: list[SubjectCurve], margin: float, k: int, delta: float) -> dict[str, Any]:
    """Per method and threshold: warning precision over every curve, and the attackers not
    warned before balanced fidelity 0.9 (what the defaults are chosen from)."""
    out: dict[str, Any] = {}
    for m in EXTENT_METHODS:
        out[m] = {}
        for t in SWEEP:
            rs = [(c.strategy, analyse_curve(c, dict.fromkeys(EXTENT_METHODS, t), margin, k, delta)) for c in curves]
            warned = [r["methods"][m] for _, r in rs if r["methods"][m]["first_warning"] is not None]
            late = sorted({s for s, r in rs if s != "benign" and not warned_in_time(r, m)})
            benign_wrong = sum(1 for s, r in rs if s == "benign" and r["methods"][m]["warning_right"] is False)
            out[m][str(t)] = {
                "warning_precision": sum(bool(r["warning_right"]) for r in warned) / len(warned) if warned else None,
                "warnings": len(warned),
                "benign_false_alarms": benign_wrong,
                "attackers_late": late,
            }
    return out


def warned_in_time(r: dict[str, Any], m: str) -> bool:
    """Warned before balanced fidelity 0.9 — or never reached it (then no warning is due)."""
    w, q90 = r["methods"][m]["first_warning"], r["queries_to_bf_090"]
    return q90 is None or (w is not None and w < q90)


def acceptance(summary: dict[str, Any]) -> dict[str, Any]:
    """This run's checks: path-finding finds every leaf; the default method's warnings are
    right (precision >= 0.95) and come before each attacker's balanced fidelity 0.9; PRADA
    stays silent on the benign population and alarms on path-finding and random; the sybil
    accounts are grouped automatically; with --reference-queries, path-finding reaches
    0.99 within ten times the published count."""
    st = summary["strategies"]
    acc: dict[str, Any] = {**_pathfinding_checks(summary), **_warning_checks(summary)}
    if "benign" in st:
        acc["prada_silent_on_benign"] = st["benign"]["evaluation"]["prada_alarms"] == 0
    for s in ("pathfinding", "random"):
        if s in st:
            acc[f"prada_alarms_on_{s}"] = st[s]["evaluation"]["prada_alarms"] == 1
    if "sybil" in st:
        acc["sybil_grouped_automatically"] = st["sybil"]["grouped_as"] is not None
    return acc


def _warning_checks(summary: dict[str, Any]) -> dict[str, Any]:
    """The default method's warning precision over every strategy, and per attacker whether
    it was warned before balanced fidelity 0.9 (by any warning; by the default method)."""
    st, method = summary["strategies"], summary["default_method"]
    warned = [r["evaluation"]["methods"][method] for r in st.values() if r.get("evaluation")]
    n_w = sum(m["warnings"] for m in warned)
    n_right = sum(m["right_warnings"] for m in warned)
    acc: dict[str, Any] = {"default_method_warning_precision": round(n_right / n_w, 4) if n_w else None,
                           "default_method_precision_at_least_095": n_w == 0 or n_right / n_w >= 0.95}  # fmt: skip
    warning_methods = [m for m in sorted(summary["config"]["thresholds"]) if m in EXTENT_METHODS]
    for s, r in st.items():
        if s != "benign" and r.get("curve"):
            acc[f"{s}_warned_before_bf_090"] = any(warned_in_time(r["curve"], m) for m in warning_methods)
            acc[f"{s}_default_method_before_bf_090"] = warned_in_time(r["curve"], method)
    return acc


def _pathfinding_checks(summary: dict[str, Any]) -> dict[str, Any]:
    """Path-finding found every leaf; with --reference-queries, it reached bf 0.99 within
    ten times the published count (none without a path-finding run)."""
    pf = summary["strategies"].get("pathfinding")
    if not pf:
        return {}
    acc: dict[str, Any] = {"pathfinding_found_every_leaf": pf.get("leaves_found") == summary["model"]["leaves"]}
    ref = summary.get("reference_queries")
    if ref:
        q = (pf.get("curve") or {}).get("queries_to_bf_099")
        acc["pathfinding_within_10x_reference"] = q is not None and q < 10 * ref
    return acc


GOAL_CALIBRATION = 0.05  # mean |status - extent| along the curve
GOAL_BELOW = 0.15  # never further below the truth than this
GOAL_PRECISION = 0.95  # warnings right on the benign population


def goals(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per strategy, the default method against the monitor's goals: calibration error <=
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
