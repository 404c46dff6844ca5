"""``analysim compare``: run every policy x placement combination in parallel processes, print one
table and write one combined plot."""

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
from analysim.core.policies import build_policy
from analysim.errors import UserError
from analysim.forked import ForkedTasks
from analysim.report import can_plot, plot_compare, summary_table, write_csv, write_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="run several policies and placements side by side",
        description="Run each combination of --policies and --placements on the same trace and cluster, "
                    "in parallel processes; print one table; write each run's results and compare.png.",
    )
    add_run_arguments(p)
    p.add_argument("--policies", default="fifo,srtf,tiresias", help="comma-separated queue policies")
    p.add_argument("--placements", default="consolidate", help="comma-separated placements")
    p.add_argument("--both", action="store_true",
                   help="run each combination with and without --preemption/--migration")
    p.add_argument("--workers", type=positive_int, default=os.cpu_count() or 1, help="parallel processes")
    p.add_argument("--out", type=Path, default=Path("out/compare"), help="output folder")
    p.set_defaults(func=main)


def _combos(args: argparse.Namespace) -> list[tuple[str, str, bool, bool]]:
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    placements = [p.strip() for p in args.placements.split(",") if p.strip()]
    for pol in policies:
        for pl in placements:
            try:
                build_policy(pol, pl, backfill=args.backfill and pol.startswith("fifo"))
            except ValueError as e:
                raise UserError(str(e)) from None
    if args.both and not (args.preemption or args.migration):
        raise UserError("--both runs each combination with and without --preemption/--migration: give one of them")
    mech = [(args.preemption, args.migration)]
    if args.both:
        mech = [(False, False), (args.preemption, args.migration)]
    return [(pol, pl, pre, mig) for pol in policies for pl in placements for pre, mig in mech]


def _label(pol: str, pl: str, pre: bool, mig: bool) -> str:
    return f"{pol}/{pl}" + ("+preempt" if pre else "") + ("+migrate" if mig else "")


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


def _one(args: argparse.Namespace, combo: tuple[str, str, bool, bool], trace, cluster,
         progress: _JobsEnded | None = None) -> tuple[str, dict, list[float]]:
    """One run, written to its folder (jobs.csv as it goes): (label, summary, JCTs of the completed jobs)."""
    pol, pl, pre, mig = combo
    ns = argparse.Namespace(**{**vars(args), "preemption": pre, "migration": mig,
                               "backfill": args.backfill and pol.startswith("fifo")})
    opts = run_options(ns, pol, pl)
    label = _label(*combo)
    ended = progress.counter() if progress is not None else None
    result, _ = run_and_write(args.out / label.replace("/", "_"), trace, cluster, opts, plots=False,
                              on_job_end=ended)
    if ended is not None:
        ended.flush()
    return label, result.summary, result.completed_jct.tolist()


def _run_forked(args: argparse.Namespace, combos: list, trace, cluster, workers: int,
                progress: _JobsEnded | None) -> list:
    tasks = ForkedTasks(workers)
    for i, combo in enumerate(combos):
        tasks.submit(i, _safe_one, args, combo, trace, cluster, progress)
    results: list = [None] * len(combos)
    for done in tasks.finished():
        if done.died:
            raise UserError(f"the run {_label(*combos[done.key])} died (exit code {done.exitcode}); "
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


def main(args: argparse.Namespace) -> int:
    if args.partition:
        raise UserError("--partition: compare does not take a partition yet (analysim simulate does)")
    combos = _combos(args)
    trace, cluster = load_inputs(args)  # once, here: forked runs inherit it, and a bad input fails fast
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    workers = max(1, min(args.workers, len(combos)))
    # As simulate and sweep: a bar on a terminal, nothing otherwise or with --no-progress (inflate
    # runs end no jobs: no bar either).
    progress = (_JobsEnded(len(combos) * len(trace.jobs))
                if args.mode == "replay" and trace.jobs and not args.no_progress and sys.stderr.isatty() else None)
    try:
        if workers == 1:
            results = [_one(args, c, trace, cluster, progress) for c in combos]
        else:
            results = _run_forked(args, combos, trace, cluster, workers, progress)
    except ValueError as e:  # e.g. every job filtered out
        raise UserError(str(e)) from None
    finally:
        if progress is not None:
            progress.close()
    table = summary_table([(label, s) for label, s, _ in results])
    print(table)
    rows = [{"run": label, **{k: v for k, v in s.items() if not isinstance(v, dict)}} for label, s, _ in results]
    write_csv(rows, args.out / "compare.csv")
    write_json({"runs": {label: s for label, s, _ in results},
                "wall_s": time.perf_counter() - started}, args.out / "compare.json")
    plotted = any(s.get("mode") != "inflate" for _, s, _ in results) and can_plot()
    if plotted:
        plot_compare(results, args.out)
    (args.out / "compare.txt").write_text(table + "\n")
    png = ", compare.png" if plotted else ""
    print(f"wrote {args.out}/compare.txt, compare.csv, compare.json{png} and one folder per run")
    return 0
