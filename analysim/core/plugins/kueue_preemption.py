"""Kueue's preemption, as a post-filter: which admitted workloads to evict so that a pending one
whose quota does not fit now is admitted (Kueue's pkg/scheduler/preemption, re-stated from its
documentation, "Preemption" and "Fair Sharing").

When it runs. A job of a ClusterQueue with a preemption policy other than Never, whose flavors'
quota does not fit now (KueueAdmission attempts it on no nodes, so that it fails and the engine
asks the post-filters). A job whose quota fits but whose nodes have no room is not preempted for:
Kueue preempts for quota only.

Classic preemption (fair sharing off), for the flavors the job would be assigned:

- *Candidates*: the queue's own running workloads that ``withinClusterQueue`` allows (LowerPriority:
  of lower priority; LowerOrNewerEqualPriority: also of equal priority and created after the job),
  and, when ``reclaimWithinCohort`` is not Never, the workloads of the other ClusterQueues of the
  cohort tree that borrow one of the flavor-resources the job lacks (Any: all of them;
  LowerPriority: of lower priority). Only workloads that use one of those flavor-resources.
- *Order*: other queues' workloads first, then the queue's own; within each, lowest priority first,
  then the most recently admitted first.
- *Targets*: walking the candidates in that order, each is evicted (on a copy of the usage) until
  the job fits; a candidate of another queue that no longer borrows is skipped. Then, from the
  next-to-last back, each target whose eviction the job does not need is spared (Kueue's fill
  back). "Fits" is the quota (without borrowing where Kueue requires it) and, since admission and
  placement are one step here, the job's placement on its flavors' nodes.
- *Which candidates, when*: only its own queue's when no other queue's are candidates; with
  ``borrowWithinCohort: LowerPriority``, all of them, the job allowed to borrow (other queues'
  workloads only below ``maxPriorityThreshold`` + 1 and the job's priority, unless the queue is
  under its nominal quota in every flavor-resource that needs preemption); else, if the queue is
  under its nominal quota there, all of them without borrowing, and failing that its own with
  borrowing.
- *Reasons*: InClusterQueue (its own queue's workload), InCohortReclaimWhileBorrowing (another's,
  with the job borrowing), InCohortReclamation (another's).

Fair sharing (Configuration fairSharing.enable) is in kueue_fair.py.

Speed. A search is bounded before it walks: when the quota the candidates could free at most (all
of the queue's own candidates, all that other borrowing queues hold) and what is available cannot
cover the request, nothing is found. A failed search is remembered with what it read (the versions
of every queue's usage it looked at and the nodes' world version) and not repeated until one changes.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from analysim.core import placement
from analysim.core import victims as victim_search
from analysim.core.job import JobRun
from analysim.core.partition import LOWER_OR_NEWER_EQUAL, LOWER_PRIORITY, NEVER, requests_of
from analysim.core.plugins.kueue import (
    IN_CLUSTER_QUEUE,
    IN_COHORT_RECLAIM_WHILE_BORROWING,
    IN_COHORT_RECLAMATION,
)
from analysim.core.plugins.kueue_fair import Shares, fair_targets

if TYPE_CHECKING:
    from analysim.core.cluster import ClusterState
    from analysim.core.framework import Handle
    from analysim.core.plugins.kueue import KueueState


Charges = tuple[tuple[tuple[str, str], int], ...]


class KueuePreemption:
    """The post-filter (module docstring). Its answers read only the running jobs, their usage and
    the nodes, so the engine's failure memo holds for them (``holds_until``: inf)."""

    name: ClassVar[str] = "kueue-preemption"

    def __init__(self, state: KueueState) -> None:
        self.state = state
        tree = state.tree
        nodes = state.partition.nodes
        # Each queue's root, and the queues under each root (a cohort tree's ClusterQueues).
        self.root: list[int] = []
        for i in range(len(nodes)):
            r = i
            while tree.parent[r] >= 0:
                r = tree.parent[r]
            self.root.append(r)
        self.tree_queues: dict[int, list[int]] = {}
        for i, n in enumerate(nodes):
            if n.is_queue:
                self.tree_queues.setdefault(self.root[i], []).append(i)
        # Failed searches: job id -> (what they read: the queues' usage versions, the nodes' and
        # the job's key), while that stands nothing is found.
        self._failed: dict[str, tuple] = {}
        self.looked = 0  # searches begun (bounded or made), for tests and profiles
        self.searches = 0  # searches made past the bound
        self.calls = 0
        self.nodes_mattered = False  # the last search's quota fitted somewhere, its nodes did not

        self._why: dict[str, tuple[str, str]] = {}  # victim -> (reason, preempting queue), until evicted
        self.shares = state.shares if state.shares is not None else Shares(state)

    def holds_until(self, job: JobRun, ctx: Handle) -> float:
        return math.inf

    def reason_of(self, victim: JobRun) -> tuple[str, str]:
        """Why a victim it chose is evicted: Kueue's reason and the preempting ClusterQueue."""
        return self._why.pop(victim.job_id, ("", ""))

    def victims(self, job: JobRun, ctx: Handle) -> list[JobRun] | None:
        self.calls += 1
        st = self.state
        q = st.queue(job)
        if not st.partition.nodes[q].preemption.enabled or st.assign(job) is not None:
            return None  # no policy, or its quota fits (then its nodes have no room: not for quota)
        plans = [self._plan(job, q, charges, flavors) for charges, flavors in self._assignments(job, q)]
        read = (job.seq, *(p.read for p in plans))
        if self._failed.get(job.job_id) == read:
            return None  # the same searches failed, and nothing they read has changed
        self.nodes_mattered = False
        for plan in plans:
            got = self._search(job, plan, ctx)
            if got:
                self._failed.pop(job.job_id, None)
                cq = st.partition.nodes[q].name
                for v, reason in got:
                    st.record_eviction(v, q, reason)
                    self._why[v.job_id] = (reason, cq)
                return [v for v, _ in got]
        if self.nodes_mattered:
            self._failed.pop(job.job_id, None)  # (a failure on the nodes: the engine's failure memo)
        else:
            if len(self._failed) > 100_000:
                self._failed.clear()  # (jobs that ended; a bound on the memory, not on correctness)
            self._failed[job.job_id] = read
        return None

    def _assignments(self, job: JobRun, q: int) -> Iterator[tuple[Charges, tuple[str, ...]]]:
        """Each flavor assignment the queue could ever hold the job on, in flavor order (Kueue's
        whenCanPreempt: TryNextFlavor): one flavor per resource group the job's requests touch."""
        st = self.state
        tree = st.tree
        node = st.partition.nodes[q]
        requests = requests_of(job.spec)
        per_group: list[list[tuple[str, Charges]]] = []
        for group in node.groups:
            wanted = [(r, requests[r]) for r in group.resources if r in requests]
            if not wanted:
                continue
            options = [(f, tuple(((f, r), a) for r, a in wanted)) for f in group.flavors
                       if all((f, r) in tree.quota[q] and tree.potential(q, (f, r)) >= a for r, a in wanted)]
            if not options:
                return
            per_group.append(options)
        for combo in itertools.product(*per_group):
            yield tuple(c for _, cs in combo for c in cs), tuple(f for f, _ in combo)

    # ------------------------------------------------------------------ the plan of a search

    def _plan(self, job: JobRun, q: int, charges: Charges, flavors: tuple[str, ...]) -> _Plan:
        """Which candidates a search on these flavors may take (Kueue's GetTargets, module
        docstring), found from the queue's own state and policies, and what the search's answer
        then reads (``read``): a search that can take only the queue's own candidates and has none
        reads only the queue (its version); any other reads every queue of the cohort tree."""
        st = self.state
        tree = st.tree
        policy = st.partition.nodes[q].preemption
        short = frozenset(fr for fr, a in charges if tree.available(q, fr) < a)  # what needs preemption
        prio = st.priority_of(job)
        under = all(tree.usage[q].get(fr, 0) < tree.subtree[q].get(fr, 0) for fr in short)
        fair = st.partition.fair_sharing is not None
        reclaims = policy.reclaim_within_cohort != NEVER and (fair or under or policy.borrow_within_cohort != NEVER)
        own = self._own_candidates(job, q, prio, policy.within_cluster_queue, short)
        plan = _Plan(charges, flavors, short, prio, under, reclaims, own)
        versions = st.queue_versions
        if not reclaims and not own:
            plan.read = (flavors, versions[q])  # (nothing to take: stands while the queue's usage does)
        else:
            plan.read = (flavors, *(versions[i] for i in self.tree_queues[self.root[q]]))
        return plan

    # ------------------------------------------------------------------ classic preemption

    def _search(self, job: JobRun, plan: _Plan, ctx: Handle) -> list[tuple[JobRun, str]] | None:
        self.looked += 1
        st = self.state
        q = st.queue(job)
        policy = st.partition.nodes[q].preemption
        others = self._others(q, plan) if plan.reclaims else []
        if not plan.own and not others:
            return None
        if self._hopeless(q, plan, others):
            return None
        self.searches += 1
        mask = ctx.static_mask(job.spec)
        for f in plan.flavors:
            mask = mask & st.flavor_mask[f]
        fit = _Fit(self, job, q, plan.charges, mask, plan.short, ctx)
        fairness = st.partition.fair_sharing
        if fairness is not None:
            by_queue = {q: plan.own} if plan.own else {}
            for c in others:
                theirs = list(self._candidates([], [c], plan.prio, policy.reclaim_within_cohort, plan.short, None))
                if theirs:
                    by_queue[c] = theirs
            return fair_targets(fit, self.shares, job, q, plan.charges, by_queue, fairness.strategies)
        return self._classic(fit, plan, others)

    def _threshold(self, plan: _Plan, q: int) -> int:
        """borrowWithinCohort's bound: other queues' workloads below it (Kueue's canBorrowWithinCohort)."""
        t = self.state.partition.nodes[q].preemption.max_priority_threshold
        return plan.prio if t is None or t >= plan.prio else t + 1

    def _others(self, q: int, plan: _Plan) -> list[int]:
        """The other queues a search may take workloads of: they borrow, and their lowest priority
        is below the policy's limit (reclaimWithinCohort LowerPriority: the job's; borrowWithinCohort,
        for a queue not under nominal quota: the threshold)."""
        st = self.state
        policy = st.partition.nodes[q].preemption
        limit = plan.prio if policy.reclaim_within_cohort == LOWER_PRIORITY else math.inf
        if policy.borrow_within_cohort != NEVER and not plan.under and st.partition.fair_sharing is None:
            limit = min(limit, self._threshold(plan, q))
        return [c for c in self._other_queues(q, plan.short) if st.by_queue[c][0][0] < limit]

    def _classic(self, fit: _Fit, plan: _Plan, others: list[int]) -> list[tuple[JobRun, str]] | None:
        """Kueue's GetTargets (module docstring): which candidates, with or without borrowing."""
        q = fit.q
        policy = self.state.partition.nodes[q].preemption
        reclaim = policy.reclaim_within_cohort
        own = plan.own
        if not others:
            return fit.minimal(iter(own), True, None)
        if policy.borrow_within_cohort != NEVER:
            threshold = self._threshold(plan, q)
            walk = self._candidates(own, others, plan.prio, reclaim, plan.short, None if plan.under else threshold)
            return fit.minimal(walk, True, threshold)
        if plan.under:
            got = fit.minimal(self._candidates(own, others, plan.prio, reclaim, plan.short, None), False, None)
            if got:
                return got
        return fit.minimal(iter(own), True, None) if own else None

    def _own_candidates(self, job: JobRun, q: int, prio: int, within: str, short: frozenset) -> list[JobRun]:
        """The queue's own candidates, in candidate order."""
        if within == NEVER:
            return []
        st = self.state
        running = st.running_jobs
        out = []
        for key in st.by_queue[q]:
            if key[0] > prio or key[0] == prio and within != LOWER_OR_NEWER_EQUAL:
                break  # (priority ascending: none further qualifies)
            v = running[key[3]]
            if key[0] == prio and (v.spec.submit_s, v.seq) <= (job.spec.submit_s, job.seq):
                continue  # equal priority, not newer than the job
            if _uses(st.held[v.job_id][1], short):
                out.append(v)
        return out

    def _other_queues(self, q: int, short: frozenset) -> list[int]:
        """The other queues of the cohort tree whose workloads may be candidates (they borrow)."""
        by_queue = self.state.by_queue
        return [c for c in self.tree_queues[self.root[q]] if c != q and by_queue[c] and self._borrows(c, short)]

    def _borrows(self, c: int, short: frozenset) -> bool:
        tree = self.state.tree
        return any(tree.borrowing(c, fr) > 0 for fr in short)

    def _candidates(self, own: list[JobRun], others: list[int], prio: int, reclaim: str, short: frozenset,
                    below: int | None) -> Iterator[JobRun]:
        """Other queues' candidates (merged in candidate order, lazily; LowerPriority: below the
        job's priority; ``below``: below that too), then the queue's own."""
        st = self.state
        running = st.running_jobs
        limit = prio if reclaim == LOWER_PRIORITY else math.inf
        if below is not None:
            limit = min(limit, below)
        for key in heapq.merge(*(iter(st.by_queue[c]) for c in others)):
            if key[0] >= limit:
                break  # (priority ascending: none further qualifies)
            v = running[key[3]]
            if _uses(st.held[v.job_id][1], short):
                yield v
        yield from own

    def _hopeless(self, q: int, plan: _Plan, others: list[int]) -> bool:
        """Whether even every candidate evicted leaves the request uncovered, known without walking
        them: the own candidates' charges and the other borrowing queues' whole usage (at least what
        their candidates hold) are taken off the quota tree at once, a few operations per queue,
        and the queue's ``available`` read then (which sees every limit of the tree: a cohort's
        borrowing limit stops a reclaim from a queue of another cohort helping). For a search that
        may not borrow (a reclaim while under nominal quota, without borrowWithinCohort or fair
        sharing), the request must also fit within nominal quota once its own candidates are gone;
        so must one under borrowWithinCohort, under nominal quota, without own candidates, when
        every other queue's workloads are at or above the threshold (taking any of them turns
        borrowing off: _Fit.minimal)."""
        st = self.state
        tree = st.tree
        policy = st.partition.nodes[q].preemption
        no_borrow = self._must_fit_nominal(q, plan, others)
        wanted = {fr for fr, _ in plan.charges}
        taken: list[tuple[int, tuple[str, str], int]] = []
        for v in plan.own:
            for fr, a in st.held[v.job_id][1]:
                if fr in wanted:
                    taken.append((q, fr, a))
        one = len(plan.short) == 1  # (then a queue stops giving up fr once it stops borrowing fr)
        # (the loosest priority limit of the walks on others' candidates: the most they may take)
        limit = plan.prio if policy.reclaim_within_cohort == LOWER_PRIORITY else math.inf
        fair = st.partition.fair_sharing is not None
        for c in others:
            for fr in wanted:
                used = tree.usage[c].get(fr, 0)
                if used <= 0:
                    continue
                if one and fr in plan.short:
                    # Kueue evicts from c only while c borrows. Classic preemption walks c's
                    # candidates in their order up to the one that takes it under its quota (each
                    # queue's own order, whatever the merge across queues: whether c still borrows
                    # reads only c's usage); fair sharing, at most its borrowed part and one
                    # workload more (its walk is not checked against this one yet).
                    borrowed = used - tree.subtree[c].get(fr, 0)
                    if fair:
                        sizes = st.amounts[c].get(fr)
                        used = min(used, max(0, borrowed) + (sizes[-1] if sizes else 0))
                    else:
                        used = min(used, self._released_by(c, fr, borrowed, limit))
                taken.append((c, fr, used))
        for c, fr, a in taken:
            tree.remove(c, fr, a)
        try:
            for fr, a in plan.charges:
                if tree.available(q, fr) < a:
                    return True
                if no_borrow and not plan.own and tree.usage[q].get(fr, 0) + a > tree.subtree[q].get(fr, 0):
                    return True  # (others' workloads only within nominal quota, and it cannot get there)
            return False
        finally:
            for c, fr, a in reversed(taken):
                tree.add(c, fr, a)

    def _must_fit_nominal(self, q: int, plan: _Plan, others: list[int]) -> bool:
        """Whether a search that takes others' workloads may not borrow (_hopeless). (Without the
        borrowWithinCohort case, Philly's first 10,000 jobs with philly-preemption.yaml made 11,798
        full searches, 10,930 of which found nothing, every one of them incubation's, under nominal
        quota, where each workload of another queue turns borrowing off.)"""
        st = self.state
        policy = st.partition.nodes[q].preemption
        if not others or st.partition.fair_sharing is not None:
            return False
        if policy.borrow_within_cohort == NEVER:
            return True
        if plan.own or not plan.under:
            return False
        threshold = self._threshold(plan, q)
        return all(st.by_queue[c][0][0] >= threshold for c in others)

    def _released_by(self, c: int, fr: tuple[str, str], borrowed: int, limit: float) -> int:
        """What a walk over every candidate takes from another queue ``c`` at most on ``fr``, the
        one resource short: its workloads that hold ``fr`` below ``limit``, in candidate order, until
        it no longer borrows (it borrows ``borrowed``), or until they run out."""
        st = self.state
        held = st.held
        taken = 0
        for key in st.by_queue[c]:
            if key[0] >= limit or taken >= borrowed:
                break
            for r, a in held[key[3]][1]:
                if r == fr:
                    taken += a
        return taken


