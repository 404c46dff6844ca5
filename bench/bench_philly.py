"""The speed table: every policy on the Philly extract, plain and with preemption and
migration, and the PAI side-by-side sample (sjf and fair on `1x6500`, and on `1x64`).

Each run is its own process, one at a time, so that its user CPU and peak RSS are its own:

    .venv/bin/python bench/bench_philly.py [--only philly|sample] [--policies fifo,sjf] [--limit N]
                                           [--timeout S]

Prints a Markdown table (wall s, user s, jobs/s, peak RSS) with the load average before and after
each run: on a shared machine wall time is pessimistic and user CPU is the steadier figure. A run
past ``--timeout`` is reported as such, not waited for. Skips cleanly when ../shared/traces is absent.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench_simulate import run_one  # the same child-process measurement

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
PHILLY = TRACES / "philly.csv"
SAMPLE = TRACES / "philly_sample20k_1000pm.csv"
POLICIES = ("fifo", "fifo-backfill", "sjf", "srtf", "tiresias", "qssf", "fair")
MECHANISMS = ("--preemption", "--migration")


def configs(only: str | None, policies: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    out = []
    if only in (None, "philly") and PHILLY.exists():
        for mech in ((), MECHANISMS):
            for policy in policies:
                out.append((f"philly {policy}" + (" +preemption +migration" if mech else ""),
                            ["--trace", str(PHILLY), "--cluster", "philly", "--policy", policy, *mech]))
    if only in (None, "sample") and SAMPLE.exists():
        for cluster in ("1x6500", "1x64"):
            for policy in ("sjf", "fair"):
                out.append((f"sample20k {cluster} {policy}",
                            ["--trace", str(SAMPLE), "--cluster", cluster, "--policy", policy]))
    return out


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("philly", "sample"))
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated (Philly rows)")
    ap.add_argument("--limit", type=int, help="first N jobs of each trace")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds of wall time per run")
    a = ap.parse_args()
    rows = configs(a.only, tuple(p for p in a.policies.split(",") if p))
    if not rows:
        print("no traces under ../shared/traces: skipped")
        return 0
    print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}"
          + (f"; --limit {a.limit}" if a.limit else ""))
    print()
    print("| run | jobs | wall s | user s | jobs/s (wall) | peak RSS MB | load before → after |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, args in rows:
        before = load_average()
        r = run_one(args, a.limit, a.timeout)
        after = load_average()
        if r["timeout"]:
            print(f"| {name} | | > {a.timeout:.0f} (timed out) | | | | {before} → {after} |", flush=True)
            continue
        print(f"| {name} | {r['jobs']:,} | {r['wall_s']:.1f} | {r['user_s']:.1f} | {r['jobs'] / r['wall_s']:,.0f} "
              f"| {r['peak_rss_mb']:.0f} | {before} → {after} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
