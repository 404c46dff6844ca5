"""QueueSort plugins: who goes first, and who may evict whom."""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, ClassVar

from mypy_extensions import mypyc_attr

from analysim.core.job import JobRun, JobStatus

if TYPE_CHECKING:
    from analysim.core.framework import Handle


@mypyc_attr(allow_interpreted_subclasses=True)  # (and so may any queue made of one)
class _QueueSort:
    name: ClassVar[str] = ""
    options: ClassVar[tuple[str, ...]] = ()  # the keyword arguments its constructor takes
    blocking: ClassVar[bool] = False
    dynamic: ClassVar[bool] = False
    preemptive: ClassVar[bool] = False  # ranks running jobs below waiting ones, so a post-filter may evict them
    # order() gets ``pending`` per VC, each VC's jobs in key order (the engine keeps those lists),
    # as a dict VC -> iterator, instead of one iterable of every pending job.
    per_vc_order: ClassVar[bool] = False
    # A waiting job's preempt_rank never orders before that of a job ahead of it in the queue.
    ranks_follow_keys: ClassVar[bool] = False
    # A running job's preempt_rank never moves later (less important) while it runs, so a waiting
    # job's candidates for eviction only shrink while the running jobs stay the same.
    running_ranks_only_rise: ClassVar[bool] = False
    # A running job's preempt_rank changes at times known ahead, one job at a time (Tiresias'
    # levels): preempt_rank_until says when for each job, and the engine ranks again only the
    # jobs whose time has come, not every running job (see ranked.RankedIndex).
    per_job_rank_times: ClassVar[bool] = False

    def key(self, job: JobRun, ctx: Handle) -> tuple:
        raise NotImplementedError

    def priority(self, job: JobRun, ctx: Handle) -> tuple:
        return self.key(job, ctx)

    def preempt_rank(self, job: JobRun, ctx: Handle) -> tuple:
        """What preemption compares: a waiting job may evict a running one ranked strictly lower."""
        return self.priority(job, ctx)

    def preempt_ranks(self, running: list[JobRun], ctx: Handle) -> list[tuple]:
        """preempt_rank of each of these running jobs (a queue may compute them in one go: every
        running job of a VC is ranked on each pass that looks for victims)."""
        return [self.preempt_rank(j, ctx) for j in running]

    def preempt_ranks_hold_until(self, running: list[JobRun], ctx: Handle) -> float:
        """A time before which none of these running jobs' preempt_rank can change while they keep
        running (the engine then does not rank them again); ``ctx.now``: it may change at once."""
        return ctx.now

    def preempt_rank_until(self, job: JobRun, ctx: Handle) -> float:
        """A time before which this running job's preempt_rank cannot change while it runs (read
        only with per_job_rank_times); ``ctx.now``: it may change at once."""
        return ctx.now

    def order(self, pending: Iterable[JobRun], ctx: Handle) -> Iterator[JobRun]:
        return iter(pending)

    def on_event(self, kind: str, job: JobRun, ctx: Handle) -> None:
        pass


class Fifo(_QueueSort):
    """First come, first served; the head blocks the queue (EASY backfill may let others pass)."""

    name: ClassVar[str] = "fifo"
    blocking: ClassVar[bool] = True

    def key(self, job: JobRun, ctx: Handle) -> tuple:
        return (job.spec.submit_s,)


class ShortestJobFirst(_QueueSort):
    """Shortest (oracle) duration first; non-preemptive, skips jobs that do not fit."""

    name: ClassVar[str] = "sjf"

    def key(self, job: JobRun, ctx: Handle) -> tuple:
        return (job.spec.duration_s or 0.0, job.spec.submit_s)


class ShortestRemainingTimeFirst(_QueueSort):
    """Shortest remaining (oracle) time first; with preemption, a job with less work left evicts
    running jobs with more."""

    name: ClassVar[str] = "srtf"
    preemptive: ClassVar[bool] = True
    ranks_follow_keys: ClassVar[bool] = True  # (a waiting job's priority is its key: neither moves)
    running_ranks_only_rise: ClassVar[bool] = True  # (work left only shrinks while a job runs)

    def key(self, job: JobRun, ctx: Handle) -> tuple:
        return (job.remaining_s + job.overhead_s, job.spec.submit_s)

    def priority(self, job: JobRun, ctx: Handle) -> tuple:
        return (ctx.remaining_now(job) + (job.overhead_s if job.status is JobStatus.PENDING else 0.0),
                job.spec.submit_s)

    def preempt_ranks(self, running: list[JobRun], ctx: Handle) -> list[tuple]:
        now = ctx.now
        return [(j.remaining_at(now) + 0.0, j.spec.submit_s) for j in running]  # (priority, as running)


