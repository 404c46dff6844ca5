"""One simulation run, start to finish: filter a trace for a cluster, drive the engine, collect
metrics. Pure — no files, no clock; the CLI adds those."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Protocol

import numpy as np

from analysim.core.cluster import ClusterSpec
from analysim.core.control_plane import ControlPlaneConfig
from analysim.core.engine import Engine, EngineConfig, InfeasibleJob
from analysim.core.framework import Policy
from analysim.core.job import GPU_MILLI, JobSpec, JobStatus
from analysim.core.metrics import MetricsRecorder
from analysim.core.policies import PARTITION_QUEUES, build_policy, partition_policy
from analysim.core.records import Decision

MODES = ("replay", "inflate")


@dataclass(frozen=True)
class RunOptions:
    policy: str = "fifo"
    placement: str = "consolidate"
    preemption: bool = False
    migration: bool = False
    backfill: bool = False
    mode: str = "replay"
    seed: int = 0
    limit: int | None = None
    inflate_order: str = "sample"  # inflate: "trace" order, or "sample" with replacement by seed
    inflate_until_pct: float = 100.0  # inflate: stop when arrived GPU demand reaches this % of capacity
    stop_at_first_failure: bool = False  # inflate: stop at the first task that does not fit instead
    restore_overhead_s: float = 30.0
    migration_overhead_s: float = 60.0
    checkpoint_interval_s: float | None = 1800.0
    rebalance_interval_s: float | None = None
    relaxed_locality: bool = False
    sample_points: int = 1000  # time-series rows, at most about this many
    fgd_metric: bool = True
    preemption_cost: str = "keep"  # what a victim keeps of its work (records.PREEMPTION_COSTS)
    control_plane: ControlPlaneConfig | None = None  # under a partition: Kueue's pacing (control_plane)

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            preemption=self.preemption, migration=self.migration,
            restore_overhead_s=self.restore_overhead_s, migration_overhead_s=self.migration_overhead_s,
            checkpoint_interval_s=self.checkpoint_interval_s, rebalance_interval_s=self.rebalance_interval_s,
            relaxed_locality=self.relaxed_locality, seed=self.seed, preemption_cost=self.preemption_cost,
        )


class NothingToRun(ValueError):
    """Every job of the trace was filtered out: a run would report nothing, misleadingly."""


# What to do about a filter reason, for the message when it took every job.
_HINTS = {
    "unknown_vc": "the trace's VCs are not the cluster's: map them with --vc-map FILE|share or --default-vc NAME",
    "no_matching_node": "no node of the cluster is open to these jobs' VC or GPU model",
    "larger_than_cluster": "the jobs ask for more than the cluster can ever hold",
    "larger_than_vc_quota": "the jobs ask for more than their VC's quota and borrowing is off",
    "unknown_duration": "replay needs durations (this trace suits --mode inflate)",
    "no_local_queue": "no LocalQueue of the partition is named like these jobs' VCs: map them with --vc-map FILE or --default-vc NAME",
    "larger_than_queue_quota": "the jobs ask for more than their ClusterQueue could ever be admitted, borrowing all it may",
    "resource_not_covered": "the jobs ask for a resource (or flavor nodes) their ClusterQueue has no quota for",
}


def check_something_runs(offered: int, kept: int, filtered: dict[str, int]) -> None:
    """Raise NothingToRun, saying how many jobs were filtered and why, when none is left."""
    if kept:
        return
    if not offered and not sum(filtered.values()):
        raise NothingToRun("the trace has no jobs")
    reasons = sorted(((n, r) for r, n in filtered.items() if n), reverse=True)
    why = ", ".join(f"{r} {n}" for n, r in reasons)
    hint = _HINTS.get(reasons[0][1]) if reasons else None
    total = sum(n for n, _ in reasons)
    raise NothingToRun(f"all {total} jobs were filtered out ({why})" + (f": {hint}" if hint else ""))


@dataclass
class RunResult:
    summary: dict
    jobs: list[dict] = field(default_factory=list)
    timeseries: list[dict] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    completed_jct: np.ndarray | None = None  # of the completed jobs, in the order they ended


def filter_for_cluster(jobs: Sequence[JobSpec], engine: Engine, mode: str) -> tuple[list[JobSpec], Counter]:
    """Jobs the cluster can run at all; the others counted by reason (never dropped silently)."""
    kept, reasons = [], Counter()
    for j in jobs:
        if mode == "replay" and j.duration_s is None:
            reasons["unknown_duration"] += 1
            continue
        try:
            engine.check_feasible(j)
        except InfeasibleJob as e:
            reasons[e.reason] += 1
            continue
        kept.append(j)
    return kept, reasons


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """The cyclic collector's youngest generation collected every 50,000 new objects, not 700,
    while a run goes: the engine makes millions of short-lived tuples (queue keys, requests) and
    almost no cycles, and collecting after every 700 cost 3-4 % of a run. What exists when the run
    starts (the trace's jobs, the partition, the cluster) lives through it: it is frozen out of
    the collector's view meanwhile, so that each full collection does not walk it again (7 % of
    Kueue's large-scale scenario, 50,000 jobs) and is handed back when the run ends."""
    threshold = gc.get_threshold()
    gc.set_threshold(50_000, *threshold[1:])
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def run(jobs: Sequence[JobSpec], cluster: ClusterSpec, opts: RunOptions, *,
        trace_filtered: dict[str, int] | None = None,
        on_job_end: Callable[[], None] | None = None,
        job_sink: JobSink | None = None, event_sinks: Sequence[EventSink] = (),
        until: float = math.inf) -> RunResult:
    """One run. ``job_sink``: hand each ended job's row to it (``expect`` first, for every job as
    it enters the engine) instead of returning them in ``RunResult.jobs``; the run then keeps
    neither ended jobs nor its decision log, so that its memory does not grow with finished jobs.
    ``event_sinks``: give each the engine before the run, to follow its decisions, and have each
    note the jobs still pending after (analysim.events.EventsCsv, analysim.kueue_perf.Recorder).
    ``until``: stop the run after the pass at this virtual time (analysim explain --at).
    """
    if opts.mode not in MODES:
        raise ValueError(f"unknown mode {opts.mode!r}; known: {', '.join(MODES)}")
    if not 0 < opts.inflate_until_pct <= 1000:
        raise ValueError(f"inflate_until_pct must be above 0 and at most 1000, got {opts.inflate_until_pct}")
    if opts.limit is not None and opts.limit < 1:
        raise ValueError(f"limit must be at least 1, got {opts.limit}")
    jobs = sorted(jobs, key=lambda j: j.submit_s)[: opts.limit] if opts.limit else list(jobs)
    policy = run_policy(cluster, opts)
    if opts.mode == "inflate":
        return _inflate(jobs, cluster, policy, opts, trace_filtered or {})
    span = (jobs[-1].submit_s - jobs[0].submit_s) if jobs else 0.0
    interval = max(1.0, math.ceil(span / max(opts.sample_points, 1))) if span > 0 else 60.0
    recorder = MetricsRecorder(sample_interval_s=interval, fgd=opts.fgd_metric,
                               job_sink=job_sink.write if job_sink is not None else None, on_job_end=on_job_end)
    config = opts.engine_config()
    if job_sink is not None:
        config = dataclasses.replace(config, keep_ended=False, keep_decisions=False)
    engine = Engine(cluster, policy, config, recorder=recorder, workload=jobs)
    for sink in event_sinks:
        sink.attach(engine)
    kept, reasons = filter_for_cluster(jobs, engine, "replay")
    check_something_runs(len(jobs), len(kept), merged_filters(trace_filtered, reasons))
    check_unique_ids(kept)
    if all(a.submit_s <= b.submit_s for a, b in pairwise(kept)):
        engine.feed(_announced(kept, job_sink) if job_sink is not None else kept)
    else:  # a caller's own unsorted list (a trace is sorted): all at once, as the list orders them
        for j in _announced(kept, job_sink) if job_sink is not None else kept:
            engine.submit(j)
    with _fewer_collections():
        engine.run(until)
    for sink in event_sinks:
        sink.pending()
    summary = summary_header(cluster, policy.name, opts, len(jobs), trace_filtered, reasons)
    summary.update(recorder.summary(engine))
    summary["jobs_total"] = len(kept)
    summary["jobs_cpu_only"] = sum(j.num_gpus == 0 for j in kept)
    if engine.policy.control is not None:  # (what pacing did: its parameters, cycles and API writes by kind)
        c = engine.policy.control
        summary["control_plane"] = {**dataclasses.asdict(c.config), "cycles": c.cycles,
                                    "api_writes": dict(sorted(c.api.writes.items()))}
    return RunResult(summary=summary, jobs=recorder.jobs, timeseries=recorder.timeseries(), decisions=engine.decisions,
                     completed_jct=recorder.ended.column("jct")[recorder.ended.status_is(JobStatus.COMPLETED)])


def run_policy(cluster: ClusterSpec, opts: RunOptions) -> Policy:
    """The run's policy: the options', or on a cluster with a partition Kueue's (its queueing and
    quota admission, the options' placement)."""
    if cluster.partition is None:
        if opts.control_plane is not None:
            raise ValueError("--control-plane: the control-plane model paces Kueue's cycles; it needs --partition")
        return build_policy(opts.policy, opts.placement, backfill=opts.backfill)
    if opts.policy not in PARTITION_QUEUES or opts.backfill:
        raise ValueError(f"--partition: jobs are queued as Kueue queues them (priority, then creation, per "
                         f"ClusterQueue), not by --policy {opts.policy}{' --backfill' if opts.backfill else ''}")
    if opts.mode == "inflate":
        raise ValueError("--partition: inflate mode places tasks without queues; a partition applies to replay")
    if opts.preemption:
        raise ValueError("--partition: preemption under a partition is set by its ClusterQueues' spec.preemption "
                         "(docs/kueue.md), not by --preemption")
    if opts.migration:
        raise ValueError("--partition: migration under a partition is not modelled")
    return partition_policy(cluster, opts.placement, opts.control_plane)


class JobSink(Protocol):
    """Where a streaming run puts its ended jobs' rows (analysim.report.JobsCsv)."""

    def expect(self, spec: JobSpec) -> None: ...  # the job is entering the engine; its row will follow

    def write(self, row: dict) -> None: ...


class EventSink(Protocol):
    """Where a run's decisions go as they are made (analysim.events.EventsCsv)."""

    def attach(self, engine: Engine) -> None: ...  # before the run: follow this engine's decisions

    def pending(self) -> None: ...  # after it: note the jobs still pending


def _announced(jobs: Sequence[JobSpec], sink: JobSink) -> Iterator[JobSpec]:
    for j in jobs:
        sink.expect(j)
        yield j


def check_unique_ids(jobs: Sequence[JobSpec]) -> None:
    """Refuse a second job with an id already taken, as the engine would on submission (jobs
    enter the engine one by one as the run goes, and ended ones may be forgotten by then)."""
    hashes = np.fromiter((hash(j.job_id) for j in jobs), dtype=np.int64, count=len(jobs))
    hashes.sort()
    if not (hashes[1:] == hashes[:-1]).any():
        return
    seen: set[str] = set()
    for j in jobs:
        if j.job_id in seen:
            raise InfeasibleJob(f"job {j.job_id!r} already submitted", "duplicate_id")
        seen.add(j.job_id)


def merged_filters(trace_filtered: dict[str, int] | None, reasons: Counter) -> dict[str, int]:
    """Jobs left out by reason: by the trace reader, then by the cluster."""
    filtered = dict(trace_filtered or {})
    for k, v in reasons.items():
        filtered[k] = filtered.get(k, 0) + v
    return dict(sorted(filtered.items()))


def summary_header(cluster: ClusterSpec, policy: str, opts: RunOptions, offered: int,
                   trace_filtered: dict[str, int] | None, reasons: Counter) -> dict:
    """The keys of summary.json that describe the run rather than its results (offline and
    live runs share them): mode, policy, mechanisms, seed, cluster, jobs offered and why any
    were filtered."""
    header = {
        "mode": opts.mode,
        "policy": policy,
        "preemption": opts.preemption,
        "migration": opts.migration,
        "seed": opts.seed,
        "cluster": cluster.name,
        "cluster_gpus": cluster.total_gpus,
        "cluster_nodes": len(cluster.nodes),
        "jobs_offered": offered,
        "jobs_filtered": merged_filters(trace_filtered, reasons),
    }
    if opts.preemption_cost != "keep":  # (said only when not the default, which every run had before)
        header["preemption_cost"] = opts.preemption_cost
    return header


def _inflate(jobs: list[JobSpec], cluster: ClusterSpec, policy, opts: RunOptions, trace_filtered: dict) -> RunResult:
    """The FGD paper's experiment (Weng et al., ATC'23): keep submitting tasks drawn from the trace,
    each placed at once if it fits and counted as failed if not, until the GPU demand that has
    arrived reaches ``inflate_until_pct`` of the cluster's GPUs; the curve of allocation and
    fragmentation against arrived demand is the result. (With ``stop_at_first_failure``, the older
    reading: stop at the first task that does not fit — one pod then decides the outcome.)"""
    engine = Engine(cluster, policy, EngineConfig(predict_completions=False, seed=opts.seed), workload=jobs)
    kept, reasons = filter_for_cluster(jobs, engine, "inflate")
    filtered = merged_filters(trace_filtered, reasons)
    check_something_runs(len(jobs), len(kept), filtered)
    if opts.inflate_order == "trace":
        stream = iter(kept)
    else:
        if not any(j.gpu_demand > 0 for j in kept):
            raise NothingToRun("no task of the trace asks for a GPU: arrived GPU demand would never reach "
                               f"{opts.inflate_until_pct:g}% of the cluster")
        rng = np.random.default_rng(opts.seed)

        def sampled():
            while True:
                yield kept[int(rng.integers(len(kept)))]

        stream = sampled()
    total = cluster.total_gpus
    bound = opts.inflate_until_pct / 100.0 * total
    curve = _InflateCurve(engine, total, opts.fgd_metric)
    for i, spec in enumerate(stream):
        # Sampling with replacement draws the same task more than once: give each draw its own id.
        task = dataclasses.replace(spec, job_id=f"{spec.job_id}#{i}", submit_s=0.0, duration_s=None)
        ok = engine.place_now(task)
        curve.arrived(task, ok)
        if (not ok and opts.stop_at_first_failure) or curve.arrived_gpus >= bound - 1e-9:
            break
    curve.finish()
    frag = engine.fragmentation_index().cluster_frag_gpus()
    summary = summary_header(cluster, policy.name, opts, len(jobs), trace_filtered, reasons)
    summary.update({
        "inflate_until_pct": opts.inflate_until_pct,
        "stop_at_first_failure": opts.stop_at_first_failure,
        **curve.counts(),
        "gpu_allocation_ratio": engine.allocated_gpus / total if total else 0.0,
        "allocated_gpus": engine.allocated_gpus,
        "fragmentation_gpus": frag,
        "fragmentation_ratio": frag / total if total else 0.0,
        "idle_gpus": total - engine.allocated_gpus,
        "first_failure_arrived_pct": curve.first_failure_pct,
        "jobs_cpu_only": sum(j.num_gpus == 0 for j in kept),  # in the pool tasks are drawn from
    })
    return RunResult(summary=summary, jobs=[], timeseries=curve.rows, decisions=engine.decisions)


class _InflateCurve:
    """The rows of inflate.csv: one each time arrived GPU demand passes another percent of the
    cluster's GPUs, and one at the end."""

    def __init__(self, engine: Engine, total_gpus: int, fgd: bool) -> None:
        self.engine, self.total, self.fgd = engine, total_gpus, fgd
        self.arrived_gpus = 0.0
        self.tasks = Counter()  # arrived, placed, failed; and the CPU-only among them
        self.failed_gpus = 0.0
        self.first_failure_pct: float | None = None
        self.rows: list[dict] = []
        self._next_pct = 1

    def arrived(self, task: JobSpec, placed: bool) -> None:
        self.arrived_gpus += task.gpu_demand
        self.tasks["arrived"] += 1
        self.tasks["placed" if placed else "failed"] += 1
        if task.num_gpus == 0:
            self.tasks["cpu_only_placed" if placed else "cpu_only_failed"] += 1
        if not placed:
            self.failed_gpus += task.gpu_demand
            if self.first_failure_pct is None:
                self.first_failure_pct = self._pct()
        if self._pct() >= self._next_pct:
            self.rows.append(self._row())
            self._next_pct = math.floor(self._pct()) + 1

    def finish(self) -> None:
        if not self.rows or self.rows[-1]["tasks_arrived"] != self.tasks["arrived"]:
            self.rows.append(self._row())

    def _pct(self) -> float:
        return 100.0 * self.arrived_gpus / self.total if self.total else 0.0

    def counts(self) -> dict:
        t = self.tasks
        return {"tasks_arrived": t["arrived"], "tasks_placed": t["placed"], "tasks_failed": t["failed"],
                "cpu_only_tasks_placed": t["cpu_only_placed"], "cpu_only_tasks_failed": t["cpu_only_failed"],
                "arrived_gpus": self.arrived_gpus, "arrived_pct": self._pct(), "failed_gpus": self.failed_gpus}

    def _row(self) -> dict:
        engine, total = self.engine, self.total
        st = engine.state
        free = float(np.where(st.free_milli > 0, st.free_milli, 0).sum()) / GPU_MILLI
        row = {"arrived_pct": self._pct(), "arrived_gpus": self.arrived_gpus, "tasks_arrived": self.tasks["arrived"],
               "tasks_placed": self.tasks["placed"], "tasks_failed": self.tasks["failed"],
               "allocated_gpus": engine.allocated_gpus,
               "gpu_allocation_ratio": engine.allocated_gpus / total if total else 0.0,
               "unallocated_gpus": self.failed_gpus, "free_gpus": free}
        if self.fgd:
            frag = engine.fragmentation_index().cluster_frag_gpus()
            row["fgd_fragmentation_gpus"] = frag
            row["fragmentation_ratio"] = frag / total if total else 0.0
        return row
