"""A sweep's tables: ``results.csv``, one row per cell (its parameters and every summary.json key),
and ``aggregate.csv``, one row per cell-without-its-seed: each metric's mean over the seeds and the
half-width of its 95 % confidence interval (Student's t).

CSV rather than Parquet: a sweep is hundreds of rows, every other table of the project is CSV
written by the same writer (exact floats), and anything reads it (a spreadsheet, pandas, DuckDB)
without pyarrow (~100 MB) in the install.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from analysim.report import write_csv
from analysim.sweep.spec import describe

# Columns before the parameters; a summary key that is also a parameter's name (policy, seed,
# cluster, trace, ...) is kept under "summary.<key>", since the two may differ (policy
# "fifo/consolidate" for --policy fifo; a cluster's name for a spec file).
LEAD = ("cell", "label", "status", "error")
# Metrics with a better direction: the report highlights the best cell of each.
LOWER_IS_BETTER = ("avg_jct_s", "median_jct_s", "p95_jct_s", "p99_jct_s", "avg_queue_s", "makespan_s",
                   "avg_fragmentation", "fragmentation_gpus", "fragmentation_ratio")
HIGHER_IS_BETTER = ("gpu_utilization", "jain_fairness", "jobs_completed", "tasks_placed", "gpu_allocation_ratio")
GROUP_BY_ALL_BUT = "seed"


def result_row(cell_id: str, label: str, status: str, error: str, params: dict, summary: dict | None) -> dict:
    row = {"cell": cell_id, "label": label, "status": status, "error": error, **params}
    for k, v in (summary or {}).items():
        key = f"summary.{k}" if k in row else k
        row[key] = json.dumps(v, sort_keys=True) if isinstance(v, dict | list) else v
    return row


def write_results(rows: Sequence[dict], path: Path) -> None:
    cols: dict[str, None] = dict.fromkeys(LEAD)
    for r in rows:
        cols.update(dict.fromkeys(r))
    write_csv(rows, path, list(cols))


def numeric_metrics(rows: Sequence[dict], params: Sequence[str]) -> list[str]:
    skip = set(LEAD) | set(params) | {"wall_s"}
    out: dict[str, None] = {}
    for r in rows:
        for k, v in r.items():
            if k not in skip and not k.startswith("summary.") and isinstance(v, int | float) and not isinstance(v, bool):
                out[k] = None
    return list(out)


def ci95(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95 % confidence interval (None for a single value)."""
    v = np.asarray(values, dtype=float)
    mean = float(v.mean())
    if len(v) < 2:
        return mean, None
    from scipy.stats import t

    return mean, float(t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))


def aggregate(rows: Sequence[dict], axes: Sequence[str], params: Sequence[str]) -> list[dict]:
    """One row per combination of the axes other than the seed, over the cells that ran ok:
    ``<metric>_mean`` and ``<metric>_ci95`` for every numeric metric, and ``seeds`` (how many)."""
    group_keys = [a for a in axes if a != GROUP_BY_ALL_BUT]
    ok = [r for r in rows if r["status"] == "ok"]
    metrics = numeric_metrics(ok, params)
    groups: dict[tuple, list[dict]] = {}
    for r in ok:
        groups.setdefault(tuple(json.dumps(r.get(k)) for k in group_keys), []).append(r)
    out = []
    for members in groups.values():
        agg = {k: members[0].get(k) for k in group_keys}
        agg["group"] = describe({k: members[0].get(k) for k in group_keys}) or "all"
        agg["seeds"] = len(members)
        for m in metrics:
            vals = [r[m] for r in members if isinstance(r.get(m), int | float) and math.isfinite(r[m])]
            mean, half = ci95(vals) if vals else (None, None)
            agg[f"{m}_mean"], agg[f"{m}_ci95"] = mean, half
        out.append(agg)
    return out


def read_results(path: Path) -> list[dict]:
    """results.csv back, typed: numbers, booleans, empty as None."""
    with path.open() as f:
        return [{k: _typed(v) for k, v in r.items()} for r in csv.DictReader(f)]


def _typed(v: str) -> object:
    if v == "":
        return None
    if v in ("True", "False"):
        return v == "True"
    try:
        return int(v)
    except ValueError:
        pass
    try:
        return float(v)
    except ValueError:
        return v
