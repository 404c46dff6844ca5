"""The bounds a Kueue preemption search asks before it walks (kueue_preemption's docstring,
"Speed"): whether the job could be placed with every workload an attempt may take released (room),
and whether even every candidate evicted leaves its quota uncovered (quota). Each answers from a
superset of what a walk may take, so a refusal holds for every walk; the memos they keep are
theirs alone.

What a walk may take of another queue: its candidates in candidate order while the queue, and
every cohort between it and the common ancestor with the job's queue, is over nominal quota in
what the job needs (kueue_trial.reclaimable). The room bound follows both levels; the quota bound,
each queue's own.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from analysim.core.job import JobRun
from analysim.core.partition import LOWER_PRIORITY
from analysim.core.plugins.kueue_trial import (
    Plan,
    Trial,
    gpus_by_node,
    uses,
    whole_gpus_may_fit,
    whole_gpus_reach,
)

if TYPE_CHECKING:
    from analysim.core.plugins.kueue_state import KueueState


class SearchBounds:
    """The room and quota bounds of one partition's preemption searches, with their memos.

    Invariant: each memo entry is kept with the usage versions it read (``_capped``: in its key)
    and trusted only while they are the state's; each memo is cleared past its size bound, which
    bounds the memory, not the answers."""

    def __init__(self, state: KueueState) -> None:
        self.state = state  # the usage and running workloads the bounds read (the preemption's)
        # Other queues' candidates a walk may take at most (_reclaimed_by_walk): (queue, need,
        # priority limit) -> (the queue's usage version, the workloads, their GPUs per node)
        self._reclaimed: dict[tuple[int, frozenset, float],
                              tuple[int, list[tuple[tuple, JobRun]], list[JobRun], dict[int, int]]] = {}
        # _capped_by_cohorts' lists, by what each was made from: a cohort, what the job needs, its
        # children's (a queue's: its id, priority limit and version; a cohort's: this same key)
        # and its usage of what the job needs.
        self._capped: dict[tuple, list[tuple[tuple, JobRun]]] = {}
        # _released_by's answers: (queue, flavor-resource, priority limit) -> (the queue's usage
        # version, what a walk takes from it at most)
        self._released: dict[tuple[int, tuple[str, str], float], tuple[int, int]] = {}
        # What the last refusal of ``room`` by whole GPUs alone read: the fewest nodes the job spans,
        # the workloads counted as released and their GPUs per node; None after a pass, or after a
        # refusal by the exact check (kueue_room keeps the first kind).
        self.refuted: tuple[int, list[JobRun], dict[int, int]] | None = None

    def room(self, fit: Trial, plan: Plan, ahead: list[int], behind: list[int], below: float) -> bool:
        """Whether the job could be placed with every workload an attempt may take released (a
        superset of its targets): the queue's own candidates, and of each other queue, its
        candidates in its own order (below ``below`` for the queues without the advantage) up to
        the one that takes it back within its nominal quota in what the job needs, and of the
        queues under a cohort below the common ancestor, up to where that cohort is back within
        its own (the walk passes over the rest: Trial.minimal, _capped_by_cohorts). Releasing only adds free room and ``can_place`` asks for room,
        so when even that does not place the job, the attempt's walk would fail on the nodes after
        trying each of its candidates (on a busy cluster most searches end so)."""
        self.refuted = None
        if fit.mask is None or fit.ctx is None or not fit.ctx.shortcuts:
            return True
        if whole_gpus_may_fit(fit, {}) and fit.fits_as_is():
            return True  # (the nodes have room now: short of quota only, the usual case on an idle cluster)
        st = self.state
        limit = plan.prio if st.partition.nodes[fit.q].preemption.reclaim_within_cohort == LOWER_PRIORITY else math.inf
        released = list(plan.own)
        freed = gpus_by_node(plan.own)
        lca = {c: a for c, a, _ in plan.sources}
        parent = st.tree.parent
        # Per cohort between a source and its common ancestor with the job's queue: the capped
        # lists of its sources, to be merged there (_capped_by_cohorts).
        under: dict[int, list[tuple[tuple, list[tuple[tuple, JobRun]]]]] = {}
        stop: dict[int, int] = {}
        # Those same sources, each up to its own cap: its workloads and their GPUs per node (what
        # a refutation counts: _refuted_per_queue).
        beyond: list[tuple[list[JobRun], dict[int, int]]] = []
        for c, below_c in [(c, limit) for c in ahead] + [(c, min(limit, below)) for c in behind]:
            keyed, jobs, theirs = self._reclaimed_by_walk(c, plan.need, below_c)
            if parent[c] != lca[c]:
                under.setdefault(parent[c], []).append(((c, below_c, st.queue_versions[c]), keyed))
                stop[parent[c]] = lca[c]
                beyond.append((jobs, theirs))
                continue
            released += jobs
            _add(freed, theirs)
        direct: tuple[list[JobRun], dict[int, int]] | None = None  # (the above before the cohorts' caps)
        if under:
            direct = (list(released), dict(freed))
            capped = self._capped_by_cohorts(under, stop, plan.need)
            released += capped
            _add(freed, gpus_by_node(capped))
        reach, gang = whole_gpus_reach(fit, freed)
        if reach >= fit.job.spec.num_gpus and fit.nodes_fit(released):
            return True
        fit.nodes_mattered = True
        if reach < fit.job.spec.num_gpus:
            self.refuted = (gang, released, freed) if direct is None else self._refuted_per_queue(fit, *direct, beyond)
        return False

    def _refuted_per_queue(self, fit: Trial, released: list[JobRun], freed: dict[int, int],
                           beyond: list[tuple[list[JobRun], dict[int, int]]]) -> tuple[int, list[JobRun], dict[int, int]] | None:
        """A refusal that cohorts' caps made, as a refutation may keep it (None: none): with the
        sources below those cohorts released up to their own caps (``beyond``), not only as far as
        their cohort lets a walk take them. A cohort's cap does not only shrink when workloads
        stop: a source that leaves its cohort's merge (back within its quota) lets another
        source's later candidates into the cohort's share, which no replay of the changes since
        would count (kueue_room). ``released`` and ``freed``: the rest, which it extends."""
        for jobs, theirs in beyond:
            released += jobs
            _add(freed, theirs)
        reach, gang = whole_gpus_reach(fit, freed)
        return (gang, released, freed) if reach < fit.job.spec.num_gpus else None

    def _capped_by_cohorts(self, under: dict[int, list[tuple[tuple, list[tuple[tuple, JobRun]]]]],
                           stop: dict[int, int], need: frozenset) -> list[JobRun]:
        """What the walks may take of the sources below cohorts that are themselves below their
        common ancestor with the job's queue (``under``: such a cohort -> its sources' capped
        lists, each with what it was made from; ``stop``: the cohort -> that ancestor). A walk
        takes a candidate only while its queue and every cohort up to the common ancestor are over
        nominal quota in what the job needs (kueue_trial.reclaimable), so of a cohort's sources,
        merged in candidate order (the walk's: a cohort's sources all share one common ancestor,
        so one walk), it takes at most those up to the one that brings the cohort back within its
        nominal quota. Until the cohort stops them, each source gives its candidates in that order
        up to its own cap, so this prefix holds every candidate a walk may take. Deepest cohorts
        first, each over its children's capped lists; a cohort's list is kept while what it was
        made from (its children's, and its usage of what the job needs) is the same."""
        st = self.state
        tree, parent = st.tree, st.tree.parent
        out: list[JobRun] = []
        pending = {k: list(lists) for k, lists in under.items()}

        def depth(a: int) -> int:
            d = 0
            while parent[a] >= 0:
                a, d = parent[a], d + 1
            return d

        while pending:
            k = max(pending, key=lambda a: (depth(a), a))  # (its children below are done)
            children = pending.pop(k)
            usage = tree.usage[k]
            made_from = (k, need, tuple(sig for sig, _ in children), tuple(usage.get(fr, 0) for fr in sorted(need)))
            known = self._capped.get(made_from)
            if known is None:
                known = _up_to_within(st, k, need, _merged([keyed for _, keyed in children]))
                if len(self._capped) > 2_000:
                    self._capped.clear()  # (a bound on the memory, not on correctness: most are stale)
                self._capped[made_from] = known
            up = parent[k]
            if up == stop[k]:
                out += [v for _, v in known]
            else:
                stop[up] = stop[k]
                pending.setdefault(up, []).append((made_from, known))
        return out

    def _reclaimed_by_walk(self, c: int, need: frozenset, limit: float) -> tuple[list[tuple[tuple, JobRun]], list[JobRun],
                                                                                dict[int, int]]:
        """Another queue's candidates a walk may take at most, in its order: those below
        ``limit`` that use what the job needs, until the queue no longer borrows any of it; with
        the GPUs they hold per node. Kept while the queue's usage stays the same (its version):
        the many searches of a pass, and of the passes after, read the same few borrowers."""
        st = self.state
        version = st.queue_versions[c]
        key = (c, need, limit)
        known = self._reclaimed.get(key)
        if known is not None and known[0] == version:
            return known[1], known[2], known[3]
        tree = st.tree
        running, held = st.running.jobs, st.held
        borrowed = {fr: tree.usage[c].get(fr, 0) - tree.subtree[c].get(fr, 0) for fr in need}
        keyed: list[tuple[tuple, JobRun]] = []
        for k in st.running.by_queue[c]:
            if k[0] >= limit or all(b <= 0 for b in borrowed.values()):
                break
            charges = held[k[3]][1]
            if not uses(charges, need):
                continue
            keyed.append((k, running[k[3]]))
            for fr, a in charges:
                if fr in borrowed:
                    borrowed[fr] -= a
        if len(self._reclaimed) > 10_000:
            self._reclaimed.clear()  # (a bound on the memory: keys are queues x needs x limits)
        jobs = [v for _, v in keyed]
        entry = self._reclaimed[key] = (version, keyed, jobs, gpus_by_node(jobs))
        return entry[1], entry[2], entry[3]

    def quota_hopeless(self, q: int, plan: Plan, others: list[int], borrow: bool) -> bool:
        """Whether even every candidate evicted leaves the request uncovered, known without walking
        them: the own candidates' charges and what the ``others`` could give up (at least what
        their candidates hold) are taken off the quota tree at once, a few operations per queue,
        and the queue's ``available`` read then (which sees every limit of the tree: a cohort's
        borrowing limit stops a reclaim from a queue of another cohort helping). For an attempt
        that may not borrow, the request must also fit within the queue's nominal quota then
        (which only its own candidates can free)."""
        st = self.state
        tree = st.tree
        policy = st.partition.nodes[q].preemption
        wanted = {fr for fr, _ in plan.charges}
        taken: list[tuple[int, tuple[str, str], int]] = []
        for v in plan.own:
            for fr, a in st.held[v.job_id][1]:
                if fr in wanted:
                    taken.append((q, fr, a))
        one = len(plan.need) == 1  # (then a queue stops giving up fr once it stops borrowing fr)
        # (the loosest priority limit of the walks on others' candidates: the most they may take)
        limit = plan.prio if policy.reclaim_within_cohort == LOWER_PRIORITY else math.inf
        fair = st.partition.fair_sharing is not None
        for c in others:
            for fr in wanted:
                used = tree.usage[c].get(fr, 0)
                if used <= 0:
                    continue
                if one and fr in plan.need:
                    # Kueue evicts from c only while c borrows. Classic preemption walks c's
                    # candidates in their order up to the one that takes it under its quota (each
                    # queue's own order, whatever the merge across queues: whether c still borrows
                    # reads only c's usage); fair sharing, at most its borrowed part and one
                    # workload more (its walk is not checked against this one yet).
                    borrowed = used - tree.subtree[c].get(fr, 0)
                    if fair:
                        sizes = st.running.amounts[c].get(fr)
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
                if not borrow and tree.usage[q].get(fr, 0) + a > tree.nominal(q, fr):
                    return True  # (not even within nominal quota with all of its own gone)
            return False
        finally:
            for c, fr, a in reversed(taken):
                tree.add(c, fr, a)

    def _released_by(self, c: int, fr: tuple[str, str], borrowed: int, limit: float) -> int:
        """What a walk over every candidate takes from another queue ``c`` at most on ``fr``, the
        one resource short: its workloads that hold ``fr`` below ``limit``, in candidate order, until
        it no longer borrows (it borrows ``borrowed``), or until they run out. Kept while the
        queue's usage (which gives ``borrowed``) stays the same."""
        st = self.state
        version = st.queue_versions[c]
        key = (c, fr, limit)
        known = self._released.get(key)
        if known is not None and known[0] == version:
            return known[1]
        held = st.held
        taken = 0
        for k in st.running.by_queue[c]:
            if k[0] >= limit or taken >= borrowed:
                break
            for r, a in held[k[3]][1]:
                if r == fr:
                    taken += a
        if len(self._released) > 10_000:
            self._released.clear()  # (a bound on the memory)
        self._released[key] = (version, taken)
        return taken


def _up_to_within(st: KueueState, k: int, need: frozenset,
                  merged: list[tuple[tuple, JobRun]]) -> list[tuple[tuple, JobRun]]:
    """The prefix of ``merged`` (candidates of queues below cohort ``k``, in walk order) that a
    walk may take: each while ``k`` is still over its nominal quota in what the job needs, with
    the ones before it released. The releases are counted here, in what the job needs and on
    the path up to ``k`` only (the one usage the test reads), as QuotaTree.remove makes them
    (QuotaTree.given_back: a node gives its parent back only what it held past its guarantee)."""
    tree = st.tree
    parent, usage, sub_k = tree.parent, tree.usage, tree.subtree[k]
    # Per flavor-resource needed: how far k is over its quota with the prefix released, and the
    # usage of each node below k that a release changed (node -> its usage with the prefix released).
    over: dict[tuple[str, str], int] = {}
    released: dict[tuple[str, str], dict[int, int]] = {}
    still_over = 0  # how many of ``over`` are above 0: the walk may take the next candidate while any is
    for fr in need:
        over[fr] = usage[k].get(fr, 0) - sub_k.get(fr, 0)
        released[fr] = {}
        if over[fr] > 0:
            still_over += 1
    out: list[tuple[tuple, JobRun]] = []
    for entry in merged:
        if not still_over:
            break
        out.append(entry)
        c, held = st.held[entry[1].job_id]
        for fr, a in held:
            at = released.get(fr)
            if at is None:
                continue  # (one the job does not need: the test does not read it)
            i = c
            while i != k and a > 0:
                before = at.get(i)
                if before is None:
                    before = usage[i].get(fr, 0)
                at[i] = before - a
                a = tree.given_back(i, fr, before, a)
                i = parent[i]
            if i == k and a > 0:
                was = over[fr]
                over[fr] = was - a
                if was > 0 >= was - a:
                    still_over -= 1  # (k is within its quota in fr from here on)
    return out


def _merged(lists: list[list[tuple[tuple, JobRun]]]) -> list[tuple[tuple, JobRun]]:
    """Keyed candidate lists, each in walk order, merged into one in that order (their keys are
    unique). A sort of the runs, not heapq.merge: the sort merges them in C, where the merge's
    generator costs a Python step per candidate, and the cap takes most of them (Philly's first
    30,000 jobs under philly-preemption.yaml: 51 candidates a cohort, 36 taken)."""
    if len(lists) == 1:
        return lists[0]
    out = [entry for keyed in lists for entry in keyed]
    out.sort(key=_first)
    return out


def _first(entry: tuple[tuple, JobRun]) -> tuple:
    """A keyed candidate's key (the walk's merge order)."""
    return entry[0]


def _add(freed: dict[int, int], more: dict[int, int]) -> None:
    """Add GPUs per node to ``freed``."""
    for n, k in more.items():
        freed[n] = freed.get(n, 0) + k
