"""Queueing hints: when a job that failed may be attempted again, and when a pass would repeat.

Kubernetes parks a pod that failed in its unschedulable pool, and moves it back only on a cluster
event that a plugin's QueueingHint says may make it schedulable. Here the same idea has four named
forms, each kept where it is read (docs/engine.md lists them with their tests):

- **failure memo** (per job, kept by the queue's unschedulable pool): an attempt that failed
  fails again while the running jobs and the nodes stay the same (the engine's world version:
  every launch, stop and node event bumps it), until the earliest ``holds_until`` its plugins
  gave (answers_hold_until). A job re-queued starts afresh.
- **sure failure** (surely_fails_until): an attempt is not made when too few whole GPUs are
  free by count and every plugin it would ask says, without a search, that it finds nothing
  (``finds_none_until``); what the plugins that read only the job's VC said
  (``finds_none_by_vc``) stands across other VCs' launches and stops.
- **idle pass** (``unschedulable.IdleHint``): a per-shape pass that gave no job to attempt is that pass again
  while the world, the queue's version and its hold stand.
- **quiet pass** (``unschedulable.QuietPass``): a blocking queue's pass that changed nothing is that pass again
  but for the arrivals since, while the world and its hold stand.

The plugins' optional hint methods are found once, when the engine starts (FailureChecks), never
by name in a pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, cast

from analysim.core.framework import FailureHints, Handle, PerRequestHints, Policy
from analysim.core.job import JobRun
from analysim.core.memos import World
from analysim.core.unschedulable import UnschedulablePool


@dataclass(slots=True)
class FailureChecks:
    """The ``finds_none_until`` of every plugin a failed placement asks (found once per engine)."""

    by_vc: list[Callable[[JobRun, Handle], float]]  # those whose answer reads only the job's VC
    others: list[Callable[[JobRun, Handle], float]]  # the rest: asked at every attempt


def failure_plugins(policy: Policy, can_preempt: bool, can_migrate: bool) -> list:
    """The plugins a placement that fails asks, in order: the post-filters, then rebalance."""
    plugins: list = list(policy.post_filters) if can_preempt else []
    if can_migrate:
        plugins.append(policy.rebalance)
    return plugins


def failure_checks(plugins: list) -> FailureChecks | None:
    """The plugins' sure-failure hints, those reading only the job's VC apart; None when some
    plugin has none (then only an attempt can tell)."""
    checks = FailureChecks([], [])
    for p in plugins:
        if not _implements(p, FailureHints):
            return None
        hinted = cast(FailureHints, p)
        (checks.by_vc if hinted.finds_none_by_vc else checks.others).append(hinted.finds_none_until)
    return checks


def answer_per_request(plugins: list) -> list:
    """The plugins' answers_per_request methods; an empty list stands for "not every plugin has
    one" (a plugin without it does not answer per request)."""
    got = []
    for p in plugins:
        if not _implements(p, PerRequestHints):
            return []
        got.append(cast(PerRequestHints, p).answers_per_request)
    return got


# The members of each optional interface of framework.py, as it declares them.
_MEMBERS: Final = {"FailureHints": ("finds_none_until", "finds_none_by_vc"), "PerRequestHints": ("answers_per_request",)}


def _implements(plugin: object, interface: type) -> bool:
    """Whether ``plugin`` has every member of one of framework.py's optional interfaces."""
    return all(hasattr(plugin, m) for m in _MEMBERS[interface.__name__])


def gangs_per_request(h: Handle, methods: list, plugins: int) -> bool:
    """Whether every plugin a failed attempt asks answers alike for all jobs of a VC and request
    (PostFilter.answers_per_request) right now."""
    return len(methods) == plugins and all(m(h) for m in methods)


def answers_hold_until(h: Handle, job: JobRun, can_migrate: bool, can_preempt: bool) -> float:
    """Until when a failed attempt to place ``job`` fails again, as long as the running jobs and
    the nodes stay the same: placement reads only those, and each plugin says how long its answer
    holds (``holds_until``). The waiting job's own rank may change only when it is queued again."""
    until = math.inf
    now = h.now
    if can_preempt:
        for pf in h.policy.post_filters:
            until = min(until, pf.holds_until(job, h))
            if until <= now:
                return until
    if can_migrate:
        rebalance = h.policy.rebalance
        assert rebalance is not None
        until = min(until, rebalance.holds_until(job, h))
    return until


def finds_none_now(h: Handle, checks: FailureChecks, job: JobRun) -> bool:
    """Whether every plugin a failed attempt asks surely finds nothing for ``job`` now, by their
    sure-failure hints alone: for an attempt on no nodes (a job whose quota does not fit, attempted
    only so that a post-filter may preempt for it: framework.QUOTA_WAIT), which only those plugins
    could turn into a placement, whatever the free GPUs."""
    now = h.now
    return all(check(job, h) > now for check in checks.by_vc) and all(check(job, h) > now for check in checks.others)


def surely_fails_until(h: Handle, pool: UnschedulablePool, world: World, job: JobRun, checks: FailureChecks) -> float:
    """Until when an attempt to place ``job`` surely fails while the running jobs and the nodes
    stay the same, known without making it: too few whole GPUs are free for it, by count, and each
    plugin the attempt would ask finds nothing (``checks``). ``now`` or earlier when only the
    attempt can tell. What the plugins that read only the job's VC said is kept with the job, and
    stands while the VC's running jobs and the nodes do."""
    spec = job.spec
    g = spec.num_gpus
    if g < 1 or spec.is_fractional:
        return -math.inf
    st = h.state
    if h.one_node(spec):
        if g <= st.max_full_free():
            return -math.inf
    else:
        # A gang over k nodes gets at most the k largest counts of whole free GPUs (any number of
        # them, with relaxed locality): see placement.gang_fits.
        k = h.gang_size(spec)
        most = st.total_full_free if h.config.relaxed_locality else min(st.total_full_free,
                                                                           k * st.max_full_free())
        if k and most >= g:
            return -math.inf
    vc_version, node_version = world.vc_version(spec.vc), world.nodes
    now = h.now
    known = pool.none_by_vc_until(job, vc_version, node_version)
    if now < known:
        until = known
    else:
        until = math.inf
        for check in checks.by_vc:
            until = min(until, check(job, h))
            if until <= now:
                return until
        pool.note_none_by_vc(job, vc_version, node_version, until)
    for check in checks.others:
        until = min(until, check(job, h))
        if until <= now:
            break
    return until
