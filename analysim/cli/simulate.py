"""``analysim simulate``: replay a trace (or inflate a cluster) under one policy; write the results."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

from analysim.cli.common import add_run_arguments, load_inputs, run_options
from analysim.core.cluster import ClusterSpec
from analysim.errors import UserError
from analysim.events import EventsCsv
from analysim.report import JobsCsv, can_plot, cluster_queue_table, summary_table, write_run
from analysim.simulation import EventSink, RunOptions, RunResult, run
from analysim.traces import Trace
from analysim.traces.summary import describe_filtered

HELP = "replay a trace under one scheduling policy"
DESCRIPTION = ("Replay a cluster trace (default: the embedded synthetic Philly-like trace) under one "
               "policy and placement; write summary.json, jobs.csv, timeseries.csv and plots to --out.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """simulate's options; ``analysim sweep`` takes its SPEC keys from them."""
    add_run_arguments(p)
    p.add_argument("--policy", default="fifo", help="queue policy: fifo, fifo-backfill, sjf, srtf, tiresias, qssf, fair")
    p.add_argument("--placement", default="consolidate", help="consolidate (best fit), spread, random, fgd")
    p.add_argument("--out", type=Path, default=Path("out/simulate"), help="output folder (default: out/simulate)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--events", type=Path, metavar="FILE",
                   help="write every decision (admit, evict, migrate, requeue, complete, ...) and, at the end, "
                        "each job still pending with its reason to this CSV (docs/kueue.md, 'The events file')")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help=HELP, description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(func=main)


def simulate(args: argparse.Namespace, trace: Trace | None = None,
             follow: EventSink | None = None) -> tuple[RunResult, list[Path]]:
    """One run as ``analysim simulate`` does it, minus the printing: returns the result and the
    files written to ``args.out``. ``trace`` is the loaded ``--trace`` when the caller has it
    already (``analysim sweep`` loads it once for all its cells); ``follow`` follows the run's
    decisions beside the events file (``analysim kueue-perf``'s recorder)."""
    trace, cluster = load_inputs(args, trace)
    opts = run_options(args, args.policy, args.placement)
    bar = _progress(len(trace.jobs) if opts.mode == "replay" else 0, args)
    try:
        return run_and_write(args.out, trace, cluster, opts, plots=not args.no_plots and can_plot(),
                             on_job_end=bar.update if bar is not None else None, events=args.events,
                             replay_args=recorded_args(args) if args.events is not None else None, follow=follow)
    finally:
        if bar is not None:
            bar.close()


# Options a replay of the run does without: where it wrote, and how it showed progress.
NOT_RECORDED = ("func", "out", "events", "no_plots", "no_progress")


def recorded_args(args: argparse.Namespace) -> dict:
    """simulate's options as JSON, each file an option names as an absolute path."""
    out = {}
    for k, v in vars(args).items():
        if k in NOT_RECORDED:
            continue
        if isinstance(v, Path) or isinstance(v, str) and v and Path(v).is_file():
            v = str(Path(v).resolve())
        out[k] = v
    return out


def simulate_namespace(recorded: dict) -> argparse.Namespace:
    """simulate's options from ``recorded_args``: its parser's defaults, then the recorded values
    (paths back as Paths where the option takes one)."""
    p = argparse.ArgumentParser(add_help=False)
    add_arguments(p)
    args = p.parse_args([])
    paths = {a.dest for a in p._actions if a.type is Path}
    for k, v in recorded.items():
        setattr(args, k, Path(v) if k in paths and v is not None else v)
    return args


def run_and_write(out: Path, trace: Trace, cluster: ClusterSpec, opts: RunOptions, *, plots: bool,
                  on_job_end: Callable[[], None] | None = None,
                  events: Path | None = None, replay_args: dict | None = None,
                  follow: EventSink | None = None) -> tuple[RunResult, list[Path]]:
    """Run and write summary.json, jobs.csv, timeseries.csv (and plots) to ``out``; a replay
    streams jobs.csv as jobs end (the run keeps no row of a finished job; inflate writes none),
    and the events file to ``events`` as decisions are made. ``summary.json`` gets the run's
    ``wall_s``, the trace's source and, with ``events``, where the file is (relative to ``out``
    when in it) with ``replay_args``, the options that replay the run (analysim explain --at).
    ``follow``: another event sink, after the events file."""
    sink = JobsCsv(out / "jobs.csv", trace.recorded_admit_s) if opts.mode == "replay" else None
    if events is not None and opts.mode != "replay":
        raise UserError("--events: inflate mode places tasks without queues or decisions; the events file is a replay's")
    event_sink = EventsCsv(events) if events is not None else None
    started = time.perf_counter()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with sink if sink is not None else nullcontext(), event_sink if event_sink is not None else nullcontext():
            result = run(trace.jobs, cluster, opts, trace_filtered=trace.filtered, on_job_end=on_job_end,
                         job_sink=sink, event_sinks=[e for e in (event_sink, follow) if e is not None])
    except ValueError as e:
        raise UserError(str(e)) from None
    except OSError as e:
        raise UserError(f"{out}: cannot write: {e.strerror}") from None
    result.summary["wall_s"] = time.perf_counter() - started
    result.summary["trace"] = trace.source
    if events is not None:
        where = events.resolve()
        where = where.relative_to(out.resolve()) if where.is_relative_to(out.resolve()) else where
        result.summary["events"] = {"file": str(where), **({"args": replay_args} if replay_args is not None else {})}
    written = write_run(out, result.summary, None if sink is not None else result.jobs, result.timeseries,
                        plots=plots, completed_jct=result.completed_jct)
    return result, written + ([events] if events is not None else [])


def main(args: argparse.Namespace, follow: EventSink | None = None) -> int:
    """``analysim simulate``: the run (``follow``: as ``simulate``), its tables, what it wrote."""
    result, written = simulate(args, follow=follow)
    print(summary_table([(result.summary["policy"], result.summary)]))
    per_queue = cluster_queue_table([(result.summary["policy"], result.summary)])
    if per_queue:
        print("\n" + per_queue)
    if result.summary.get("jobs_filtered"):
        print(f"filtered out of the trace: {describe_filtered(result.summary['jobs_filtered'])} (docs/traces.md)")
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _progress(total: int, args: argparse.Namespace):
    if not total or args.no_progress or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="job", desc="simulating", leave=False, mininterval=0.5)
