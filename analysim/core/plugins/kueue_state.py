"""What Kueue's plugins share (kueue, kueue_preemption, kueue_fair, kueue_trial, kueue_reasons):
the quota tree's usage and what each running workload is charged (``KueueState``), each queue's
running workloads in Kueue's preemption candidate order (``Running``), and the requeues of the
control plane's inadmissible pool (``Requeues``). It imports none of those modules, so each of
them imports it and nothing imports back."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import numpy as np
from sortedcontainers import SortedList  # type: ignore[import-untyped, import-not-found]

from analysim.core.job import JobRun
from analysim.core.partition import PREEMPTION_OVER_BORROWING, Partition, QuotaTree, requests_of
from analysim.core.plugins import kueue_flavors
from analysim.core.plugins.kueue_flavors import FIT, Heights
from analysim.core.plugins.kueue_room import Changes

if TYPE_CHECKING:
    from analysim.core.framework import Handle
    from analysim.core.plugins.kueue_flavors import Choice, Oracle
    from analysim.core.plugins.kueue_share import Shares


# Kueue's reasons for a preemption (kueue_preemption, kueue_fair).
IN_CLUSTER_QUEUE: Final = "InClusterQueue"
IN_COHORT_RECLAMATION: Final = "InCohortReclamation"
IN_COHORT_FAIR_SHARING: Final = "InCohortFairSharing"
IN_COHORT_RECLAIM_WHILE_BORROWING: Final = "InCohortReclaimWhileBorrowing"


class Running:
    """Each queue's running workloads in Kueue's preemption candidate order: lowest priority
    first, then most recently admitted first, kept on every charge and release so that a victim
    search walks them in order and stops when the job fits.

    Invariant: ``jobs`` and ``key`` have the same job ids, those of the workloads in ``by_queue``;
    ``key[j]`` is in ``by_queue`` of the queue ``j`` is charged to, and ``amounts[q][fr]`` holds
    one entry per charge of ``fr`` by a workload of queue ``q``."""

    def __init__(self, queues: int) -> None:
        # Per tree node (only queues' are filled): its running workloads' keys, sorted, as
        # (priority, -admitted at in seconds, -seq, job id): candidate order.
        self.by_queue: list[SortedList] = [SortedList() for _ in range(queues)]
        self.key: dict[str, tuple[int, float, int, str]] = {}  # job id -> its key in by_queue
        self.jobs: dict[str, JobRun] = {}  # job id -> the running job (what by_queue's keys name)
        # Per queue and flavor-resource, the amounts its running workloads are charged (in the
        # resource's base units: partition.requests_of), sorted: the largest bounds what one eviction frees (kueue_preemption).
        self.amounts: list[dict[tuple[str, str], SortedList]] = [{} for _ in range(queues)]

    def add(self, job: JobRun, q: int, priority: int, now: float,
            charges: tuple[tuple[tuple[str, str], int], ...]) -> None:
        """Queue ``q`` admitted ``job`` at ``now`` with ``priority``, charged ``charges``."""
        key = (priority, -now, -job.seq, job.job_id)
        self.key[job.job_id] = key
        self.by_queue[q].add(key)
        self.jobs[job.job_id] = job
        amounts = self.amounts[q]
        for fr, amount in charges:
            got = amounts.get(fr)
            if got is None:
                got = amounts[fr] = SortedList()
            got.add(amount)

    def remove(self, job: JobRun, q: int, charges: tuple[tuple[tuple[str, str], int], ...]) -> None:
        """The job, added to queue ``q`` with ``charges``, no longer runs."""
        self.by_queue[q].remove(self.key.pop(job.job_id))
        del self.jobs[job.job_id]
        amounts = self.amounts[q]
        for fr, amount in charges:
            amounts[fr].remove(amount)


class Requeues:
    """The requeues of the control plane's inadmissible pool, per cohort tree (by its root's
    index): a release of quota in a tree asks for one, due ``requeue_batch_s`` later; a parked
    workload comes back when its tree's count has risen since it was parked (KueueQueue.parked).

    Invariant: ``due[r]`` is None or the time a requeue of tree ``r`` falls due; at most one is
    due per tree, and ``count[r]`` only rises."""

    def __init__(self, nodes: int) -> None:
        self.count: list[int] = [0] * nodes  # per tree root: the requeues counted so far
        self.due: list[float | None] = [None] * nodes  # per tree root: when the next is due (s); None: none asked
        self.releases = 0  # releases of quota anywhere (what a workload parked for want of nodes waits on)

    def ask(self, root: int, now: float, batch_s: float) -> float | None:
        """Quota was released in tree ``root``: its inadmissible workloads come back ``batch_s``
        later (the time, for a pass then), unless a requeue is due already (None)."""
        if self.due[root] is not None:
            return None
        due = self.due[root] = now + batch_s
        return due

    def counted(self, root: int, now: float) -> int:
        """The requeues of tree ``root`` by ``now``, counting the one due if it is."""
        due = self.due[root]
        if due is not None and due <= now:
            self.count[root] += 1
            self.due[root] = None
        return self.count[root]

    def by(self, root: int, now: float) -> int:
        """What ``counted`` would answer, without counting a due requeue (a question, not a step)."""
        due = self.due[root]
        return self.count[root] + (1 if due is not None and due <= now else 0)


# What assign gives of a flavor assignment that fits: the flavors, the charges, the borrowing level.
Admissible = tuple[tuple[str, ...], tuple[tuple[tuple[str, str], int], ...], int]


class Assignments:
    """Kueue's flavor assignment of a partition's jobs now (kueue_flavors.choose), with a memo per
    queue and request: most waiting jobs share a few shapes, asked again and again while their
    cohort tree stands (a change in one tree leaves the others' answers standing: Kueue's
    large-scale scenario has ten).

    Invariant: an entry holds its tree's version when it was made, and stands while it does. Never
    asked while a search has taken charges off the tree (kueue_trial), which leaves the versions as
    they were."""

    def __init__(self, partition: Partition, tree: QuotaTree, heights: Heights, root: list[int],
                 tree_versions: list[int]) -> None:
        self.partition = partition  # the ClusterQueues and their groups
        self.tree = tree  # the quota tree whose usage a choice reads (KueueState's)
        self.heights = heights  # its heights, for the borrowing level
        self.root = root  # per tree node: its cohort tree's root (KueueState's)
        self.tree_versions = tree_versions  # per cohort tree: its changes so far (KueueState's, read only)
        # Per tree node: a ClusterQueue whose every resource group has one flavor (its choice has
        # nothing to ask the oracle: kueue_flavors.choose asks it to rank flavors).
        self.one_flavor: list[bool] = [n.is_queue and all(len(g.flavors) == 1 for g in n.groups) for n in partition.nodes]
        # Per tree node: whether its choice asks the preemption oracle even when a flavor fits: a
        # flavor that needs preemption may then win (whenCanPreempt: MayStopSearch stops at it;
        # PreemptionOverBorrowing may rank it above a borrowing fit). False for cohorts.
        self.asks_oracle: list[bool] = [
            n.is_queue and n.preemption.enabled and not self.one_flavor[i]
            and (not n.try_next_when_preempting or n.preference == PREEMPTION_OVER_BORROWING)
            for i, n in enumerate(partition.nodes)]
        # Per queue: request -> (its tree's version, the choice without the oracle, what assign
        # makes of it); the choice is what a one-flavor queue's search reads too.
        self._answers: list[dict[tuple, tuple[int, Choice | None, Admissible | None]]] = [{} for _ in partition.nodes]

    def assign(self, job: JobRun, q: int, oracle: Oracle | None) -> Admissible | None:
        """KueueState.assign for a job of queue ``q``."""
        if self.asks_oracle[q]:
            return _admissible(self._choose(job, q, oracle))
        return self._answer(job, q)[1]

    def choose(self, job: JobRun, q: int, oracle: Oracle | None) -> Choice | None:
        """KueueState.choose for a job of queue ``q``: from the memo where the oracle is never asked."""
        if self.one_flavor[q]:
            return self._answer(job, q)[0]
        return self._choose(job, q, oracle)

    def _answer(self, job: JobRun, q: int) -> tuple[Choice | None, Admissible | None]:
        """The choice without the oracle and what assign makes of it, made afresh unless the memo
        has them at the tree's version."""
        request = job.spec.request
        version = self.tree_versions[self.root[q]]
        memo = self._answers[q]
        got = memo.get(request)
        if got is not None and got[0] == version:
            return got[1], got[2]
        choice = self._choose(job, q, None)
        answer = _admissible(choice)
        memo[request] = (version, choice, answer)
        return choice, answer

    def _choose(self, job: JobRun, q: int, oracle: Oracle | None) -> Choice | None:
        return kueue_flavors.choose(self.tree, self.heights, self.partition.nodes[q], q, requests_of(job.spec),
                                    self.partition.fair_sharing is not None, job, oracle)


