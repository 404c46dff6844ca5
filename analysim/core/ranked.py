"""The running jobs ranked for preemption, kept across passes while no rank can have moved.

Preemption compares a waiting job's rank with the running jobs' (QueueSort.preempt_rank): the
candidates are the running jobs ranked strictly lower, a suffix of the ranked list, found by
bisecting. Ranking every running job for every waiting job that does not fit is what this saves.
"""

from __future__ import annotations

import bisect
import heapq
import math
from typing import TYPE_CHECKING

from mypy_extensions import mypyc_attr

from analysim.core.job import JobRun

if TYPE_CHECKING:
    from analysim.core.framework import Handle


def _started_before(a: JobRun, b: JobRun) -> bool:
    """Whether ``a`` ranks ahead of ``b`` among running jobs of one rank: (last start, seq)."""
    return a.last_start_s < b.last_start_s or a.last_start_s == b.last_start_s and a.seq < b.seq


class RankedRunning:
    """Running jobs ascending by (preemption rank, last start, seq), in parallel lists: the ranks
    (for bisecting) and the jobs.

    Invariant: ``jobs`` holds exactly the running jobs of its scope; ``ranks[i]`` is the rank
    ``jobs[i]`` had when last ranked, and the list is sorted by (rank, last start, seq). A job
    launched since is filed by its rank at its launch. This is exact while no rank moves; once one
    may have (``hold_until``, or ``due`` under per-job rank times), the list is ranked again before
    it is read (rank_again, rank_due)."""

    __slots__ = ("ranks", "jobs", "pass_no", "hold_until", "due", "until_of")

    def __init__(self, jobs: list[JobRun], ranks: list[tuple], pass_no: int, hold_until: float,
                 untils: list[float] | None = None) -> None:
        self.ranks: list[tuple] = []  # ranks[i]: jobs[i]'s preemption rank when last ranked
        self.jobs: list[JobRun] = []  # the scope's running jobs, in the order above
        self._sort(jobs, ranks)
        self.pass_no = pass_no  # the last pass whose ranks it holds
        self.hold_until = hold_until  # no rank moves before (QueueSort.preempt_ranks_hold_until)
        # Under a queue with per_job_rank_times, ``untils``: when each job's rank may next move
        # (preempt_rank_until). Then ``due`` is a heap of (that time, seq) and ``until_of`` maps
        # the seq of each job listed to (that time, job): a heap entry that differs is stale.
        self.due: list[tuple[float, int]] | None = None
        self.until_of: dict[int, tuple[float, JobRun]] = {}  # (above) empty without per_job_rank_times
        if untils is not None:
            self.due = [(u, j.seq) for u, j in zip(untils, jobs, strict=True) if u < math.inf]
            heapq.heapify(self.due)
            self.until_of = {j.seq: (u, j) for u, j in zip(untils, jobs, strict=True)}

    def _sort(self, jobs: list[JobRun], ranks: list[tuple]) -> None:
        rows = sorted([(rank, r.last_start_s, r.seq, r) for rank, r in zip(ranks, jobs, strict=True)])  # (seq is unique)
        self.ranks = [row[0] for row in rows]
        self.jobs = [row[3] for row in rows]

    def rank_again(self, ranks: list[tuple]) -> None:
        """Take ``ranks``, the jobs' ranks now in the list's order; sort only if that order no longer
        holds (ranks that move with time mostly keep their order: SRTF's all shrink at one pace)."""
        jobs = self.jobs
        for i in range(1, len(ranks)):
            a, b = ranks[i - 1], ranks[i]
            if a < b:
                continue
            if a == b and _started_before(jobs[i - 1], jobs[i]):
                continue
            self._sort(jobs, ranks)
            return
        self.ranks = ranks

    def rank_due(self, ctx: Handle) -> None:
        """Under per-job rank times: file again, by their rank now, the jobs whose time to be
        ranked again has come; every other job's rank stands (so the list's order is the one a
        ranking of them all would give)."""
        heap, until_of, now = self.due, self.until_of, ctx.now
        assert heap is not None
        moved: dict[int, JobRun] = {}  # (by seq: a job filed again at once has two like entries)
        while heap and heap[0][0] <= now:
            until, seq = heapq.heappop(heap)
            got = until_of.get(seq)
            if got is not None and got[0] == until:
                moved[seq] = got[1]
        for job in moved.values():
            self.discard(job)
        for job in moved.values():
            self.add(ctx, job)
        while heap and until_of.get(heap[0][1], (None,))[0] != heap[0][0]:
            heapq.heappop(heap)  # (stale: the job stopped, or was filed again)
        self.hold_until = heap[0][0] if heap else math.inf

    def add(self, ctx: Handle, job: JobRun) -> None:
        q = ctx.policy.queue
        rank = q.preempt_rank(job, ctx)
        if self.due is not None:
            until = q.preempt_rank_until(job, ctx)
            self.until_of[job.seq] = (until, job)
            if until < math.inf:
                heapq.heappush(self.due, (until, job.seq))
        else:
            until = q.preempt_ranks_hold_until([job], ctx)
        self.hold_until = min(self.hold_until, until)
        ranks, jobs = self.ranks, self.jobs
        i = bisect.bisect_left(ranks, rank)
        while i < len(ranks) and ranks[i] == rank and _started_before(jobs[i], job):
            i += 1
        ranks.insert(i, rank)
        jobs.insert(i, job)

    def discard(self, job: JobRun) -> None:
        # (By identity: the job's rank now may differ from the one it is filed by.)
        jobs = self.jobs
        for i in range(len(jobs)):
            if jobs[i] is job:
                del self.ranks[i], jobs[i]
                if self.due is not None:
                    del self.until_of[job.seq]
                return


