"""Cost linear in work: ``analysim simulate`` on 10k, 100k and 1M synthetic Philly-like jobs, each
run a child process measured on its own (wall, CPU, peak RSS from os.wait4), as a markdown table.

    .venv/bin/python bench/bench_scale.py                      # 10k, 100k, 1M on 96x8
    .venv/bin/python bench/bench_scale.py --jobs 10000 100000  # fewer sizes
    .venv/bin/python bench/bench_scale.py --cluster 64x8       # Philly's 512 GPUs: queues grow

Every trace is ``analysim trace generate --rate-scale 1`` (Philly's load, ~374 busy GPUs), so a
longer trace is more of the same load over a longer span (10k jobs ~13 days, 1M ~3.6 years). On
the 768 GPUs of 96x8 (~49 % offered load) the queues stay comparable (average queueing 0 h at 10k,
0.3 h at 100k); on the 512 GPUs the load was fitted for (64x8), the synthetic trace's bursty weeks
build queues that grow with the span (6.6 h at 10k, 16 h at 100k, 147 h at 1M), so each job costs
more there. jobs/s should stay roughly constant, and the peak RSS grow far slower than the jobs.
With ``--scale-cluster``, the arrival rate and the nodes grow with the jobs instead (the span stays
~13 days); a larger pool then queues far less. Traces are written to ``--work`` (default: a
temporary folder) and kept there for a re-run. jobs/s is per CPU second (user + sys) of the whole
process, the fairer figure on a shared machine, start-up (imports, ~0.7 s) and reading the trace
included; "run s" is the run alone, jobs.csv streamed during it (summary.json's ``wall_s``); the
load average is the 1-minute figure before and after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from measure import Measured, run_measured

BASE_JOBS = 10_000


def child(argv: list[str]) -> Measured:
    """Run ``argv``; what that process alone cost (``bench/measure.py``)."""
    m = run_measured(argv, stderr=None)
    if m.exit_code:
        raise SystemExit(f"failed ({m.exit_code}): {' '.join(argv)}")
    return m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--cluster", default="96x8", help="cluster for every size (default 96x8: 768 GPUs)")
    ap.add_argument("--scale-cluster", action="store_true",
                    help="scale the arrival rate and the nodes of --cluster with jobs / 10k instead")
    ap.add_argument("--policy", default="fifo")
    ap.add_argument("--work", type=Path, help="folder for the traces (default: a temporary one)")
    args = ap.parse_args()
    exe = str(Path(sys.executable).parent / "analysim")
    nodes, gpus = (int(x) for x in args.cluster.split("x"))
    work = args.work or Path(tempfile.mkdtemp(prefix="analysim-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} cores; policy {args.policy}; traces in {work}", file=sys.stderr)
    print("| jobs | cluster | avg queue h | wall s | run s | user s | sys s | jobs/s (CPU) | peak RSS MB "
          "| load avg before → after |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for n in args.jobs:
        scale = n / BASE_JOBS if args.scale_cluster else 1.0
        cluster = f"{round(nodes * scale)}x{gpus}" if args.scale_cluster else args.cluster
        trace = work / f"synthetic-{n}-r{scale:g}.csv"
        if not trace.exists():
            subprocess.run([exe, "trace", "generate", "--jobs", str(n), "--seed", "0", "--rate-scale", f"{scale:g}",
                            "--out", str(trace)], check=True, stdout=subprocess.DEVNULL)
        with tempfile.TemporaryDirectory() as out:
            before = os.getloadavg()[0]
            m = child([exe, "simulate", "--trace", str(trace), "--cluster", cluster, "--policy",
                       args.policy, "--no-plots", "--no-progress", "--out", out])
            after = os.getloadavg()[0]
            summary = json.loads((Path(out) / "summary.json").read_text())
        done = summary["jobs_completed"]
        print(f"| {n:,} | {cluster} | {summary['avg_queue_s'] / 3600:.2f} | {m.wall_s:.1f} | {summary['wall_s']:.1f} "
              f"| {m.user_s:.1f} | {m.sys_s:.1f} | {done / m.cpu_s:,.0f} | {m.peak_rss_mb:.0f} "
              f"| {before:.1f} → {after:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
