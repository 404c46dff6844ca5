"""How close a replay's admissions are to the ones the traced cluster recorded: for a run of a
trace with recorded admissions (a Kueue Workload list, analysim.traces.kueue_workloads), each
job's admission wait in the replay (first start less submit) beside the recorded one (recorded
admission less submit), per ClusterQueue and overall: mean, median and 95th percentile, the share
admitted within 1 and within 10 minutes, and the two-sample Kolmogorov-Smirnov distance between
the two waits' distributions (0: the same distribution; 1: no overlap).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from analysim.core.figures import distribution
from analysim.errors import InputFileError, UserError
from analysim.report import RECORDED_ADMISSION

# Waits a share is reported within (seconds): a minute and ten.
WITHIN_S = (60.0, 600.0)
OVERALL = "(all)"


def read_waits(run: Path, left_out: dict[str, int] | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per ClusterQueue (the run's VC where it has no partition), then OVERALL: the simulated and
    the recorded admission waits of the jobs admitted in both, in the same job order. ``left_out``
    (filled when given): per group, the jobs with a recorded admission that ended in the replay
    without one (cancelled or failed while waiting)."""
    jobs = run / "jobs.csv"
    if not jobs.is_file():
        raise UserError(f"{run}: no jobs.csv: not the output folder of a replay (analysim simulate --out)")
    cq_of: dict[str, str] = {}  # (no summary, or one without ClusterQueues: the jobs are grouped by their VC)
    try:
        for cq, figures in (_summary(run).get("per_cluster_queue") or {}).items():
            cq_of.update(dict.fromkeys(figures.get("local_queues") or (), cq))
    except AttributeError:
        pass
    groups: dict[str, tuple[list[float], list[float]]] = {}
    with jobs.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        if RECORDED_ADMISSION not in header:
            raise UserError(f"{jobs}: no {RECORDED_ADMISSION} column: the run's trace has no recorded admissions "
                            "(analysim trace convert --format kueue-workloads)")
        at = {c: header.index(c) for c in ("vc", "submit_s", "first_start_s", RECORDED_ADMISSION)}
        for row in reader:
            if len(row) != len(header):
                raise InputFileError(str(jobs), reader.line_num, None, "expected as many fields as the header")
            vc = row[at["vc"]]
            its = (cq_of.get(vc, vc), OVERALL)  # the groups the job counts in
            if not row[at["first_start_s"]] or not row[at[RECORDED_ADMISSION]]:
                if row[at[RECORDED_ADMISSION]] and left_out is not None:
                    for g in its:
                        left_out[g] = left_out.get(g, 0) + 1
                continue  # (not admitted in the replay, or no admission recorded)
            try:
                submit = float(row[at["submit_s"]])
                sim = float(row[at["first_start_s"]]) - submit
                real = float(row[at[RECORDED_ADMISSION]]) - submit
            except ValueError as e:
                raise InputFileError(str(jobs), reader.line_num, None, str(e)) from None
            for g in its:
                s, r = groups.setdefault(g, ([], []))
                s.append(sim)
                r.append(real)
    if not groups:
        raise UserError(f"{jobs}: no job has both a simulated and a recorded admission")
    return {g: (np.array(s), np.array(r)) for g, (s, r) in sorted(groups.items(), key=lambda kv: kv[0] == OVERALL)}


