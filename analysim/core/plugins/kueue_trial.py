"""One preemption search's trial (kueue_preemption): candidates evicted on the quota tree itself
and on a copy of the nodes, undone before the search returns, and whether the job then fits; with
the few quota-tree tests the walks share."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from analysim.core import placement
from analysim.core import victims as victim_search
from analysim.core.job import JobRun
from analysim.core.partition import QuotaTree

if TYPE_CHECKING:
    from analysim.core.cluster import ClusterState
    from analysim.core.framework import Handle
    from analysim.core.plugins.kueue_state import KueueState

Charges = tuple[tuple[tuple[str, str], int], ...]
# A candidate as the walk yields it: the workload, its reason, the lowest common ancestor of its
# queue and the preemptor's (-1 for the preemptor's own), and whether it may be taken only by an
# attempt that does not borrow.
Candidate = tuple[JobRun, str, int, bool]


def within_nominal(tree: QuotaTree, i: int, need: frozenset) -> bool:
    """Whether node ``i`` uses no more than its subtree quota of every flavor-resource of ``need``."""
    return all(tree.usage[i].get(fr, 0) <= tree.subtree[i].get(fr, 0) for fr in need)


def charge(st: KueueState, v: JobRun, sign: int) -> None:
    """Take a running workload's charges off the quota tree (sign -1) or put them back (+1)."""
    c, held = st.held[v.job_id]
    for fr, a in held:
        if sign < 0:
            st.tree.remove(c, fr, a)
        else:
            st.tree.add(c, fr, a)


def gpus_by_node(jobs: list[JobRun]) -> dict[int, int]:
    """The GPUs running jobs hold, per node (fractional ones counted whole)."""
    out: dict[int, int] = {}
    for v in jobs:
        for n, slots in v.placed.gpus:
            out[n] = out.get(n, 0) + len(slots)
    return out


def whole_gpus_may_fit(fit: Trial, freed: dict[int, int]) -> bool:
    """Whether a job of whole GPUs might fit once the GPUs ``freed`` (per node) are free, counting
    whole free GPUs alone (an upper bound: CPU and memory taken as enough; for a job on one node,
    every node as one it may use): a few additions, and for a gang one pass over the nodes, that
    settle most searches on a busy cluster before the exact check. Fractional jobs: always True."""
    return whole_gpus_reach(fit, freed)[0] >= fit.job.spec.num_gpus


def whole_gpus_reach(fit: Trial, freed: dict[int, int]) -> tuple[float, int]:
    """What whole_gpus_may_fit compares with the request: the most whole GPUs the job could reach
    once ``freed`` is free (inf for a fractional job, or one of no GPUs), with the fewest nodes
    it spans (1: one node)."""
    spec = fit.job.spec
    g = spec.num_gpus
    if spec.is_fractional or g == 0 or fit.ctx is None:
        return math.inf, 1
    state = fit.ctx.state
    full_free = state.full_free
    best = state.max_full_free()
    for n, k in freed.items():
        best = max(best, int(full_free[n]) + k)
    k_min = placement.gang_size(state, spec, fit.mask) if fit.mask is not None else 1
    if k_min <= 1:
        return best, 1
    reach = min(k_min * best, state.total_full_free + sum(freed.values()))
    if reach < g or fit.ctx.config.relaxed_locality:
        return reach, k_min  # (any number of nodes: the total above is the bound)
    # A gang spans its k_min nodes with the most (placement.gang_fits): the most whole GPUs any
    # k_min nodes could give, the nodes where GPUs are freed counted with them.
    assert fit.mask is not None
    full_free, up, mask = state.full_free, state.up, fit.mask
    counted: dict[int, int] = {}  # whole GPUs free -> nodes with that many counted with their freed GPUs
    most: list[int] = []
    for n, k in freed.items():
        if mask[n] and up[n]:
            v = int(full_free[n])
            counted[v] = counted.get(v, 0) + 1
            most.append(v + k)
    taken, level = 0, state.max_full_free()  # (the other nodes, the most first)
    while level > 0 and taken < k_min:
        more = min(state.nodes_with_full_free(level) - counted.get(level, 0), k_min - taken)
        most += [level] * more
        taken += more
        level -= 1
    most.sort(reverse=True)
    return min(reach, sum(most[:k_min])), k_min


