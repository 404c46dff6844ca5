"""The scheduling pass: one walk over the pending jobs, in the queue's order, placing what fits.

For each job the order gives (orders.py, backfill.py): admit it (quota, a queue blocked ahead of
it, EASY's reservations), pass over it where the pass already knows it fails (a request no smaller
than one that failed, a failure memo that stands, a sure-failure hint), else attempt it: bind,
then migration, then the post-filters. A job that fails blocks its queue scopes under a blocking
queue. The pass leaves hints for the next one (unschedulable.IdleHint, unschedulable.QuietPass).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Final

import numpy as np

from analysim.core import backfill, hints, orders, placement
from analysim.core.cycle_state import (
    CycleState,
    note_failure,
    queue_scopes,
    scopes_blocked_by,
)
from analysim.core.framework import PassStreams
from analysim.core.gate import PROCEED, REFUSED, WAIT, gate
from analysim.core.job import JobRun, JobStatus, Placement
from analysim.core.pass_streams import ShapeStreams
from analysim.core.unschedulable import IdleHint, QuietPass

if TYPE_CHECKING:
    from analysim.core.scheduler import Scheduler

# What a visit did with a job.
_PASSED: Final = 0
_FAILED: Final = 1
_LAUNCHED: Final = 2


def run_pass(s: Scheduler) -> None:
    """One scheduling pass (the queue's lists do not change during it: see SchedulingQueue)."""
    s.pass_no += 1
    world = s.world.running
    pool = s.queue.pool
    idle = pool.take_idle()
    if idle is not None and idle.stands(world, s.queue.version, s.handle.now):
        pool.leave_idle(idle)  # it would be that pass again
        return
    # (Failures are told apart per VC where quotas matter: a VC's quota, or under a partition that
    # preempts its ClusterQueue's, is part of why a job fails.)
    quotas_matter = (bool(s.handle.spec.vcs) and (s.can_preempt or not s.handle.spec.allow_borrowing)
                     or s.admission is not None and s.can_preempt)
    c = CycleState(world, s.can_preempt, s.can_migrate, quotas_matter, s.checks)
    source = _order(s, c)
    if source is None:
        return
    if c.only_capacity and s.queue.hopeless(s.handle.state, s.gmax, s.handle.config.relaxed_locality):
        return
    given = _visit_all(s, c, source)
    if c.over:
        return  # (it did not walk every job: it leaves no hint)
    if c.by_shape and not given and s.world.running == world:
        pool.leave_idle(IdleHint(world, s.queue.version, c.hold))
    if s.plugins.queue.blocking and s.shortcuts and s.world.running == world:
        pool.leave_quiet(QuietPass(world, c.hold, dict(c.blocked), dict(c.failed), s.queue.last_key(), []))


def _order(s: Scheduler, c: CycleState) -> Iterable[JobRun] | dict[str, Iterator[JobRun]] | PassStreams | None:
    """The order this pass walks (None: the pass would repeat the last one, which changed nothing)."""
    q, sq, skip = s.plugins.queue, s.queue, s.shortcuts
    quiet = sq.pool.take_quiet()
    if quiet is not None and quiet.resumable(c.world, s.handle.now):
        if not quiet.new:
            sq.pool.leave_quiet(quiet)  # it would be that pass again
            return None
        c.blocked.update(quiet.blocked)
        c.failed.update(quiet.failed)
        c.hold = quiet.hold
        return orders.resumed_order(sq, sorted(quiet.new))
    if q.blocking and not s.plugins.backfill and sq.of_vc is not None:
        return orders.blocking_order(s, c, skip)
    if q.blocking and skip:
        return backfill.backfill_order(s, c)
    if c.only_capacity and skip and sq.of_width is not None:
        return orders.merge_widths(s, sq.of_width)
    if c.only_capacity and skip and sq.of_vc_width is not None:
        return {vc: orders.merge_widths(s, lists) for vc, lists in sq.of_vc_width.items()}
    if skip and sq.of_vc_shape is not None:
        c.by_shape = True
        per_request = hints.gangs_per_request(s.handle, s.per_request, len(s.failure_plugins))
        if not q.dynamic:
            return orders.shape_order(s, c, list(sq.of_vc_shape), per_request)
        if s.handle.traits.heads_ranked_by_state:
            # (Streams that give every job and let the queue leave out runs of those whose visits
            # change nothing where its merge would take them one after another; shape_order's
            # leaving out a shape would bring the job behind it up early: pass_streams.)
            return ShapeStreams(s, c)
        return {vc: orders.shape_order(s, c, (vc,), per_request) for vc in sq.of_vc_shape}
    if q.dynamic:
        return sq.for_dynamic_order(s.handle.traits.per_vc_order)
    return sq.jobs()


def _visit_all(s: Scheduler, c: CycleState, source: Iterable[JobRun] | dict[str, Iterator[JobRun]] | PassStreams) -> int:
    """Visit every job the queue's order gives; the number given."""
    q, st = s.plugins.queue, s.handle.state
    blocking, backfilling = q.blocking, s.plugins.backfill
    c.ffmax = st.max_full_free()
    given = 0
    for job in q.order(source, s.handle):  # type: ignore[arg-type]  # (a per-VC order is given the mapping)
        given += 1
        if job.status is not JobStatus.PENDING:
            continue
        scopes: tuple[str | None, ...] = ()
        held: list = []
        if blocking:
            scopes = queue_scopes(s.handle, job)
            held = [c.blocked[sc] for sc in scopes if sc in c.blocked]
            if held and not backfilling:
                continue  # behind a blocked head of its own queue
        done = _visit(s, c, job, held, scopes)
        if c.over:
            break
        if done == _LAUNCHED:
            c.ffmax = st.max_full_free()
            if c.can_preempt and s.admission is not None:
                # (Under a partition a launch can open a search for victims that failed: it can
                # put a cohort over its nominal quota, whose borrowers then become candidates.)
                c.failed_exact.clear()
            if c.only_capacity and not blocking and s.queue.hopeless(st, s.gmax, s.handle.config.relaxed_locality):
                break
        elif done == _FAILED and blocking:
            for sc in scopes_blocked_by(s.handle, job.spec.vc):
                if sc not in c.blocked:
                    c.blocked[sc] = backfill.reserve(s, job, sc) if backfilling else None
            # (Once no job still waiting can pass a blocked head, the merge drops each VC as it
            # next comes up, at less cost than a sweep over every VC after each failure.)
    return given


def _visit(s: Scheduler, c: CycleState, job: JobRun, held: list, scopes: tuple[str | None, ...]) -> int:
    """Gate one pending job (gate.py), then attempt it; launch it if it is placed."""
    code = gate(s, c, job)
    if code != PROCEED:
        if code == WAIT:
            c.held_until(s.handle.now)  # (what this pass leaves holds no later than now)
        return _PASSED if code == REFUSED else _FAILED
    if held:
        reservations: list[tuple[float, float]] = held  # (EASY: each blocked queue has one)
        if not all(backfill.may_backfill(s, job, r) for r in reservations):
            return _PASSED
        backfill.note_backfill_hold(c, job, reservations)
    gated = c.gated
    sig, req, gang, exact = gated.sig, gated.req, gated.gang, gated.exact
    pl = _attempt(s, c, job, gang, (sig, req), gated.nodes)
    if pl is not None:
        if held:
            for sc in scopes:
                r = c.blocked.get(sc)
                if r is not None:
                    c.blocked[sc] = backfill.consume_reservation(s, job, r)
        s.actuator.dequeue(job)
        s.actuator.launch(job, pl)
        return _LAUNCHED
    if exact:
        c.failed_exact.add((sig, req))
    else:
        note_failure(c.failed, sig, req)
    return _FAILED


def _attempt(s: Scheduler, c: CycleState, job: JobRun, gang: bool, signed: tuple,
             nodes: np.ndarray | None) -> Placement | None:
    """Try to place a job the pass does not already know to fail: bind (on ``nodes``, those its
    admission gave it, else every node open to it), then migration, then the post-filters. A
    failure is remembered with the job (hints: failure memo)."""
    pool = s.queue.pool
    now, world = s.handle.now, s.world.running
    failed_until = pool.failed_until(job, world)
    if now < failed_until:
        c.held_until(failed_until)  # failed in an earlier pass, and nothing it reads has changed
        return None
    if gang and c.only_capacity and (job.spec.num_gpus > s.handle.state.total_full_free or signed in c.failed_exact):
        return None  # more whole GPUs than are free, or the same gang failed with more free
    # An attempt known to fail without being made is recorded as made.
    sure = -math.inf if c.checks is None else hints.surely_fails_until(s.handle, s.queue.pool, s.world, job, c.checks)
    pl = None
    if sure <= now:
        pl = placement.bind(s.handle, job, s.handle.static_mask(job.spec) if nodes is None else nodes)
        if pl is None and c.can_migrate:
            pl = s.actuator.migrate_for(job)
            if pl is not None:
                c.forget_failures()
        if pl is None and c.can_preempt:
            pl = s.actuator.preempt_for(job)
            if pl is not None:
                c.forget_failures()
            elif s.actuator.evicting:
                c.over = True  # (the cycle waits for the evictions it issued: the control plane)
    if pl is None and s.shortcuts:
        until = sure if sure > now else hints.answers_hold_until(s.handle, job, c.can_migrate, c.can_preempt)
        pool.mark_failed(job, s.world.running, until)
        c.held_until(until)
    return pl
