"""Kueue's own metrics, under Kueue's names, types and labels, for a run under a partition
(``--partition``): dashboards and alerts built for Kueue read the emulator as they read Kueue.

After Kueue's metrics reference (https://kueue.sigs.k8s.io/docs/reference/metrics/; docs/live.md
lists each metric with what it means here):

- counters and the histogram are updated from the engine's decisions, as they are sent to the
  agents (``on_decision``): ``kueue_admitted_workloads_total`` and
  ``kueue_admission_wait_time_seconds`` at each admission (a launch: admission and placement are
  one step here), ``kueue_evicted_workloads_total`` and ``kueue_preempted_workloads_total`` at each
  eviction;
- gauges are read from the core's quota tree and queues when /metrics is scraped (``collect``):
  pending and admitted workloads per ClusterQueue, and per ClusterQueue, flavor and resource the
  nominal quota, borrowing and lending limits, usage and reservation, in Kubernetes' units
  (``nvidia.com/gpu`` in GPUs, ``cpu`` in cores, ``memory`` in bytes).

Seconds are virtual seconds (the trace's clock), as every ``analysim_*_seconds`` of a job's life.
"""

from __future__ import annotations

import math
from collections import Counter as Tally
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from analysim.core.partition import STRICT_FIFO, in_kubernetes_units
from analysim.core.plugins.kueue import KueueState
from analysim.events import kueue_state
from scheduler_svc.read_model import ClusterView

if TYPE_CHECKING:
    from analysim.core.job import JobRun
    from analysim.core.records import Decision

# Kueue's buckets (1 s, then 2.5 s doubling to 10240 s), continued doubling to a month: a trace's
# admission waits run to days, which Kueue's last bucket (under three hours) would all hold in +Inf.
# A superset of Kueue's boundaries, so that a query on any of its `le` values reads the same here.
KUEUE_BUCKETS = (1.0, *(2.5 * 2**i for i in range(13)))
ADMISSION_WAIT_BUCKETS = (*KUEUE_BUCKETS, *(10240.0 * 2**i for i in range(1, 9)))
# kueue_pending_workloads' statuses.
ACTIVE, INADMISSIBLE = "active", "inadmissible"
# kueue_evicted_workloads_total's reasons (Kueue has more: PodsReadyTimeout, AdmissionCheck,
# ClusterQueueStopped, LocalQueueStopped, Deactivated; nothing here makes those).
PREEMPTED, NODE_FAILURES = "Preempted", "NodeFailures"
# kueue_preempted_workloads_total's reasons: why the preempting workload's ClusterQueue took the room.
PREEMPTION_REASONS = ("InClusterQueue", "InCohortReclamation", "InCohortFairSharing", "InCohortReclaimWhileBorrowing")


def preemption_of(decision: Decision) -> tuple[str, str] | None:
    """The ClusterQueue of the workload a preemption made room for, and Kueue's reason for it (one
    of PREEMPTION_REASONS), as the engine recorded them with the eviction (``Decision.by`` and
    ``Decision.reason``, from Kueue's preemption in the core); None when it recorded none. The one
    place the service reads them."""
    if not decision.reason:
        return None
    return decision.by, decision.reason


class KueueMetrics:
    """Kueue's counters and histogram on the scheduler's registry, and the collector of its gauges."""

    def __init__(self, registry: CollectorRegistry, live: ClusterView) -> None:
        state = kueue_state(live.engine)
        if state is None:
            raise ValueError("Kueue's metrics need a run under a partition")
        self.state = state  # the Kueue plugin's state in the live engine (a job's ClusterQueue)
        partition = state.partition
        self.queues = [n.name for n in partition.nodes if n.is_queue]  # every ClusterQueue's name
        self.classes = dict(partition.priorities)  # WorkloadPriorityClass name -> its value
        self._requeued: dict[str, float] = {}  # job -> when it was last put back in its queue
        r = registry
        # kueue_admitted_workloads_total, by ClusterQueue and priority class
        self.admitted = Counter("kueue_admitted_workloads", "The total number of admitted workloads per 'cluster_queue'",
                                ["cluster_queue", "priority_class"], registry=r)
        # kueue_admission_wait_time_seconds (virtual seconds)
        self.wait = Histogram("kueue_admission_wait_time_seconds",
                              "The time between a workload was created or requeued until admission, per "
                              "'cluster_queue' (virtual seconds)", ["cluster_queue", "priority_class"],
                              buckets=ADMISSION_WAIT_BUCKETS, registry=r)
        # kueue_evicted_workloads_total, by ClusterQueue and reason
        self.evicted = Counter("kueue_evicted_workloads",
                               "The number of evicted workloads per 'cluster_queue'; 'reason': Preempted (to free "
                               "resources for another workload), NodeFailures (its nodes went down)",
                               ["cluster_queue", "reason", "underlying_cause", "priority_class"], registry=r)
        # kueue_preempted_workloads_total, by preempting ClusterQueue and reason
        self.preempted = Counter("kueue_preempted_workloads",
                                 "The number of preempted workloads per 'preempting_cluster_queue'; 'reason': "
                                 + ", ".join(PREEMPTION_REASONS), ["preempting_cluster_queue", "reason"], registry=r)
        # Every ClusterQueue's series from the start, at 0: a rate is 0, not absent, until the first event.
        for q in self.queues:
            self.admitted.labels(q, "")
            self.wait.labels(q, "")
            for reason in (PREEMPTED, NODE_FAILURES):
                self.evicted.labels(q, reason, "", "")
            for reason in PREEMPTION_REASONS:
                self.preempted.labels(q, reason)
        registry.register(_KueueGauges(live, state))

    def priority_class(self, job: JobRun) -> str:
        """The job's WorkloadPriorityClass ('' when it names none of the partition's)."""
        return job.spec.qos if job.spec.qos in self.classes else ""

    def on_decision(self, d: Decision, job: JobRun) -> None:
        kind = d.kind
        if kind == "launch":
            q = self.state.partition.nodes[self.state.queue(job)].name
            pc = self.priority_class(job)
            self.admitted.labels(q, pc).inc()
            self.wait.labels(q, pc).observe(d.time - self._requeued.pop(job.job_id, job.spec.submit_s))
        elif kind in ("preempt", "requeue"):
            q = self.state.partition.nodes[self.state.queue(job)].name
            self._requeued[job.job_id] = d.time
            self.evicted.labels(q, PREEMPTED if kind == "preempt" else NODE_FAILURES, "", self.priority_class(job)).inc()
            by = preemption_of(d) if kind == "preempt" else None
            if by is not None:
                self.preempted.labels(*by).inc()
        elif kind in ("complete", "cancel", "fail"):
            self._requeued.pop(job.job_id, None)