@mypyc_attr(allow_interpreted_subclasses=True)
class RankedIndex:
    """The ranked running jobs per scope (a VC, or None for every running job), built when first
    asked for in a pass and kept up to date by launches and stops (on_launch, on_stop).

    Invariant: each list built holds exactly its scope's running jobs (see RankedRunning)."""

    def __init__(self, per_job_rank_times: bool) -> None:
        self.per_job = per_job_rank_times  # the queue's ranks change one job at a time (RankHints)
        self._ranked: dict[str | None, RankedRunning] = {}  # scope (VC; None: all) -> its list, once built

    def ranked(self, ctx: Handle, vc: str | None, pass_no: int) -> tuple[list[tuple], list[JobRun]]:
        """(ranks, jobs) of ``vc``'s running jobs (every running job's for None), ranked at the
        current time: once per pass, and only where a rank may have moved since."""
        got = self._ranked.get(vc)
        if got is not None and got.pass_no == pass_no:
            return got.ranks, got.jobs
        q = ctx.policy.queue
        if got is not None:
            if ctx.now >= got.hold_until:
                if got.due is not None:
                    got.rank_due(ctx)
                else:
                    got.rank_again(q.preempt_ranks(got.jobs, ctx))
                    got.hold_until = q.preempt_ranks_hold_until(got.jobs, ctx)
            got.pass_no = pass_no
            return got.ranks, got.jobs
        jobs = list((ctx.running if vc is None else ctx.running_by_vc.get(vc, {})).values())
        if self.per_job:
            untils = [q.preempt_rank_until(j, ctx) for j in jobs]
            got = RankedRunning(jobs, q.preempt_ranks(jobs, ctx), pass_no, min(untils, default=math.inf), untils)
        else:
            got = RankedRunning(jobs, q.preempt_ranks(jobs, ctx), pass_no, q.preempt_ranks_hold_until(jobs, ctx))
        self._ranked[vc] = got
        return got.ranks, got.jobs

    def hold_until(self, ctx: Handle, vc: str | None, pass_no: int) -> float:
        """A time before which no rank of ``vc``'s running jobs can move while they keep running."""
        self.ranked(ctx, vc, pass_no)
        return self._ranked[vc].hold_until

    def on_change(self, ctx: Handle, job: JobRun, running: bool) -> None:
        """Keep the lists built in step with a launch (``running``) or a stop of ``job``."""
        for scope in (None, job.spec.vc):
            got = self._ranked.get(scope)
            if got is not None:
                if running:
                    got.add(ctx, job)
                else:
                    got.discard(job)


class FreshRanking(RankedIndex):
    """No list is kept: the running jobs are ranked anew, one by one, whenever asked for, and no
    rank is taken to stand (the reference engine)."""

    def ranked(self, ctx: Handle, vc: str | None, pass_no: int) -> tuple[list[tuple], list[JobRun]]:
        q = ctx.policy.queue
        pool = ctx.running if vc is None else ctx.running_by_vc.get(vc, {})
        rows = sorted(((q.preempt_rank(r, ctx), r.last_start_s, r.seq), r) for r in pool.values())
        return [k[0] for k, _ in rows], [r for _, r in rows]

    def hold_until(self, ctx: Handle, vc: str | None, pass_no: int) -> float:
        return ctx.now

    def on_change(self, ctx: Handle, job: JobRun, running: bool) -> None:
        pass
