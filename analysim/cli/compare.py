"""``analysim compare``: run every policy x placement (x partition file) combination in parallel
processes, print one table (and, under partitions, one per ClusterQueue) and write one combined plot."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path

from analysim.cli.argtypes import positive_int
from analysim.cli.common import add_run_arguments, load_inputs, run_options
from analysim.cli.simulate import run_and_write
from analysim.core.policies import PARTITION_QUEUES, build_policy
from analysim.errors import UserError
from analysim.events import EVENTS_FILE
from analysim.forked import ForkedTasks
from analysim.report import (
    can_plot,
    cluster_queue_rows,
    cluster_queue_table,
    plot_cluster_queues,
    plot_compare,
    summary_table,
    write_csv,
    write_json,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="run several policies and placements side by side",
        description="Run each combination of --policies and --placements (and --partitions) on the same trace and "
                    "cluster, in parallel processes; print one table (and one per ClusterQueue under a partition); "
                    "write each run's results and compare.png.",
    )
    add_run_arguments(p)
    p.add_argument("--policies", help="comma-separated queue policies (default: fifo,srtf,tiresias; under "
                                      "--partition or --partitions kueue, the only one)")
    p.add_argument("--partitions", metavar="FILE,FILE",
                   help="comma-separated partition files (Kueue YAML, as --partition): each combination runs "
                        "under each, labelled by the file's name; the ClusterQueue table compares them")
    p.add_argument("--placements", default="consolidate", help="comma-separated placements")
    p.add_argument("--both", action="store_true",
                   help="run each combination with and without --preemption/--migration")
    p.add_argument("--workers", type=positive_int, default=os.cpu_count() or 1, help="parallel processes")
    p.add_argument("--out", type=Path, default=Path("out/compare"), help="output folder")
    p.add_argument("--events", action="store_true",
                   help="write each run's events file, events.csv, into its folder (docs/kueue.md, 'The events file')")
    p.set_defaults(func=main)


Combo = tuple[str, str, bool, bool, str | None]  # policy, placement, preemption, migration, partition file


def _partitions(args: argparse.Namespace) -> list[str | None]:
    if args.partitions is None:
        return [args.partition]
    if args.partition:
        raise UserError("--partition and --partitions: give one (--partitions FILE,FILE runs each)")
    files = [f.strip() for f in args.partitions.split(",") if f.strip()]
    if not files:
        raise UserError("--partitions: expected comma-separated partition files")
    if len(set(files)) != len(files):
        raise UserError("--partitions: a file is named twice")
    return files


def _combos(args: argparse.Namespace) -> list[Combo]:
    partitions = _partitions(args)
    under = partitions != [None]
    policies = [p.strip() for p in (args.policies or ("kueue" if under else "fifo,srtf,tiresias")).split(",") if p.strip()]
    placements = [p.strip() for p in args.placements.split(",") if p.strip()]
    for pol in policies:
        if under and pol not in PARTITION_QUEUES:
            raise UserError(f"--policies {pol}: under a partition jobs are queued as Kueue queues them; "
                            f"give {' or '.join(PARTITION_QUEUES)}")
        for pl in placements:
            try:
                build_policy("fifo" if under else pol, pl, backfill=args.backfill and pol.startswith("fifo"))
            except ValueError as e:
                raise UserError(str(e)) from None
    if args.both and not (args.preemption or args.migration):
        raise UserError("--both runs each combination with and without --preemption/--migration: give one of them")
    mech = [(args.preemption, args.migration)]
    if args.both:
        mech = [(False, False), (args.preemption, args.migration)]
    return [(pol, pl, pre, mig, part) for part in partitions for pol in policies for pl in placements
            for pre, mig in mech]


def _labels(combos: list[Combo], several_partitions: bool) -> list[str]:
    """Each run's label: its policy/placement(+mechanisms); with --partitions, the partition file's
    name (its path when two share a name), followed by the rest when there is more than one."""
    def run(c: Combo) -> str:
        pol, pl, pre, mig, _ = c
        return f"{pol}/{pl}" + ("+preempt" if pre else "") + ("+migrate" if mig else "")

    if not several_partitions:
        return [run(c) for c in combos]
    files = list(dict.fromkeys(c[4] for c in combos))
    stems = [Path(f).stem for f in files if f]
    name = {f: (Path(f).stem if len(set(stems)) == len(stems) else f) for f in files if f}
    one_run_each = len(combos) == len(files)
    return [name[c[4]] if one_run_each else f"{name[c[4]]}:{run(c)}" for c in combos if c[4]]


class _JobsEnded:
    """The progress bar of every run at once: each run (a forked process or this one) adds the jobs
    it ended to one shared counter, in batches (a lock per job would cost), and a thread here
    redraws the bar from it twice a second. None of it exists without a terminal."""

    BATCH = 256

    def __init__(self, total: int) -> None:
        from tqdm import tqdm

        self.count = multiprocessing.get_context("fork").Value("q", 0)
        self.bar = tqdm(total=total, unit="job", desc="comparing", leave=False, mininterval=0.5, dynamic_ncols=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._draw, daemon=True)
        self._thread.start()

    def counter(self) -> _RunCounter:
        """The ``on_job_end`` of one run (called in the process that runs it)."""
        return _RunCounter(self)

    def add(self, n: int) -> None:
        with self.count.get_lock():
            self.count.value += n

    def _draw(self) -> None:
        while not self._stop.wait(0.5):
            self.bar.update(self.count.value - self.bar.n)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.bar.update(self.count.value - self.bar.n)
        self.bar.refresh()  # the final count, drawn once before the bar clears its line
        self.bar.close()


class _RunCounter:
    """One run's share of ``_JobsEnded``: called per ended job, adds them in batches."""

    def __init__(self, shared: _JobsEnded) -> None:
        self.shared, self.pending = shared, 0

    def __call__(self) -> None:
        self.pending += 1
        if self.pending == _JobsEnded.BATCH:
            self.flush()

    def flush(self) -> None:
        self.shared.add(self.pending)
        self.pending = 0


