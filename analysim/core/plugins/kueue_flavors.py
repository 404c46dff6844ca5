"""Kueue's flavor assignment: which flavor of each resource group a workload gets, and how far up
the cohort tree it borrows (Kueue's pkg/scheduler/flavorassigner, re-stated from its documentation
"Flavor fungibility" and its code's rules; docs/kueue.md pins the release).

**Borrowing level.** How locally the quota a request needs is found: 0 when it fits within the
ClusterQueue's own nominal quota; else the height (the longest distance down to a leaf) of the
lowest cohort on its path whose subtree quota covers what is left of the request after each node
below it has given what it keeps for itself. The level ranks heads across ClusterQueues (fewer
levels first, KueueQueue) and flavors against each other (below).

**Modes.** Each flavor-resource of a request gets a mode, worst first: *no fit* (more than the
ClusterQueue could ever hold, or it would need preemption the policies cannot give), *no
candidates* (preemption could make room but a search finds no victims), *preempt* (victims found,
some in its own ClusterQueue), *reclaim* (victims found, all in other ClusterQueues), *fit* (free
quota now). A flavor's mode is its worst resource's. A resource that does not fit now is handed to
the preemption oracle (the post-filter's search on that one resource, ``Oracle``) when the queue's
nominal quota covers it, or the request would fit in a subtree below the root (reclaim in the
hierarchy), or the queue may preempt while borrowing (borrowWithinCohort, or fair sharing with
reclaimWithinCohort).

**Choice.** Per resource group, the flavors in order: the search stops at the first flavor that
fits without borrowing, or fits by borrowing under ``whenCanBorrow: MayStopSearch`` (the default),
or needs preemption with victims found under ``whenCanPreempt: MayStopSearch``; that flavor is
taken. Past the last flavor, the best one seen: modes first, then the lower borrowing level
(``preference: BorrowingOverPreemption``, the default), or the lower level first
(``PreemptionOverBorrowing``); a flavor without candidates below any with them; the earlier flavor
on a tie.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from analysim.core.partition import NEVER, PREEMPTION_OVER_BORROWING, QuotaTree

if TYPE_CHECKING:
    from analysim.core.job import JobRun
    from analysim.core.partition import PartitionNode

# Preemption modes, worst first (compared as ints).
NO_FIT: Final = 0
NO_CANDIDATES: Final = 1
PREEMPT: Final = 2
RECLAIM: Final = 3
FIT: Final = 4

# A mode with its borrowing level: (mode, level).
Mode = tuple[int, int]
WORST: Final[Mode] = (NO_FIT, sys.maxsize)
BEST: Final[Mode] = (FIT, 0)

# The preemption oracle: (job, queue, flavor-resource, amount) -> its mode (NO_CANDIDATES, PREEMPT or
# RECLAIM) and the borrowing level after the victims it found are gone.
Oracle = Callable[["JobRun", int, tuple[str, str], int], Mode]

Charges = tuple[tuple[tuple[str, str], int], ...]


def preferred(a: Mode, b: Mode, preference: str) -> bool:
    """Whether mode ``a`` is better than ``b`` under a ClusterQueue's flavor preference."""
    if a[0] == NO_FIT:
        return False
    if b[0] == NO_FIT:
        return True
    a_none, b_none = a[0] == NO_CANDIDATES, b[0] == NO_CANDIDATES
    if a_none != b_none:
        return b_none  # (a flavor whose search found no victims cannot admit now: below any that can)
    if preference == PREEMPTION_OVER_BORROWING:
        if a[1] != b[1]:
            return a[1] < b[1]
        return a[0] > b[0]
    if a[0] != b[0]:
        return a[0] > b[0]
    return a[1] < b[1]


def stops_search(m: Mode, node: PartitionNode) -> bool:
    """Whether a flavor of this mode ends the search (it is taken without looking further)."""
    if m[0] in (NO_FIT, NO_CANDIDATES):
        return False
    if m[0] in (PREEMPT, RECLAIM) and node.try_next_when_preempting:
        return False
    return not (m[1] > 0 and node.try_next_flavor)


class Heights:
    """Each tree node's height: the longest distance from it down to a leaf (a ClusterQueue 0, a
    cohort with any child at least 1), Kueue's measure of how far a borrowing level reaches."""

    def __init__(self, tree: QuotaTree) -> None:
        self.of: list[int] = [0] * len(tree.parent)  # per tree node: its height (fixed: the tree is)
        for i in range(len(tree.parent)):
            self.of[i] = self._height(tree, i)

    @staticmethod
    def _height(tree: QuotaTree, i: int) -> int:
        if tree.partition.nodes[i].is_queue:
            return 0
        h = min(len(tree.children[i]), 1)
        for c in tree.children[i]:
            if not tree.partition.nodes[c].is_queue:
                h = max(h, Heights._height(tree, c) + 1)
        return h


def local_available(tree: QuotaTree, i: int, fr: tuple[str, str]) -> int:
    """What node ``i`` keeps for itself of ``fr`` and does not use (its guaranteed part left)."""
    return max(0, tree.guaranteed(i, fr) - tree.usage[i].get(fr, 0))


