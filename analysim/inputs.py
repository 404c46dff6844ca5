"""A run's inputs from its arguments: the options shared by everything that runs simulations
(``analysim simulate``/``compare``/``up``/``sweep`` and the live scheduler service), reading the
trace and the cluster they name, and the run options. A library module: services use it without
importing the CLI."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from analysim.argtypes import (
    control_plane,
    control_plane_config,
    count_at_most,
    nonneg_int,
    percent,
    positive_int,
    positive_number,
    positive_seconds,
    seconds,
)
from analysim.clusters import parse_cluster
from analysim.core.cluster import ClusterSpec
from analysim.core.records import PREEMPTION_COSTS
from analysim.errors import UserError
from analysim.partitions import assign_queues, load_partition, without_vcs
from analysim.simulation import MODES, RunOptions
from analysim.traces import Trace, load_trace
from analysim.traces.synthetic import generate
from analysim.traces.vcmap import BY_SHARE, apply_vc_map, read_vc_map

DEFAULT_SYNTHETIC_JOBS = 2000
# The embedded trace offers a quarter of Philly's load, sized for the 128-GPU 'demo' cluster
# (Philly's ~374 busy GPUs were sized for 512).
DEFAULT_RATE_SCALE = 0.25
# The most jobs the embedded synthetic trace makes: ten times Philly's, still a few GB in memory.
MAX_SYNTHETIC_JOBS = 10**7
# A trace's own cluster, when --cluster is not given.
DEFAULT_CLUSTER = {"philly": "philly", "openb": "openb", "helios": "helios-venus", "synthetic": "demo"}


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload and cluster")
    g.add_argument("--trace", help="trace file (default: the embedded synthetic Philly-like trace)")
    g.add_argument("--format", default="auto", choices=["auto", "philly", "openb", "helios", "canonical"],
                   help="trace format (default: detected from the header)")
    g.add_argument("--jobs", type=count_at_most(MAX_SYNTHETIC_JOBS, "the synthetic trace is held in memory"),
                   default=DEFAULT_SYNTHETIC_JOBS,
                   help=f"jobs in the embedded synthetic trace (default {DEFAULT_SYNTHETIC_JOBS})")
    g.add_argument("--rate-scale", type=positive_number, default=DEFAULT_RATE_SCALE,
                   help=f"arrival rate of the embedded synthetic trace, relative to Philly's (default {DEFAULT_RATE_SCALE})")
    g.add_argument("--cluster", help="preset name, NxG[:MODEL] (e.g. 64x8:V100), or a JSON/YAML/TOML spec or "
                                     "openb node-list CSV (default: the trace's own cluster: 'demo' for the "
                                     "synthetic trace, 'philly', 'openb', 'helios-venus'; 'philly' for others)")
    g.add_argument("--drop-cpu-only", action="store_true",
                   help="leave out jobs that ask for no GPU (openb keeps its CPU-only pods by default: they "
                        "take CPU and memory on GPU nodes); counted as cpu_only")
    g.add_argument("--limit", type=positive_int, help="use only the first N jobs of the trace (by submit time); a file sorted by submit "
                        "time is read only that far, another is read whole")
    g.add_argument("--vc-map", metavar="FILE|share",
                   help="put the trace's VCs onto the cluster's: a CSV with header trace_vc,cluster_vc, or "
                        "'share' to balance the trace VCs' GPU-time over the cluster VCs' guaranteed GPUs "
                        "(a cluster that names its VCs refuses jobs of any other, and counts them as unknown_vc)")
    g.add_argument("--default-vc", metavar="NAME",
                   help="the cluster VC for trace VCs that neither the cluster nor --vc-map names")
    g.add_argument("--partition", metavar="FILE",
                   help="the cluster's logical partition, replacing its VCs: a YAML of Kueue objects "
                        "(ResourceFlavor, ClusterQueue, Cohort, LocalQueue, WorkloadPriorityClass; docs/kueue.md). "
                        "A job goes to the LocalQueue named like its VC (or as --vc-map maps it, or --default-vc)")
    g.add_argument("--partition-set", action="append", default=None, metavar="PATH=VALUE",
                   help="change one quota field of --partition for the run (repeatable): "
                        "KIND/NAME/FLAVOR/RESOURCE/FIELD=VALUE, e.g. "
                        "ClusterQueue/team-a/v100/nvidia.com/gpu/borrowingLimit=16 (VALUE none: no limit)")
    g.add_argument("--seed", type=nonneg_int, default=0, help="seed for the synthetic trace, random placement and sampling")
    g.add_argument("--mode", choices=MODES, default="replay",
                   help="replay the trace in time, or inflate: submit tasks, each placed at once or counted "
                        "as failed, until the GPU demand that has arrived reaches --inflate-until")
    g.add_argument("--inflate-order", choices=["sample", "trace"], default="sample",
                   help="inflate mode: draw tasks at random (by --seed) or in trace order")
    g.add_argument("--inflate-until", type=percent, default=100.0, metavar="PCT",
                   help="inflate mode: stop when arrived GPU demand reaches PCT%% of the cluster's GPUs "
                        "(default 100)")
    g.add_argument("--stop-at-first-failure", action="store_true",
                   help="inflate mode: stop at the first task that does not fit instead")
    m = p.add_argument_group("mechanisms")
    m.add_argument("--preemption", action="store_true", help="let the policy evict running jobs (checkpointed)")
    m.add_argument("--migration", action="store_true", help="move running jobs to defragment for blocked jobs")
    m.add_argument("--backfill", action="store_true", help="EASY backfilling behind a blocked FIFO head")
    m.add_argument("--restore-overhead", type=seconds, default=30.0, metavar="S",
                   help="seconds to restore a preempted job's checkpoint (default 30)")
    m.add_argument("--migration-overhead", type=seconds, default=60.0, metavar="S",
                   help="seconds a migrated job loses (default 60)")
    m.add_argument("--checkpoint-interval", type=seconds, default=1800.0, metavar="S",
                   help="periodic checkpoint every S seconds of progress; a node failure loses the rest "
                        "(0: none; default 1800)")
    m.add_argument("--preemption-cost", choices=PREEMPTION_COSTS, default="keep",
                   help="what a preempted job keeps of its work: all (it checkpoints when evicted), nothing "
                        "(restart: Kueue's default for a job that does not checkpoint), or its last periodic "
                        "checkpoint (default keep)")
    m.add_argument("--control-plane", type=control_plane, metavar="kueue[,FIELD=VALUE...]",
                   help="under --partition: pace the run by Kueue's control plane: scheduling cycles, one head "
                        "per ClusterQueue per cycle, an API write rate (docs/kueue.md, 'The control-plane model'; "
                        "e.g. kueue,heads_per_queue=4)")
    m.add_argument("--rebalance-interval", type=positive_seconds, metavar="S",
                   help="also try to defragment every S virtual seconds (with --migration)")
    m.add_argument("--relaxed-locality", action="store_true",
                   help="let jobs span more nodes than they need (they run slower by the cluster's slowdown)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


# Options that only act once the trace is read (the cluster, the run's options, the outputs).
RUN_ONLY = frozenset({"cluster", "policy", "placement", "mode", "inflate_order", "preemption", "migration",
                      "backfill", "restore_overhead", "migration_overhead", "checkpoint_interval",
                      "preemption_cost", "control_plane",
                      "rebalance_interval", "relaxed_locality", "inflate_until", "stop_at_first_failure",
                      "vc_map", "default_vc", "partition", "partition_set", "out", "no_plots", "no_progress", "func"})
SYNTHETIC_ONLY = frozenset({"jobs", "seed", "rate_scale"})


def trace_inputs(args: argparse.Namespace) -> tuple:
    """What ``read_trace`` may depend on: runs that agree on it share one loaded trace
    (``analysim sweep`` reads each trace once). Every option not known to act after reading
    counts, so that an option added later keys the trace until it is listed above."""
    skip = RUN_ONLY | (SYNTHETIC_ONLY if args.trace else {"trace", "format"})
    return tuple(sorted((k, repr(v)) for k, v in vars(args).items() if k not in skip))


def read_trace(args: argparse.Namespace) -> Trace:
    if args.trace:
        return load_trace(args.trace, args.format, drop_cpu_only=args.drop_cpu_only, limit=args.limit)
    return generate(args.jobs, args.seed, rate_scale=args.rate_scale, limit=args.limit)


def load_inputs(args: argparse.Namespace, trace: Trace | None = None) -> tuple[Trace, ClusterSpec]:
    """The run's trace and cluster; ``trace``, when given, is ``read_trace(args)`` done already
    (and is shared: it is never changed here)."""
    if trace is None:
        trace = read_trace(args)
    cluster = parse_cluster(args.cluster or DEFAULT_CLUSTER.get(trace.format, "philly"))
    if getattr(args, "partition", None):
        return _on_partition(args, trace, cluster)
    if getattr(args, "partition_set", None):
        raise UserError("--partition-set changes a field of --partition FILE: give the file")
    vc_map = args.vc_map if args.vc_map in (None, BY_SHARE) else str(args.vc_map)
    jobs, changed = apply_vc_map(trace.jobs, cluster, vc_map, args.default_vc)
    if changed:
        trace = dataclasses.replace(trace, jobs=jobs)
    return trace, cluster


def _on_partition(args: argparse.Namespace, trace: Trace, cluster: ClusterSpec) -> tuple[Trace, ClusterSpec]:
    """The trace's jobs on the partition's LocalQueues (those no LocalQueue takes, or that no
    ClusterQueue could ever admit, counted as filtered), and the cluster with the partition in
    place of its VCs. Fields the file has that are accepted but not modelled are warned about."""
    partition, warnings = load_partition(args.partition, cluster, getattr(args, "partition_set", None) or ())
    for w in warnings:
        print(f"analysim: warning: {w}", file=sys.stderr)
    if args.vc_map == BY_SHARE:
        raise UserError("--vc-map share balances VCs over a cluster's quotas; under --partition map the "
                        "trace's VCs to LocalQueues with a CSV (trace_vc,cluster_vc)")
    targets = [lq for lq, _ in partition.queue_of]
    mapping = read_vc_map(args.vc_map, cluster, targets) if args.vc_map else None
    jobs, reasons = assign_queues(trace.jobs, partition, mapping, args.default_vc)
    filtered = dict(trace.filtered)
    for k, v in reasons.items():
        filtered[k] = filtered.get(k, 0) + v
    trace = dataclasses.replace(trace, jobs=jobs, filtered=filtered)
    return trace, dataclasses.replace(without_vcs(cluster), partition=partition)


def run_options(args: argparse.Namespace, policy: str, placement: str) -> RunOptions:
    return RunOptions(
        policy=policy, placement=placement, preemption=args.preemption, migration=args.migration,
        backfill=args.backfill, mode=args.mode, seed=args.seed, limit=args.limit,
        inflate_order=args.inflate_order, inflate_until_pct=args.inflate_until,
        stop_at_first_failure=args.stop_at_first_failure, restore_overhead_s=args.restore_overhead,
        migration_overhead_s=args.migration_overhead,
        checkpoint_interval_s=args.checkpoint_interval or None,
        rebalance_interval_s=args.rebalance_interval, relaxed_locality=args.relaxed_locality,
        preemption_cost=args.preemption_cost,
        control_plane=None if args.control_plane is None else control_plane_config(args.control_plane),
    )
