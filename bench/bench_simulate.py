"""Wall time and peak memory of `analysim simulate` on the real traces.

Each configuration runs in its own process, one at a time, so that its peak RSS is its own:

    .venv/bin/python bench/bench_simulate.py [--only philly|openb] [--limit N]

Prints a Markdown table (for BENCHMARKS.md). Skips cleanly when ../shared/traces is absent.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

from measure import run_measured  # the child-process measurement

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
PHILLY = TRACES / "philly.csv"
OPENB_PODS = TRACES / "openb_pod_list_default.csv"
OPENB_NODES = TRACES / "openb_node_list_gpu_node.csv"


def configs(only: str | None) -> list[tuple[str, list[str]]]:
    out = []
    if only in (None, "philly") and PHILLY.exists():
        for policy in ("fifo", "sjf", "srtf", "tiresias"):
            for mig in (False, True):
                args = ["--trace", str(PHILLY), "--cluster", "philly", "--policy", policy]
                out.append((f"philly {policy}" + (" +migration" if mig else ""), args + (["--migration"] if mig else [])))
    if only in (None, "openb") and OPENB_PODS.exists() and OPENB_NODES.exists():
        for placement in ("fgd", "consolidate"):
            for mode in ("replay", "inflate"):
                args = ["--trace", str(OPENB_PODS), "--cluster", str(OPENB_NODES), "--placement", placement,
                        "--mode", mode]
                out.append((f"openb {placement} {mode}", args))
    return out


def run_one(args: list[str], limit: int | None, timeout: float | None = None) -> dict:
    """``analysim simulate ARGS`` in a child process: its wall time, its own CPU and peak RSS
    (``bench/measure.py``), its summary; ``{"timeout": True}`` when it outlives ``timeout`` seconds."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "analysim", "simulate", *args, "--out", out, "--no-plots", "--no-progress"]
        if limit:
            cmd += ["--limit", str(limit)]
        m = run_measured(cmd, timeout)
        if m.timed_out:
            return {"timeout": True}
        if m.exit_code != 0:
            raise SystemExit(f"failed: {' '.join(cmd)}")
        summary = json.loads((Path(out) / "summary.json").read_text())
    return {
        "wall_s": m.wall_s, "sim_wall_s": summary["wall_s"], "cpu_s": m.cpu_s, "user_s": m.user_s,
        "peak_rss_mb": m.peak_rss_mb, "summary": summary, "jobs": summary.get("jobs_total"), "timeout": False,  # (inflate: tasks_placed)
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["philly", "openb"])
    ap.add_argument("--limit", type=int)
    args = ap.parse_args()
    todo = configs(args.only)
    if not todo:
        print("skipped: ../shared/traces not found")
        return 0
    print(f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, python {platform.python_version()}")
    print("| run | jobs | process wall s | simulate wall s | jobs/s | peak RSS MB | key figures |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for label, a in todo:
        r = run_one(a, args.limit)
        s = r["summary"]
        if s["mode"] == "inflate":
            jobs = s["tasks_placed"]
            figures = f"allocation ratio {s['gpu_allocation_ratio']:.2%}, FGD frag {s['fragmentation_gpus']:.0f} GPUs"
        else:
            jobs = s["jobs_total"]
            figures = (f"avg JCT {s['avg_jct_s'] / 3600:.2f} h, util {s['gpu_utilization']:.1%}, "
                       f"migrations {s['migrations']}")
        print(f"| {label} | {jobs} | {r['wall_s']:.1f} | {r['sim_wall_s']:.1f} | {jobs / r['sim_wall_s']:,.0f} "
              f"| {r['peak_rss_mb']:.0f} | {figures} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
