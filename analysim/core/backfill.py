"""EASY backfilling: reservations for blocked heads, and the pass order that jumps over the jobs
they keep out.

A blocked head gets a reservation at the earliest time enough GPUs free up (the shadow time, and
the GPUs spare then); a later job may go ahead of it if it ends by then or uses only spare GPUs.
Under per-VC FIFO each blocked queue scope (cycle_state.queue_scopes) holds its own reservation.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final, cast

import numpy as np
from sortedcontainers import SortedList  # type: ignore[import-untyped, import-not-found]

from analysim.core.cycle_state import CycleState, fails_as_worse, failure_vc, scopes_blocked_by
from analysim.core.job import GPU_MILLI, JobRun
from analysim.core.orders import jump
from analysim.core.sorted_keys import NextKeys, first_after, first_key, keys_from, merge_heap, push_from

if TYPE_CHECKING:
    from analysim.core.scheduler import Scheduler


# ------------------------------------------------------------------------- reservations

def reserve(s: Scheduler, head: JobRun, scope: str | None) -> tuple[float, float]:
    """The reservation of a blocked head in ``scope``: (shadow time, GPUs spare then)."""
    ends = s.ends
    assert ends is not None
    if scope is not None and scope in s.handle.dedicated:
        # A dedicated VC's head can only get its own nodes' GPUs.
        st = s.handle.state
        own = np.array([o == scope for o in st.owner_vc], dtype=bool) & st.up
        free = float(st.free_total[own].sum()) / GPU_MILLI
        walk = ends.of_vc.get(scope, ())
    else:
        free = s.handle.state.free_gpus_total()
        walk = ends.every
    need = head.spec.gpu_demand
    # In (end, GPUs) order; jobs with equal end and GPUs add the same, so seq's order among them
    # does not change a sum.
    for entry in walk:
        end, gpus, _ = cast(tuple[float, float, int], entry)  # (typed: unboxed in the compiled loop)
        free += gpus
        if free >= need:
            return end, free - need
    return math.inf, 0.0


def may_backfill(s: Scheduler, job: JobRun, reservation: tuple[float, float]) -> bool:
    shadow, spare = reservation
    return s.handle.now + job.overhead_s + job.remaining_s <= shadow or job.spec.gpu_demand <= spare


def note_backfill_hold(c: CycleState, job: JobRun, held: list[tuple[float, float]]) -> None:
    """A job that may backfill only because it ends by a shadow time may not a little later: the
    pass's answer for it holds until then, less a margin far above the rounding of ``now + work``."""
    work = job.overhead_s + job.remaining_s
    for shadow, spare in held:
        if job.spec.gpu_demand > spare:
            c.held_until(shadow - work - (1e-9 * (abs(shadow) + work) + 1e-6))


def consume_reservation(s: Scheduler, job: JobRun, reservation: tuple[float, float]) -> tuple[float, float]:
    shadow, spare = reservation
    if s.handle.now + job.overhead_s + job.remaining_s <= shadow:
        return reservation
    return shadow, spare - job.spec.gpu_demand


# ---------------------------------------------------------------------- the pass's order

def _width_cannot_fit(s: Scheduler, w: int) -> tuple[bool, bool]:
    """(a job of this width takes the pass's "cannot fit" path, which blocks its queues; it is a
    gang the pass passes over as larger than all free GPUs). Both False for widths whose answer
    depends on the job (nodes of several sizes)."""
    st = s.handle.state
    return 0 < w <= st.smallest_node_gpus and w > st.max_full_free(), w > s.gmax and w > st.total_full_free


def _held(s: Scheduler, vc: str, demand: float, blocked: dict, scopes: tuple) -> list[tuple[float, float]]:
    """The reservations a job of ``vc`` asking for ``demand`` GPUs must let it pass, when every
    queue the VC's jobs block (``scopes``) is blocked."""
    if s.handle.within_quota_of(vc, demand):  # (a VC with one queue has no quota to exceed)
        return [blocked[scopes[0]]]
    return [blocked[sc] for sc in scopes]


def _backfill_effect(s: Scheduler, job: JobRun, blocked: dict, scopes: tuple, narrowed: bool,
                     only_capacity: bool) -> bool:
    """Whether the pass would do anything with this pending job (see backfill_order)."""
    spec = job.spec
    w = 0 if spec.is_fractional else spec.num_gpus
    cannot, gang_cannot = _width_cannot_fit(s, w) if only_capacity else (False, False)
    if narrowed:
        return not (cannot or gang_cannot) and all(
            may_backfill(s, job, r) for r in _held(s, spec.vc, spec.gpu_demand, blocked, scopes))
    if s.handle.within_quota_of(spec.vc, spec.gpu_demand):
        return True  # not held by the shared queue
    return cannot or may_backfill(s, job, blocked[None])