def borrowing_level(tree: QuotaTree, heights: Heights, q: int, fr: tuple[str, str], amount: int) -> tuple[int, bool]:
    """The borrowing level of ``amount`` more of ``fr`` for queue ``q`` (module docstring), and
    whether the subtree that covers it lies below the root (so that the queue may reclaim in the
    hierarchy: Kueue's FindHeightOfLowestSubtreeThatFits)."""
    p = tree.parent[q]
    if tree.nominal(q, fr) >= tree.usage[q].get(fr, 0) + amount or p < 0:
        return 0, p >= 0
    remaining = amount - local_available(tree, q, fr)
    root = p
    while p >= 0:
        if tree.subtree[p].get(fr, 0) >= tree.usage[p].get(fr, 0) + remaining:
            return heights.of[p], tree.parent[p] >= 0
        remaining -= local_available(tree, p, fr)
        root = p
        p = tree.parent[p]
    return heights.of[root], False


def may_preempt_while_borrowing(node: PartitionNode, fair_sharing: bool) -> bool:
    pre = node.preemption
    return pre.borrow_within_cohort != NEVER or fair_sharing and pre.reclaim_within_cohort != NEVER


class Choice:
    """A workload's flavor assignment: one flavor per resource group its requests touch
    (``flavors``, in group order), what it charges, its borrowing level (the largest of its
    resources'), its mode (the worst of its flavors'), and the flavor-resources that need
    preemption (every one whose own mode is not FIT). Never changed once made. (A plain class, not
    a frozen dataclass, whose generated constructor runs as Python even in the compiled core: one
    is made at every flavor choice the memo does not answer.)"""

    __slots__ = ("flavors", "charges", "level", "mode", "need")

    def __init__(self, flavors: tuple[str, ...], charges: Charges, level: int, mode: int, need: frozenset) -> None:
        self.flavors: Final = flavors  # one per resource group touched, in group order
        self.charges: Final = charges  # ((flavor, resource), amount in base units) per resource asked for
        self.level: Final = level  # its borrowing level (0: within nominal quota)
        self.mode: Final = mode  # NO_FIT .. FIT (above)
        self.need: Final = need  # the (flavor, resource) pairs needing preemption


def resource_mode(tree: QuotaTree, heights: Heights, node: PartitionNode, q: int, fr: tuple[str, str], amount: int,
                  fair_sharing: bool, job: JobRun, oracle: Oracle | None) -> Mode:
    """The mode of ``amount`` of ``fr`` for queue ``q`` now (module docstring). Without an oracle a
    request that needs preemption is NO_CANDIDATES (what a queue that cannot preempt gets)."""
    if fr not in tree.quota[q] or amount > tree.potential(q, fr):
        return (NO_FIT, 0)
    level, below_root = borrowing_level(tree, heights, q, fr, amount)
    if amount <= tree.available(q, fr):
        return (FIT, level)
    if tree.nominal(q, fr) >= amount or below_root or may_preempt_while_borrowing(node, fair_sharing):
        return (NO_CANDIDATES, level) if oracle is None else oracle(job, q, fr, amount)
    return (NO_FIT, level)


def choose(tree: QuotaTree, heights: Heights, node: PartitionNode, q: int, requests: dict[str, int],
           fair_sharing: bool, job: JobRun, oracle: Oracle | None) -> Choice | None:
    """Kueue's flavor assignment for ``requests`` (module docstring); None when some resource group
    has no flavor but of mode NO_FIT (or a requested resource is in no group)."""
    flavors: list[str] = []
    charges: list[tuple[tuple[str, str], int]] = []
    need: list[tuple[str, str]] = []
    level, mode = 0, FIT
    covered = 0
    # (Index loops, not zip(..., strict=True), which the compiled core calls as a Python builtin
    # with keywords: about a quarter of a choice's instructions on Philly's queues. QuotaTree.group_keys
    # has one entry per group, and per flavor of it, by construction.)
    group_keys = tree.group_keys[q]
    for g, group in enumerate(node.groups):
        keys = group_keys[g]
        wanted = [(k, requests[r]) for k, r in enumerate(group.resources) if r in requests]
        if not wanted:
            continue
        covered += len(wanted)
        # (a group with one flavor has no choice to make: its preemption modes are left to the
        # post-filter's search, not asked of the oracle)
        ask = oracle if len(group.flavors) > 1 else None
        best: tuple[str, list[tuple[tuple[str, str], int, Mode]]] | None = None
        best_mode = WORST
        for j, f in enumerate(group.flavors):
            frs = keys[j]
            m: Mode = BEST
            per: list[tuple[tuple[str, str], int, Mode]] = []
            for k, amount in wanted:
                got = resource_mode(tree, heights, node, q, frs[k], amount, fair_sharing, job, ask)
                if preferred(m, got, node.preference):
                    m = got
                if m[0] == NO_FIT:
                    break
                per.append((frs[k], amount, got))
            if stops_search(m, node):
                best, best_mode = (f, per), m
                break
            if preferred(m, best_mode, node.preference):
                best, best_mode = (f, per), m
        if best is None or best_mode[0] == NO_FIT:
            return None
        flavors.append(best[0])
        mode = min(mode, best_mode[0])
        for fr, amount, m in best[1]:
            charges.append((fr, amount))
            level = max(level, m[1])
            if m[0] != FIT:
                need.append(fr)
    if covered < len(requests):
        return None
    return Choice(tuple(flavors), tuple(charges), level, mode, frozenset(need))
