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
from typing import TYPE_CHECKING, ClassVar, Final

import numpy as np

from analysim.core import placement
from analysim.core import victims as victim_search
from analysim.core.job import JobRun
from analysim.core.partition import LOWER_OR_NEWER_EQUAL, LOWER_PRIORITY, NEVER, requests_of

if TYPE_CHECKING:
    from analysim.core.cluster import ClusterState
    from analysim.core.framework import Handle
    from analysim.core.plugins.kueue import KueueState

IN_CLUSTER_QUEUE: Final = "InClusterQueue"
IN_COHORT_RECLAMATION: Final = "InCohortReclamation"
IN_COHORT_FAIR_SHARING: Final = "InCohortFairSharing"
IN_COHORT_RECLAIM_WHILE_BORROWING: Final = "InCohortReclaimWhileBorrowing"

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
        read = self._read_key(job, q)
        if self._failed.get(job.job_id) == read:
            return None  # the same search failed on quota, and no usage it read has changed
        self.nodes_mattered = False
        for charges, flavors in self._assignments(job, q):
            got = self._search(job, q, charges, flavors, ctx)
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

    def _read_key(self, job: JobRun, q: int) -> tuple:
        """What a search for ``job`` that failed on quota read: the usage of every queue of its
        cohort tree (their versions; each charge and release bumps its queue's)."""
        versions = self.state.queue_versions
        return (job.seq, *(versions[i] for i in self.tree_queues[self.root[q]]))

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

    # ------------------------------------------------------------------ classic preemption

    def _search(self, job: JobRun, q: int, charges: Charges, flavors: tuple[str, ...],
                ctx: Handle) -> list[tuple[JobRun, str]] | None:
        self.looked += 1
        st = self.state
        tree = st.tree
        short = {fr for fr, a in charges if tree.available(q, fr) < a}  # what needs preemption
        if not short:
            short = {fr for fr, _ in charges}  # (its quota fits on this flavor: for room on its nodes)
        policy = st.partition.nodes[q].preemption
        prio = st.priority_of(job)
        own = self._own_candidates(job, q, prio, policy.within_cluster_queue, short)
        others = self._other_queues(q, policy.reclaim_within_cohort, short)
        if self._hopeless(q, charges, own, others, ctx):
            return None
        self.searches += 1
        mask = ctx.static_mask(job.spec)
        for f in flavors:
            mask = mask & st.flavor_mask[f]
        fit = _Fit(self, job, q, charges, mask, ctx)
        if not others:
            return fit.minimal(iter(own), True, None, short)
        if policy.borrow_within_cohort != NEVER:
            threshold = prio
            if policy.max_priority_threshold is not None and policy.max_priority_threshold < threshold:
                threshold = policy.max_priority_threshold + 1
            bound = None if self._under_nominal(q, short) else threshold
            walk = self._candidates(own, others, prio, policy.reclaim_within_cohort, short, bound)
            return fit.minimal(walk, True, threshold, short)
        if self._under_nominal(q, short):
            walk = self._candidates(own, others, prio, policy.reclaim_within_cohort, short, None)
            got = fit.minimal(walk, False, None, short)
            if got:
                return got
        return fit.minimal(iter(own), True, None, short)

    def _own_candidates(self, job: JobRun, q: int, prio: int, within: str, short: set) -> list[JobRun]:
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

    def _other_queues(self, q: int, reclaim: str, short: set) -> list[int]:
        """The other queues of the cohort tree whose workloads may be candidates (they borrow)."""
        if reclaim == NEVER:
            return []
        return [c for c in self.tree_queues[self.root[q]] if c != q and self._borrows(c, short) and self.state.by_queue[c]]

    def _borrows(self, c: int, short: set) -> bool:
        tree = self.state.tree
        return any(tree.usage[c].get(fr, 0) > tree.subtree[c].get(fr, 0) for fr in short)

    def _under_nominal(self, q: int, short: set) -> bool:
        tree = self.state.tree
        return all(tree.usage[q].get(fr, 0) < tree.subtree[q].get(fr, 0) for fr in short)

    def _candidates(self, own: list[JobRun], others: list[int], prio: int, reclaim: str, short: set,
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

    def _hopeless(self, q: int, charges: Charges, own: list[JobRun], others: list[int], ctx: Handle) -> bool:
        """Whether even every candidate evicted leaves the request uncovered, by a few sums: per
        flavor-resource, what is available plus all the own candidates hold plus all the other
        borrowing queues hold there."""
        st = self.state
        tree = st.tree
        for fr, a in charges:
            most = tree.available(q, fr)
            if most >= a:
                continue
            for v in own:
                for vfr, va in st.held[v.job_id][1]:
                    if vfr == fr:
                        most += va
            for c in others:
                most += tree.usage[c].get(fr, 0)
            if most < a:
                return True
        return False


def _uses(held: Charges, short: set) -> bool:
    return any(fr in short for fr, _ in held)


class _Fit:
    """One search's trial: evicts candidates on the quota tree itself (undone before the search
    returns) and on a copy of the nodes, and tells whether the job then fits."""

    def __init__(self, plugin: KueuePreemption, job: JobRun, q: int, charges: Charges, mask: np.ndarray,
                 ctx: Handle) -> None:
        self.plugin, self.job, self.q, self.charges, self.mask, self.ctx = plugin, job, q, charges, mask, ctx
        self.state = plugin.state

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

    def _release(self, v: JobRun) -> None:
        c, held = self.state.held[v.job_id]
        for fr, a in held:
            self.state.tree.remove(c, fr, a)

    def _restore(self, v: JobRun) -> None:
        c, held = self.state.held[v.job_id]
        for fr, a in held:
            self.state.tree.add(c, fr, a)

    def minimal(self, candidates: Iterator[JobRun], allow_borrowing: bool, threshold: int | None,
                short: set) -> list[tuple[JobRun, str]] | None:
        """Kueue's minimal preemptions over ``candidates`` (module docstring): the targets with
        their reasons, or None. The quota tree is as it was when this returns."""
        st, q, plugin = self.state, self.q, self.plugin
        targets: list[tuple[JobRun, str]] = []
        trial: ClusterState | None = None
        found = False
        try:
            for v in candidates:
                c = st.held[v.job_id][0]
                if c != q and not plugin._borrows(c, short):
                    continue  # (its queue no longer borrows: reclaiming more is not Kueue's)
                if threshold is not None and c != q and st.priority_of(v) >= threshold:
                    allow_borrowing = False
                self._release(v)
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
                    plugin.nodes_mattered = True
                return None
            # Fill back: spare, from the next-to-last target back, each the job does not need.
            def fits(chosen: list[JobRun]) -> bool:
                ids = {id(t) for t in chosen}
                spared = [t for t, _ in targets if id(t) not in ids]
                for t in spared:
                    self._restore(t)
                try:
                    return self.quota_fits(allow_borrowing) and self.nodes_fit(chosen)
                finally:
                    for t in spared:
                        self._release(t)
            jobs = [t for t, _ in targets]
            kept = victim_search.reprieved(jobs[-1], jobs[:-1], fits)
            reason_of = {t.job_id: r for t, r in targets}
            return [(t, reason_of[t.job_id]) for t in kept]
        finally:
            for t, _ in targets:
                self._restore(t)

