"""What a live run knows of its jobs besides the engine: where each came from, those that ended
before a restart, those journalled but not yet resumed, and the counts of first starts and ends.
The ledger is the only writer of these; the feed, the intake, the recovery and the decisions'
accounts record through its methods, the queries read it."""

from __future__ import annotations

from analysim.core.job import JobSpec


class JobLedger:
    """Every job of the run by id, across scheduler lives (the journal's view of them)."""

    def __init__(self) -> None:
        # job id -> "trace" | "client": every job accepted, in this life or a previous one.
        self.source: dict[str, str] = {}
        # job id -> its record (a jobs.csv row): the jobs that ended before a restart.
        self.restored: dict[str, dict] = {}
        # job id -> spec: journalled, not ended; resumed or resubmitted at the start (empty after).
        self.unresumed: dict[str, JobSpec] = {}
        # The last client-NNNNNN number taken (journalled client jobs count): ids are never reused.
        self.client_seq = 0
        # Jobs launched at least once: a job's queueing delay is observed at its first start only.
        self.started_ids: set[str] = set()
        # Jobs that ended (completed, cancelled, failed) in this life; the replay is done when every
        # job in the engine has.
        self.terminal = 0

    def accept(self, job_id: str, source: str) -> None:
        self.source[job_id] = source

    def journalled(self, job_id: str, source: str, spec: JobSpec, record: dict | None) -> None:
        """A job read back from the journal: ended (with its record), or to resume or resubmit."""
        self.source[job_id] = source
        if source == "client":
            self.client_seq += 1
        if record is not None:
            self.restored[job_id] = record
        else:
            self.unresumed[job_id] = spec

    def hold(self, spec: JobSpec) -> None:
        """A job to resume or resubmit at the start."""
        self.unresumed[spec.job_id] = spec

    def resumed(self, job_id: str) -> JobSpec:
        """A held job continues on its agents: no longer held; its spec."""
        return self.unresumed.pop(job_id)

    def resubmitted(self) -> None:
        """The held jobs not resumed went back into the engine: none is held any more."""
        self.unresumed.clear()

    def next_client_seq(self) -> int:
        self.client_seq += 1
        return self.client_seq

    def first_start(self, job_id: str) -> bool:
        """Record a launch; True if it is the job's first."""
        if job_id in self.started_ids:
            return False
        self.started_ids.add(job_id)
        return True

    def ended(self) -> None:
        self.terminal += 1

    def client_jobs(self) -> int:
        return sum(1 for v in self.source.values() if v == "client")
