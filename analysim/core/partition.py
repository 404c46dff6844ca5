"""The logical partition of a cluster: who may use how much of what, and who lends to whom.

One model that every partition format is read into (Kueue's ClusterQueues and Cohorts by
analysim.partitions.kueue; the cluster spec's VCs by ``from_vcs``; Volcano queues or Slurm
partitions later), and the one implementation of its quota arithmetic (``QuotaTree``).

The model is Kueue's, which is general enough for the others: a tree whose leaves are **queues**
(tenants' ClusterQueues, VCs) and whose inner nodes are **cohorts**; every node may hold quota,
per (flavor, resource) — a flavor being a set of nodes (analysim.partitions' readers map
Kueue's ResourceFlavor nodeLabels onto the cluster's nodes) — with three numbers:

- ``nominal``: what the node brings to the tree;
- ``borrowing_limit``: how much beyond what it brings it may take from its parent (None: no limit);
- ``lending_limit``: how much of what it brings its parent may hand to others (None: all of it).

Quantities are whole numbers in each resource's base unit (``UNITS``): GPUs in thousandths (a
GPU-sharing job asks for part of one), CPU in millicores, memory in bytes.

The arithmetic is Kueue's hierarchical cohorts (pkg/cache's resource nodes, re-stated here from its
documentation and semantics): a node's *guaranteed* quota is what it keeps from its parent,
``max(0, subtree - lending_limit)`` (0 without a lending limit); its *subtree quota* is its own
nominal plus what each child lends up (the child's subtree quota less its guaranteed part); its
*usage* is, for a queue, what its admitted jobs hold, and for a cohort the sum of its children's
usage past their guaranteed quota. A queue may take ``available(queue)`` more, where for a node
with a parent

    available(n) = max(0, guaranteed(n) - usage(n))
                   + min(available(parent(n)),
                         subtree(n) - guaranteed(n) - max(0, usage(n) - guaranteed(n)) + borrowing_limit(n))

(the ``min`` only with a borrowing limit), and ``subtree - usage`` at the root. A queue outside any
cohort is its own root: it gets its nominal quota and nothing more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from analysim.core.job import GPU_MILLI, JobSpec, by_fields

GPU = "nvidia.com/gpu"
CPU = "cpu"
MEMORY = "memory"
# The resources the cluster model has, and the base unit of each.
UNITS = {GPU: "milli-GPU", CPU: "millicore", MEMORY: "byte"}
MIB = 1 << 20
# What Kueue reports a quantity in (its metrics, resources.Amount.AsApproximateFloat64): GPUs, cores,
# bytes; a resource not named here in its quantity's own unit. Base units per reported unit:
PER_REPORTED_UNIT = {GPU: GPU_MILLI, CPU: 1000}
# The reported unit's name, per resource (None: the quantity's own unit).
REPORTED_UNITS = {GPU: "GPU", CPU: "core", MEMORY: "byte"}


def in_kubernetes_units(resource: str, amount: int) -> float:
    """A quantity in base units in Kubernetes' own (GPUs, cores, bytes): what Kueue reports."""
    return amount / PER_REPORTED_UNIT.get(resource, 1)


def requests_of(spec: JobSpec) -> dict[str, int]:
    """What a job asks for, per resource, in base units (resources it asks none of left out)."""
    out: dict[str, int] = {}
    gpu = spec.num_gpus * spec.gpu_milli
    if gpu:
        out[GPU] = gpu
    if spec.cpu_milli:
        out[CPU] = spec.cpu_milli
    if spec.memory_mib:
        out[MEMORY] = spec.memory_mib * MIB
    return out


@dataclass(frozen=True, slots=True)
class Quota:
    """A node's quota of one flavor-resource, in the resource's base units (requests_of)."""

    nominal: int  # what it is guaranteed (a cohort's: what it holds besides its children's)
    borrowing_limit: int | None = None  # None: may borrow whatever its parent has
    lending_limit: int | None = None  # None: lends all it does not use

    def __reduce__(self) -> tuple:
        return by_fields(self)


@dataclass(frozen=True, slots=True)
class Flavor:
    """A set of nodes that quota is kept for (Kueue's ResourceFlavor, resolved to node names)."""

    name: str  # what quotas and resource groups name
    nodes: tuple[str, ...]  # the cluster's nodes it stands for, by name

    def __reduce__(self) -> tuple:
        return by_fields(self)