class Tiresias(_QueueSort):
    """Tiresias' discretized two-dimensional least-attained-service (Gu et al., NSDI'19).

    A job's level is the number of ``thresholds_gpu_s`` its attained GPU-time (GPUs x seconds run)
    has passed; lower levels go first, FIFO within a level, and with preemption a job in a lower
    level evicts jobs in higher ones (never within a level). Starvation guard: a job that has
    waited ``starve_factor`` times as long as it has run in total goes back to level 0, and its
    attained service counts afresh from there.

    Invariant: ``_promote_at`` names only jobs stopped above level 0 and not launched since;
    ``_base`` (a job's attained service at its last promotion) only jobs not completed.
    """

    name: ClassVar[str] = "tiresias"
    options: ClassVar[tuple[str, ...]] = ("thresholds_gpu_s", "starve_factor")
    preemptive: ClassVar[bool] = True
    # A waiting job ranks by its level, its key's first part; a promotion re-keys it (its timer
    # fires before the pass of its time).
    ranks_follow_keys: ClassVar[bool] = True
    per_job_rank_times: ClassVar[bool] = True  # (preempt_rank_until: a level changes at a threshold)

    def __init__(self, thresholds_gpu_s: tuple[float, ...] = (3600.0, 36000.0), starve_factor: float = 10.0) -> None:
        self.thresholds = tuple(sorted(thresholds_gpu_s))  # the level boundaries, GPU-seconds, ascending
        self.starve_factor = starve_factor  # (above) waited / run time past which a job goes back to level 0
        self._promote_at: dict[str, float] = {}  # job stopped above level 0 -> when it goes back to 0 (s)
        self._base: dict[str, float] = {}  # attained service at the last promotion

    def level(self, job: JobRun, attained_gpu_s: float) -> int:
        # The thresholds it has reached: they are sorted.
        return bisect_right(self.thresholds, attained_gpu_s - self._base.get(job.job_id, 0.0))

    def key(self, job: JobRun, ctx: Handle) -> tuple:
        promote = self._promote_at.get(job.job_id)
        if promote is not None and ctx.now >= promote:
            job.queue_level = 0
            self._base[job.job_id] = job.attained_gpu_s
            del self._promote_at[job.job_id]
        return (job.queue_level, job.spec.submit_s)

    def priority(self, job: JobRun, ctx: Handle) -> tuple:
        if job.status is JobStatus.RUNNING:
            return (self.level(job, ctx.attained_now(job)), job.spec.submit_s)
        return (job.queue_level, job.spec.submit_s)

    def preempt_rank(self, job: JobRun, ctx: Handle) -> tuple:
        # Only a lower level evicts: FIFO within a level must not make jobs evict each other.
        if job.status is JobStatus.RUNNING:
            return (self.level(job, job.attained_at(ctx.now)),)
        return (job.queue_level,)

    def preempt_ranks(self, running: list[JobRun], ctx: Handle) -> list[tuple]:
        now = ctx.now
        return [(self.level(j, j.attained_at(now)),) for j in running]

    def preempt_ranks_hold_until(self, running: list[JobRun], ctx: Handle) -> float:
        return min([self.preempt_rank_until(j, ctx) for j in running], default=math.inf)

    def preempt_rank_until(self, job: JobRun, ctx: Handle) -> float:
        # A running job's level changes when its attained service reaches the next threshold.
        # The time that happens is computed with a margin (a billionth of the magnitudes involved,
        # far above the rounding of the level's own arithmetic) so that the level surely has
        # not changed before it.
        d = job.spec.gpu_demand
        if d <= 0:
            return math.inf
        b = self._base.get(job.job_id, 0.0)
        thresholds = self.thresholds
        attained = job.attained_gpu_s + (ctx.now - job.last_start_s) * d - b
        i = bisect_right(thresholds, attained)
        if i == len(thresholds):
            return math.inf  # past the last threshold: its level no longer changes
        gap = thresholds[i] + b - job.attained_gpu_s
        at = job.last_start_s + gap / d
        margin = 1e-9 * (abs(at) + (abs(thresholds[i]) + abs(b) + abs(job.attained_gpu_s)) / d) + 1e-6
        return at - margin

    def on_event(self, kind: str, job: JobRun, ctx: Handle) -> None:
        if kind == "launch":
            self._promote_at.pop(job.job_id, None)
            # Wake up whenever the job crosses a threshold: it drops a level and may be evicted.
            # (Every threshold ahead, not only the next: a job running through two levels in one
            # go must be looked at when it enters each.)
            attained = job.attained_gpu_s - self._base.get(job.job_id, 0.0)
            if job.spec.gpu_demand > 0:
                for t in self.thresholds:
                    if t > attained:
                        ctx.set_timer(ctx.now + (t - attained) / job.spec.gpu_demand, None, "tiresias-demote")
        elif kind == "stop":
            job.queue_level = self.level(job, job.attained_gpu_s)
            if job.queue_level > 0 and job.executed_s > 0:
                at = ctx.now + self.starve_factor * job.executed_s
                self._promote_at[job.job_id] = at
                ctx.set_timer(at, job, "tiresias-promote")
        elif kind == "complete":
            self._promote_at.pop(job.job_id, None)
            self._base.pop(job.job_id, None)