def _summary(run: Path) -> dict:
    """The run's summary.json, or {} where there is none readable (the report then goes without
    what only it says)."""
    try:
        summary = json.loads((run / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the two ECDFs."""
    from scipy.stats import ks_2samp

    return float(ks_2samp(a, b).statistic)


def _side(waits: np.ndarray) -> dict[str, float | None]:
    mean, p50, p95, _ = distribution(waits)
    return {"mean_wait_s": mean, "p50_wait_s": p50, "p95_wait_s": p95,
            **{f"within_{int(s // 60)}min": float(np.mean(waits <= s)) for s in WITHIN_S}}


def score(run: Path) -> dict:
    """fidelity.json's content: per group, the jobs compared, both sides' figures and the KS
    distance; and what could not be compared: per group the jobs recorded as admitted that ended in
    the replay without an admission (``not_admitted``), and, from summary.json (jobs.csv has no row
    for them), the trace's jobs the replay refused by reason (``filtered_in_replay``) and its jobs
    that never ended (``unfinished_in_replay``)."""
    left_out: dict[str, int] = {}
    waits = read_waits(run, left_out)
    summary = _summary(run)
    try:
        unfinished = int(summary.get("jobs_unfinished") or 0)
        filtered = {str(k): int(v) for k, v in (summary.get("jobs_filtered") or {}).items() if v}
    except (ValueError, AttributeError, TypeError):
        unfinished, filtered = 0, {}  # (a summary of another shape: nothing known of them)
    return {"run": str(run), "groups": {
        g: {"jobs": int(len(s)), "not_admitted": left_out.get(g, 0), "simulated": _side(s), "recorded": _side(r),
            "ks_distance": ks_distance(s, r)}
        for g, (s, r) in waits.items()}, "filtered_in_replay": filtered, "unfinished_in_replay": unfinished}


def not_compared(report: dict) -> list[str]:
    """The lines saying which jobs the table leaves out, when any are."""
    out = []
    total = report["groups"].get(OVERALL, {}).get("not_admitted", 0)
    if total:
        out.append(f"{total:,} job(s) recorded as admitted ended in the replay without an admission (not compared)")
    filtered = report.get("filtered_in_replay") or {}
    if filtered:
        why = ", ".join(f"{reason} {n:,}" for reason, n in sorted(filtered.items()))
        out.append(f"{sum(filtered.values()):,} job(s) of the trace refused by the replay ({why}): not compared")
    if report.get("unfinished_in_replay"):
        out.append(f"{report['unfinished_in_replay']:,} job(s) of the replay never ended (still waiting or running "
                   "at its end): not in jobs.csv, not compared")
    return out


def table(report: dict) -> str:
    """The terminal table: a row per group."""
    def f(v: float | None) -> str:
        return "–" if v is None else f"{v:,.1f}"

    head = ("ClusterQueue", "jobs", "mean wait s sim/rec", "p50 s sim/rec", "p95 s sim/rec",
            "≤1 min sim/rec", "≤10 min sim/rec", "KS")
    rows = [head]
    for g, x in report["groups"].items():
        s, r = x["simulated"], x["recorded"]
        rows.append((g, str(x["jobs"]), f"{f(s['mean_wait_s'])} / {f(r['mean_wait_s'])}",
                     f"{f(s['p50_wait_s'])} / {f(r['p50_wait_s'])}", f"{f(s['p95_wait_s'])} / {f(r['p95_wait_s'])}",
                     f"{s['within_1min']:.0%} / {r['within_1min']:.0%}",
                     f"{s['within_10min']:.0%} / {r['within_10min']:.0%}", f"{x['ks_distance']:.3f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def plot(run: Path, out: Path) -> Path:
    """An ECDF of the simulated and the recorded admission waits, a panel per group."""
    from analysim.report import pyplot

    waits = read_waits(run)
    if len(waits) == 2:  # one ClusterQueue: its panel is the whole
        del waits[OVERALL]
    plt = pyplot()
    n = len(waits)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    for ax, (g, (s, r)) in zip(axes.flat, waits.items(), strict=False):
        for values, label, color in ((s, "simulated", "tab:blue"), (r, "recorded", "tab:orange")):
            v = np.sort(values)
            ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=label, color=color, lw=1.2)
        ax.set_title(f"{g}: {len(s)} jobs, KS {ks_distance(s, r):.2f}", fontsize=9)
        ax.set_xlabel("admission wait (s)", fontsize=8)
        ax.set_ylabel("fraction of jobs", fontsize=8)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    partial = out.with_name(out.name + ".partial.png")
    fig.savefig(partial, dpi=110)
    plt.close(fig)
    partial.replace(out)
    return out
