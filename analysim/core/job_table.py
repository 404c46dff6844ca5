"""Every job the engine knows, by id, and the jobs it is fed as the clock reaches them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

from analysim.core.job import JobRun, JobSpec
from analysim.core.records import JobBook


class JobTable:
    """The jobs submitted and not forgotten, with the engine's bookkeeping of each. Invariants:
    ``jobs`` and ``books`` have the same keys; ``held`` is a subset of ``jobs`` (pending, outside
    the queue); seqs are given in submission order (``new_run``, taken by ``add``)
    and never reused, but for a job dropped before it ever ran."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobRun] = {}  # job id -> its run, from submission until forgotten
        self.books: dict[str, JobBook] = {}  # job id -> the engine's bookkeeping of it
        self.held: dict[str, JobRun] = {}  # submitted with hold=True, waiting for nodes to come up
        # Ended jobs dropped from ``jobs`` (EngineConfig.keep_ended off), counted by VC.
        self.forgotten_by_vc: Counter[str] = Counter()
        self.next_seq = 0  # the seq the next job submitted gets

    def new_run(self, spec: JobSpec, remaining_s: float, overhead_s: float = 0.0) -> JobRun:
        """A run of a job about to be added, with the next seq (taken when it is added)."""
        return JobRun(spec=spec, seq=self.next_seq, remaining_s=remaining_s, overhead_s=overhead_s)

    def add(self, job: JobRun) -> None:
        """A run from ``new_run`` joins the table and takes its seq."""
        self.jobs[job.job_id] = job
        self.books[job.job_id] = JobBook()
        self.next_seq = job.seq + 1

    def drop(self, job_id: str) -> None:
        """Take back a job that was never started (a placement that failed in inflate mode): the
        next run gets its seq again, as if it had never been added."""
        job = self.jobs.pop(job_id)
        del self.books[job_id]
        self.next_seq = job.seq

    @property
    def forgotten(self) -> int:
        """Ended jobs dropped from ``jobs``."""
        return sum(self.forgotten_by_vc.values())

    @property
    def submitted(self) -> int:
        """Every job submitted, held or forgotten included."""
        return len(self.jobs) + self.forgotten

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
