"""The unschedulable pool (Kubernetes' ``unschedulablePods``): what the queue knows of the pending
jobs a pass could not place, and of the passes that changed nothing.

Kubernetes parks a pod that failed in its unschedulable pool and moves it back to the active
queue only on an event a plugin's QueueingHint says may make it schedulable. Here a job stays in
the queue's lists, and the pool keeps, per pending job and per pass, the answers that let a pass
leave it alone until such an event:

- **failure memo**: its last attempt failed with the running jobs and the nodes at a version
  (``World.running``), and fails the same way until a time (hints.answers_hold_until);
- **sure failure**: the plugins whose answer reads only its VC found nothing for it with that
  VC's running jobs and the nodes at their versions, until a time (hints.surely_fails_until);
- **quiet pass** and **idle pass**: a pass that changed nothing, and what would make the next one
  differ (see ``QuietPass`` and ``IdleHint``);
- **held-out victims**: the jobs evicted at the latest instant of an eviction, which no pass at
  that instant launches again (Engine._preempt).

The pool is the only writer of all of these. A job queued again starts afresh (``activate``), and
one that leaves the queue takes its records with it (``drop``).
"""

from __future__ import annotations

import math
from typing import Final

from analysim.core.job import JobRun

# What the memo getters return for "no answer at these versions". NaN, not -inf: a failed attempt
# may hold until -inf (a plugin whose answer does not outlive the instant), and that answer is
# still an answer. Every comparison with NaN is false, so "fails until NO_ANSWER" never holds.
NO_ANSWER: Final = math.nan


def has_answer(until: float) -> bool:
    """Whether a memo getter's result is an answer (NaN is the one float unequal to itself)."""
    return until == until  # noqa: PLR0124


class FailureMemo:
    """A pending job's failure memo and sure-failure record. Invariant: an answer is read only at
    the versions it was given at (the callers compare them)."""

    __slots__ = ("world", "until", "vc_version", "node_version", "none_until")

    def __init__(self) -> None:
        self.world = -1  # World.running when its last attempt failed (-1: none failed)
        # That attempt fails again until this time, at that version. (-inf before any failure is
        # never read: world -1 matches no version, and the pool's getters answer NO_ANSWER then.)
        self.until = -math.inf
        self.vc_version = -1  # World.vc_version of its VC when the by-VC plugins found nothing
        self.node_version = -1  # World.nodes then
        self.none_until = -math.inf  # they find nothing until this time, at those versions


class IdleHint:
    """A per-shape pass that gave no job to attempt (every job passed over as one that would fail
    again, or as no smaller than a failed request): the next such pass gives none either while
    the world, the queue and the hold stand. (Timers alone do not end it: what a plugin's answer
    reads of the time is in its holds_until, and a timer that re-keys a job changes the queue.)"""

    # A plain class with its own __init__, not a dataclass: one is made per idle pass, and a
    # dataclass's generated __init__ runs as interpreted Python even in the compiled core.
    __slots__ = ("world", "queue_version", "hold")

    def __init__(self, world: int, queue_version: int, hold: float) -> None:
        self.world = world  # World.running during it
        self.queue_version = queue_version  # SchedulingQueue.version during it
        self.hold = hold  # the earliest failure memo it met

    def stands(self, world: int, queue_version: int, now: float) -> bool:
        return self.world == world and self.queue_version == queue_version and now < self.hold


class QuietPass:
    """What a blocking queue's pass that changed nothing left (see orders.resumed_order)."""

    __slots__ = ("world", "hold", "blocked", "failed", "last_key", "new")  # (not a dataclass: see IdleHint)

    def __init__(self, world: int, hold: float, blocked: dict, failed: dict, last_key: tuple,
                 new: list[tuple]) -> None:
        self.world = world  # World.running during it
        # Until when its failures hold (the earliest failed_until it met), and EASY's answers (a
        # job that may backfill by ending before a shadow time may not once time moves on).
        self.hold = hold
        self.blocked = blocked  # the heads blocked at its end, with their reservations
        self.failed = failed  # the smallest failed request per signature at its end (see cycle)
        self.last_key = last_key  # the queue's last key then (a pass runs only with jobs waiting)
        self.new = new  # keys queued since, each by an arrival

    def resumable(self, world: int, now: float) -> bool:
        """Whether a pass now would be this one again, visiting only the arrivals (``new``, each
        after every key this pass saw)."""
        return self.world == world and now < self.hold and (not self.new or min(self.new) > self.last_key)


