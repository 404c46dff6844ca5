"""``analysim sweep SPEC --out DIR``: every cell of a SPEC (a cross product of simulate's options)
run once, locally or on Ray; results.csv, aggregate.csv and cells/<id>/ in DIR; a re-run resumes."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from analysim.cli.argtypes import nonneg_int, positive_int
from analysim.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="run a design sweep (policies x placements x mechanisms x clusters x traces x seeds)",
        description="Run every cell of SPEC, a YAML or TOML file whose keys are analysim simulate's options "
                    "(underscores for hyphens): a value applies to every cell, a list is an axis, the cells "
                    "are the cross product (minus 'exclude:' entries; or an explicit 'cells:' list). "
                    "Finished cells are skipped when the sweep runs again.",
    )
    p.add_argument("spec", type=Path, metavar="SPEC", help="the sweep's YAML (or .toml) file")
    p.add_argument("--out", type=Path, default=Path("out/sweep"), help="sweep folder (default: out/sweep)")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: a process pool on this machine (default); ray: Ray tasks on a Ray cluster")
    p.add_argument("--workers", type=positive_int,
                   help="local: processes (default: this machine's CPUs); ray: CPUs of the Ray started "
                        "for the run when there is no --address")
    p.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                   help="Ray cluster to run on, e.g. 10.0.0.5:6379 (default: $RAY_ADDRESS; none: start a "
                        "local Ray for the run)")
    p.add_argument("--cell-cpus", type=float, default=1.0, metavar="N", help="ray: CPUs each cell's task asks for")
    p.add_argument("--cell-memory", type=positive_int, default=1024, metavar="MIB",
                   help="ray: memory each cell's task asks for, MiB (default 1024)")
    p.add_argument("--retries", type=nonneg_int, default=3,
                   help="tries again for a cell whose worker died (default 3)")
    p.add_argument("--retry-failed", action="store_true", help="run again the cells that failed last time")
    p.add_argument("--dry-run", action="store_true", help="check SPEC and list its cells; run nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from analysim.report import cluster_queue_table
    from analysim.sweep import EngineOptions, preflight, run_sweep
    from analysim.sweep.engines import import_ray, machine_cpus
    from analysim.sweep.spec import load_sweep

    if not args.cell_cpus > 0:
        raise UserError(f"--cell-cpus: expected a positive number, got {args.cell_cpus}")
    sweep = load_sweep(args.spec)
    if args.dry_run:
        preflight(sweep, sweep.cells)  # the run's own checks: policies, traces, clusters, partitions
        for c in sweep.cells:
            print(f"{c.id}  {c.label}")
        print(f"{len(sweep.cells)} cells")
        return 0
    if args.engine == "ray":
        import_ray()
    engine = EngineOptions(engine=args.engine, workers=args.workers or machine_cpus(), address=args.address,
                           cell_cpus=args.cell_cpus, cell_memory_mb=args.cell_memory, retries=args.retries)
    run = run_sweep(sweep, args.out, engine, retry_failed=args.retry_failed,
                    progress=not args.no_progress and sys.stderr.isatty(), spec_file=args.spec)
    print(aggregate_table(run.aggregate))
    if run.cluster_queues:
        print(cluster_queue_table(run.cluster_queues))
    print(f"sweep: {run.ran} cells ran in {run.wall_s:.1f} s, {run.skipped} skipped (finished before), "
          f"{run.failed} failed, {run.lost} lost")
    queues = "cluster_queues.csv, " if run.cluster_queues else ""
    print(f"wrote {args.out}/results.csv, aggregate.csv, {queues}cells/<id>/; analysim report {args.out}")
    bad = sum(r["status"] != "ok" for r in run.rows)
    if bad:
        print(f"sweep: {bad} of {run.total} cells have no results (see the status and error columns of results.csv)")
    return 1 if bad else 0


TABLE = (("avg JCT h", "avg_jct_s", 3600), ("p99 JCT h", "p99_jct_s", 3600), ("avg queue h", "avg_queue_s", 3600),
         ("util %", "gpu_utilization", 0.01), ("frag %", "avg_fragmentation", 0.01),
         ("preempt", "preemptions", 1), ("migrate", "migrations", 1), ("jain", "jain_fairness", 1),
         ("tasks placed", "tasks_placed", 1), ("alloc %", "gpu_allocation_ratio", 0.01),
         ("frag GPUs", "fragmentation_gpus", 1))


def aggregate_table(rows: list[dict], top: int = 20) -> str:
    """The sweep's groups, best average JCT first: mean ± 95 % CI half-width over the seeds."""
    rows = sorted(rows, key=lambda r: (r.get("avg_jct_s_mean") is None, r.get("avg_jct_s_mean") or 0))[:top]
    cols = [(t, k, s) for t, k, s in TABLE if any(r.get(f"{k}_mean") is not None for r in rows)]
    header = ["cells (mean ± 95 % CI over seeds)", "seeds"] + [t for t, _, _ in cols]
    body = []
    for r in rows:
        line = [r["group"], str(r["seeds"])]
        for _, k, scale in cols:
            m, h = r.get(f"{k}_mean"), r.get(f"{k}_ci95")
            line.append("-" if m is None else f"{m / scale:.2f}" + ("" if h is None else f" ± {h / scale:.2f}"))
        body.append(line)
    widths = [max(len(x[i]) for x in [header] + body) for i in range(len(header))]
    fmt = lambda x: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(x, widths, strict=True)))  # noqa: E731
    return "\n".join([fmt(header), "  ".join("-" * w for w in widths)] + [fmt(b) for b in body])