@dataclass(frozen=True, slots=True)
class ResourceGroup:
    """Resources whose flavor is chosen together, and the flavors in the order they are tried."""

    resources: tuple[str, ...]  # resource names (GPU, CPU, MEMORY); each in one group of a queue at most
    flavors: tuple[str, ...]  # flavor names, in the order they are tried

    def __reduce__(self) -> tuple:
        return by_fields(self)


# Queueing strategies: a StrictFIFO queue's head that cannot be admitted blocks the jobs behind it;
# under BestEffortFIFO they may go past it.
STRICT_FIFO = "StrictFIFO"
BEST_EFFORT_FIFO = "BestEffortFIFO"

# Preemption policies (Kueue's ClusterQueue spec.preemption). NEVER everywhere is no preemption.
NEVER = "Never"
LOWER_PRIORITY = "LowerPriority"
LOWER_OR_NEWER_EQUAL = "LowerOrNewerEqualPriority"
ANY = "Any"
WITHIN_CLUSTER_QUEUE = (NEVER, LOWER_PRIORITY, LOWER_OR_NEWER_EQUAL)
RECLAIM_WITHIN_COHORT = (NEVER, LOWER_PRIORITY, ANY)
BORROW_WITHIN_COHORT = (NEVER, LOWER_PRIORITY)
# Fair sharing's preemption strategies (Kueue's Configuration fairSharing.preemptionStrategies),
# and its default list.
LESS_THAN_OR_EQUAL_TO_FINAL_SHARE = "LessThanOrEqualToFinalShare"
LESS_THAN_INITIAL_SHARE = "LessThanInitialShare"
FAIR_STRATEGIES = (LESS_THAN_OR_EQUAL_TO_FINAL_SHARE, LESS_THAN_INITIAL_SHARE)
# Flavor fungibility's preference (Kueue's flavorFungibility.preference): which of two flavors that
# both need borrowing or preemption wins — the one borrowing less far up the cohort tree, or the
# one with the better preemption mode (reclaim over preemption within the ClusterQueue).
BORROWING_OVER_PREEMPTION = "BorrowingOverPreemption"
PREEMPTION_OVER_BORROWING = "PreemptionOverBorrowing"


@dataclass(frozen=True, slots=True)
class Preemption:
    """A ClusterQueue's preemption policies (Kueue's spec.preemption; every default Never).
    ``max_priority_threshold``: borrowWithinCohort's, None when not given (any priority below the
    preemptor's)."""

    within_cluster_queue: str = NEVER  # one of WITHIN_CLUSTER_QUEUE: which of its own workloads it may evict
    reclaim_within_cohort: str = NEVER  # one of RECLAIM_WITHIN_COHORT: which borrowing queues' it may evict
    borrow_within_cohort: str = NEVER  # one of BORROW_WITHIN_COHORT: whether it may evict while borrowing
    max_priority_threshold: int | None = None  # borrowWithinCohort's (above)

    @property
    def enabled(self) -> bool:
        return (self.within_cluster_queue != NEVER or self.reclaim_within_cohort != NEVER
                or self.borrow_within_cohort != NEVER)

    def __reduce__(self) -> tuple:
        return by_fields(self)


NO_PREEMPTION = Preemption()


@dataclass(frozen=True, slots=True)
class FairSharing:
    """Kueue's Configuration ``fairSharing`` when enabled: the preemption strategies, in order."""

    strategies: tuple[str, ...] = FAIR_STRATEGIES  # each LESS_THAN_OR_EQUAL_TO_FINAL_SHARE or LESS_THAN_INITIAL_SHARE

    def __reduce__(self) -> tuple:
        return by_fields(self)


