"""What a run measures: per-job records, a downsampled time series, and the summary.

Integrals (GPU-seconds allocated, pending jobs over time) are exact, accumulated between events;
fragmentation is sampled with the time series, since measuring it costs more than an event.

Fragmentation, two figures:
- ``fragmented_gpus`` (head-of-line): free GPUs that the first job of the queue cannot use —
  free capacity on nodes where it does not fit (for a job spanning nodes: on nodes that are not
  entirely free). Zero when nothing waits. ``avg_fragmentation`` is its time average as a
  fraction of the cluster's GPUs.
- ``fgd_fragmentation_gpus``: FGD's expected fragmentation (Weng et al., ATC'23) under the
  trace's distribution of task sizes, summed over nodes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from mypy_extensions import mypyc_attr

from analysim.core import placement
from analysim.core.ended_jobs import EndedJobs
from analysim.core.figures import jain_index, jct_stats
from analysim.core.job import GPU_MILLI, JobRun, JobStatus
from analysim.core.queue_metrics import QueueMeter, queue_meter

if TYPE_CHECKING:
    from analysim.core.run_view import RunView

JOB_FIELDS = (
    "job_id", "vc", "user", "num_gpus", "gpu_milli", "duration_s", "submit_s", "first_start_s", "end_s",
    "wait_s", "queue_s", "jct_s", "slowdown", "preemptions", "migrations", "restarts", "status", "nodes",
)


def head_of_line_fragmentation(engine: RunView) -> float:
    head = engine.head_of_line()
    st = engine.state
    if head is None:
        return 0.0
    free = np.where(st.free_milli > 0, st.free_milli, 0).sum(axis=1) / GPU_MILLI
    free = np.where(st.up, free, 0.0)
    static = engine.static_mask(head.spec)
    if placement.gang_size(st, head.spec, static) > 1:
        usable = static & (st.full_free == st.gpus)
    else:
        usable = static & placement.single_node_fit(st, head.spec)
    return float(free[~usable].sum())


@dataclass
@mypyc_attr(allow_interpreted_subclasses=True)  # (a scheduler service's and tests' recorders)
class MetricsRecorder:
    """Collects a run's measurements from the engine's hooks. Pure: writes nothing anywhere.

    Each ended job's row (JOB_FIELDS) is kept in ``jobs``, or, given a ``job_sink``, handed to it
    instead, so that a run of millions of jobs holds none of their rows (``analysim simulate``
    streams them into jobs.csv); the summary reads ``ended``, a few numbers a job.
    """

    sample_interval_s: float = 600.0  # virtual seconds between time-series samples (doubles as they thin)
    max_samples: int = 2000  # past this, every other sample is dropped and the interval doubles
    fgd: bool = True  # also sample FGD's expected fragmentation
    jobs: list[dict] = field(default_factory=list)  # each ended job's row, without a job_sink
    job_sink: Callable[[dict], None] | None = None  # where each ended job's row goes instead (None: jobs)
    on_job_end: Callable[[], None] | None = None  # called after each ended job's row (a progress bar)
    ended: EndedJobs = field(default_factory=EndedJobs)  # what the summary needs of each ended job
    samples: list[dict] = field(default_factory=list)  # the time series' rows, at most max_samples
    alloc_gpu_s: float = 0.0  # GPU-seconds allocated, integrated between events
    capacity_gpu_s: float = 0.0  # GPU-seconds of nodes that were up
    pending_job_s: float = 0.0  # job-seconds spent pending
    vc_alloc_gpu_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # the same per VC
    # Per VC, the GPUs it has held since when: vc_alloc_gpu_s is brought up to a time from there
    # (_integrate_vcs) when the VC's usage changes, and for every VC at the summary.
    _vc_held: dict[str, tuple[float, float]] = field(default_factory=dict)
    start_s: float | None = None  # the time of the run's first event (None: before it)
    last_end_s: float = 0.0  # when the last job ended (the makespan's end)
    _next_sample: float | None = None  # when the next time-series sample is due
    # Under a partition, per ClusterQueue usage, borrowing and evictions (summary's per_cluster_queue).
    queue_meter: QueueMeter | None = None

    # --- engine hooks

    def advance(self, engine: RunView, t: float) -> None:
        if self.start_s is None:
            # Time before the first event is not part of the run.
            self._start(engine, t)
            return
        dt = t - engine.now
        if dt <= 0:
            return
        self.alloc_gpu_s += engine.tally.allocated_gpus * dt
        self.capacity_gpu_s += engine.tally.up_gpus * dt
        self.pending_job_s += len(engine.squeue) * dt
        if self.queue_meter is not None:
            self.queue_meter.advance(engine.now)
        if engine.tally.touched:
            self._integrate_vcs(engine, engine.tally.take_touched())
        while self._next_sample is not None and self._next_sample < t:
            self.samples.append(self._sample(engine, self._next_sample))
            self._next_sample += self.sample_interval_s
            if len(self.samples) >= self.max_samples:
                # Runs outlast their trace's submissions by far (long jobs): keep the series
                # bounded and evenly spaced rather than guessing the makespan up front.
                self.samples = self.samples[::2]
                self.sample_interval_s *= 2
                self._next_sample = self.samples[-1]["time_s"] + self.sample_interval_s

    def after_pass(self, engine: RunView) -> None:
        if self.start_s is None:
            self._start(engine, engine.now)

    def _start(self, engine: RunView, t: float) -> None:
        self.start_s = t
        self._next_sample = t
        self.queue_meter = queue_meter(engine)
        engine.tally.take_touched()
        self._vc_held = {vc: (used, t) for vc, used in engine.state.vc_used.items() if used}

    def _integrate_vcs(self, engine: RunView, vcs: Iterable[str]) -> None:
        """Each of ``vcs``'s GPU-seconds up to now, at what it held since its last change; from
        now, what it holds now."""
        now, acc, held, used_now = engine.now, self.vc_alloc_gpu_s, self._vc_held, engine.state.vc_used
        for vc in vcs:
            was = held.get(vc)
            if was is not None and was[0]:
                acc[vc] = acc.get(vc, 0.0) + was[0] * (now - was[1])  # (a defaultdict's += is a generic lookup and add)
            used = used_now.get(vc, 0.0)
            if used:
                held[vc] = (used, now)
            else:
                held.pop(vc, None)

    def job_ended(self, engine: RunView, job: JobRun) -> None:
        s = job.spec
        end = job.end_s if job.end_s is not None else engine.now
        self.last_end_s = max(self.last_end_s, end)
        if self.queue_meter is not None:
            self.queue_meter.job_ended(job)
        jct = end - s.submit_s
        dur = s.duration_s or 0.0
        self.add_row({
            "job_id": s.job_id, "vc": s.vc, "user": s.user, "num_gpus": s.num_gpus, "gpu_milli": s.gpu_milli,
            "duration_s": dur, "submit_s": s.submit_s, "first_start_s": job.first_start_s, "end_s": end,
            "wait_s": (job.first_start_s - s.submit_s) if job.first_start_s is not None else jct,
            "queue_s": max(0.0, jct - job.executed_s), "jct_s": jct,
            "slowdown": jct / dur if dur > 0 else 1.0,
            "preemptions": job.preemptions, "migrations": job.migrations, "restarts": job.restarts,
            "status": job.status.value,
            "nodes": "|".join(engine.spec.nodes[n].name for n in job.placement.nodes) if job.placement else
                     "|".join(engine.spec.nodes[n].name for n in job.placements_seen[-1]) if job.placements_seen else "",
        })
        if self.on_job_end is not None:
            self.on_job_end()

    def add_row(self, row: dict) -> None:
        """An ended job's row (JOB_FIELDS): counted in the summary, and kept or handed on."""
        self.ended.add(row)
        if self.job_sink is None:
            self.jobs.append(row)
        else:
            self.job_sink(row)

    def _sample(self, engine: RunView, t: float) -> dict:
        st = engine.state
        up_gpus = float(st.gpus[st.up].sum())
        row = {
            "time_s": t,
            "allocated_gpus": engine.tally.allocated_gpus,
            "idle_gpus": up_gpus - engine.tally.allocated_gpus,
            "running_jobs": len(engine.running),
            "pending_jobs": len(engine.squeue),
            "pending_gpu_demand": engine.squeue.demand,
            "fragmented_gpus": head_of_line_fragmentation(engine),
        }
        if self.fgd:
            row["fgd_fragmentation_gpus"] = engine.fragmentation_index().cluster_frag_gpus()
        for vc in sorted(st.vc_used):
            row[f"vc:{vc}:allocated_gpus"] = st.vc_used[vc]
            q = engine.quota_of(vc)
            if q is not None:
                row[f"vc:{vc}:idle_quota_gpus"] = max(0.0, q - st.vc_used[vc])
        for i, m in enumerate(st.model_names):
            cap = float(st.gpus[st.up & (st.model_id == i)].sum())
            row[f"model:{m}:allocated_gpus"] = float(engine.tally.allocated_by_model[i])
            row[f"model:{m}:idle_gpus"] = cap - float(engine.tally.allocated_by_model[i])
        return row

    # --- results

    def timeseries(self) -> list[dict]:
        """Samples with one column set: VCs or models that appear later are filled with 0."""
        cols: dict[str, None] = {}
        for r in self.samples:
            cols.update(dict.fromkeys(r))
        return [{c: r.get(c, 0.0) for c in cols} for r in self.samples]

    def summary(self, engine: RunView) -> dict:
        if self.start_s is not None:  # (the integrals, brought up to now)
            self._integrate_vcs(engine, sorted(set(engine.tally.take_touched()) | set(self._vc_held)))
            if self.queue_meter is not None:
                self.queue_meter.bring_up_to(engine.now)
        ended = self.ended
        done = ended.status_is(JobStatus.COMPLETED)
        jct, queue, slowdown = ended.column("jct"), ended.column("queue"), ended.column("slowdown")
        preemptions, migrations = ended.column("preemptions"), ended.column("migrations")
        start = self.start_s or 0.0
        makespan = max(0.0, self.last_end_s - start)
        total_gpus = engine.spec.total_gpus
        out = {
            "jobs_total": engine.table.submitted,
            "jobs_completed": int(done.sum()),
            "jobs_failed": int(ended.status_is(JobStatus.FAILED).sum()),
            "jobs_cancelled": int(ended.status_is(JobStatus.CANCELLED).sum()),
            "jobs_unfinished": sum(j.status in (JobStatus.PENDING, JobStatus.RUNNING) for j in engine.table.jobs.values()),
            **jct_stats(jct[done], queue[done]),
            "makespan_s": makespan,
            "gpu_utilization": self.alloc_gpu_s / (total_gpus * makespan) if makespan > 0 and total_gpus else 0.0,
            "avg_fragmentation": (float(np.mean([s["fragmented_gpus"] for s in self.samples])) / total_gpus
                                  if self.samples and total_gpus else 0.0),
            "avg_fragmented_gpus": float(np.mean([s["fragmented_gpus"] for s in self.samples])) if self.samples else 0.0,
            "preemptions": int(preemptions.sum()),
            "migrations": int(migrations.sum()),
            "restarts": int(ended.column("restarts").sum()),
        }
        if self.fgd and self.samples:
            out["avg_fgd_fragmentation_gpus"] = float(np.mean([s["fgd_fragmentation_gpus"] for s in self.samples]))
        per_vc = {}
        live_by_vc: dict[str, int] = defaultdict(int)
        for j in engine.table.jobs.values():
            live_by_vc[j.spec.vc] += 1
        for name in sorted(set(ended.vc_names) | set(live_by_vc)):
            rows = ended.rows_of(name)  # (in the order the jobs ended, as the figures' rounding reads them)
            done_rows = rows[done[rows]]
            q = engine.guaranteed_gpus(name)
            per_vc[name] = {
                "jobs_total": live_by_vc[name] + engine.table.forgotten_by_vc.get(name, 0),
                "jobs_completed": int(done_rows.size),
                **jct_stats(jct[done_rows], queue[done_rows]),
                "quota_gpus": q,
                "gpu_time_s": self.vc_alloc_gpu_s.get(name, 0.0),
                "gpu_share": self.vc_alloc_gpu_s.get(name, 0.0) / self.alloc_gpu_s if self.alloc_gpu_s else 0.0,
                "avg_slowdown": float(np.mean(slowdown[done_rows])) if done_rows.size else None,
                "preemptions": int(preemptions[rows].sum()),
                "migrations": int(migrations[rows].sum()),
            }
        out["per_vc"] = per_vc
        slows = [v["avg_slowdown"] for v in per_vc.values() if v["avg_slowdown"] is not None]
        out["jain_fairness"] = jain_index(slows)
        if self.queue_meter is not None:
            out["per_cluster_queue"] = self.queue_meter.summary(ended, makespan)
        return out