@dataclass(slots=True)
class _Plan:
    """One flavor assignment's search: what it charges, on which flavors, what needs preemption
    (``short``), the job's priority, whether the queue is under nominal quota there, whether other
    queues' workloads may be taken (``reclaims``), the queue's own candidates, and what it reads."""

    charges: Charges
    flavors: tuple[str, ...]
    short: frozenset
    prio: int
    under: bool
    reclaims: bool
    own: list[JobRun]
    read: tuple = ()


def _uses(held: Charges, short: frozenset) -> bool:
    return any(fr in short for fr, _ in held)


class _Fit:
    """One search's trial: evicts candidates on the quota tree itself (undone before the search
    returns) and on a copy of the nodes, and tells whether the job then fits."""

    def __init__(self, plugin: KueuePreemption, job: JobRun, q: int, charges: Charges, mask: np.ndarray,
                 short: frozenset, ctx: Handle) -> None:
        self.plugin, self.job, self.q, self.charges, self.mask, self.ctx = plugin, job, q, charges, mask, ctx
        self.short = short
        self.state = plugin.state
        self.borrowing: dict[int, bool] = {}  # other queues' "still borrows", while nothing of theirs is released

    def quota_fits(self, allow_borrowing: bool) -> bool:
        tree = self.state.tree
        q = self.q
        for fr, a in self.charges:
            if tree.available(q, fr) < a:
                return False
            if not allow_borrowing and tree.usage[q].get(fr, 0) + a > tree.subtree[q].get(fr, 0):
                return False
        return True

    def nodes_fit(self, evicted: list[JobRun]) -> bool:
        trial = self.ctx.state.clone()
        for v in evicted:
            placement.release_on(trial, v)
        return placement.can_place(self.ctx, self.job.spec, self.mask, trial)

    def fits_now(self, evicted: list[JobRun], allow_borrowing: bool = True) -> bool:
        """With ``evicted`` released on the tree already: whether the quota and the nodes fit."""
        if not self.quota_fits(allow_borrowing):
            return False
        fits = self.nodes_fit(evicted)
        if not fits:
            self.plugin.nodes_mattered = True
        return fits

    def still_borrows(self, c: int) -> bool:
        got = self.borrowing.get(c)
        if got is None:
            got = self.borrowing[c] = self.plugin._borrows(c, self.short)
        return got

    def release(self, v: JobRun) -> None:
        c, held = self.state.held[v.job_id]
        for fr, a in held:
            self.state.tree.remove(c, fr, a)
        self.borrowing.pop(c, None)

    def restore(self, v: JobRun) -> None:
        c, held = self.state.held[v.job_id]
        for fr, a in held:
            self.state.tree.add(c, fr, a)
        self.borrowing.pop(c, None)

    def minimal(self, candidates: Iterator[JobRun], allow_borrowing: bool,
                threshold: int | None) -> list[tuple[JobRun, str]] | None:
        """Kueue's minimal preemptions over ``candidates`` (module docstring): the targets with
        their reasons, or None. The quota tree is as it was when this returns."""
        st, q = self.state, self.q
        targets: list[tuple[JobRun, str]] = []
        trial: ClusterState | None = None
        found = False
        try:
            for v in candidates:
                c = st.held[v.job_id][0]
                if c != q and not self.still_borrows(c):
                    continue  # (its queue no longer borrows: reclaiming more is not Kueue's)
                if threshold is not None and c != q and st.priority_of(v) >= threshold:
                    allow_borrowing = False
                self.release(v)
                reason = (IN_CLUSTER_QUEUE if c == q else
                          IN_COHORT_RECLAIM_WHILE_BORROWING if allow_borrowing else IN_COHORT_RECLAMATION)
                targets.append((v, reason))
                if not self.quota_fits(allow_borrowing):
                    continue
                if trial is None:
                    trial = self.ctx.state.clone()
                    for t, _ in targets:
                        placement.release_on(trial, t)
                else:
                    placement.release_on(trial, v)
                if placement.can_place(self.ctx, self.job.spec, self.mask, trial):
                    found = True
                    break
            if not found:
                if trial is not None:
                    self.plugin.nodes_mattered = True
                return None
            return self.fill_back(targets, allow_borrowing)
        finally:
            for t, _ in targets:
                self.restore(t)

    def fill_back(self, targets: list[tuple[JobRun, str]], allow_borrowing: bool) -> list[tuple[JobRun, str]]:
        """With every target released on the tree: from the next-to-last back, spare each target
        the job does not need (victims.reprieved); the targets kept, with their reasons. The
        tree is left with every target released, as it was given."""
        def fits(chosen: list[JobRun]) -> bool:
            ids = {id(t) for t in chosen}
            spared = [t for t, _ in targets if id(t) not in ids]
            for t in spared:
                self.restore(t)
            try:
                return self.quota_fits(allow_borrowing) and self.nodes_fit(chosen)
            finally:
                for t in spared:
                    self.release(t)
        jobs = [t for t, _ in targets]
        kept = victim_search.reprieved(jobs[-1], jobs[:-1], fits)
        reason_of = {t.job_id: r for t, r in targets}
        return [(t, reason_of[t.job_id]) for t in kept]
