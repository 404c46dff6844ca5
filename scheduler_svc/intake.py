"""Jobs from clients: their checks (InvalidJob, with the reason it is counted under), the ids a
client job may take, submission (journalled before the engine takes it) and cancellation."""

from __future__ import annotations

import math

from analysim.core.cluster import ClusterSpec
from analysim.core.engine import Engine, InfeasibleJob
from analysim.core.job import GPU_MILLI, JobSpec
from analysim.core.partition import Partition
from analysim.partitions import assign_queues
from scheduler_svc.ending import RunEnd
from scheduler_svc.journal import Journal
from scheduler_svc.ledger import JobLedger
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.pace import Pace
from scheduler_svc.watch import EventFeed


class InvalidJob(ValueError):
    """A client's job that can never run here: INVALID_ARGUMENT, with this message."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason  # the analysim_jobs_rejected_total reason (one of SUBMISSION_REFUSALS)


def known_vcs(cluster: ClusterSpec) -> list[str]:
    """Every value a job's vc takes on this run: the partition's LocalQueues under a partition,
    else the cluster's VCs, else "default". Every per-VC metric has a series for each, at 0
    until something happens, so that "none" reads as 0 rather than as no data."""
    if cluster.partition is not None:
        return sorted(lq for lq, _ in cluster.partition.queue_of)
    return [v.name for v in cluster.vcs] or ["default"]


def default_vc(cluster: ClusterSpec) -> str:
    """What a submission without a vc means: "default" on a cluster that names no VCs; on one
    that does, nothing ("vc is required", with the list), rather than a VC it has not."""
    return "" if cluster.vcs or cluster.partition is not None else "default"


def check_numbers(spec: JobSpec) -> None:
    """The job's id, duration and GPUs are in their ranges."""
    if not spec.job_id or len(spec.job_id) > 200:
        raise InvalidJob("job_id must be 1 to 200 characters", "bad_id")
    if spec.duration_s is None or not math.isfinite(spec.duration_s) or spec.duration_s < 0:
        raise InvalidJob(f"duration_s must be a finite number >= 0, got {spec.duration_s}", "bad_duration")
    if spec.num_gpus < 1:
        raise InvalidJob("num_gpus must be at least 1", "bad_gpus")
    if not 0 < spec.gpu_milli <= GPU_MILLI or (spec.gpu_milli < GPU_MILLI and spec.num_gpus != 1):
        raise InvalidJob("gpu_milli must be in 1..1000, and below 1000 only for a 1-GPU job", "bad_gpus")


def check_vc(spec: JobSpec, cluster: ClusterSpec) -> None:
    """The job names one of the cluster's VCs (or, under a partition, a LocalQueue that can admit it)."""
    names = ", ".join(v.name for v in cluster.vcs)
    if cluster.vcs and not spec.vc:
        raise InvalidJob(f"vc is required on this cluster; its virtual clusters: {names}", "unknown_vc")
    if cluster.vcs and cluster.vc(spec.vc) is None:
        raise InvalidJob(f"unknown virtual cluster {spec.vc!r}; known: {names}", "unknown_vc")
    if cluster.partition is not None:
        check_queue(spec, cluster.partition)


def check_queue(spec: JobSpec, partition: Partition) -> None:
    """Under a partition, a job's vc names its LocalQueue, whose ClusterQueue must be able to
    admit it some day (the trace's jobs are filtered the same way: analysim.partitions)."""
    queues = ", ".join(lq for lq, _ in partition.queue_of)
    if not spec.vc:
        raise InvalidJob(f"vc is required under a partition: the job's LocalQueue, one of {queues}", "no_local_queue")
    _, refused = assign_queues([spec], partition)
    cq = partition.queue_for(spec.vc)
    why = {"no_local_queue": f"no LocalQueue {spec.vc!r} in the partition; its LocalQueues: {queues}",
           "resource_not_covered": f"ClusterQueue {cq!r} has no quota (or no nodes) for a resource the job asks for",
           "larger_than_queue_quota": f"larger than ClusterQueue {cq!r} can ever admit, borrowing all it may"}
    for reason in refused:
        raise InvalidJob(why.get(reason, reason), reason)


def check_gpu_models(spec: JobSpec, cluster: ClusterSpec) -> None:
    unknown = [m for m in spec.gpu_models if m not in cluster.gpu_models]
    if unknown:
        raise InvalidJob(f"unknown GPU model {unknown[0]!r}; this cluster has {', '.join(cluster.gpu_models)}",
                         "unknown_gpu_model")


class Intake:
    """Client submissions and cancellations into the run."""

    def __init__(self, cluster: ClusterSpec, engine: Engine, validator: Engine, journal: Journal, ledger: JobLedger,
                 trace_ids: frozenset[str], metrics: SchedulerMetrics, pace: Pace, feed: EventFeed,
                 end: RunEnd) -> None:
        self.cluster = cluster  # what a job is checked against
        self.engine = engine  # the live engine the jobs go into
        # An engine of the whole cluster, all nodes up, with its own policy (plugins keep state, a
        # partition's quota usage, that is the live engine's): a job's feasibility is checked there.
        self.validator = validator
        self.journal = journal  # a client's job is durable before the engine takes it
        self.ledger = ledger  # where each job came from; the ids taken
        self.trace_ids = trace_ids  # ids a client job may not take: the trace's, arrived or not
        self.metrics = metrics  # analysim_jobs_submitted_total
        self.pace = pace  # the event time of a cancellation; the loop's wake-up
        self.feed = feed  # a submission is an event to the watchers
        self.end = end  # a job after the replay's end opens the run again

    def taken(self, job_id: str) -> bool:
        ledger = self.ledger
        return (job_id in self.engine.jobs or job_id in ledger.restored or job_id in self.trace_ids
                or job_id in ledger.unresumed)

    def submit(self, spec: JobSpec) -> None:
        """Into the journal, then the engine (KeyError: the id is taken; InvalidJob: it can never
        run here; JournalUnavailable: refused, and nothing of it is anywhere)."""
        if self.taken(spec.job_id):
            raise KeyError(spec.job_id)
        self.validate(spec)
        # Durable before the engine takes it: an acknowledged job survives a crash, a refused one never runs.
        self.journal.add_client_job(spec)
        self.end.reopen()
        self.engine.submit(spec, hold=True)
        self.ledger.accept(spec.job_id, "client")
        self.metrics.submitted.labels(spec.vc, "client").inc()
        self.feed.publish("submit", spec.job_id, (), "client")
        self.pace.wake()

    def next_client_id(self) -> str:
        while True:
            job_id = f"client-{self.ledger.next_client_seq():06d}"
            if not self.taken(job_id):
                return job_id

    def validate(self, spec: JobSpec) -> None:
        check_numbers(spec)
        check_vc(spec, self.cluster)
        check_gpu_models(spec, self.cluster)
        self._check_feasible(spec)

    def _check_feasible(self, spec: JobSpec) -> None:
        """Against the whole cluster, not the live engine: a job is not invalid because some nodes
        are down right now (it waits for them)."""
        try:
            self.validator.check_feasible(spec)
        except InfeasibleJob as e:
            c = self.cluster
            extra = f" (the largest node has {max(n.gpus for n in c.nodes)} GPUs, the cluster {c.total_gpus})" \
                if e.reason == "larger_than_cluster" else ""
            raise InvalidJob(str(e) + extra, e.reason) from None

    def cancel(self, job_id: str) -> None:
        if self.engine.jobs.get(job_id) is None:
            raise KeyError(job_id)
        self.engine.cancel(job_id, at=self.pace.event_time())
        self.pace.wake()
