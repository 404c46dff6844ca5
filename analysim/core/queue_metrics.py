"""What a run under a partition measures per ClusterQueue: the summary's ``per_cluster_queue``.

One implementation of each figure, which ``analysim simulate``, ``compare`` and ``sweep`` all
print from summary.json (analysim.report.cluster_queue_table):

- admission wait (creation to first admission, ``wait_s`` of jobs.csv) and JCT of the queue's
  completed jobs: mean, median, p95, p99 (``metrics.distribution``, as the run's own JCT figures);
- usage of every resource it has quota for (``resources``: GPUs, cores, bytes, as Kueue reports
  them), summed over its flavors: the unit-seconds its admitted jobs held, read from the quota tree
  between events, its time average over the run's makespan, also as a fraction of its nominal
  quota, and the most held at once; the GPU figures again under the summary's GPU keys
  (``nominal_gpus``, ``avg_gpus``, ...: ``GPU_FIGURES``);
- borrowing: the same integral of what it held past its nominal quota, per flavor (a queue under
  its quota of one flavor and over it in another borrows the latter);
- evictions (preemptions) by Kueue's reason, from ``eviction_reasons``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from analysim.core.figures import distribution, jct_stats
from analysim.core.job import JobRun, JobStatus
from analysim.core.partition import GPU, REPORTED_UNITS, in_kubernetes_units
from analysim.core.run_view import RunView

if TYPE_CHECKING:
    from analysim.core.ended_jobs import EndedJobs
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


def queue_meter(engine: RunView) -> QueueMeter | None:
    """The meter of a run whose admission is Kueue's (None for a run on the cluster's VCs)."""
    from analysim.core.plugins.kueue import KueueAdmission

    adm = engine.policy.admission
    return QueueMeter(adm.state) if isinstance(adm, KueueAdmission) else None


# A queue's figures for one resource, and the summary's GPU keys that repeat the GPU ones (a queue
# without GPU quota has them at 0).
GPU_FIGURES = {"nominal_gpus": "nominal", "gpu_time_s": "usage_time_s", "avg_gpus": "avg_usage",
               "usage_of_nominal": "usage_of_nominal", "borrowed_gpu_time_s": "borrowed_time_s",
               "avg_borrowed_gpus": "avg_borrowed"}


def _total(resource: str, amounts: list[int | None]) -> float | None:
    """Per-flavor amounts summed, in Kueue's reported unit; None when one is None (no limit)."""
    if any(a is None for a in amounts):
        return None
    return in_kubernetes_units(resource, sum(amounts))  # type: ignore[arg-type]


def resource_figures(nominal: float, usage_time_s: float, peak: float, borrowed_time_s: float,
                     makespan_s: float) -> dict[str, float | None]:
    """A queue's usage of one resource over the run, in Kueue's unit of it: the time integral
    (unit-seconds), its average over ``makespan_s`` (as the run's utilization), also as a share of
    the nominal quota, the most held at once, and the same integral and average of what it held
    past its nominal quota."""
    avg = usage_time_s / makespan_s if makespan_s > 0 else 0.0
    return {"nominal": nominal, "usage_time_s": usage_time_s, "avg_usage": avg, "peak_usage": peak,
            "usage_of_nominal": avg / nominal if nominal > 0 else None, "borrowed_time_s": borrowed_time_s,
            "avg_borrowed": borrowed_time_s / makespan_s if makespan_s > 0 else 0.0}


