"""Fit the synthetic generator's and the ``philly`` preset's constants to the Philly extract.

Run: ``.venv/bin/python bench/fit_philly.py [../shared/traces/philly.csv]``. Prints the numbers that
``analysim/traces/synthetic.py`` and ``analysim/clusters.py`` embed; re-run it and paste if the
model changes. Calendar days and hours are taken in the trace's own (unstated) time zone.
"""

from __future__ import annotations

import csv
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path

import numpy as np

from analysim.traces import load_trace

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT.parent / "shared" / "traces" / "philly.csv"
# Dense in the tail: with log-linear interpolation between knots, the sampled class means then stay
# within 2% of the data's (with knots only up to 0.95, 0.98, 0.99, ... the 1-GPU mean came out 8% high).
QUANTILE_LEVELS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6,
                   0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.925, 0.95, 0.96, 0.97, 0.98, 0.985, 0.99, 0.9925,
                   0.995, 0.9975, 0.999, 0.9995, 0.9999, 1.0)  # fmt: skip
CLASSES = ((1, 1), (2, 2), (3, 4), (5, 15), (16, 10**9))  # GPU-count classes: 1, 2, 4, 8 (and 12), 16+
BUSY_DAY_MIN_JOBS = 100  # days below this are the extract's ramp-up and logging gaps, not workload


def main(path: Path) -> None:
    trace = load_trace(path, "philly")
    jobs = trace.jobs
    # submit_s counts from the first timestamp; shift to calendar time so days and hours line up.
    with path.open(newline="") as f:
        first = datetime.fromisoformat(min(row["timestamp"] for row in csv.DictReader(f)))
    start_weekday = first.weekday()  # 0 = Monday; 2017-09-04 is one, as the generator assumes
    t = np.array([j.submit_s for j in jobs]) + (first.hour * 3600 + first.minute * 60 + first.second)
    g = np.array([j.num_gpus for j in jobs])
    d = np.array([j.duration_s for j in jobs], dtype=float)
    vcs = [j.vc for j in jobs]
    span_days = (t.max() - t.min()) / 86400
    print(
        f"# {len(jobs)} jobs over {span_days:.3f} days from {first}, a weekday {start_weekday} (0 = Monday)"
    )
    print(f"MEAN_JOBS_PER_DAY = {len(jobs) / span_days:.2f}")

    day = (t // 86400).astype(int)
    per_day = np.bincount(day)
    busy = np.flatnonzero(per_day >= BUSY_DAY_MIN_JOBS)
    print(f"# busy days: {len(busy)} of {len(per_day)} (first busy day index {busy[0]})")
    in_busy = np.isin(day, busy)
    hours = np.bincount(((t[in_busy] % 86400) // 3600).astype(int), minlength=24)
    print("HOUR_WEIGHTS =", tuple(round(float(x), 4) for x in hours / hours.mean()))
    weekday = (busy + start_weekday) % 7
    dow_mean = np.array([per_day[busy][weekday == w].mean() for w in range(7)])
    dow = dow_mean / dow_mean.mean()
    print("WEEKDAY_WEIGHTS =", tuple(round(float(x), 4) for x in dow))
    resid = np.log(per_day[busy] / (per_day[busy].mean() * dow[weekday]))
    print(f"DAILY_LOG_SIGMA = {resid.std():.4f}")

    # Jobs submitted in the same second are mostly one sweep: same VC (93%) and GPU count (98%).
    secs = Counter(t.tolist())
    sizes = Counter(secs.values())
    print("BATCH_SIZE_COUNTS =", dict(sorted(sizes.items())))

    counts = Counter(g.tolist())
    print("GPU_COUNT_JOBS =", dict(sorted(counts.items())))
    vc_order = [v for v, _ in Counter(vcs).most_common()]
    print("VCS =", tuple(vc_order))
    for lo, hi in CLASSES:
        m = (g >= lo) & (g <= hi)
        c = Counter(v for v, keep in zip(vcs, m, strict=True) if keep)
        q = np.quantile(d[m], QUANTILE_LEVELS)
        print(f"# class {lo}-{hi}: {m.sum()} jobs, mean duration {d[m].mean():.0f} s")
        print("  VC_JOBS:", tuple(c.get(v, 0) for v in vc_order))
        print("  DURATION_QUANTILES:", tuple(round(float(x), 1) for x in q))

    gpu_time = g * d
    total = gpu_time.sum()
    print(f"# GPU-hours {total / 3600:.0f}, average busy GPUs {total / (span_days * 86400):.1f}")
    share = {v: float(gpu_time[[x == v for x in vcs]].sum() / total) for v in vc_order}
    print("# GPU-time share per VC (largest first):")
    for v, s in sorted(share.items(), key=lambda kv: -kv[1]):
        print(f"    ({v!r}, {s:.6f}),")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
