"""The orders a scheduling pass walks the pending jobs in, leaving out what it would only pass over.

Every order gives the pending jobs in queue-key order (the order ``SchedulingQueue.jobs`` gives),
but for jobs the pass would pass over with no effect: a job left out is one the pass would visit
and then fail or skip exactly as it would have anyway. The reference engine (shortcuts off) walks
every job, and the property tests compare the two decision for decision. EASY backfilling's order
is backfill.py's.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Final

from sortedcontainers import SortedList  # type: ignore[import-untyped, import-not-found]

from analysim.core import hints
from analysim.core.cycle_state import CycleState, failure_vc, no_smaller, note_failure
from analysim.core.job import JobRun, JobStatus
from analysim.core.scheduling_queue import SchedulingQueue
from analysim.core.sorted_keys import first_after, first_key, keys_from, merge_heap, push_from
from analysim.core.unschedulable import has_answer

if TYPE_CHECKING:
    from analysim.core.scheduler import Scheduler


# ------------------------------------------------------------------ by width (launches only)

def merge_widths(s: Scheduler, lists: dict[tuple[int, str | None], SortedList]) -> Iterator[JobRun]:
    """Pending jobs in key order from per-width lists, leaving out a width once no job of it could
    fit, for the rest of a pass that only launches (free GPUs only shrink): a width no larger than
    the smallest node, when no node has that many whole GPUs free; a width larger than every node,
    when all nodes together do not. The nodes are those of the bucket's scope: a dedicated VC's
    own, else all of them. The pass would pass over each such job as one that cannot fit."""
    by_seq = s.queue.by_seq
    st = s.handle.state
    small, gmax = st.smallest_node_gpus, s.gmax
    heap = merge_heap(lists)
    while heap:
        key, bucket, _, it = heap[0]
        w, scope = bucket
        if w and (st.max_full_free() < w <= small or st.total_full_free < w > gmax
                  or scope is not None and s.rooms.room(scope, (s.world.running, s.world.nodes)).cannot_fit(w)):
            heapq.heappop(heap)
            continue
        job = by_seq.get(key[1])
        if job is not None:
            yield job
        nxt = next(it, None)
        if nxt is None:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (nxt, bucket, 0, it))


# ------------------------------------------------------------ by shape (may preempt or migrate)

# What the shape order does with a shape's next job: leave the shape out (until a stop, or until
# a launch or stop for a gang's), pass over the job, or give it to the pass.
_DROP: Final = 0
_DROP_GANG: Final = 1
_PASS: Final = 2
_GIVE: Final = 3


def merge_entry(key: tuple, vc: str, shape: tuple) -> tuple:
    """A shape's entry in the shape order's merge: the queue key (its own fields, then the job's
    seq) laid out flat, so that entries compare field by field without nested tuples (most of the
    merge's cost was those comparisons), then the key itself, the VC and the shape, which are
    never compared (seq is unique)."""
    return key[0] + (key[1], key, vc, shape)


def _bring_back(order: list, top: int, lists: dict, dropped: list[tuple[str, tuple]], after: tuple) -> None:
    """Shapes the shape order left out, (VC, shape) in ``lists``, back into its merge from their
    first key past ``after`` (the key of ``order[top]``): in past it."""
    for vc, shape in dropped:
        first = first_after(lists[vc][shape], after)
        if first is not None:
            bisect.insort(order, merge_entry(first, vc, shape), top + 1)
    dropped.clear()


def _shape_verdict(s: Scheduler, c: CycleState, job: JobRun, vc: str, shape: tuple, gang: bool,
                   gangs_per_request: bool) -> int:
    """What the shape order does with the first pending job of a shape: leave the shape out as no
    smaller than a failed request, or as failing again (the pass's bookkeeping of the failure,
    without the visit), pass over it (evicted at this instant), or give it to the pass."""
    models, frac, g, milli, cpu, mem = shape  # (JobSpec.request)
    sig = (models, failure_vc(s.handle, vc, c.quotas_matter), frac)  # (failure_sig, from the shape)
    worse = c.failed.get(sig)
    if worse is not None and not gang and no_smaller((g, milli, cpu, mem), worse):
        return _DROP
    pool = s.queue.pool
    world = s.world.running
    until = pool.failed_until(job, world)
    if c.checks is not None and not has_answer(until) and (s.handle.spec.allow_borrowing or s.handle.within_quota(job)):
        sure = hints.surely_fails_until(s.handle, s.queue.pool, s.world, job, c.checks)  # (a job over quota the pass passes over)
        if sure > s.handle.now:
            pool.mark_failed(job, world, sure)
            until = sure
    if s.handle.now < until:
        c.held_until(until)
        if not gang:
            note_failure(c.failed, sig, (g, milli, cpu, mem))
            return _DROP  # (the rest of the shape is no smaller)
        return _DROP_GANG if gangs_per_request else _PASS
    if pool.evicted_now(job, s.handle.now):
        c.held_until(s.handle.now)  # evicted at this instant: it waits (see Engine._preempt)
        return _PASS
    return _GIVE


def shape_order(s: Scheduler, c: CycleState, vcs: Iterable[str], gangs_per_request: bool) -> Iterator[JobRun]:
    """The pending jobs of ``vcs`` in key order from the per-VC, per-shape lists, for a pass that
    may preempt or migrate: a shape whose requests are all at least as large as a failed one of the
    same signature is left out (gangs are always tried), until a preemption or migration succeeds,
    which clears the failures: then the shapes left out come back from the job after the last one
    given. With ``gangs_per_request`` (every plugin asked answers per VC and request), a gang's
    shape is left out too once one of its gangs fails and changes nothing, or would fail again,
    until the next launch or stop. A job known to fail without an attempt (hints) is recorded as
    failed here."""
    by_seq = s.queue.by_seq
    of_vc_shape = s.queue.of_vc_shape
    assert of_vc_shape is not None
    # Each shape's first key, sorted; order[i] is the next. A shape's next key is looked up when
    # needed (most shapes give one job a pass), from its list, which does not change during the
    # pass, and goes in past i: keys only grow.
    order = sorted([merge_entry(first_key(keys), vc, shape) for vc in vcs for shape, keys in of_vc_shape[vc].items()])
    i = 0
    dropped: list[tuple[str, tuple]] = []
    gangs_dropped: list[tuple[str, tuple]] = []  # left out while the running jobs stay the same
    world, stops, last = s.world.running, s.world.stops, None
    while i < len(order):
        entry = order[i]
        key, vc, shape = entry[-3], entry[-2], entry[-1]
        job = by_seq.get(key[1])
        if job is not None:
            gang = shape[2] > s.handle.state.smallest_node_gpus and not s.handle.one_node(job.spec)
            verdict = _shape_verdict(s, c, job, vc, shape, gang, gangs_per_request)
            if verdict <= _DROP_GANG:
                i += 1
                (dropped if verdict == _DROP else gangs_dropped).append((vc, shape))
                continue
            if verdict == _GIVE:
                last = key
                yield job
                if s.world.running != world:
                    world = s.world.running
                    _bring_back(order, i, of_vc_shape, gangs_dropped, last)
                elif gang and gangs_per_request and job.status is JobStatus.PENDING:
                    i += 1  # (pushes above went in past it)
                    gangs_dropped.append((vc, shape))
                    continue
            if s.world.stops != stops:
                stops = s.world.stops
                assert last is not None  # (jobs stop only in answer to a job given)
                _bring_back(order, i, of_vc_shape, dropped, last)
        i += 1  # (shapes brought back went in past this entry: it is still order[i])
        nxt = first_after(of_vc_shape[vc][shape], key)
        if nxt is not None:
            bisect.insort(order, merge_entry(nxt, vc, shape), i)


# ------------------------------------------------------------------- per-VC FIFO (blocking)

def vc_blocked(s: Scheduler, vc: str, blocked: dict) -> bool:
    """Whether every waiting job of ``vc`` is behind a blocked head (never wrongly True)."""
    if vc in blocked:
        return True  # its own queue (a VC with a guarantee: every job waits in it)
    if None not in blocked or vc in s.handle.dedicated:
        return False
    q = s.handle.quota_of(vc)
    if q is None:
        return True  # the shared pool's queue is its only one
    # Even its smallest waiting job would take it over its quota: every one of them would borrow,
    # and waits in the shared queue (until preemption lowers its usage: blocking_order).
    return s.handle.state.vc_used.get(vc, 0.0) + min(s.queue.demands[vc]) > q + 1e-9


def jump(sq: SchedulingQueue, heap: list, vc: str, to: tuple | None, gen: dict[str, int]) -> None:
    """Move a VC's merge entry to its key ``to`` (None: out of the merge): older entries go stale."""
    gen[vc] += 1
    if to is not None:
        lists = sq.of_vc
        assert lists is not None
        push_from(heap, vc, keys_from(lists[vc], to, True), gen[vc])


def blocking_order(s: Scheduler, c: CycleState, skip: bool) -> Iterator[JobRun]:
    """Pending jobs in key order, leaving out, from the moment the pass blocks them, the VCs none
    of whose jobs could pass (vc_blocked), and, with ``skip``, the jobs that would borrow while
    the shared queue is blocked. The queue does not change during a pass, so positions stay valid."""
    sq = s.queue
    lists = sq.of_vc
    assert lists is not None
    blocked = c.blocked
    # Each VC's list is walked by an iterator (a SortedList's positional lookup costs a Python-level
    # index search per step).
    heap = merge_heap(lists)
    gen: dict[str, int] = dict.fromkeys(lists, 0)  # a VC's heap entries from undone jumps are stale
    dropped: list[str] = []
    jumped: set[str] = set()  # VCs with a jump ahead of the merge
    stops = s.world.stops
    while heap:
        key, vc, g, it = heapq.heappop(heap)
        if g != gen[vc]:
            continue
        jumped.discard(vc)
        if skip and blocked and vc_blocked(s, vc, blocked):
            dropped.append(vc)  # out of the merge
            continue
        job = sq.by_seq.get(key[1])
        if (skip and job is not None and None in blocked and vc not in s.handle.dedicated
                and not s.handle.within_quota(job)):
            # It would borrow, and the shared queue is blocked: it and every job of its VC up to
            # the next one within quota would be passed over (launches only raise the VC's usage).
            # Resume the VC there.
            quota = s.handle.quota_of(vc)
            assert quota is not None
            jump(sq, heap, vc, sq.next_within_quota(vc, key, quota, s.handle.state.vc_used.get(vc, 0.0)), gen)
            jumped.add(vc)
            continue
        if job is not None:
            yield job
            if s.world.stops != stops:
                # A job was taken off its GPUs (preemption, migration), and its VC's usage may be
                # lower: a VC left out or jumped over as borrowing may have jobs within its quota
                # again. From here on, their jobs come back into the merge. (With the built-in
                # post-filters a VC jumped over is within its quota and keeps its GPUs, as reclaim
                # takes from VCs over theirs; another post-filter may not.)
                stops = s.world.stops
                for d in dropped + list(jumped):
                    gen[d] += 1
                    push_from(heap, d, keys_from(lists[d], key, False), gen[d])
                dropped.clear()
                jumped.clear()
        push_from(heap, vc, it, g)


def resumed_order(sq: SchedulingQueue, new: list[tuple]) -> Iterator[JobRun]:
    """The order of a blocking queue's pass after one that changed nothing, with nothing changed
    since but arrivals (keys ``new``, in order, each after every key that pass saw), before any
    of that pass's answers may turn (unschedulable.QuietPass): that pass would be done again, every job
    failing or passed over the same way, ending with the same heads blocked and requests failed,
    so only the arrivals are visited. (A queue that does not block is left out: its arrivals fall
    among the jobs that pass saw, each visited with the failures before it in hand.)"""
    by_seq = sq.by_seq
    for key in new:
        job = by_seq.get(key[1])
        if job is not None:
            yield job