def _one(args: argparse.Namespace, combo: Combo, label: str, trace, cluster,
         progress: _JobsEnded | None = None) -> tuple[str, dict, list[float]]:
    """One run, written to its folder (jobs.csv as it goes): (label, summary, JCTs of the completed jobs)."""
    pol, pl, pre, mig, _ = combo
    ns = argparse.Namespace(**{**vars(args), "preemption": pre, "migration": mig,
                               "backfill": args.backfill and pol.startswith("fifo")})
    opts = run_options(ns, pol, pl)
    ended = progress.counter() if progress is not None else None
    out = args.out / label.replace("/", "_")
    result, _ = run_and_write(out, trace, cluster, opts, plots=False, on_job_end=ended,
                              events=out / EVENTS_FILE if args.events else None)
    if ended is not None:
        ended.flush()
    return label, result.summary, result.completed_jct.tolist()


def _run_forked(args: argparse.Namespace, combos: list[Combo], labels: list[str], inputs: dict, workers: int,
                progress: _JobsEnded | None) -> list:
    tasks = ForkedTasks(workers)
    for i, combo in enumerate(combos):
        tasks.submit(i, _safe_one, args, combo, labels[i], *inputs[combo[4]], progress)
    results: list = [None] * len(combos)
    for done in tasks.finished():
        if done.died:
            raise UserError(f"the run {labels[done.key]} died (exit code {done.exitcode}); "
                            "out of memory? try fewer --workers")
        if isinstance(done.result, ValueError | UserError):
            raise done.result
        results[done.key] = done.result
    return results


def _safe_one(*a) -> tuple[str, dict, list[float]] | ValueError | UserError:
    try:
        return _one(*a)
    except (ValueError, UserError) as e:  # raised again in the parent, as a one-line error
        return e


def _inputs(args: argparse.Namespace, combos: list[Combo]) -> dict:
    """partition file (or None) -> (trace, cluster), the trace read once: loaded here, before any
    run, so that forked runs inherit them and a bad input (a bad partition file) fails fast."""
    from analysim.inputs import read_trace

    trace = read_trace(args)
    out = {}
    for part in dict.fromkeys(c[4] for c in combos):
        out[part] = load_inputs(argparse.Namespace(**{**vars(args), "partition": part}), trace)
    return out


def main(args: argparse.Namespace) -> int:
    combos = _combos(args)
    labels = _labels(combos, args.partitions is not None)
    inputs = _inputs(args, combos)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    workers = max(1, min(args.workers, len(combos)))
    # As simulate and sweep: a bar on a terminal, nothing otherwise or with --no-progress (inflate
    # runs end no jobs: no bar either).
    jobs = sum(len(inputs[c[4]][0].jobs) for c in combos)
    progress = (_JobsEnded(jobs) if args.mode == "replay" and jobs and not args.no_progress and sys.stderr.isatty()
                else None)
    try:
        if workers == 1:
            results = [_one(args, c, label, *inputs[c[4]], progress) for c, label in zip(combos, labels, strict=True)]
        else:
            results = _run_forked(args, combos, labels, inputs, workers, progress)
    except ValueError as e:  # e.g. every job filtered out
        raise UserError(str(e)) from None
    finally:
        if progress is not None:
            progress.close()
    runs = [(label, s) for label, s, _ in results]
    table = summary_table(runs)
    per_queue = cluster_queue_table(runs)
    if per_queue:
        table += "\n\n" + per_queue
        write_csv(cluster_queue_rows(runs), args.out / "cluster_queues.csv")
    print(table)
    rows = [{"run": label, **{k: v for k, v in s.items() if not isinstance(v, dict)}} for label, s, _ in results]
    write_csv(rows, args.out / "compare.csv")
    write_json({"runs": {label: s for label, s, _ in results},
                "wall_s": time.perf_counter() - started}, args.out / "compare.json")
    plotted = any(s.get("mode") != "inflate" for _, s, _ in results) and can_plot()
    if plotted:
        plot_compare(results, args.out)
    queue_png = plotted and per_queue and plot_cluster_queues(runs, args.out)
    (args.out / "compare.txt").write_text(table + "\n")
    written = ["compare.txt", "compare.csv", "compare.json"] + (["cluster_queues.csv"] if per_queue else [])
    written += (["compare.png"] if plotted else []) + (["cluster_queues.png"] if queue_png else [])
    print(f"wrote {args.out}/{', '.join(written)} and one folder per run")
    return 0