@dataclass(frozen=True, slots=True)
class PartitionNode:
    """A queue (a leaf: jobs are admitted to it) or a cohort (an inner node), with its quotas.

    ``quotas``: ((flavor, resource), Quota) pairs. For a queue, ``groups`` says which flavors of
    which resources it offers and in which order, ``strategy`` its queueing strategy, and
    ``try_next_flavor`` whether a flavor that fits only by borrowing is kept while the next ones
    are tried (Kueue's flavorFungibility.whenCanBorrow: TryNextFlavor; MayStopSearch by default),
    ``try_next_when_preempting`` the same for a flavor that fits only by preempting
    (whenCanPreempt: TryNextFlavor, Kueue's default; MayStopSearch stops there), ``preference``
    which flavor wins when none stops the search (kueue_flavors), ``preemption`` its preemption
    policies. ``weight`` is a node's fair-sharing weight
    (``fairSharing.weight``; read only with fair sharing on)."""

    name: str  # unique among the partition's nodes (ClusterQueue or Cohort name)
    is_queue: bool  # a ClusterQueue (a leaf), else a cohort
    parent: str | None = None  # its cohort's name (None: a root); the parents form a tree, no cycle
    quotas: tuple[tuple[tuple[str, str], Quota], ...] = ()  # (see above)
    groups: tuple[ResourceGroup, ...] = ()  # (a queue's; see above)
    strategy: str = BEST_EFFORT_FIFO  # STRICT_FIFO or BEST_EFFORT_FIFO (a queue's)
    try_next_flavor: bool = False  # whenCanBorrow: TryNextFlavor (above)
    preemption: Preemption = NO_PREEMPTION  # (a queue's)
    weight: float = 1.0  # fairSharing.weight, >= 0 (above)
    try_next_when_preempting: bool = True  # whenCanPreempt: TryNextFlavor (above)
    preference: str = BORROWING_OVER_PREEMPTION  # BORROWING_OVER_PREEMPTION or PREEMPTION_OVER_BORROWING

    def __reduce__(self) -> tuple:
        return by_fields(self)


@dataclass(frozen=True, slots=True)
class Partition:
    """A whole partition: the flavors, the tree, which queue each job's tenant submits to
    (``queue_of``: job VC -> queue name, Kueue's LocalQueue -> ClusterQueue) and the priority
    classes (name -> value; a job's ``qos`` names its class, 0 when it names none)."""

    flavors: tuple[Flavor, ...]  # every flavor the queues name
    nodes: tuple[PartitionNode, ...]  # the tree's nodes; node i of a QuotaTree is nodes[i]
    queue_of: tuple[tuple[str, str], ...]  # (job VC, queue name) pairs (above)
    priorities: tuple[tuple[str, int], ...] = ()  # (priority class, value) pairs (above)
    source: str = ""  # where it was read from (a YAML file's path, or "cluster VCs"), for messages
    fair_sharing: FairSharing | None = None  # (a Configuration with fairSharing.enable: true)

    @property
    def preempts(self) -> bool:
        """Whether any ClusterQueue may preempt (a policy other than Never). Fair sharing alone
        orders admission; its preemption reclaims through reclaimWithinCohort, as Kueue's does."""
        return any(n.preemption.enabled for n in self.nodes if n.is_queue)

    @property
    def lowest_priority(self) -> int:
        """The lowest priority any workload can have: of the priority classes, and 0 (a workload
        without one)."""
        return min([0, *(v for _, v in self.priorities)])

    def node(self, name: str) -> PartitionNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def queue_for(self, vc: str) -> str | None:
        for tenant, queue in self.queue_of:
            if tenant == vc:
                return queue
        return None

    def priority_of(self, spec: JobSpec) -> int:
        for name, value in self.priorities:
            if name == spec.qos:
                return value
        return 0

    def __reduce__(self) -> tuple:
        return by_fields(self)