def reclaimable(tree: QuotaTree, c: int, lca: int, need: frozenset) -> bool:
    """Whether another queue's candidate may still be taken: its queue, and every cohort between
    it and the lowest common ancestor, still over nominal quota in ``need``."""
    if within_nominal(tree, c, need):
        return False
    a = tree.parent[c]
    while a >= 0 and a != lca:
        if within_nominal(tree, a, need):
            return False
        a = tree.parent[a]
    return True


class Trial:
    """One search's trial: evicts candidates on the quota tree itself (undone before the search
    returns) and on a copy of the nodes, and tells whether the job then fits. Without a mask, the
    quota alone (the oracle's trial).

    Invariant: between its calls the quota tree is as the search found it, but for the
    candidates the search has released and not restored (release and restore pair up); an
    entry of ``borrowing`` is dropped whenever its queue's usage changes, so one kept holds."""

    def __init__(self, state: KueueState, job: JobRun, q: int, charges: Charges, mask: np.ndarray | None,
                 short: frozenset, ctx: Handle | None) -> None:
        self.state = state  # whose quota tree it evicts on (and puts back)
        self.job = job  # the preemptor
        self.q = q  # its ClusterQueue
        self.charges = charges  # what it would charge, on the flavors chosen
        self.mask = mask  # the nodes it may use (None: the quota alone)
        self.ctx = ctx  # the engine's nodes (None: the quota alone, as with no mask)
        self.short = short  # the flavor-resources needing preemption
        self.borrowing: dict[int, bool] = {}  # other queues' "still borrows", while nothing of theirs is released
        # Whether the quota fitted at some point and the nodes did not (a failure the engine's
        # failure memo keeps, not the plugin's, which reads only the usage)
        self.nodes_mattered = False
        # Whether the job fits on the nodes as they are, nothing released (None: not asked yet).
        # Placement is monotone in free capacity, so when it does, every trial's nodes fit: a
        # search that is short of quota only (the usual case where nodes are plenty) then
        # never copies the cluster.
        self._fits_as_is: bool | None = None

    def fits_as_is(self) -> bool:
        got = self._fits_as_is
        if got is None:
            assert self.ctx is not None and self.mask is not None
            got = self._fits_as_is = placement.can_place(self.ctx, self.job.spec, self.mask, self.ctx.state)
        return got

    def quota_fits(self, allow_borrowing: bool) -> bool:
        tree = self.state.tree
        q = self.q
        for fr, a in self.charges:
            if tree.available(q, fr) < a:
                return False
            if not allow_borrowing and tree.usage[q].get(fr, 0) + a > tree.nominal(q, fr):
                return False
        return True

    def nodes_fit(self, evicted: list[JobRun]) -> bool:
        if self.mask is None or self.ctx is None or self.fits_as_is():
            return True
        return placement.can_place_released(self.ctx, self.job.spec, self.mask, self.ctx.state, evicted)

    def fits_now(self, evicted: list[JobRun], allow_borrowing: bool = True) -> bool:
        """With ``evicted`` released on the tree already: whether the quota and the nodes fit."""
        if not self.quota_fits(allow_borrowing):
            return False
        fits = self.nodes_fit(evicted)
        if not fits:
            self.nodes_mattered = True
        return fits

    def still_borrows(self, c: int) -> bool:
        got = self.borrowing.get(c)
        if got is None:
            got = self.borrowing[c] = not within_nominal(self.state.tree, c, self.short)
        return got

    def release(self, v: JobRun) -> None:
        charge(self.state, v, -1)
        self.borrowing.pop(self.state.held[v.job_id][0], None)

    def restore(self, v: JobRun) -> None:
        charge(self.state, v, 1)
        self.borrowing.pop(self.state.held[v.job_id][0], None)

    def minimal(self, candidates: Iterator[Candidate], allow_borrowing: bool,
                dead: set[int]) -> list[tuple[JobRun, str]] | None:
        """Kueue's minimal preemptions over ``candidates`` (module docstring): the targets with
        their reasons, or None. The quota tree is as it was when this returns. Another queue
        found no longer reclaimable goes into ``dead`` (the walks then leave its candidates out:
        the trial only releases, so it stays so)."""
        st, q = self.state, self.q
        targets: list[tuple[JobRun, str]] = []
        trial: ClusterState | None = None
        found = False
        try:
            for v, reason, lca, without_borrowing in candidates:
                c = st.held[v.job_id][0]
                if c != q:
                    if allow_borrowing and without_borrowing:
                        continue  # (may be taken only by an attempt that does not borrow)
                    if not reclaimable(self.state.tree, c, lca, self.short):
                        dead.add(c)  # (it, or a cohort up to the common ancestor, no longer over nominal)
                        continue
                self.release(v)
                targets.append((v, reason))
                if not self.quota_fits(allow_borrowing):
                    continue
                if self.mask is None or self.ctx is None or self.fits_as_is():
                    found = True
                    break
                # (The job did not fit as is, nor before v was released: only the nodes released
                # since can take it.)
                if trial is None:
                    trial = self.ctx.state.clone()
                    for t, _ in targets:
                        placement.release_on(trial, t)
                    changed = {n for t, _ in targets for n, _ in t.placed.gpus}
                else:
                    placement.release_on(trial, v)
                    changed = {n for n, _ in v.placed.gpus}
                if placement.can_place_on(self.ctx, self.job.spec, self.mask, trial, changed):
                    found = True
                    break
            if not found:
                if trial is not None:
                    self.nodes_mattered = True
                return None
            return self.fill_back(targets, allow_borrowing)
        finally:
            for t, _ in targets:
                self.restore(t)

    def fill_back(self, targets: list[tuple[JobRun, str]], allow_borrowing: bool) -> list[tuple[JobRun, str]]:
        """With every target released on the tree: from the next-to-last back, spare each target
        the job does not need (victims.reprieved); the targets kept, with their reasons. The
        tree is left with every target released, as it was given."""
        spared: list[JobRun] = []

        def spare(v: JobRun, evicted: list[JobRun]) -> bool:
            self.restore(v)  # (on top of those spared before it: the tree is the trial's)
            if self.quota_fits(allow_borrowing) and self.nodes_fit(evicted):
                spared.append(v)
                return True
            self.release(v)
            return False
        jobs = [t for t, _ in targets]
        try:
            kept = victim_search.reprieved(jobs[-1], jobs[:-1], spare)
        finally:
            for v in spared:
                self.release(v)
        reason_of = {t.job_id: r for t, r in targets}
        return [(t, reason_of[t.job_id]) for t in kept]


def uses(held: Charges, short: frozenset) -> bool:
    """Whether a workload's charges touch any of the flavor-resources ``short``."""
    return any(fr in short for fr, _ in held)


@dataclass(slots=True)
class Plan:
    """One search: what the job charges, the flavor-resources needing preemption, the job's
    priority, whether its queue is under nominal quota (strictly) in all of them, its own
    candidates (in candidate order) and the other queues that may give candidates (with their
    lowest common ancestor and whether the job has the advantage over them)."""

    charges: Charges  # ((flavor, resource), amount) on the flavors chosen
    need: frozenset  # the (flavor, resource) pairs needing preemption
    prio: int  # the job's priority
    under: bool  # (above)
    own: list[JobRun]  # (above)
    sources: list[tuple[int, int, bool]]  # (queue, lowest common ancestor, advantage), above