class QuasiShortestServiceFirst(_QueueSort):
    """Helios' QSSF (Hu et al., SC'21): least predicted GPU-time first, where a job's duration is
    predicted from the history of its user's (or, without users, its VC's) finished jobs of the
    same size, then of any size, then of all jobs. Non-preemptive; oracle durations are not used.
    Invariant: each history holds the last ``window`` durations at most, oldest first."""

    name: ClassVar[str] = "qssf"
    options: ClassVar[tuple[str, ...]] = ("window", "prior_s")

    def __init__(self, window: int = 32, prior_s: float = 3600.0) -> None:
        self.window = window  # finished jobs a prediction averages over, per history
        self.prior_s = prior_s  # the prediction with no history at all, seconds
        # (owner, GPUs), (owner, None) and (None, None) -> the durations (s) of the last ``window``
        # finished jobs of that owner and size, that owner, and all owners
        self._hist: dict[tuple, deque[float]] = defaultdict(lambda: deque(maxlen=window))

    def _owner(self, job: JobRun) -> str:
        return job.spec.user or f"vc:{job.spec.vc}"

    def estimate(self, job: JobRun) -> float:
        owner = self._owner(job)
        for k in ((owner, job.spec.num_gpus), (owner, None), (None, None)):
            h = self._hist.get(k)
            if h:
                return sum(h) / len(h)
        return self.prior_s

    def key(self, job: JobRun, ctx: Handle) -> tuple:
        if job.estimate_s is None:
            job.estimate_s = self.estimate(job)
        return (job.estimate_s * max(job.spec.gpu_demand, 1e-3), job.spec.submit_s)

    def on_event(self, kind: str, job: JobRun, ctx: Handle) -> None:
        if kind == "complete":
            owner = self._owner(job)
            run = job.end_s - job.first_start_s if job.end_s is not None and job.first_start_s is not None else 0.0
            run = job.spec.duration_s if job.spec.duration_s is not None else run
            for k in ((owner, job.spec.num_gpus), (owner, None), (None, None)):
                self._hist[k].append(run)


@mypyc_attr(allow_interpreted_subclasses=True)  # (tests check it against a plain sort)
class FairShare(_QueueSort):
    """Fair share across VCs: each pick goes to the VC using the least of its share (its quota, or
    an equal share without quotas); FIFO within a VC. Non-blocking."""

    name: ClassVar[str] = "fair"
    dynamic: ClassVar[bool] = True
    per_vc_order: ClassVar[bool] = True  # FIFO within a VC is the key's order: the engine keeps it per VC

    def key(self, job: JobRun, ctx: Handle) -> tuple:
        return (job.spec.submit_s,)

    def _usage(self, vc: str, ctx: Handle) -> float:
        share = ctx.quota_of(vc) or 1.0
        return ctx.state.vc_used.get(vc, 0.0) / max(share, 1e-9)

    def order(self, pending: Mapping[str, Iterator[JobRun]], ctx: Handle) -> Iterator[JobRun]:  # type: ignore[override]
        # Each VC's jobs come in (submit time, seq) order from the engine's per-VC lists: a pass
        # costs the jobs it looks at, not a sort of the whole queue. A VC's next job is taken
        # only when it is its turn (the engine may leave out jobs as the pass goes).
        used = ctx.state.vc_used
        shares = {vc: max(ctx.quota_of(vc) or 1.0, 1e-9) for vc in pending}  # (what _usage divides by)
        heap = [(used.get(vc, 0.0) / shares[vc], vc) for vc in pending]
        heapq.heapify(heap)  # VC names are unique: no ties
        while heap:
            _, vc = heapq.heappop(heap)
            jobs = pending[vc]
            for job in jobs:
                yield job
                entry = (used.get(vc, 0.0) / shares[vc], vc)
                # Pushed back and popped again at once, unless another VC now uses less of its
                # share. (While it waits in the heap its usage can only fall, by other VCs
                # reclaiming its GPUs: it would still come first.)
                if heap and heap[0] < entry:
                    heapq.heappush(heap, entry)
                    break


QUEUE_SORTS: dict[str, type[_QueueSort]] = {
    cls.name: cls for cls in (Fifo, ShortestJobFirst, ShortestRemainingTimeFirst, Tiresias,
                              QuasiShortestServiceFirst, FairShare)
}