class KueueState:
    """What the plugins read: the partition, its quota tree, each queue's flavors as node masks,
    which flavors each running job holds (``held``), each queue's running workloads in candidate
    order (``running``), and the evictions by Kueue's reason (``reasons`` per job, ``preempted``
    per preempting queue and reason).

    Invariant: ``tree``'s usage is the sum of the charges in ``held``, outside a preemption
    search's trial (kueue_trial: it takes charges off and puts them back before it returns);
    ``held`` and ``running`` name the same jobs; every charge or release bumps ``version``, the
    queue's ``queue_versions`` and its tree's ``tree_versions`` (so a reading stamped with one of
    them stands while it does)."""

    def __init__(self, partition: Partition, node_names: list[str]) -> None:
        self.partition = partition  # the ClusterQueues, cohorts and flavors (tree node i is partition.nodes[i])
        self.tree = QuotaTree(partition)  # quota and usage per tree node and flavor-resource
        where = {n: i for i, n in enumerate(node_names)}
        self.flavor_mask: dict[str, np.ndarray] = {}  # flavor -> its nodes, a mask over the cluster's
        for f in partition.flavors:
            mask = np.zeros(len(node_names), dtype=bool)
            mask[[where[n] for n in f.nodes]] = True
            self.flavor_mask[f.name] = mask
        # (static key, flavors) -> (the static mask, the nodes of those flavors in it): nodes_of's,
        # made once, for a waiting job's admission is asked pass after pass and each ``&`` makes an
        # array. A node event makes a new static mask (NodeViews), which an entry is checked against.
        self._nodes: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self.queue_of: dict[str, int] = {vc: self.tree.index[q] for vc, q in partition.queue_of}  # VC -> its queue
        self.priority: dict[str, int] = dict(partition.priorities)  # priority class (a job's qos) -> priority
        self.heights = Heights(self.tree)  # the tree's heights, for the flavor choice (kueue_flavors)
        self.held: dict[str, tuple[int, tuple[tuple[tuple[str, str], int], ...]]] = {}  # job -> (queue, charges)
        self.version = 0  # bumped by every charge and release
        # Per tree node: its cohort tree's root's index (a root's is its own). The tree versions
        # and the requeues are kept per root.
        self.root: list[int] = [self._root(i) for i in range(len(partition.nodes))]
        # Per cohort tree (by its root's index): a version bumped by every charge and release in
        # it. A flavor choice reads the usage of its queue's tree only.
        self.tree_versions: list[int] = [0] * len(partition.nodes)
        # Kueue's flavor assignment of a job now, with its memo (it reads the versions above)
        self.assignments = Assignments(partition, self.tree, self.heights, self.root, self.tree_versions)
        # Job id -> (queue, charges, flavors) of its admission, from admit to its launch right after.
        self.chosen: dict[str, tuple[int, tuple[tuple[tuple[str, str], int], ...], tuple[str, ...]]] = {}
        # The preemption oracle (kueue_preemption sets it), which a flavor choice may ask how a
        # flavor would preempt (Assignments.asks_oracle)
        self.oracle: Oracle | None = None
        # Whether a preemption search for a job surely finds nothing now, from counts on the quota
        # tree (kueue_preemption sets it): such a job waits as in a queue that does not preempt.
        self.no_candidate: Callable[[JobRun], bool] | None = None
        # The flavors a preemption chose for a job, until the job is admitted on them right after.
        self.after_preemption: dict[str, tuple[tuple[str, ...], tuple[tuple[tuple[str, str], int], ...], int]] = {}
        self.queue_versions: list[int] = [0] * len(partition.nodes)  # per queue: bumped by its charges and releases
        # The queues charged or released since the usage meter (queue_metrics.QueueMeter, its one
        # reader, which empties it) last read them: a read costs the queues that changed, not all
        # of them (Kueue's large-scale scenario has a thousand).
        self.changed: set[int] = set()
        self.running = Running(len(partition.nodes))  # each queue's running workloads, in candidate order
        # Evictions by reason: per evicted job (reason -> count; read and dropped when it ends),
        # and per (preempting queue's name, reason) -> count.
        self.reasons: dict[str, dict[str, int]] = {}
        self.preempted: dict[tuple[str, str], int] = {}  # (above)
        self.shares: Shares | None = None  # fair sharing's, when the partition turns it on (policies)
        self.requeues = Requeues(len(partition.nodes))  # the control plane's requeues, per cohort tree
        # The launches and stops in the order ``version`` counts them, which the room refutations of
        # preemption searches are replayed against (kueue_room); kept only where a queue may preempt.
        self.changes: Changes | None = None
        if partition.preempts:
            self.changes = Changes(partition.lowest_priority)

    def _root(self, i: int) -> int:
        while self.tree.parent[i] >= 0:
            i = self.tree.parent[i]
        return i

    def priority_of(self, job: JobRun) -> int:
        return self.priority.get(job.spec.qos, 0)

    def record_eviction(self, victim: JobRun, preempting_queue: int, reason: str) -> None:
        """A victim is about to be evicted for a workload of ``preempting_queue``, for ``reason``."""
        mine = self.reasons.setdefault(victim.job_id, {})
        mine[reason] = mine.get(reason, 0) + 1
        key = (self.partition.nodes[preempting_queue].name, reason)
        self.preempted[key] = self.preempted.get(key, 0) + 1

    def queue(self, job: JobRun) -> int:
        return self.queue_of[job.spec.vc]

    def nodes_of(self, job: JobRun, flavors: tuple[str, ...], ctx: Handle) -> np.ndarray:
        """The nodes of ``flavors`` open to the job (its static mask): one array for every job of
        its static key, read only, as the static mask is."""
        base = ctx.static_mask(job.spec)
        if not flavors:
            return base
        key = (ctx.static_key(job.spec), flavors)
        known = self._nodes.get(key)
        if known is not None and known[0] is base:
            return known[1]
        mask = base
        for f in flavors:
            mask = mask & self.flavor_mask[f]
        self._nodes[key] = (base, mask)
        return mask

    def assign(self, job: JobRun) -> Admissible | None:
        """The flavors Kueue would admit the job on now (one per resource group its requests touch),
        what it would charge, and its borrowing level (0: within nominal quota); None when its
        flavor assignment does not fit now (kueue_flavors)."""
        return self.assignments.assign(job, self.queue(job), self.oracle)

    def choose(self, job: JobRun, oracle: Oracle | None) -> Choice | None:
        """Kueue's flavor assignment for the job now, fitting or not (kueue_flavors.choose)."""
        return self.assignments.choose(job, self.queue(job), oracle)

    def charge(self, job: JobRun, q: int, charges: tuple[tuple[tuple[str, str], int], ...], now: float = 0.0) -> None:
        over_before = self._cohorts_over(q, charges) if self.changes is not None else 0
        for fr, amount in charges:
            self.tree.add(q, fr, amount)
        self.held[job.job_id] = (q, charges)
        self.version += 1
        self.queue_versions[q] += 1
        self.tree_versions[self.root[q]] += 1
        self.changed.add(q)
        priority = self.priority_of(job)
        self.running.add(job, q, priority, now, charges)
        if self.changes is not None:
            contained = self._cohorts_over(q, charges) == over_before
            self.changes.launched(job, q, priority, now, self.version, contained)

    def _cohorts_over(self, q: int, charges: tuple[tuple[tuple[str, str], int], ...]) -> int:
        """How many (cohort, flavor-resource) pairs, of the cohorts on queue ``q``'s path below its
        root and the flavor-resources of ``charges``, are over the cohort's subtree quota. A launch
        that leaves the count as it was (usage only grows, so no cohort crossed into borrowing)
        makes no other queue's workloads candidates of a walk that were not (kueue_room)."""
        tree = self.tree
        frs = [fr for fr, a in charges if a > 0]
        over = 0
        a = tree.parent[q]
        while a >= 0 and tree.parent[a] >= 0:
            usage, subtree = tree.usage[a], tree.subtree[a]
            over += sum(1 for fr in frs if usage.get(fr, 0) > subtree.get(fr, 0))
            a = tree.parent[a]
        return over

    def release(self, job: JobRun) -> None:
        held = self.held.pop(job.job_id, None)
        if held is None:
            return
        q, charges = held
        for fr, amount in charges:
            self.tree.remove(q, fr, amount)
        self.requeues.releases += 1
        self.version += 1
        self.queue_versions[q] += 1
        self.tree_versions[self.root[q]] += 1
        self.changed.add(q)
        self.running.remove(job, q, charges)
        if self.changes is not None:
            self.changes.stopped(job)


def _admissible(choice: Choice | None) -> Admissible | None:
    """A flavor assignment that fits now, as assign gives it (flavors, charges, level); else None."""
    return None if choice is None or choice.mode != FIT else (choice.flavors, choice.charges, choice.level)