def _worse_from(s: Scheduler, vc: str, failed: dict, quotas_matter: bool) -> int | None:
    """The width from which every waiting one-node whole-GPU job of ``vc`` fails as no smaller than
    a request that failed in the pass, or None. Only when no waiting job names GPU models: then
    each such job has the signature of the VC's unconstrained whole-GPU requests, and one that
    failed asking no CPU or memory is no larger than any of them of its width or more."""
    if s.queue.with_models:
        return None
    req = failed.get(((), failure_vc(s.handle, vc, quotas_matter), False))
    if req is None or req[0] < 1 or req[2] or req[3]:
        return None
    return int(req[0])


def _next_as_wide(s: Scheduler, c: CycleState, vc: str, after: tuple, gpus: int) -> tuple | None:
    """The first key past ``after`` of a job of ``vc`` that may ask for ``gpus`` GPUs or more
    (fractional and CPU-only jobs, width 0, ask for at most one). The merge asks from ever later
    keys: each list's next key past the last ``after`` is kept (NextKeys)."""
    merge = c.wide_merges.get((vc, gpus))
    if merge is None or after < merge.after:
        lists = s.queue.of_vc_dw
        assert lists is not None
        merge = c.wide_merges[vc, gpus] = NextKeys(
            [keys for (_, width, _), keys in lists[vc].items() if width >= gpus or (width == 0 and gpus <= 1)], after)
    return merge.next_after(after)


# Bucket b of queued work holds [2^(b-1), 2^b) seconds (b = 0: under 1 s), widened by a second
# either side for the rounding of now + overhead + work; b = int(work).bit_length() <= 34.
_WORK_BUCKET_BOUNDS: Final = [((2.0 ** (b - 1) if b else 0.0) - 1.0, 2.0 ** b + 1.0) for b in range(64)]
# A work bucket's list against its reservations.
_SKIP: Final = 0
_SURE: Final = 1
_WALK: Final = 2


def _bucket_verdict(held: list[tuple[float, float]], demand: float, b: int, now: float) -> int:
    """Whether every job of a list (GPU demand ``demand``, work bucket ``b``) fails some
    reservation (_SKIP), passes every one (_SURE), or only the exact test can tell (_WALK)."""
    low, high = _WORK_BUCKET_BOUNDS[b]
    sure = True
    for shadow, spare in held:
        if demand <= spare or now + high <= shadow:
            continue
        if now + low > shadow:
            return _SKIP  # every job here ends past this shadow time and does not fit in its spare
        sure = False
    return _SURE if sure else _WALK


def _walk_bucket(s: Scheduler, c: CycleState, walk: tuple, keys: SortedList, after: tuple,
                 held: list[tuple[float, float]], best: tuple | None) -> tuple | None:
    """The first job of a list past ``after`` that passes every reservation, read from there up to
    ``best``. What a read found stands for a later ask before it while the reservations are the
    same (the lists do not change during a pass)."""
    known = c.backfill_walks.get(walk)
    if known is not None and known[0] <= after and (known[1] is None or after < known[1]):
        return known[1]
    by_seq = s.queue.by_seq
    for k in keys_from(keys, after, False):
        if best is not None and not k < best:
            return None  # (nothing earlier than the best so far here; not kept: the read was cut)
        job = by_seq.get(k[1])
        if job is not None and all(may_backfill(s, job, r) for r in held):
            c.backfill_walks[walk] = (after, k)
            return k
    c.backfill_walks[walk] = (after, None)
    return None


def _bucket_held(s: Scheduler, vc: str, demand: float, width: int, blocked: dict, scopes: tuple,
                 narrowed: bool, only_capacity: bool) -> list[tuple[float, float]] | None:
    """The reservations the jobs of a (demand, width) list must pass (None: none of them has an
    effect, leave the list out; []: every one has)."""
    cannot, gang_cannot = _width_cannot_fit(s, width) if only_capacity else (False, False)
    if narrowed:
        return None if cannot or gang_cannot else _held(s, vc, demand, blocked, scopes)
    if cannot or s.handle.within_quota_of(vc, demand):
        return []
    return [blocked[None]]