class _KueueGauges(Collector):
    """Kueue's gauges, read from the core's state at each scrape."""

    def __init__(self, live: ClusterView, state: KueueState) -> None:
        self.live = live  # the run's read model
        self.state = state  # the Kueue plugin's state in the live engine (quota tree, queues)

    def describe(self) -> list:
        return []  # computed on scrape

    def collect(self) -> Iterator[GaugeMetricFamily]:
        live, st = self.live, self.state
        nodes = st.partition.nodes
        queues = [i for i, n in enumerate(nodes) if n.is_queue]
        pending: Tally = Tally()
        for job in live.engine.pending_jobs():
            q = st.queue(job)
            # Kueue keeps a StrictFIFO queue's workloads in its heap; a BestEffortFIFO one's that
            # failed admission wait aside until quota frees up: here, those its quota cannot admit now.
            fits = nodes[q].strategy == STRICT_FIFO or st.assign(job) is not None
            pending[(q, ACTIVE if fits else INADMISSIBLE)] += 1
        g = GaugeMetricFamily("kueue_pending_workloads", "The number of pending workloads, per 'cluster_queue' and "
                              "'status' (active: in the admission queue; inadmissible: its ClusterQueue's quota "
                              "cannot admit it now)", labels=["cluster_queue", "status"])
        for q in queues:
            for status in (ACTIVE, INADMISSIBLE):
                g.add_metric([nodes[q].name, status], pending[(q, status)])
        yield g
        active: Tally = Tally(st.queue(job) for job in live.engine.running.values())
        g = GaugeMetricFamily("kueue_admitted_active_workloads", "The number of admitted Workloads that are active "
                              "(unsuspended and not finished), per 'cluster_queue'", labels=["cluster_queue"])
        for q in queues:
            g.add_metric([nodes[q].name], active[q])
        yield g
        yield from self._quotas(queues)

    def _quotas(self, queues: list[int]) -> Iterator[GaugeMetricFamily]:
        st = self.state
        labels = ["cohort", "cluster_queue", "flavor", "resource"]
        what = {"nominal_quota": "resource nominal quota", "borrowing_limit": "resource borrowing limit",
                "lending_limit": "resource lending limit", "resource_usage": "total resource usage",
                "resource_reservation": "total resource reservation"}
        fams = {k: GaugeMetricFamily(f"kueue_cluster_queue_{k}", f"Reports the cluster_queue's {v} within all the "
                                     f"flavors{' (+Inf: none)' if k.endswith('_limit') else ''}", labels=labels)
                for k, v in what.items()}
        for q in queues:
            node = st.partition.nodes[q]
            for (flavor, resource), quota in node.quotas:
                at = [node.parent or "", node.name, flavor, resource]
                used = in_kubernetes_units(resource, st.tree.usage[q].get((flavor, resource), 0))
                fams["nominal_quota"].add_metric(at, in_kubernetes_units(resource, quota.nominal))
                for k, limit in (("borrowing_limit", quota.borrowing_limit), ("lending_limit", quota.lending_limit)):
                    fams[k].add_metric(at, math.inf if limit is None else in_kubernetes_units(resource, limit))
                # Admission is placement here: what a workload reserves it uses at once.
                fams["resource_usage"].add_metric(at, used)
                fams["resource_reservation"].add_metric(at, used)
        yield from fams.values()