class QuotaTree:
    """The partition's quota and usage, per node and (flavor, resource), as Kueue keeps them.

    Invariant (kept by add and remove): a node's usage is what was charged to it plus what its
    children use past what they are guaranteed (``guaranteed``); ``over_children`` counts, per
    node and flavor-resource, the children whose usage is above their subtree quota. Amounts are
    in the resource's base units (requests_of)."""

    def __init__(self, partition: Partition) -> None:
        self.partition = partition  # the tree's nodes, flavors and quotas (node i is partition.nodes[i])
        self.index: dict[str, int] = {n.name: i for i, n in enumerate(partition.nodes)}  # node name -> index
        if len(self.index) != len(partition.nodes):
            raise ValueError("two partition nodes share a name")
        # Per node: its parent's index (-1: a root).
        self.parent: list[int] = [-1 if n.parent is None else self.index[n.parent] for n in partition.nodes]
        self.children: list[list[int]] = [[] for _ in partition.nodes]  # per node: its children's indices
        for i, p in enumerate(self.parent):
            if p >= 0:
                self.children[p].append(i)
        self._check_acyclic()
        # Each (flavor, resource) the partition names, as one tuple object: every dict here and
        # every charge is keyed by these, so that a lookup finds its key by identity (a tuple
        # key equal but not identical is compared item by item, on every lookup).
        self.keys: dict[tuple[str, str], tuple[str, str]] = {}
        self.quota: list[dict[tuple[str, str], Quota]] = [  # per node: its own
            {self.keys.setdefault(fr, fr): q for fr, q in n.quotas} for n in partition.nodes]
        # Per node, resource group and flavor (in the group's order): the keys of the group's
        # resources in that flavor, in the group's order (kueue_flavors.choose charges these).
        self.group_keys: list[list[list[tuple[tuple[str, str], ...]]]] = [self._group_keys(n) for n in partition.nodes]
        # Per node: its subtree quota (its nominal plus what its children lend up: their subtree
        # quota past what they keep), fixed after __init__.
        self.subtree: list[dict[tuple[str, str], int]] = [{} for _ in partition.nodes]
        self.usage: list[dict[tuple[str, str], int]] = [{} for _ in partition.nodes]  # per node (above)
        # Per node and flavor-resource: how many of its children use more than their subtree
        # quota (borrow). Kept by add and remove. Another queue's workload can be reclaimed only
        # under such a child, so a preemption search whose path counts none has no candidate in
        # other queues, found without walking the tree (kueue_preemption).
        self.over_children: list[dict[tuple[str, str], int]] = [{} for _ in partition.nodes]
        for root in (i for i, p in enumerate(self.parent) if p < 0):
            self._sum_subtree(root)
        # Per node, flavor-resource -> what it keeps from its parent (``guaranteed``; absent: 0).
        # It reads the quotas and subtree quotas alone, fixed by now; every charge asks for it.
        self.kept: list[dict[tuple[str, str], int]] = self._table(self._guaranteed)
        # Per node, flavor-resource -> the most it could ever hold (``potential``; absent: 0), likewise.
        self.most: list[dict[tuple[str, str], int]] = self._table(self._potential)

    def _group_keys(self, node: PartitionNode) -> list[list[tuple[tuple[str, str], ...]]]:
        return [[tuple(self.keys.setdefault((f, r), (f, r)) for r in g.resources) for f in g.flavors]
                for g in node.groups]

    def _table(self, of: Callable[[int, tuple[str, str]], int]) -> list[dict[tuple[str, str], int]]:
        """Per node, ``of`` each flavor-resource of the tree, where it is not 0."""
        frs = [fr for fr in self.keys.values() if any(fr in sub for sub in self.subtree)]
        return [{fr: v for fr in frs if (v := of(i, fr))} for i in range(len(self.parent))]

    def _check_acyclic(self) -> None:
        for start in range(len(self.parent)):
            seen = {start}
            p = self.parent[start]
            while p >= 0:
                if p in seen:
                    raise ValueError(f"cohort {self.partition.nodes[p].name!r} is its own ancestor")
                seen.add(p)
                p = self.parent[p]

    def _sum_subtree(self, i: int) -> None:
        sub = self.subtree[i]
        for fr, q in self.quota[i].items():
            sub[fr] = q.nominal
        for c in self.children[i]:
            self._sum_subtree(c)
            for fr, v in self.subtree[c].items():
                sub[fr] = sub.get(fr, 0) + v - self._guaranteed(c, fr)

    def guaranteed(self, i: int, fr: tuple[str, str]) -> int:
        """What node ``i`` keeps from its parent: its subtree quota past its lending limit."""
        return self.kept[i].get(fr, 0)

    def _guaranteed(self, i: int, fr: tuple[str, str]) -> int:
        q = self.quota[i].get(fr)
        if q is None or q.lending_limit is None:
            return 0
        return max(0, self.subtree[i].get(fr, 0) - q.lending_limit)

    def available(self, i: int, fr: tuple[str, str], limited: bool = True) -> int:
        """How much more of ``fr`` node ``i`` may take now (negative when over-admitted, e.g. a
        quota lowered under running jobs); ``limited`` off: as if ``i`` had no borrowing limit of
        its own (what the limit keeps it from, kueue_reasons)."""
        sub, used = self.subtree[i].get(fr, 0), self.usage[i].get(fr, 0)
        p = self.parent[i]
        if p < 0:
            return sub - used
        guaranteed = self.guaranteed(i, fr)
        from_parent = self.available(p, fr)
        q = self.quota[i].get(fr)
        if limited and q is not None and q.borrowing_limit is not None:
            stored = sub - guaranteed  # what it lent up
            used_up = max(0, used - guaranteed)  # what it uses of the parent's
            from_parent = min(from_parent, stored - used_up + q.borrowing_limit)
        return max(0, guaranteed - used) + from_parent

    def potential(self, i: int, fr: tuple[str, str]) -> int:
        """The most of ``fr`` node ``i`` could ever hold (nothing else in use)."""
        return self.most[i].get(fr, 0)

    def _potential(self, i: int, fr: tuple[str, str]) -> int:
        p = self.parent[i]
        sub = self.subtree[i].get(fr, 0)
        if p < 0:
            return sub
        most = self._guaranteed(i, fr) + self._potential(p, fr)
        q = self.quota[i].get(fr)
        if q is not None and q.borrowing_limit is not None:
            most = min(most, sub + q.borrowing_limit)
        return most

    def add(self, i: int, fr: tuple[str, str], amount: int) -> None:
        """Charge ``amount`` to node ``i``; what passes its guaranteed quota counts in its parent."""
        before = self.usage[i].get(fr, 0)
        local = max(0, self.guaranteed(i, fr) - before)
        self.usage[i][fr] = before + amount
        p = self.parent[i]
        if p >= 0:
            self._count_over(i, p, fr, before)
            if amount > local:
                self.add(p, fr, amount - local)

    def remove(self, i: int, fr: tuple[str, str], amount: int) -> None:
        """Undo ``add``: the parent gives back what the node held of it."""
        before = self.usage[i].get(fr, 0)
        self.usage[i][fr] = before - amount
        p = self.parent[i]
        if p >= 0:
            self._count_over(i, p, fr, before)
            up = self.given_back(i, fr, before, amount)
            if up > 0:
                self.remove(p, fr, up)

    def given_back(self, i: int, fr: tuple[str, str], before: int, amount: int) -> int:
        """What a release of ``amount`` from node ``i``, which used ``before``, gives back to its
        parent: what the node held past its guarantee, at most ``amount`` (``remove``; and the
        preemption's cohort caps, which count releases without making them)."""
        return max(0, min(amount, before - self.guaranteed(i, fr)))

    def _count_over(self, i: int, p: int, fr: tuple[str, str], before: int) -> None:
        """Node ``i``'s usage of ``fr`` changed from ``before``: keep its parent's count of
        borrowing children."""
        sub = self.subtree[i].get(fr, 0)
        was, now = before > sub, self.usage[i][fr] > sub
        if was != now:
            counts = self.over_children[p]
            counts[fr] = counts.get(fr, 0) + (1 if now else -1)

    def nominal(self, i: int, fr: tuple[str, str]) -> int:
        q = self.quota[i].get(fr)
        return 0 if q is None else q.nominal

    def borrowing(self, i: int, fr: tuple[str, str]) -> int:
        """How much of ``fr`` node ``i`` uses past its own subtree quota (0 within it)."""
        return max(0, self.usage[i].get(fr, 0) - self.subtree[i].get(fr, 0))


def from_vcs(vcs: list[tuple[str, float | None]], total_gpus: int, allow_borrowing: bool,
             all_nodes: tuple[str, ...]) -> Partition:
    """The cluster spec's VC model as a partition: each VC with a quota is a queue with that nominal
    GPU quota in one cohort over the whole cluster, whose own quota is the shared pool (the GPUs no
    VC is guaranteed); borrowing off is a borrowing limit of 0. (Dedicated nodes are their own
    flavors in the VC model's engine path and not read here.)"""
    flavor = "default"
    fr = (flavor, GPU)
    nodes = []
    guaranteed = 0
    for name, quota in vcs:
        if quota is None:
            continue
        milli = round(quota * GPU_MILLI)
        guaranteed += milli
        nodes.append(PartitionNode(name, True, "cluster", ((fr, Quota(milli, None if allow_borrowing else 0)),),
                                   (ResourceGroup((GPU,), (flavor,)),)))
    shared = max(0, total_gpus * GPU_MILLI - guaranteed)
    nodes.append(PartitionNode("cluster", False, None, ((fr, Quota(shared)),)))
    return Partition((Flavor(flavor, all_nodes),), tuple(nodes), tuple((n.name, n.name) for n in nodes if n.is_queue),
                     source="cluster VCs")
