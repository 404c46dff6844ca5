"""What a run under a partition measures per ClusterQueue: the summary's ``per_cluster_queue``.

One implementation of each figure, which ``analysim simulate``, ``compare`` and ``sweep`` all
print from summary.json (analysim.report.cluster_queue_table):

- admission wait (creation to first admission, ``wait_s`` of jobs.csv) and JCT of the queue's
  completed jobs: mean, median, p95, p99 (``metrics.distribution``, as the run's own JCT figures);
- GPU usage: GPU-seconds its admitted jobs held, read from the quota tree between events, and its
  time average over the run's makespan, also as a fraction of its nominal GPU quota;
- borrowing: the same integral of what it held past its nominal quota, per flavor (Kueue's
  ``kueue_cluster_queue_borrowing``: a queue under its quota of one flavor and over it in another
  borrows the latter);
- evictions (preemptions) by Kueue's reason, from ``eviction_reasons``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from analysim.core.job import GPU_MILLI, JobRun, JobStatus
from analysim.core.partition import GPU

if TYPE_CHECKING:
    from analysim.core.engine import Engine
    from analysim.core.metrics import EndedJobs
    from analysim.core.plugins.kueue import KueueState

# Kueue's eviction reasons for a preempted workload (the ``reason`` label of
# kueue_evicted_workloads_total / kueue_preempted_workloads_total), in the table's order.
EVICTION_REASONS = ("InClusterQueue", "InCohortReclamation", "InCohortFairSharing", "InCohortReclaimWhileBorrowing")
# An eviction whose reason the engine did not record.
UNKNOWN_REASON = "Unknown"


def eviction_reasons(job: JobRun, state: KueueState | None = None) -> dict[str, int]:
    """A job's evictions by Kueue reason. The one place they are read: Kueue's preemption records
    each of its evictions' reason in ``state.reasons`` (kueue_preemption); an eviction it did not
    record (the engine counts every one in ``JobRun.preemptions``) counts as ``Unknown``."""
    got = dict(state.reasons.get(job.job_id, {})) if state is not None else {}
    rest = job.preemptions - sum(got.values())
    if rest > 0:
        got[UNKNOWN_REASON] = rest
    return got


def queue_meter(engine: Engine) -> QueueMeter | None:
    """The meter of a run whose admission is Kueue's (None for a run on the cluster's VCs)."""
    from analysim.core.plugins.kueue import KueueAdmission

    adm = engine.admission
    return QueueMeter(adm.state) if isinstance(adm, KueueAdmission) else None


class QueueMeter:
    """Integrates each ClusterQueue's GPU usage and borrowing over the run (``advance``, between
    events) and counts its jobs' evictions by reason (``job_ended``)."""

    def __init__(self, state: KueueState) -> None:
        self.state = state
        tree = state.tree
        nodes = state.partition.nodes
        self.queues: list[int] = [i for i, n in enumerate(nodes) if n.is_queue]
        self.names: list[str] = [nodes[i].name for i in self.queues]
        self.gpu_keys: list[list[tuple[str, str]]] = [sorted(fr for fr in tree.quota[i] if fr[1] == GPU)
                                                     for i in self.queues]
        self.nominal_gpus: list[float] = [sum(tree.nominal(i, fr) for fr in keys) / GPU_MILLI
                                          for i, keys in zip(self.queues, self.gpu_keys, strict=True)]
        n = len(self.queues)
        self.used_gpu_s: list[float] = [0.0] * n
        self.borrowed_gpu_s: list[float] = [0.0] * n
        self.evictions: list[dict[str, int]] = [{} for _ in range(n)]
        self._position: dict[int, int] = {q: k for k, q in enumerate(self.queues)}
        # Usage and borrowing now, per queue, read again only when the tree's usage changed.
        self._version = -1
        self._used: list[float] = [0.0] * n
        self._borrowed: list[float] = [0.0] * n

    def advance(self, dt: float) -> None:
        st = self.state
        if st.version != self._version:
            tree = st.tree
            for k, i in enumerate(self.queues):
                usage = tree.usage[i]
                self._used[k] = sum(usage.get(fr, 0) for fr in self.gpu_keys[k]) / GPU_MILLI
                self._borrowed[k] = sum(tree.borrowing(i, fr) for fr in self.gpu_keys[k]) / GPU_MILLI
            self._version = st.version
        for k in range(len(self.queues)):
            if self._used[k]:
                self.used_gpu_s[k] += self._used[k] * dt
                if self._borrowed[k]:
                    self.borrowed_gpu_s[k] += self._borrowed[k] * dt

    def job_ended(self, job: JobRun) -> None:
        reasons = eviction_reasons(job, self.state)
        self.state.reasons.pop(job.job_id, None)  # (read once, when the job ends)
        if reasons:
            counts = self.evictions[self._position[self.state.queue(job)]]
            for reason, n in reasons.items():
                counts[reason] = counts.get(reason, 0) + n

    def summary(self, ended: EndedJobs, makespan_s: float) -> dict[str, dict]:
        """``per_cluster_queue``: each ClusterQueue's figures (module docstring), in the
        partition's order. Averages over time are over ``makespan_s``, as the run's utilization."""
        from analysim.core.metrics import distribution, jct_stats

        partition = self.state.partition
        cq_of = dict(partition.queue_of)  # LocalQueue (the jobs' VC) -> ClusterQueue
        vc = ended.column("vc")
        done = ended.status_is(JobStatus.COMPLETED)
        jct, queue, wait = ended.column("jct"), ended.column("queue"), ended.column("wait")
        out: dict[str, dict] = {}
        for k, i in enumerate(self.queues):
            name = self.names[k]
            lqs = [v for v, local in enumerate(ended.vc_names) if cq_of.get(local) == name]
            ours = np.isin(vc, lqs) & done
            mean, median, p95, p99 = distribution(wait[ours])
            nominal = self.nominal_gpus[k]
            avg = self.used_gpu_s[k] / makespan_s if makespan_s > 0 else 0.0
            evictions = dict.fromkeys(EVICTION_REASONS, 0)
            for reason, n in sorted(self.evictions[k].items()):
                evictions[reason] = evictions.get(reason, 0) + n
            out[name] = {
                "cohort": partition.nodes[i].parent,
                "local_queues": sorted(lq for lq, cq in partition.queue_of if cq == name),
                "jobs_completed": int(ours.sum()),
                "avg_admission_wait_s": mean, "median_admission_wait_s": median,
                "p95_admission_wait_s": p95, "p99_admission_wait_s": p99,
                **jct_stats(jct[ours], queue[ours]),
                "nominal_gpus": nominal,
                "gpu_time_s": self.used_gpu_s[k],
                "avg_gpus": avg,
                "usage_of_nominal": avg / nominal if nominal > 0 else None,
                "borrowed_gpu_time_s": self.borrowed_gpu_s[k],
                "avg_borrowed_gpus": self.borrowed_gpu_s[k] / makespan_s if makespan_s > 0 else 0.0,
                "evictions": evictions,
                "evictions_total": sum(evictions.values()),
            }
        return out
