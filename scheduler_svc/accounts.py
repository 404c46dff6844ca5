"""What each of the engine's decisions is recorded as, besides the command it becomes: the
scheduler's counters and histograms (and Kueue's under a partition), the journal's outcome of an
ended job, and the watchers' event."""

from __future__ import annotations

from analysim.core.engine import Engine
from analysim.core.job import JobRun
from analysim.core.metrics import MetricsRecorder
from analysim.core.records import Decision
from scheduler_svc.journal import Journal
from scheduler_svc.ledger import JobLedger
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.watch import EventFeed

# Decision kind -> the SchedulerMetrics counter (by VC) it counts under ("resume", a job taken up
# as its agents still run it after a restart, counts under none).
COUNTED = {"launch": "started", "complete": "completed", "preempt": "preempted", "migrate": "migrated",
           "requeue": "requeued", "cancel": "cancelled", "fail": "failed"}
# The decisions that end a job: its outcome goes to the journal.
ENDING = frozenset({"complete", "cancel", "fail"})


class LiveRecorder(MetricsRecorder):
    """The standard recorder, which also keeps each ended job's row by id (for the journal)."""

    rows: dict[str, dict]  # job id -> its jobs.csv row, for every job ended in this life

    def job_ended(self, engine: Engine, job: JobRun) -> None:
        super().job_ended(engine, job)
        self.rows[job.job_id] = self.jobs[-1]


class DecisionAccounts:
    """Metrics, journal and watchers for each decision, in the order the engine made them."""

    def __init__(self, engine: Engine, recorder: LiveRecorder, metrics: SchedulerMetrics, journal: Journal,
                 ledger: JobLedger, feed: EventFeed) -> None:
        self.engine = engine  # the live engine, whose jobs the decisions name
        self.recorder = recorder  # an ended job's row, journalled with its outcome
        self.metrics = metrics  # the counters and histograms each decision moves
        self.journal = journal  # where an ended job's outcome goes
        self.ledger = ledger  # first starts and ends are recorded there
        self.feed = feed  # each decision is an event to the watchers

    def account(self, d: Decision) -> None:
        job = self.engine.jobs[d.job_id]
        m = self.metrics
        kind = d.kind
        counter = COUNTED.get(kind)
        if counter is not None:
            m.vc(getattr(m, counter), job.spec.vc).inc()
        if kind == "launch" and self.ledger.first_start(d.job_id):
            m.queueing.observe(d.time - job.spec.submit_s)
        elif kind == "complete":
            m.jct.observe(d.time - job.spec.submit_s)
        if kind in ENDING:
            self._ended(job)
        if m.kueue is not None:
            m.kueue.on_decision(d, job)
        if self.feed.watchers:
            self.feed.publish(kind, d.job_id, d.nodes, "", d.time)

    def _ended(self, job: JobRun) -> None:
        self.ledger.ended()
        rec = self.recorder.rows.get(job.job_id)
        self.journal.ended(job.job_id, job.status.value, rec or {"job_id": job.job_id, "status": job.status.value})