class UnschedulablePool:
    """See the module docstring. Invariants: ``memos`` has an entry only for a pending job;
    ``victims`` are the ids of the jobs evicted at ``evicted_at``, and ``victims_of_vc`` the same
    jobs per VC in eviction order."""

    def __init__(self) -> None:
        # job id -> its records (made at its first failure). Keyed by the id, a string whose hash
        # is kept, not by the seq: every pass looks jobs up here, and an int key is boxed anew
        # for each lookup. (Ids are unique among the jobs a run holds.)
        self.memos: dict[str, FailureMemo] = {}
        self.quiet: QuietPass | None = None  # the last pass, if it changed nothing and nothing has since
        self.idle: IdleHint | None = None  # the last per-shape pass, if it gave no job to attempt
        self.evicted_at = -math.inf  # the latest instant a preemption evicted a job at
        self.victims: set[str] = set()  # the ids of the jobs evicted then
        self.victims_of_vc: dict[str, list[JobRun]] = {}  # the same jobs, per VC, in eviction order

    # ------------------------------------------------------------- a job in and out of the queue

    def activate(self, job: JobRun) -> None:
        """The job is queued (again): its own key and rank may have changed, nothing it failed at
        stands."""
        self.memos.pop(job.spec.job_id, None)

    def drop(self, job: JobRun) -> None:
        """The job left the queue (placed, cancelled, re-keyed)."""
        self.memos.pop(job.spec.job_id, None)

    # ------------------------------------------------------------------------ failure memos

    def failed_until(self, job: JobRun, world: int) -> float:
        """Until when the job's last failed attempt fails again, if it failed at ``world``
        (``NO_ANSWER``: no attempt failed at that version). A float, not an Optional: the passes
        ask this of every job they meet, and a boxed float costs an allocation each time."""
        memo = self.memos.get(job.spec.job_id)
        return memo.until if memo is not None and memo.world == world else NO_ANSWER

    def mark_failed(self, job: JobRun, world: int, until: float) -> None:
        memo = self.memos.get(job.spec.job_id)
        if memo is None:
            memo = self.memos[job.spec.job_id] = FailureMemo()
        memo.world, memo.until = world, until

    def none_by_vc_until(self, job: JobRun, vc_version: int, node_version: int) -> float:
        """What the by-VC plugins last said of the job, if they said it at these versions
        (``NO_ANSWER``: nothing at these versions)."""
        memo = self.memos.get(job.spec.job_id)
        if memo is None or memo.vc_version != vc_version or memo.node_version != node_version:
            return NO_ANSWER
        return memo.none_until

    def note_none_by_vc(self, job: JobRun, vc_version: int, node_version: int, until: float) -> None:
        memo = self.memos.get(job.spec.job_id)
        if memo is None:
            memo = self.memos[job.spec.job_id] = FailureMemo()
        memo.vc_version, memo.node_version, memo.none_until = vc_version, node_version, until

    # ------------------------------------------------------------------ the passes' hints

    def arrived(self, key: tuple) -> None:
        """A job arrived with this key (its key went into the lists at once)."""
        if self.quiet is not None:
            self.quiet.new.append(key)

    def head_left(self) -> None:
        """A job left the lists: a head leaving may unblock a queue."""
        self.quiet = None

    def timer(self) -> None:
        """A plugin asked for a pass: something it reads has changed."""
        self.quiet = self.idle = None

    def take_idle(self) -> IdleHint | None:
        """The idle hint, taken: a pass leaves one again only if it is idle too."""
        idle, self.idle = self.idle, None
        return idle

    def take_quiet(self) -> QuietPass | None:
        quiet, self.quiet = self.quiet, None
        return quiet

    def leave_idle(self, hint: IdleHint) -> None:
        self.idle = hint

    def leave_quiet(self, hint: QuietPass) -> None:
        self.quiet = hint

    # ---------------------------------------------------------------- held-out victims

    def evicted(self, job: JobRun, now: float) -> None:
        """A preemption evicted the job at ``now``."""
        if self.evicted_at != now:
            self.evicted_at = now
            self.victims = set()
            self.victims_of_vc = {}
        self.victims.add(job.spec.job_id)
        self.victims_of_vc.setdefault(job.spec.vc, []).append(job)

    def evicted_now(self, job: JobRun, now: float) -> bool:
        """Whether a preemption evicted the job at ``now`` (it waits for a later instant)."""
        return self.evicted_at == now and job.spec.job_id in self.victims
