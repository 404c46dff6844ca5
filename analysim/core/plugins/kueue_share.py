"""Kueue's share of a ClusterQueue or cohort under fair sharing (Kueue's dominant resource share),
which orders admission across queues (kueue.KueueQueue) and chooses the targets of a fair-sharing
preemption (kueue_fair).

For a node of the tree with a parent, per resource, what it uses above its own quota summed over
flavors (``max(0, usage - subtree quota)`` per flavor), divided by what its parent's subtree could
lend of that resource (the parent's subtree quota summed over flavors); the largest of these over
resources, divided by the node's ``fairSharing.weight``. 0 for a node within its quota; a weight
of 0 makes any borrowing an infinite share. A root (or a ClusterQueue outside any cohort) has
share 0.
"""

from __future__ import annotations

import math

from analysim.core.partition import QuotaTree

Charges = tuple[tuple[tuple[str, str], int], ...]


class Shares:
    """Shares of the tree's nodes, from the quota tree's usage (read afresh: the tree changes on
    every charge and release, and with the trial evictions of a search). What it keeps is fixed
    by the partition: per node, ``by_resource``, ``lendable`` and ``weight`` have one entry each."""

    def __init__(self, tree: QuotaTree) -> None:
        self.tree = tree  # the quota tree whose usage the shares are of (KueueState's own)
        nodes = tree.partition.nodes
        self.weight = [n.weight for n in nodes]  # per node: its fairSharing.weight (the share's divisor)
        # Per node: its flavor-resources, grouped by resource; and what its parent could lend of
        # each resource (its parent's subtree quota summed over flavors, in base units; empty for a root).
        self.by_resource: list[dict[str, list[tuple[str, str]]]] = []
        self.lendable: list[dict[str, int]] = []  # (above) resource -> amount
        for i in range(len(nodes)):
            groups: dict[str, list[tuple[str, str]]] = {}
            for fr in tree.subtree[i]:
                groups.setdefault(fr[1], []).append(fr)
            self.by_resource.append(groups)
            p = tree.parent[i]
            lend: dict[str, int] = {}
            if p >= 0:
                for fr, v in tree.subtree[p].items():
                    lend[fr[1]] = lend.get(fr[1], 0) + v
            self.lendable.append(lend)

    def share(self, i: int, extra: Charges = ()) -> float:
        """Node ``i``'s share, with ``extra`` charged to it (a workload it would admit)."""
        tree = self.tree
        if tree.parent[i] < 0:
            return 0.0
        added: dict[tuple[str, str], int] = {}
        for fr, a in extra:
            added[fr] = added.get(fr, 0) + a
        most = 0.0
        for r, frs in self.by_resource[i].items():
            borrowed = sum(max(0, tree.usage[i].get(fr, 0) + added.get(fr, 0) - tree.subtree[i].get(fr, 0))
                           for fr in frs)
            if borrowed <= 0:
                continue
            lendable = self.lendable[i].get(r, 0)
            most = max(most, math.inf if lendable <= 0 else borrowed / lendable)
        if most == 0.0:
            return 0.0
        w = self.weight[i]
        return math.inf if w <= 0 else most / w