class QueueMeter:
    """Integrates each ClusterQueue's usage and borrowing of every resource it has quota for over
    the run (from one change of a slot to the next: ``advance``, before the clock moves, and
    ``bring_up_to``, before the integrals are read) and counts its jobs' evictions by reason (``job_ended``).

    A *slot* is one queue's one resource, summed over the flavors it has quota of it in: the unit
    that usage is integrated in (Kueue's ``kueue_cluster_queue_resource_usage``, summed over its
    ``flavor`` label)."""

    def __init__(self, state: KueueState) -> None:
        self.state = state  # the partition's quota usage, read between events
        tree = state.tree
        nodes = state.partition.nodes
        self.queues: list[int] = [i for i, n in enumerate(nodes) if n.is_queue]  # the ClusterQueues' tree nodes
        self.names: list[str] = [nodes[i].name for i in self.queues]  # their names, in that order
        # Per slot: its queue (a position in ``queues``), resource, and flavor-resource keys (by flavor).
        self.slot_queue: list[int] = []
        self.slot_resource: list[str] = []  # (per slot, as above)
        self.slot_keys: list[list[tuple[str, str]]] = []  # (per slot, as above)
        # Per queue: its slots, in the order its resource groups cover the resources.
        self.slots_of: list[list[int]] = []
        for k, i in enumerate(self.queues):
            covered = [r for g in nodes[i].groups for r in g.resources]
            resources = sorted({fr[1] for fr in tree.quota[i]},
                               key=lambda r: (covered.index(r) if r in covered else len(covered), r))
            self.slots_of.append([])
            for r in resources:
                self.slots_of[k].append(len(self.slot_queue))
                self.slot_queue.append(k)
                self.slot_resource.append(r)
                self.slot_keys.append(sorted(fr for fr in tree.quota[i] if fr[1] == r))
        n = len(self.slot_queue)
        # Per slot: quota (Kueue's units), and the integrals and peak of its usage over the run.
        self.nominal: list[float] = []
        self.borrowing_limit: list[float | None] = []  # (per slot, as above; None: no limit)
        self.lending_limit: list[float | None] = []  # (per slot, as above; None: no limit)
        for s, keys in enumerate(self.slot_keys):
            quotas = [tree.quota[self.queues[self.slot_queue[s]]][fr] for fr in keys]
            r = self.slot_resource[s]
            self.nominal.append(in_kubernetes_units(r, sum(q.nominal for q in quotas)))
            self.borrowing_limit.append(_total(r, [q.borrowing_limit for q in quotas]))
            self.lending_limit.append(_total(r, [q.lending_limit for q in quotas]))
        self.usage_time_s: list[float] = [0.0] * n  # per slot: its usage integrated over the run (unit-seconds)
        self.borrowed_time_s: list[float] = [0.0] * n  # per slot: what it held past its nominal quota, integrated
        self.peak: list[float] = [0.0] * n  # per slot: the most it held at once
        self.evictions: list[dict[str, int]] = [{} for _ in self.queues]  # per queue: evictions by Kueue reason
        self._position: dict[int, int] = {q: k for k, q in enumerate(self.queues)}  # tree node -> position in queues
        # The slots held now: slot -> (usage, borrowing, since when), read again for a queue only
        # when its usage changed (the queues the state names as changed since the last read); the
        # integrals hold each slot's time up to its ``since``.
        self._held: dict[int, tuple[float, float, float]] = {}  # (see above)

    def advance(self, now: float) -> None:
        """The clock is about to move on from ``now``: the slots whose usage changed since the
        last read are integrated up to now, and held from now at what they hold now."""
        if self.state.changed:
            self._read(now)

    def bring_up_to(self, now: float) -> None:
        """Every slot's integrals, up to ``now`` (what it holds is held from then on)."""
        self.advance(now)
        for s in list(self._held):
            self._integrate(s, now)

    def _integrate(self, s: int, now: float) -> None:
        """A held slot's integrals, up to ``now``; held from now on at what it held."""
        used, borrowed, since = self._held[s]
        self.usage_time_s[s] += used * (now - since)
        if borrowed:
            self.borrowed_time_s[s] += borrowed * (now - since)
        self._held[s] = (used, borrowed, now)

    def _read(self, now: float) -> None:
        """The usage and borrowing of every slot of a queue whose usage changed since last read;
        read only before a stretch of time it is held for (so a peak is held for some time)."""
        st = self.state
        tree, position = st.tree, self._position
        held = self._held
        for i in st.changed:
            k = position[i]
            usage = tree.usage[i]
            for s in self.slots_of[k]:
                if s in held:
                    self._integrate(s, now)
                r, keys = self.slot_resource[s], self.slot_keys[s]
                used = in_kubernetes_units(r, sum(usage.get(fr, 0) for fr in keys))
                if used:
                    held[s] = (used, in_kubernetes_units(r, sum(tree.borrowing(i, fr) for fr in keys)), now)
                    if used > self.peak[s]:
                        self.peak[s] = used
                else:
                    held.pop(s, None)
        st.changed.clear()

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

        partition = self.state.partition
        local_queues: dict[str, list[str]] = {}  # ClusterQueue -> its LocalQueues (the jobs' VCs), sorted
        for lq, cq in sorted(partition.queue_of):
            local_queues.setdefault(cq, []).append(lq)
        done = ended.status_is(JobStatus.COMPLETED)
        jct, queue, wait = ended.column("jct"), ended.column("queue"), ended.column("wait")
        out: dict[str, dict] = {}
        for k, i in enumerate(self.queues):
            name = self.names[k]
            lqs = local_queues.get(name, [])
            of_lqs = [ended.rows_of(lq) for lq in lqs]
            # (its jobs' rows in the order they ended, as the figures' rounding reads them)
            rows = of_lqs[0] if len(of_lqs) == 1 else np.sort(np.concatenate(of_lqs)) if of_lqs else np.zeros(0, dtype=np.intp)
            rows = rows[done[rows]]
            mean, median, p95, p99 = distribution(wait[rows])
            resources = {self.slot_resource[s]: self._resource(s, makespan_s) for s in self.slots_of[k]}
            gpu = resources.get(GPU) or resource_figures(0.0, 0.0, 0.0, 0.0, makespan_s)
            evictions = dict.fromkeys(EVICTION_REASONS, 0)
            for reason, n in sorted(self.evictions[k].items()):
                evictions[reason] = evictions.get(reason, 0) + n
            out[name] = {
                "cohort": partition.nodes[i].parent,
                "local_queues": lqs,
                "jobs_completed": int(rows.size),
                "avg_admission_wait_s": mean, "median_admission_wait_s": median,
                "p95_admission_wait_s": p95, "p99_admission_wait_s": p99,
                **jct_stats(jct[rows], queue[rows]),
                **{key: gpu[figure] for key, figure in GPU_FIGURES.items()},
                "evictions": evictions,
                "evictions_total": sum(evictions.values()),
                "resources": resources,
            }
        return out

    def _resource(self, s: int, makespan_s: float) -> dict:
        """One slot's entry of a queue's ``resources``: its unit, flavors, quota and usage."""
        r = self.slot_resource[s]
        return {"unit": REPORTED_UNITS.get(r), "flavors": [f for f, _ in self.slot_keys[s]],
                "borrowing_limit": self.borrowing_limit[s], "lending_limit": self.lending_limit[s],
                **resource_figures(self.nominal[s], self.usage_time_s[s], self.peak[s], self.borrowed_time_s[s],
                                   makespan_s)}
