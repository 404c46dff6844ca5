"""A 24-cell `analysim sweep` on the Philly extract: the local engine against Ray with 2 workers.

    .venv/bin/python bench/bench_sweep.py [--limit 1000]

SPEC: the Philly extract (82,247 jobs) on the `philly` preset, the first --limit jobs (default 2000), policy
fifo/srtf/tiresias x placement consolidate/spread x preemption off/on x seed 1/2 = 24 cells.
Engines, each into a fresh folder:
- local: `--engine local --workers 2` (a process pool);
- ray: `--engine ray --address` a Ray head started here beforehand (`ray start --head
  --num-cpus 2`, 127.0.0.1, its own ports and token; its start-up time is reported apart);
- ray (own): `--engine ray --workers 2` without an address: the sweep starts and stops a Ray.

For each: the whole command's wall time, the sweep's (cells only), cells/min, the mean cell's own
time (`cell_wall_s` in cell.json: one simulate, measured inside the worker), and the overhead per
cell: (sweep wall x 2 workers - sum of cell times) / 24, i.e. worker time not spent in cells.
Checks that every engine gives byte-identical jobs.csv per cell. Prints Markdown for BENCHMARKS.md.
Skips when ../shared/traces is absent.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.rayhead import ray_head  # noqa: E402  (the Ray head the tests use)

PHILLY = ROOT.parent / "shared" / "traces" / "philly.csv"
CELLS, WORKERS = 24, 2
SPEC = """\
trace: {trace}
cluster: philly
limit: {limit}
policy: [fifo, srtf, tiresias]
placement: [consolidate, spread]
preemption: [false, true]
seed: [1, 2]
"""


def run_sweep(spec: Path, out: Path, extra: list[str], env: dict) -> dict:
    cmd = [sys.executable, "-m", "analysim", "sweep", str(spec), "--out", str(out), "--no-progress", *extra]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    total = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{r.stderr}")
    m = re.search(r"sweep: (\d+) cells ran in ([0-9.]+) s", r.stdout)
    assert m and int(m.group(1)) == CELLS, r.stdout
    cells = [json.loads(p.read_text()) for p in (out / "cells").glob("*/cell.json")]
    sweep_s = float(m.group(2))
    cell_s = sum(c["cell_wall_s"] for c in cells)
    return {"total_s": total, "sweep_s": sweep_s, "cells_per_min": CELLS / sweep_s * 60, "mean_cell_s": cell_s / CELLS,
            "overhead_s": (sweep_s * WORKERS - cell_s) / CELLS, "stdout": r.stdout,
            "digests": {p.parent.name: hashlib.sha256(p.read_bytes()).hexdigest()
                        for p in (out / "cells").glob("*/jobs.csv")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=2000, help="jobs per cell (default 2000)")
    args = ap.parse_args()
    if not PHILLY.exists():
        print(f"skipped: {PHILLY} absent")
        return 0
    work = Path(tempfile.mkdtemp(prefix="bsw", dir="/tmp"))
    spec = work / "philly.yaml"
    spec.write_text(SPEC.format(trace=PHILLY, limit=args.limit))
    load = [os.getloadavg()[0]]
    res = {"local": run_sweep(spec, work / "local", ["--engine", "local", "--workers", str(WORKERS)], os.environ)}
    load.append(os.getloadavg()[0])
    t0 = time.perf_counter()
    with ray_head(num_cpus=WORKERS) as head:
        ray_start_s = time.perf_counter() - t0
        res["ray"] = run_sweep(spec, work / "ray-cluster", ["--engine", "ray", "--address", head.address], head.env)
    load.append(os.getloadavg()[0])
    res["ray (own)"] = run_sweep(spec, work / "ray-own", ["--engine", "ray", "--workers", str(WORKERS)], os.environ)
    load.append(os.getloadavg()[0])
    same = all(r["digests"] == res["local"]["digests"] for r in res.values())
    print(f"24 cells, Philly extract, --limit {args.limit}, {WORKERS} workers; load average (1 min) during: "
          f"{min(load):.2f}–{max(load):.2f}; jobs.csv identical across engines: {same}\n")
    print("| engine | command wall s | sweep wall s | cells/min | mean cell s | overhead per cell s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in res.items():
        print(f"| {name} | {r['total_s']:.1f} | {r['sweep_s']:.1f} | {r['cells_per_min']:.1f} | "
              f"{r['mean_cell_s']:.2f} | {r['overhead_s']:.2f} |")
    print(f"\nRay head start-up (`ray start --head`, before the 'ray' row): {ray_start_s:.1f} s")
    print(f"Overhead Ray adds per cell (ray − local): {res['ray']['overhead_s'] - res['local']['overhead_s']:+.2f} s; "
          f"cell time Ray adds (ray − local mean cell): {res['ray']['mean_cell_s'] - res['local']['mean_cell_s']:+.2f} s")
    print("\nTop rows (best average JCT first):\n")
    print("\n".join(res["local"]["stdout"].splitlines()[1:8]))
    shutil.rmtree(work, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
