"""The live run's read model: every read the metrics, the summary and the gRPC queries make,
answered from the parts that own the state (the engine, the ledger, the trace, the agents, the
pace, the steppers, the recovery, the end). It holds no state of its own and writes none."""

from __future__ import annotations

from collections import defaultdict

from prometheus_client import CollectorRegistry

from analysim.core.cluster import ClusterSpec
from analysim.core.engine import Engine
from analysim.core.job import JobSpec, JobStatus
from analysim.core.metrics import MetricsRecorder
from analysim.events import kueue_state, queue_in, why_pending
from analysim.simulation import RunOptions
from scheduler_svc.agents import Agents
from scheduler_svc.clock import VirtualClock
from scheduler_svc.ending import RunEnd
from scheduler_svc.intake import known_vcs
from scheduler_svc.journal import Journal
from scheduler_svc.latency import LatencyQuantiles
from scheduler_svc.ledger import JobLedger
from scheduler_svc.pace import Pace
from scheduler_svc.recovery import Recovery
from scheduler_svc.sessions import Session
from scheduler_svc.steppers import Stepper
from scheduler_svc.trace_feed import TraceFeed


class RunView:
    """Reads of one live run (``scheduler_svc.read_model.LiveView``, and the job queries)."""

    def __init__(self, *, engine: Engine, cluster: ClusterSpec, opts: RunOptions, journal: Journal,
                 recorder: MetricsRecorder, registry: CollectorRegistry, ledger: JobLedger, trace: TraceFeed,
                 agents: Agents, pace: Pace, stepper: Stepper, recovery: Recovery, end: RunEnd) -> None:
        self._engine = engine  # the live engine: jobs, queue, cluster state
        self._cluster = cluster  # the cluster the run schedules
        self._opts = opts  # the run's options (the offline comparison runs with them)
        self._journal = journal  # its failure, if any, is a gauge
        self._recorder = recorder  # the jobs' rows and the time series
        self._registry = registry  # the scheduler's metrics (the summary reads its message counts)
        self._ledger = ledger  # jobs outside the engine: ended before a restart, not yet resumed; sources
        self._trace = trace  # the trace's header, size and skips
        self._agents = agents  # sessions, losses, divergence
        self._pace = pace  # the clock's start and end
        self._stepper = stepper  # steps and decision latencies
        self._recovery = recovery  # jobs resumed at the start
        self._end = end  # the summary of the replay's end, once it ended

    # ------------------------------------------------------------------ the run (LiveView)

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def cluster(self) -> ClusterSpec:
        return self._cluster

    @property
    def opts(self) -> RunOptions:
        return self._opts

    @property
    def journal(self) -> Journal:
        return self._journal

    @property
    def recorder(self) -> MetricsRecorder:
        return self._recorder

    @property
    def registry(self) -> CollectorRegistry:
        return self._registry

    @property
    def clock(self) -> VirtualClock:
        return self._pace.clock

    @property
    def started(self) -> bool:
        return self._pace.started

    @property
    def diverged(self) -> dict | None:
        return self._agents.diverged

    @property
    def done(self) -> bool:
        return self._end.done

    @property
    def summary(self) -> dict | None:
        return self._end.summary

    @property
    def header(self) -> dict:
        return self._trace.header

    @property
    def offline_input(self) -> list[JobSpec]:
        return self._trace.offline_input

    @property
    def trace_source(self) -> str:
        return self._trace.source

    @property
    def trace_filtered(self) -> dict[str, int] | None:
        return self._trace.filtered

    @property
    def trace_total(self) -> int:
        return self._trace.total

    @property
    def trace_skipped(self) -> int:
        return self._trace.skipped

    @property
    def wall_start(self) -> float | None:
        return self._pace.wall_start

    @property
    def wall_done(self) -> float | None:
        return self._pace.wall_done

    @property
    def virtual_start(self) -> float:
        return self._pace.virtual_start

    @property
    def steps(self) -> int:
        return self._stepper.steps

    @property
    def latencies(self) -> LatencyQuantiles:
        return self._stepper.latencies

    @property
    def agents_lost(self) -> int:
        return self._agents.lost

    @property
    def jobs_resumed(self) -> int:
        return self._recovery.jobs_resumed

    def known_vcs(self) -> list[str]:
        return known_vcs(self._cluster)

    def agents_connected(self) -> int:
        return len(self._agents.connected())

    def achieved_speed(self) -> float:
        return self._pace.achieved_speed()

    def agent_of(self, node: str) -> Session | None:
        """The connected session holding a node; None when the node is down."""
        return self._agents.node_owner.get(node)

    def client_jobs(self) -> int:
        return self._ledger.client_jobs()

    # ------------------------------------------------------------------ jobs

    def job_ids(self) -> list[str]:
        """Every job this run knows: restored from the journal as ended, in the engine, and
        journalled but not yet resumed or resubmitted."""
        ledger = self._ledger
        return list(ledger.restored) + list(self._engine.jobs) + list(ledger.unresumed)

    def job_record(self, job_id: str) -> dict | None:
        """A job's state as a dict (JobInfo's fields), or None if unknown."""
        job = self._engine.jobs.get(job_id)
        ledger = self._ledger
        source = ledger.source.get(job_id, "")
        if job is None and job_id in ledger.unresumed:
            s = ledger.unresumed[job_id]
            return {"job_id": job_id, "status": "pending", "vc": s.vc, "user": s.user, "num_gpus": s.num_gpus,
                    "gpu_milli": s.gpu_milli, "duration_s": s.duration_s, "submit_s": s.submit_s, "source": source}
        if job is None:
            rec = ledger.restored.get(job_id)
            if rec is None:
                return None
            return {**rec, "source": source, "nodes": [n for n in rec.get("nodes", "").split("|") if n]}
        s = job.spec
        nodes = job.placement.nodes if job.placement else (job.placements_seen[-1] if job.placements_seen else ())
        names = self._engine.node_names
        return {
            "job_id": s.job_id, "status": job.status.value, "vc": s.vc, "user": s.user, "num_gpus": s.num_gpus,
            "gpu_milli": s.gpu_milli, "duration_s": s.duration_s or 0.0, "submit_s": s.submit_s,
            "first_start_s": job.first_start_s, "end_s": job.end_s, "nodes": [names[n] for n in nodes],
            "preemptions": job.preemptions, "migrations": job.migrations, "restarts": job.restarts,
            "source": source,
        }

    def explain(self, job_id: str) -> dict | None:
        """Why a job is where it is now (ExplainJobResponse's fields): for a pending one, the reason
        it is not admitted (analysim.events.why_pending); None if the engine does not know it."""
        eng = self._engine
        job = eng.jobs.get(job_id)
        if job is None:
            return None
        reason = detail = ""
        if job.status is JobStatus.PENDING:
            reason, detail = why_pending(eng, job)
        return {"status": job.status.value, "time_s": eng.now, "reason": reason, "detail": detail,
                "queue": queue_in(kueue_state(eng), job.spec.vc)}

    def counts(self) -> dict[str, int]:
        """Jobs by status, the ones outside the engine included."""
        c: dict[str, int] = defaultdict(int)
        for job in self._engine.jobs.values():
            c[job.status.value] += 1
        for rec in self._ledger.restored.values():
            c[rec.get("status", "completed")] += 1
        c["pending"] += len(self._ledger.unresumed)
        return c
