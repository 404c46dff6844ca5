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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from analysim.core import placement
from analysim.core.job import GPU_MILLI, JobRun, JobStatus

if TYPE_CHECKING:
    from analysim.core.engine import Engine

JOB_FIELDS = (
    "job_id", "vc", "user", "num_gpus", "gpu_milli", "duration_s", "submit_s", "first_start_s", "end_s",
    "wait_s", "queue_s", "jct_s", "slowdown", "preemptions", "migrations", "restarts", "status", "nodes",
)


def head_of_line_fragmentation(engine: Engine) -> float:
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
class MetricsRecorder:
    """Collects a run's measurements from the engine's hooks. Pure: writes nothing anywhere."""

    sample_interval_s: float = 600.0
    max_samples: int = 2000  # past this, every other sample is dropped and the interval doubles
    fgd: bool = True  # also sample FGD's expected fragmentation
    jobs: list[dict] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    alloc_gpu_s: float = 0.0
    capacity_gpu_s: float = 0.0
    pending_job_s: float = 0.0
    vc_alloc_gpu_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    start_s: float | None = None
    last_end_s: float = 0.0
    _next_sample: float | None = None

    # --- engine hooks

    def advance(self, engine: Engine, t: float) -> None:
        if self.start_s is None:
            # Time before the first event is not part of the run.
            self.start_s = t
            self._next_sample = t
            return
        dt = t - engine.now
        if dt <= 0:
            return
        self.alloc_gpu_s += engine.allocated_gpus * dt
        self.capacity_gpu_s += engine.up_gpus * dt
        self.pending_job_s += engine.pending_count * dt
        for vc, used in engine.state.vc_used.items():
            if used:
                self.vc_alloc_gpu_s[vc] += used * dt
        while self._next_sample is not None and self._next_sample < t:
            self.samples.append(self._sample(engine, self._next_sample))
            self._next_sample += self.sample_interval_s
            if len(self.samples) >= self.max_samples:
                # Runs outlast their trace's submissions by far (long jobs): keep the series
                # bounded and evenly spaced rather than guessing the makespan up front.
                self.samples = self.samples[::2]
                self.sample_interval_s *= 2
                self._next_sample = self.samples[-1]["time_s"] + self.sample_interval_s

    def after_pass(self, engine: Engine) -> None:
        if self.start_s is None:
            self.start_s = engine.now
            self._next_sample = engine.now

    def job_ended(self, engine: Engine, job: JobRun) -> None:
        s = job.spec
        end = job.end_s if job.end_s is not None else engine.now
        self.last_end_s = max(self.last_end_s, end)
        jct = end - s.submit_s
        dur = s.duration_s or 0.0
        self.jobs.append({
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

    def _sample(self, engine: Engine, t: float) -> dict:
        st = engine.state
        up_gpus = float(st.gpus[st.up].sum())
        row = {
            "time_s": t,
            "allocated_gpus": engine.allocated_gpus,
            "idle_gpus": up_gpus - engine.allocated_gpus,
            "running_jobs": len(engine.running),
            "pending_jobs": engine.pending_count,
            "pending_gpu_demand": engine.pending_demand,
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
            row[f"model:{m}:allocated_gpus"] = float(engine.allocated_by_model[i])
            row[f"model:{m}:idle_gpus"] = cap - float(engine.allocated_by_model[i])
        return row

    # --- results

    def timeseries(self) -> list[dict]:
        """Samples with one column set: VCs or models that appear later are filled with 0."""
        cols: dict[str, None] = {}
        for r in self.samples:
            cols.update(dict.fromkeys(r))
        return [{c: r.get(c, 0.0) for c in cols} for r in self.samples]

    def summary(self, engine: Engine) -> dict:
        done = [j for j in self.jobs if j["status"] == JobStatus.COMPLETED.value]
        start = self.start_s or 0.0
        makespan = max(0.0, self.last_end_s - start)
        total_gpus = engine.spec.total_gpus
        out = {
            "jobs_total": len(engine.jobs),
            "jobs_completed": len(done),
            "jobs_failed": sum(j["status"] == JobStatus.FAILED.value for j in self.jobs),
            "jobs_cancelled": sum(j["status"] == JobStatus.CANCELLED.value for j in self.jobs),
            "jobs_unfinished": sum(j.status in (JobStatus.PENDING, JobStatus.RUNNING) for j in engine.jobs.values()),
            **_jct_stats(done),
            "makespan_s": makespan,
            "gpu_utilization": self.alloc_gpu_s / (total_gpus * makespan) if makespan > 0 and total_gpus else 0.0,
            "avg_fragmentation": (float(np.mean([s["fragmented_gpus"] for s in self.samples])) / total_gpus
                                  if self.samples and total_gpus else 0.0),
            "avg_fragmented_gpus": float(np.mean([s["fragmented_gpus"] for s in self.samples])) if self.samples else 0.0,
            "preemptions": sum(j["preemptions"] for j in self.jobs),
            "migrations": sum(j["migrations"] for j in self.jobs),
            "restarts": sum(j["restarts"] for j in self.jobs),
        }
        if self.fgd and self.samples:
            out["avg_fgd_fragmentation_gpus"] = float(np.mean([s["fgd_fragmentation_gpus"] for s in self.samples]))
        per_vc = {}
        by_vc: dict[str, list[dict]] = defaultdict(list)
        for j in self.jobs:
            by_vc[j["vc"]].append(j)
        for vc in sorted(set(by_vc) | {j.spec.vc for j in engine.jobs.values()}):
            vdone = [j for j in by_vc.get(vc, []) if j["status"] == JobStatus.COMPLETED.value]
            q = engine.guaranteed_gpus(vc)
            per_vc[vc] = {
                "jobs_total": sum(1 for j in engine.jobs.values() if j.spec.vc == vc),
                "jobs_completed": len(vdone),
                **_jct_stats(vdone),
                "quota_gpus": q,
                "gpu_time_s": self.vc_alloc_gpu_s.get(vc, 0.0),
                "gpu_share": self.vc_alloc_gpu_s.get(vc, 0.0) / self.alloc_gpu_s if self.alloc_gpu_s else 0.0,
                "avg_slowdown": float(np.mean([j["slowdown"] for j in vdone])) if vdone else None,
                "preemptions": sum(j["preemptions"] for j in by_vc.get(vc, [])),
                "migrations": sum(j["migrations"] for j in by_vc.get(vc, [])),
            }
        out["per_vc"] = per_vc
        slows = [v["avg_slowdown"] for v in per_vc.values() if v["avg_slowdown"] is not None]
        out["jain_fairness"] = jain_index(slows)
        return out


def jain_index(values: list[float]) -> float:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 when all equal, 1/n when one takes everything.
    Applied to the VCs' mean job slowdown: 1 means every tenant waits in the same proportion."""
    if not values:
        return 1.0
    sq = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * sq) if sq > 0 else 1.0


def _jct_stats(jobs: list[dict]) -> dict:
    if not jobs:
        return {"avg_jct_s": None, "median_jct_s": None, "p95_jct_s": None, "p99_jct_s": None, "avg_queue_s": None}
    jct = np.array([j["jct_s"] for j in jobs])
    return {
        "avg_jct_s": float(jct.mean()),
        "median_jct_s": float(np.median(jct)),
        "p95_jct_s": float(np.percentile(jct, 95)),
        "p99_jct_s": float(np.percentile(jct, 99)),
        "avg_queue_s": float(np.mean([j["queue_s"] for j in jobs])),
    }