def _first_backfill_effect(s: Scheduler, c: CycleState, vc: str, after: tuple, scopes: tuple, narrowed: bool,
                           worse_from: int | None, before: tuple | None) -> tuple | None:
    best = before
    # One-node widths whose jobs all fail as worse (_worse_from): left out (an empty range without).
    worse_lo, worse_hi = (worse_from, s.handle.state.smallest_node_gpus) if worse_from is not None else (1, 0)
    now = s.handle.now
    held_of: dict[tuple[float, int], list[tuple[float, float]] | None] = {}
    lists = s.queue.of_vc_dw
    assert lists is not None
    for (demand, width, b), keys in lists[vc].items():
        if worse_lo <= width <= worse_hi:
            continue
        bucket = (demand, width)
        if bucket in held_of:
            got = held_of[bucket]
        else:
            got = held_of[bucket] = _bucket_held(s, vc, demand, width, c.blocked, scopes, narrowed,
                                                 c.only_capacity)
        if got is None:
            continue
        held = cast(list[tuple[float, float]], got)  # (typed: the compiled loops compare unboxed floats)
        verdict = _bucket_verdict(held, demand, b, now)
        if verdict == _SKIP:
            continue
        if verdict == _SURE:
            # (A list whose first key is no earlier than the best so far cannot give an earlier one.)
            if best is not None and not first_key(keys) < best:
                continue
            found = first_after(keys, after)
        else:
            found = _walk_bucket(s, c, (vc, demand, width, b, tuple(held)), keys, after, held, best)
        if found is not None and (best is None or found < best):
            best = found
    return best


def _next_backfill_effect(s: Scheduler, c: CycleState, vc: str, after: tuple, scopes: tuple, narrowed: bool,
                          worse_from: int | None = None, before: tuple | None = None) -> tuple | None:
    """The first key past ``after`` of a job of ``vc`` that backfill_order does not jump over, or
    ``before`` if none comes earlier, from the per-demand, width and work-bucket lists: a list whose
    jobs all fail some reservation holding them is left out, one whose jobs all pass every one (or
    need none) gives its first key past ``after``, and the few on a shadow time's boundary are
    walked with the exact test."""
    if not c.only_capacity or before is not None:
        # (With preemption or migration the same question is hardly ever asked twice.)
        return _first_backfill_effect(s, c, vc, after, scopes, narrowed, worse_from, before)
    # What it reads besides the lists: quotas and free GPUs (launches and stops change them), and
    # the reservations of the VC's queues.
    asked = ("effect", vc, narrowed, s.world.running, tuple([c.blocked.get(sc) for sc in scopes]), worse_from)
    last = c.next_answers.get(asked)
    if last is not None and last[0] <= after and (last[1] is None or after < last[1]):
        return last[1]
    best = _first_backfill_effect(s, c, vc, after, scopes, narrowed, worse_from, None)
    c.next_answers[asked] = (after, best)
    return best


def _shared_jump(s: Scheduler, c: CycleState, vc: str, key: tuple, scopes: tuple) -> tuple | None:
    """Where a VC's jobs held by the shared reservation resume: once a request has failed, a later
    job as large takes the failure path and blocks its VC's queue instead, so the jump stops at any
    that may be."""
    wide = None
    if c.failed:
        # (Only a failure of a signature this VC's jobs have counts: with quotas that matter, the VC's own.)
        mine = failure_vc(s.handle, vc, c.quotas_matter)
        widths = [req[0] for sig, req in c.failed.items() if sig[1] == mine]
        if widths:
            wide = _next_as_wide(s, c, vc, key, min(widths))
    return _next_backfill_effect(s, c, vc, key, scopes, False, before=wide)


def _up_to_held_out(held_out: dict[str, list[tuple]], vc: str, after: tuple, to: tuple | None) -> tuple | None:
    """A jump's target ``to`` past ``after``, or the VC's first held-out victim between them."""
    keys = held_out.get(vc)
    if keys:
        i = bisect_right(keys, after)
        if i < len(keys) and (to is None or keys[i] < to):
            return keys[i]
    return to


# What backfill_order does with a VC's next job: give it, or jump over it and the VC's jobs after it
# that the pass would pass over, for the rest of the pass, until a stop, or until the pass looks at
# its next job (whose launch or failure may undo the jump).
_GIVE: Final = 0
_FOR_GOOD: Final = 1
_UNTIL_STOP: Final = 2
_AFTER_NEXT: Final = 3


