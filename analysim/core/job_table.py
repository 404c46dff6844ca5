"""Every job the engine knows, by id, and the jobs it is fed as the clock reaches them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

from analysim.core.job import JobRun, JobSpec
from analysim.core.records import JobBook


class JobTable:
    """The jobs submitted and not forgotten, with the engine's bookkeeping of each. Invariants:
    ``jobs`` and ``books`` have the same keys; ``held`` is a subset of ``jobs`` (pending, outside
    the queue); seqs are given in submission order and never reused."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobRun] = {}  # job id -> its run, from submission until forgotten
        self.books: dict[str, JobBook] = {}  # job id -> the engine's bookkeeping of it
        self.held: dict[str, JobRun] = {}  # submitted with hold=True, waiting for nodes to come up
        # Ended jobs dropped from ``jobs`` (EngineConfig.keep_ended off), counted by VC.
        self.forgotten_by_vc: Counter[str] = Counter()
        self.next_seq = 0  # the seq the next job submitted gets

    def add(self, job: JobRun) -> None:
        self.jobs[job.job_id] = job
        self.books[job.job_id] = JobBook()

    def drop(self, job_id: str) -> None:
        """Take back a job that was never started (a placement that failed in inflate mode)."""
        del self.jobs[job_id], self.books[job_id]

    def forget(self, job: JobRun) -> None:
        """An ended job leaves the table; only its VC's count remembers it."""
        del self.jobs[job.job_id], self.books[job.job_id]
        self.forgotten_by_vc[job.spec.vc] += 1


class JobFeed:
    """Jobs sorted by submit time, each submitted only as the clock reaches it (Engine.feed)."""

    def __init__(self, jobs: Iterable[JobSpec]) -> None:
        self.rest: Iterator[JobSpec] = iter(jobs)  # the jobs not yet looked at
        self.next: JobSpec | None = next(self.rest, None)  # the first job not submitted (None: fed all)

    def advance(self) -> None:
        self.next = next(self.rest, None)
