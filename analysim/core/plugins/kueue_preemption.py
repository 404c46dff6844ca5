"""Kueue's preemption, as a post-filter: which admitted workloads to evict so that a pending one
whose quota does not fit now is admitted (Kueue's pkg/scheduler/preemption, re-stated from its
documentation, "Preemption", "Hierarchical Cohorts" and "Fair Sharing", and the rules of its code
at the release docs/kueue.md pins).

When it runs. A job of a ClusterQueue with a preemption policy other than Never, whose flavor
assignment does not fit now (KueueAdmission attempts it on no nodes, so that it fails and the engine
asks the post-filters). The flavors are Kueue's choice (kueue_flavors.choose, which asks this
plugin's ``oracle`` how each flavor-resource would preempt); the flavor-resources not free now
*need preemption*. A job whose quota fits but whose nodes have no room is not preempted for: Kueue
preempts for quota only.

Classic preemption (fair sharing off):

- *Own candidates*: the queue's running workloads that ``withinClusterQueue`` allows (LowerPriority:
  of lower priority; LowerOrNewerEqualPriority: also of equal priority and created after the job)
  and that use a flavor-resource needing preemption. Reason InClusterQueue.
- *Other queues' candidates* (``reclaimWithinCohort`` not Never): walking up from the queue's
  cohort to the root, each ancestor's subtree not yet seen is searched for ClusterQueues (and
  cohorts on the way down) over their nominal quota in the flavor-resources needing preemption;
  their workloads that the policy allows (Any: all; LowerPriority: lower priority) are candidates,
  the ancestor being the *lowest common ancestor* of the two queues. The job has the *hierarchical
  advantage* over a candidate when the request fits within its queue's nominal quota, or within the
  subtree quota of an ancestor below that lowest common ancestor (what is left of it after each
  node's own quota): such a candidate may be taken whatever the priorities, borrowing or not
  (reason InCohortReclamation). Otherwise it may be taken only without the job borrowing
  (InCohortReclamation) when ``borrowWithinCohort`` is Never, or its priority is not below the job's
  or is above ``maxPriorityThreshold``; else also while borrowing (InCohortReclaimWhileBorrowing).
- *Order*: the candidates with the advantage, then the other queues' others, then the queue's own;
  each lowest priority first, then the most recently admitted first.
- *Targets*: walking the candidates in that order, each is evicted (on the quota tree, undone at
  the end) until the job fits; a candidate is passed over when the attempt borrows and it may only
  be taken without, or when its queue, or a cohort between it and the lowest common ancestor, is no
  longer over its nominal quota. Then, from the next-to-last back, each target the job does not
  need is spared (fill back). "Fits" is the quota (within nominal quota for an attempt that may not
  borrow) and, since admission and placement are one step here, the job's placement on its
  flavors' nodes.
- *Attempts*: borrowing only, when there is no other queue's candidate or when borrowWithinCohort is
  Never and the queue is not under its nominal quota (strictly) in every flavor-resource needing
  preemption; without borrowing then with, when borrowWithinCohort is Never and no candidate has
  the advantage; else with borrowing, then without.

Fair sharing (Configuration fairSharing.enable) is in kueue_fair.py.

Speed. Most searches find nothing, pass after pass, and are answered without a walk, each by a
bound that holds whatever the usage (the reference engine, shortcuts off, makes them in full):

- *No candidate* (a queue whose groups have one flavor each, classic preemption): the queue has no
  candidate of its own, and no cohort on its path has another child that borrows what the job
  needs, or the job has the advantage over none of those and may not take them (Never) and does
  not fit within its nominal quota. The quota tree counts each node's borrowing children, so this
  is a few reads per level, without the flavor choice.
- *Quota*: when the quota the candidates could free at most (all of the queue's own candidates,
  what other borrowing queues could give up) and what is available cannot cover the request.
- *Room*: when the job cannot be placed even with every workload the search might take released
  (whole free GPUs counted first, then the nodes those workloads hold), every walk would fail on
  the nodes after trying each candidate; on a busy cluster most searches that get this far end so,
  and this bound is asked before the quota's. An attempt that borrows, which may take fewer of the
  other queues' workloads, asks it again with those. What a walk may take of another queue stops
  where the queue, or a cohort between it and the common ancestor, is back within its nominal
  quota: each queue's candidates in order up to there, and of a cohort's queues, merged in the
  walk's order, up to where the cohort is (kueue_bounds).

A search that failed on the quota is remembered with what it read (the versions of every queue's
usage it looked at) and not repeated until one changes. One that the room bound refused by whole
GPUs alone is kept as a refutation (kueue_room) and replayed against the launches and stops since:
while they leave the job's reach short, the same search is answered without being made. The
sure-failure hint (``finds_none_until``) gives that answer, and the others that need no search,
before the attempt: the gate then fails the job without visiting it, and a pass drains a run of
such jobs at once (pass_streams).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar, Final

import numpy as np

from analysim.core.job import JobRun
from analysim.core.partition import LOWER_OR_NEWER_EQUAL, LOWER_PRIORITY, NEVER, QuotaTree, requests_of
from analysim.core.plugins.kueue_bounds import SearchBounds
from analysim.core.plugins.kueue_fair import fair_targets
from analysim.core.plugins.kueue_flavors import (
    FIT,
    NO_CANDIDATES,
    PREEMPT,
    RECLAIM,
    Choice,
    Mode,
    borrowing_level,
    local_available,
)
from analysim.core.plugins.kueue_room import Refutation, still_refutes
from analysim.core.plugins.kueue_share import Shares
from analysim.core.plugins.kueue_state import (
    IN_CLUSTER_QUEUE,
    IN_COHORT_RECLAIM_WHILE_BORROWING,
    IN_COHORT_RECLAMATION,
)
from analysim.core.plugins.kueue_trial import (
    Candidate,
    Charges,
    Plan,
    Trial,
    charge,
    uses,
    within_nominal,
)

if TYPE_CHECKING:
    from analysim.core.framework import Handle
    from analysim.core.plugins.kueue_state import KueueState


NO_ANCESTOR: Final = -1
# A gang's room refutation keeps this many nodes beyond its own count, the most GPUs first: a check
# reads past the nodes stops touched (kueue_room).
TOPS_SPARE: Final = 32


class KueuePreemption:
    """The post-filter (module docstring). Its answers read only the running jobs, their usage and
    the nodes, so the engine's failure memo holds for them (``holds_until``: inf).

    Invariant: each memo entry (``_failed``, ``_tree_refusal``, and the bounds', kueue_bounds) is
    kept with the usage versions it read and trusted only while they are the state's; ``_why``
    holds the victims of the last searches until the engine evicts them (reason_of)."""

    name: ClassVar[str] = "kueue-preemption"

    def __init__(self, state: KueueState) -> None:
        self.state = state  # the usage and running workloads it searches, shared with the admission
        nodes = state.partition.nodes
        # Each queue's root (the state's), and the queues under each root (a cohort tree's
        # ClusterQueues).
        self.root: list[int] = state.root
        self.tree_queues: dict[int, list[int]] = {}  # root -> its tree's ClusterQueues (above)
        for i, n in enumerate(nodes):
            if n.is_queue:
                self.tree_queues.setdefault(self.root[i], []).append(i)
        # Queues whose own candidates depend on the preemptor's creation (newer ones of its priority)
        self.by_creation = [n.is_queue and n.preemption.within_cluster_queue == LOWER_OR_NEWER_EQUAL for n in nodes]
        # The lowest priority any workload can have (priority classes, and 0 without one): a
        # LowerPriority reclaim by a job at or below it has no other queue's candidate, ever.
        self.lowest_priority = state.partition.lowest_priority
        # Failed searches: job id -> what they read (the queues' usage versions, the job), while
        # that stands nothing is found.
        self._failed: dict[str, tuple] = {}
        self.looked = 0  # searches begun (bounded or made), for tests and profiles
        self.searches = 0  # searches made past the bound
        self.calls = 0  # victims() asked
        self.replayed = 0  # searches answered by an earlier one's room refutation, replayed (kueue_room)
        self.hinted = 0  # sure failures told by such a refutation before any search (finds_none_until)
        self.nodes_mattered = False  # the last search's quota fitted somewhere, its nodes did not
        self.bounds = SearchBounds(state)  # the room and quota bounds asked before a walk, with their memos

        # _no_candidate's reading of the quota tree: (queue, request) -> (its cohort tree's
        # version, whether another queue's candidate may be taken, and the request's charges on
        # the queue's flavors, which stand whatever the version). Asked by every visit of a
        # waiting job, mostly for the same few requests of a queue while its tree stands still
        # (83 % of the first 20,000 Philly jobs' asks under philly-preemption.yaml). Never asked
        # while a search has taken charges off the tree, which leaves the versions as they were.
        self._tree_refusal: dict[tuple[int, tuple], tuple[int, bool, dict[tuple[str, str], int]]] = {}
        self._why: dict[str, tuple[str, str]] = {}  # victim -> (reason, preempting queue), until evicted
        # The shares a fair-sharing search reads: the state's, or its own if the state has none
        self.shares = state.shares if state.shares is not None else Shares(state.tree)
        state.oracle = self.oracle
        state.no_candidate = self._surely_none

    def holds_until(self, job: JobRun, ctx: Handle) -> float:
        return math.inf

    # The sure-failure hint (framework.FailureHints). It reads the quota tree's usage and the nodes.
    finds_none_by_vc: ClassVar[bool] = False

    def finds_none_until(self, job: JobRun, ctx: Handle) -> float:
        """``inf`` when ``victims`` surely finds nothing for the job while the running jobs and the
        nodes stay the same, known without a search: its queue does not preempt or its quota fits
        (a search is for quota only), it has no candidate (``_no_candidate``), its flavor choice
        needs no preemption, or the room refutation of its search still refutes it (kueue_room);
        else ``ctx.now``. It reads only what every job of one queue, request and priority shares,
        never a job's own failed searches nor its creation, so that a pass may read it of the first
        of a run of such jobs for all of them (pass_streams): ``now`` for a queue whose candidates
        depend on the job's creation. ``now`` too where the flavor choice reads the oracle (a
        queue with a group of several flavors): that choice is a search per flavor, the cost the
        hint would spare."""
        st = self.state
        q = st.queue(job)
        if not st.partition.nodes[q].preemption.enabled or st.assign(job) is not None:
            return math.inf
        if (not ctx.shortcuts or self.by_creation[q] or not st.assignments.one_flavor[q]
                or st.partition.fair_sharing is not None):
            return ctx.now
        if self._no_candidate(job, q):
            return math.inf
        choice = st.choose(job, self.oracle)
        if choice is None or choice.mode == FIT:
            return math.inf
        rooms, room_key = self._rooms(job, q, st.priority_of(job), choice.flavors, ctx)
        if rooms is not None and self._refuted_again(rooms.get(room_key), choice.need, q):
            self.hinted += 1
            return math.inf
        return ctx.now

    def reason_of(self, victim: JobRun) -> tuple[str, str]:
        """Why a victim it chose is evicted: Kueue's reason and the preempting ClusterQueue."""
        return self._why.pop(victim.job_id, ("", ""))

    def victims(self, job: JobRun, ctx: Handle) -> list[JobRun] | None:
        self.calls += 1
        st = self.state
        q = st.queue(job)
        if not st.partition.nodes[q].preemption.enabled or st.assign(job) is not None:
            return None  # no policy, or its quota fits (then its nodes have no room: not for quota)
        self.nodes_mattered = False
        if ctx.shortcuts and self._no_candidate(job, q):
            return None
        read = self._read(job, q)
        if self._failed.get(job.job_id) == read:
            return None  # the same searches failed, and nothing they read has changed
        choice = st.choose(job, self.oracle)
        got = None
        if choice is not None and choice.mode != FIT:
            got = self._search(job, q, choice, st.nodes_of(job, choice.flavors, ctx), ctx)
        if got:
            self._failed.pop(job.job_id, None)
            cq = st.partition.nodes[q].name
            for v, reason in got:
                st.record_eviction(v, q, reason)
                self._why[v.job_id] = (reason, cq)
            st.after_preemption[job.job_id] = (choice.flavors, choice.charges, choice.level)  # type: ignore[union-attr]
            return [v for v, _ in got]
        if self.nodes_mattered:
            self._failed.pop(job.job_id, None)  # (a failure on the nodes: the engine's failure memo)
        else:
            if len(self._failed) > 100_000:
                self._failed.clear()  # (jobs that ended; a bound on the memory, not on correctness)
            self._failed[job.job_id] = read
        return None

    def oracle(self, job: JobRun, q: int, fr: tuple[str, str], amount: int) -> Mode:
        """How ``amount`` of ``fr`` would be found for the job by preemption, on the quota alone
        (kueue_flavors' oracle: Kueue's SimulatePreemption): NO_CANDIDATES, PREEMPT (some victim in
        its own queue) or RECLAIM (all in others), with the borrowing level once they are gone."""
        st = self.state
        choice = Choice((fr[0],), ((fr, amount),), 0, NO_CANDIDATES, frozenset((fr,)))
        got = self._search(job, q, choice, None, None)
        if not got:
            return (NO_CANDIDATES, borrowing_level(st.tree, st.heights, q, fr, amount)[0])
        for v, _ in got:
            charge(st, v, -1)
        try:
            level = borrowing_level(st.tree, st.heights, q, fr, amount)[0]
        finally:
            for v, _ in got:
                charge(st, v, 1)
        mine = any(st.held[v.job_id][0] == q for v, _ in got)
        return (PREEMPT if mine else RECLAIM, level)

    def _rooms(self, job: JobRun, q: int, prio: int, flavors: tuple[str, ...],
               ctx: Handle | None) -> tuple[dict[tuple, Refutation] | None, tuple]:
        """The room refutations of searches on the nodes (kueue_room), kept in the engine's lasting
        memo (a node going down or up ends them; the reference engine's keeps nothing), and the
        job's key there: what its search reads of it (its creation where its own candidates do).
        None without the shortcuts, with fair sharing (no room bound) or for the quota alone (no
        ``ctx``: the oracle's question)."""
        if ctx is None or not ctx.shortcuts or self.state.partition.fair_sharing is not None:
            return None, ()
        memo = ctx.lasting_memo()
        got = memo.get(self.name)
        if got is None or len(got) > 10_000:
            got = memo[self.name] = {}  # (a bound on the memory: keys are queues x requests x priorities)
        return got, (q, job.spec.vc, job.spec.request, prio, job.seq if self.by_creation[q] else -1, flavors)

    def _refuted_again(self, known: Refutation | None, need: frozenset, q: int) -> bool:
        """Whether an earlier refutation of the same key still refutes the search (kueue_room)."""
        st = self.state
        return known is not None and st.changes is not None and still_refutes(known, need, st.changes, st.version,
                                                                                q, st.root)

    def _refutation(self, job: JobRun, need: frozenset, ctx: Handle | None) -> Refutation:
        """The room bound's last refusal, by whole GPUs alone, as a refutation to replay (kueue_room)."""
        assert self.bounds.refuted is not None and ctx is not None
        gang, released, freed = self.bounds.refuted
        state = ctx.state
        within = state.full_free.astype(np.int64)
        for n, k in freed.items():
            within[n] += k
        tops = None
        if gang > 1 and not ctx.config.relaxed_locality:
            many = min(len(within), gang + TOPS_SPARE)
            best = np.argpartition(-within, many - 1)[:many]
            tops = best[np.argsort(-within[best], kind="stable")].tolist()
        total = state.total_full_free + sum(freed.values())
        return Refutation(gang, job.spec.num_gpus, need, {v.job_id for v in released}, within.tolist(), tops,
                          total, self.state.version)

    def _surely_none(self, job: JobRun) -> bool:
        return self._no_candidate(job, self.state.queue(job))

    def _no_candidate(self, job: JobRun, q: int) -> bool:
        """Whether a search for the job surely finds no target, known from a few counts on its path
        instead of the flavor choice and the walks. Classic preemption in a queue whose groups have
        one flavor each (the charges, and what needs preemption, are then known: what does not fit
        in ``available``). It holds when the queue has no candidate of its own and either no cohort
        on the queue's path has another child borrowing what the job needs (no other queue's
        candidate: _sources would find none), or the job has the hierarchical advantage over none
        of them and borrowWithinCohort is Never (its attempts that borrow may not take them) and
        the request does not fit within the queue's nominal quota (so an attempt that does not
        borrow cannot succeed either: only the queue's own workloads could make room there)."""
        st = self.state
        if not st.assignments.one_flavor[q] or st.partition.fair_sharing is not None or self._own_possible(job, q):
            return False
        if not self._may_reclaim(job, q):
            return True
        key = (q, job.spec.request)
        version = st.tree_versions[st.root[q]]
        known = self._tree_refusal.get(key)
        if known is not None and known[0] == version:
            return known[1]
        charges = known[2] if known is not None else self._one_flavor_charges(job, q)
        refused = self._no_other_candidate(q, charges)
        if len(self._tree_refusal) > 10_000:
            self._tree_refusal.clear()  # (a bound on the memory: queues x requests)
        self._tree_refusal[key] = (version, refused, charges)
        return refused

    def _one_flavor_charges(self, job: JobRun, q: int) -> dict[tuple[str, str], int]:
        """The job's charges in a queue whose groups have one flavor each: its request of each
        resource the queue covers, on that resource's flavor."""
        requests = requests_of(job.spec)
        charges: dict[tuple[str, str], int] = {}
        for group in self.state.partition.nodes[q].groups:
            for r in group.resources:
                if r in requests:
                    charges[(group.flavors[0], r)] = requests[r]
        return charges

    def _no_other_candidate(self, q: int, charges: dict[tuple[str, str], int]) -> bool:
        """_no_candidate's reading of the quota tree, for a job that has no candidate of its own
        and may reclaim: it reads the job's charges and the usage of its queue's cohort tree only."""
        st = self.state
        tree = st.tree
        need = [fr for fr, a in charges.items() if a > tree.available(q, fr)]
        if not need:
            return True  # (nothing needs preemption: there is no target to find)
        forbidden = st.partition.nodes[q].preemption.borrow_within_cohort == NEVER
        # The hierarchical advantage is read only where it decides: while another queue's
        # candidates may not be taken without it (forbidden), until the job has it.
        advantage, remaining = _fits_in_quota(tree, q, charges) if forbidden else (False, charges)
        child, a = q, tree.parent[q]
        while a >= 0:
            counts = tree.over_children[a]
            for fr in need:
                if counts.get(fr, 0) > (tree.borrowing(child, fr) > 0):
                    if advantage or not forbidden:
                        return False  # (a candidate of another queue may be taken)
                    break
            if forbidden and not advantage:
                advantage, remaining = _fits_in_quota(tree, a, remaining)
            child, a = a, tree.parent[a]
        return True

    def _read(self, job: JobRun, q: int) -> tuple:
        """What a search for the job reads: the job, and the usage of its queue alone when it can
        take only its own queue's workloads and has none to take, else of every queue of the tree
        (the flavor choice and the walk read their usage)."""
        versions = self.state.queue_versions
        if not self._may_reclaim(job, q) and not self._own_possible(job, q):
            return (job.seq, versions[q])
        return (job.seq, *(versions[i] for i in self.tree_queues[self.root[q]]))

    def _may_reclaim(self, job: JobRun, q: int) -> bool:
        """Whether another queue's workload could ever be a candidate for the job."""
        st = self.state
        reclaim = st.partition.nodes[q].preemption.reclaim_within_cohort
        if reclaim == NEVER or st.tree.parent[q] < 0:
            return False
        return reclaim != LOWER_PRIORITY or st.priority_of(job) > self.lowest_priority

    def _own_possible(self, job: JobRun, q: int) -> bool:
        """Whether the queue runs a workload that its withinClusterQueue policy could take (its
        lowest-priority one, in candidate order, qualifies by priority)."""
        st = self.state
        within = st.partition.nodes[q].preemption.within_cluster_queue
        running = st.running.by_queue[q]
        if within == NEVER or not running:
            return False
        prio = st.priority_of(job)
        if within == LOWER_PRIORITY and prio <= self.lowest_priority:
            return False  # (none runs below the lowest priority: read without the sorted list)
        lowest = running[0][0]
        return lowest < prio or lowest == prio and within == LOWER_OR_NEWER_EQUAL

    # ------------------------------------------------------------------ a search

    def _search(self, job: JobRun, q: int, choice: Choice, mask: np.ndarray | None,
                ctx: Handle | None) -> list[tuple[JobRun, str]] | None:
        """Kueue's GetTargets for the job on ``choice``'s flavors (module docstring): the targets
        with their reasons, or None. ``mask`` None: the quota alone (the oracle's question)."""
        self.looked += 1
        st = self.state
        tree = st.tree
        policy = st.partition.nodes[q].preemption
        need = choice.need
        prio = st.priority_of(job)
        rooms, room_key = self._rooms(job, q, prio, choice.flavors, ctx)
        if rooms is not None and self._refuted_again(rooms.get(room_key), need, q):
            self.replayed += 1
            self.nodes_mattered = True
            return None
        own = self._own_candidates(job, q, prio, policy.within_cluster_queue, need)
        sources = self._sources(job, q, choice.charges, need) if self._may_reclaim(job, q) else []
        under = all(tree.usage[q].get(fr, 0) < tree.nominal(q, fr) for fr in need)
        plan = Plan(choice.charges, need, prio, under, own, sources)
        others = self._others(q, plan)
        if not own and not others:
            return None
        fit = Trial(st, job, q, choice.charges, mask, need, ctx)
        try:
            fairness = st.partition.fair_sharing
            # The room bound before the quota bound: on a busy cluster it ends most searches, and
            # with every source's candidates taken (no attempt takes more) it holds for each attempt.
            if fairness is None and not self.bounds.room(fit, plan, [c for c, _, _ in plan.sources], [], math.inf):
                if rooms is not None and self.bounds.refuted is not None:
                    rooms[room_key] = self._refutation(job, need, ctx)  # (refused by whole GPUs alone)
                return None
            if self.bounds.quota_hopeless(q, plan, others, True):
                return None
            self.searches += 1
            if fairness is None:
                return self._classic(fit, job, plan)
            by_queue = {q: own} if own else {}
            for c in self._other_queues(q, need):
                theirs = [v for v, *_ in self._walk([c], job, plan, policy.reclaim_within_cohort, False)]
                if theirs:
                    by_queue[c] = theirs
            within = all(tree.usage[q].get(fr, 0) + a <= tree.nominal(q, fr) for fr, a in choice.charges if fr in need)
            return fair_targets(fit, self.shares, job, q, choice.charges, by_queue, fairness.strategies, within)
        finally:
            self.nodes_mattered = self.nodes_mattered or fit.nodes_mattered

    def _sources(self, job: JobRun, q: int, charges: Charges, need: frozenset) -> list[tuple[int, int, bool]]:
        """The other queues whose workloads may be candidates, each with its lowest common ancestor
        with ``q`` and whether the job has the hierarchical advantage over it (module docstring:
        Kueue's collectCandidatesForHierarchicalReclaim)."""
        tree = self.state.tree
        out: list[tuple[int, int, bool]] = []
        requests = dict(charges)
        advantage, remaining = _fits_in_quota(tree, q, requests)
        seen = NO_ANCESTOR
        a = tree.parent[q]
        while a >= 0:
            self._collect(a, a, seen, advantage, need, q, out)
            fits, remaining = _fits_in_quota(tree, a, remaining)
            advantage = advantage or fits
            seen, a = a, tree.parent[a]
        return out

    def _collect(self, node: int, lca: int, skip: int, advantage: bool, need: frozenset, q: int,
                 out: list[tuple[int, int, bool]]) -> None:
        """The queues under ``node`` (past cohorts over their nominal quota, not ``skip``'s subtree)
        that are over their nominal quota in ``need``."""
        tree = self.state.tree
        nodes = self.state.partition.nodes
        for c in tree.children[node]:
            if nodes[c].is_queue:
                if c != q and not within_nominal(tree, c, need):
                    out.append((c, lca, advantage))
            elif c != skip and not within_nominal(tree, c, need):
                self._collect(c, lca, skip, advantage, need, q, out)

    def _others(self, q: int, plan: Plan) -> list[int]:
        """The other queues a search may take workloads of (for the bound): those of its sources
        whose lowest priority is below the reclaim policy's limit."""
        st = self.state
        policy = st.partition.nodes[q].preemption
        limit = plan.prio if policy.reclaim_within_cohort == LOWER_PRIORITY else math.inf
        by_queue = st.running.by_queue
        return [c for c, _, _ in plan.sources if by_queue[c] and by_queue[c][0][0] < limit]

    def _walk(self, queues: list[int], job: JobRun, plan: Plan, reclaim: str, advantage: bool,
              lca: dict[int, int] | None = None, dead: set[int] | None = None,
              below: float = math.inf) -> Iterator[Candidate]:
        """Other queues' candidates for the job, merged in candidate order, lazily (LowerPriority:
        below the job's priority; and below ``below``), with their reasons (module docstring).
        A queue put in ``dead`` while the walk goes on gives no more candidates: a trial only
        releases workloads, so a queue no longer reclaimable stays so (Trial.minimal)."""
        st = self.state
        running, by_queue = st.running.jobs, st.running.by_queue
        policy = st.partition.nodes[st.queue(job)].preemption
        limit = min(plan.prio if reclaim == LOWER_PRIORITY else math.inf, below)
        forbidden = policy.borrow_within_cohort == NEVER
        threshold = policy.max_priority_threshold
        heap: list[tuple[tuple, int, Iterator[tuple]]] = []
        for c in queues:
            keys = iter(by_queue[c])
            first = next(keys, None)
            if first is not None:
                heap.append((first, c, keys))
        heapq.heapify(heap)
        while heap:
            key, c, keys = heap[0]
            if key[0] >= limit:
                return  # (priority ascending: none further qualifies)
            nxt = None if dead is not None and c in dead else next(keys, None)
            if nxt is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (nxt, c, keys))
            if dead is not None and c in dead:
                continue
            v = running[key[3]]
            held = st.held[v.job_id][1]
            if not uses(held, plan.need):
                continue
            at = NO_ANCESTOR if lca is None else lca[c]
            if advantage:
                yield v, IN_COHORT_RECLAMATION, at, False
            elif forbidden or key[0] >= plan.prio or threshold is not None and key[0] > threshold:
                yield v, IN_COHORT_RECLAMATION, at, True
            else:
                yield v, IN_COHORT_RECLAIM_WHILE_BORROWING, at, False

    def _classic(self, fit: Trial, job: JobRun, plan: Plan) -> list[tuple[JobRun, str]] | None:
        """Kueue's classical preemptions (module docstring): the attempts, each a walk over the
        candidates with the advantage, the other queues' others and the queue's own."""
        st = self.state
        q = fit.q
        reclaim = st.partition.nodes[q].preemption.reclaim_within_cohort
        lca = {c: a for c, a, _ in plan.sources}
        ahead = [c for c, _, adv in plan.sources if adv]
        behind = [c for c, _, adv in plan.sources if not adv]
        attempts = self._attempts(job, plan, ahead, behind)
        while_borrowing = self._while_borrowing(q, plan)
        # (the other queues each attempt may take from, for its bound: one that borrows only the
        # advantaged and those with a workload below while_borrowing)
        by_queue = st.running.by_queue
        borrowing_others = [c for c in ahead if by_queue[c]] + [
            c for c in behind if by_queue[c] and by_queue[c][0][0] < while_borrowing]
        every_other = [c for c in ahead + behind if by_queue[c]]
        for borrow in attempts:
            if self.bounds.quota_hopeless(q, plan, borrowing_others if borrow else every_other, borrow):
                continue
            if borrow and while_borrowing < math.inf and not self.bounds.room(fit, plan, ahead, behind, while_borrowing):
                continue  # (the search's room bound took every candidate: one that borrows may take fewer)
            dead: set[int] = set()
            walk = _chain(self._walk(ahead, job, plan, reclaim, True, lca, dead),
                          self._walk(behind, job, plan, reclaim, False, lca, dead,
                                     while_borrowing if borrow else math.inf),
                          ((v, IN_CLUSTER_QUEUE, NO_ANCESTOR, False) for v in plan.own))
            got = fit.minimal(walk, borrow, dead)
            if got:
                return got
        return None

    def _attempts(self, job: JobRun, plan: Plan, ahead: list[int], behind: list[int]) -> tuple[bool, ...]:
        """Whether each attempt, in order, may borrow (module docstring, "Attempts")."""
        policy = self.state.partition.nodes[self.state.queue(job)].preemption
        reclaim = policy.reclaim_within_cohort
        no_advantaged = next(self._walk(ahead, job, plan, reclaim, True), None) is None
        no_others = no_advantaged and next(self._walk(behind, job, plan, reclaim, False), None) is None
        forbidden = policy.borrow_within_cohort == NEVER
        if no_others or forbidden and not plan.under:
            return (True,)
        if forbidden and no_advantaged:
            return (False, True)
        return (True, False)

    def _while_borrowing(self, q: int, plan: Plan) -> float:
        """The priority from which the other queues' candidates without the advantage may be taken
        only by an attempt that does not borrow: at or above the job's, or above
        maxPriorityThreshold; all of them when borrowWithinCohort is Never. (Priority ascending,
        a borrowing attempt's walk stops there.)"""
        policy = self.state.partition.nodes[q].preemption
        if policy.borrow_within_cohort == NEVER:
            return -math.inf
        t = policy.max_priority_threshold
        return plan.prio if t is None or t >= plan.prio else t + 1

    def _own_candidates(self, job: JobRun, q: int, prio: int, within: str, need: frozenset) -> list[JobRun]:
        """The queue's own candidates, in candidate order."""
        if within == NEVER:
            return []
        st = self.state
        running = st.running.jobs
        out = []
        for key in st.running.by_queue[q]:
            if key[0] > prio or key[0] == prio and within != LOWER_OR_NEWER_EQUAL:
                break  # (priority ascending: none further qualifies)
            v = running[key[3]]
            if key[0] == prio and (v.spec.submit_s, v.seq) <= (job.spec.submit_s, job.seq):
                continue  # equal priority, not newer than the job
            if uses(st.held[v.job_id][1], need):
                out.append(v)
        return out

    def _other_queues(self, q: int, short: frozenset) -> list[int]:
        """The other queues of the cohort tree that borrow what the job needs (fair sharing's
        candidates' queues: Kueue's findCandidates)."""
        by_queue = self.state.running.by_queue
        return [c for c in self.tree_queues[self.root[q]] if c != q and by_queue[c] and not within_nominal(self.state.tree, c, short)]

def _fits_in_quota(tree: QuotaTree, i: int, requests: dict[tuple[str, str], int]) -> tuple[bool, dict[tuple[str, str], int]]:
    """Whether ``requests`` fit within node ``i``'s subtree quota now, and what is left of them
    past what the node keeps for itself (Kueue's QuantitiesFitInQuota, asked of each node up the
    path in turn)."""
    fits = True
    left: dict[tuple[str, str], int] = {}
    for fr, v in requests.items():
        if tree.subtree[i].get(fr, 0) < tree.usage[i].get(fr, 0) + v:
            fits = False
        left[fr] = max(0, v - local_available(tree, i, fr))
    return fits, left


def _chain(*walks: Iterator[Candidate]) -> Iterator[Candidate]:
    for walk in walks:
        yield from walk