def _jump(s: Scheduler, c: CycleState, job: JobRun, vc: str, key: tuple, scopes: tuple,
          narrowed: set[str]) -> tuple[int, tuple | None]:
    """Whether backfill_order gives ``job`` (its VC's next, at ``key``), or jumps over it, and to
    which key (None: past the VC's last), with how long the jump stands (see backfill_order)."""
    blocked, only_capacity = c.blocked, c.only_capacity
    if vc in narrowed or all(sc in blocked for sc in scopes):
        narrowed.add(vc)
        # (A job that fails as no smaller than a failed request has no effect once its queues are
        # blocked: it only fails again, in queues already blocked.)
        if not _backfill_effect(s, job, blocked, scopes, True, only_capacity) or (
                c.failed and fails_as_worse(s.handle, job, c.failed, c.quotas_matter)):
            worse_from = _worse_from(s, vc, c.failed, c.quotas_matter) if c.failed else None
            to = _next_backfill_effect(s, c, vc, key, scopes, True, worse_from)
            return (_FOR_GOOD if only_capacity else _UNTIL_STOP), to
        return _GIVE, None
    if (len(scopes) == 2 and None in blocked and not _backfill_effect(s, job, blocked, scopes, False, only_capacity)
            and not (c.failed and fails_as_worse(s.handle, job, c.failed, c.quotas_matter))):
        # With preemption or migration (and so quotas that matter), what a launch or a failure of
        # another VC's job changes turns none of the jobs jumped over into one the pass would not
        # pass over: that VC's usage (which only rises), the shared spare GPUs (which only shrink)
        # and the failures of that VC's own signature. A stop may bring them back within their
        # VC's quota.
        return (_UNTIL_STOP if c.quotas_matter and not only_capacity else _AFTER_NEXT), _shared_jump(s, c, vc, key, scopes)
    return _GIVE, None


def backfill_order(s: Scheduler, c: CycleState) -> Iterator[JobRun]:
    """Pending jobs in key order, leaving out jobs the pass would pass over with no effect:
    - once every queue a VC's jobs block is blocked (until then, a job that is not placed blocks
      its queues), those its reservations keep from backfilling (they only lose spare GPUs during a
      pass), those that fail as no smaller than a request that failed in the pass and, in a pass
      that only launches, those of widths that cannot fit as capacity stands (it only shrinks): the
      merge jumps to the VC's next job that is none of these. With preemption or migration, a job
      taken off its GPUs may bring a VC back within quota, out of the shared queue: such jumps are
      taken again after one;
    - before that, with the shared queue blocked, a VC's jobs that would borrow, could fit, and the
      shared reservation keeps out: the merge jumps to the VC's next job that is within quota,
      cannot fit (it blocks) or may backfill, or, once a request has failed in the pass, may ask for
      as many GPUs. In a pass that only launches, a launch or a failure can turn a job jumped over
      into one that blocks, so such jumps are taken again from each job the pass looks at; with
      preemption or migration, from each job after which a job was stopped.
    A victim evicted at this instant is always given, and no jump passes it (each blocks its queues
    as a failure would: SchedulingQueue.held_out)."""
    sq = s.queue
    lists = sq.of_vc
    assert lists is not None
    scopes_of = {vc: scopes_blocked_by(s.handle, vc) for vc in lists}
    heap = merge_heap(lists)
    gen: dict[str, int] = dict.fromkeys(lists, 0)  # a VC's heap entries from older jumps are stale
    narrowed: set[str] = set()
    jumped: set[str] = set()  # VCs with a jump ahead that the next job's launch or failure may undo
    until_stop: set[str] = set()  # with preemption or migration, VCs with a jump ahead only a stop may undo
    stops = s.world.stops
    held_out = sq.held_out(None, s.handle.now)
    while heap:
        key, vc, g, it = heapq.heappop(heap)
        if g != gen[vc]:
            continue
        jumped.discard(vc)
        until_stop.discard(vc)
        job = sq.by_seq.get(key[1])
        if job is not None:
            if not (held_out and key in held_out.get(vc, ())):  # (a victim held out is given: it blocks its queues)
                undone, to = _jump(s, c, job, vc, key, scopes_of[vc], narrowed)
                if undone != _GIVE:
                    jump(sq, heap, vc, _up_to_held_out(held_out, vc, key, to), gen)
                    if undone == _UNTIL_STOP:
                        until_stop.add(vc)
                    elif undone == _AFTER_NEXT:
                        jumped.add(vc)
                    continue
            yield job
            if s.world.stops != stops:
                stops = s.world.stops
                jumped |= until_stop
                until_stop.clear()
            for v in jumped:  # taken again from here (see above)
                gen[v] += 1
                push_from(heap, v, keys_from(lists[v], key, False), gen[v])
            jumped.clear()
        push_from(heap, vc, it, g)
