"""The cluster model: physical topology (racks, nodes, GPUs) and logical partition (virtual clusters),
and the mutable allocation state the engine keeps over it."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from analysim.core.job import GPU_MILLI, by_fields
from analysim.core.partition import Partition


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One machine. Its name is unique in its cluster (VCs, flavors and decisions name nodes)."""

    name: str  # unique in the cluster
    rack: str  # the rack it sits in (a job spread over racks runs cross_rack_slowdown slower)
    gpu_model: str  # its GPUs' model, all alike (a job's gpu_models may restrict it to some)
    gpus: int  # GPUs, each of GPU_MILLI thousandths (a fractional job takes part of one)
    cpu_milli: int  # CPU, in thousandths of a core
    memory_mib: int  # memory, in MiB

    def __reduce__(self) -> tuple:
        return by_fields(self)


@dataclass(frozen=True, slots=True)
class VCSpec:
    """A virtual cluster (tenant). ``quota_gpus``: GPUs it is guaranteed (None: no quota);
    ``nodes``: names of nodes dedicated to it (only its jobs run there)."""

    name: str  # what jobs name in their ``vc``
    quota_gpus: float | None = None  # GPUs guaranteed to it (None: no quota)
    nodes: tuple[str, ...] = ()  # names of nodes dedicated to it (only its jobs run there)

    def __reduce__(self) -> tuple:
        return by_fields(self)


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A whole cluster. With no VCs, every job shares one pool (jobs' VCs are still reported).

    ``allow_borrowing``: a VC over its quota may use idle GPUs, which the owning VC can reclaim by
    preemption. Slowdowns: the fraction by which a job runs slower when spread over more nodes than
    it needs (``cross_node_slowdown``) or over more than one rack (``cross_rack_slowdown``).
    """

    name: str  # the cluster's name (reports and run files)
    nodes: tuple[NodeSpec, ...]  # every node; its position is the node's index in ClusterState's arrays
    vcs: tuple[VCSpec, ...] = ()  # the tenants (empty: one shared pool)
    allow_borrowing: bool = True  # a VC over its quota may use idle GPUs (above)
    cross_node_slowdown: float = 0.0  # fraction slower when spread over more nodes than needed (above)
    cross_rack_slowdown: float = 0.0  # fraction slower when spread over more than one rack
    description: str = ""  # free text, for the reader of a report
    # A logical partition that replaces the VCs (analysim.core.partition: Kueue's ClusterQueues):
    # runs on such a cluster admit jobs by its quotas (analysim.core.plugins.kueue).
    partition: Partition | None = None

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def gpu_models(self) -> tuple[str, ...]:
        return tuple(sorted({n.gpu_model for n in self.nodes}))

    @property
    def racks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n.rack for n in self.nodes))

    def vc(self, name: str) -> VCSpec | None:
        for v in self.vcs:
            if v.name == name:
                return v
        return None

    def __reduce__(self) -> tuple:
        return by_fields(self)


@dataclass(slots=True)
class ClusterState:
    """Free resources, as flat arrays indexed by node (and GPU slot): cheap to scan with numpy.

    ``free_milli[n, g]`` is the free share of GPU g on node n in thousandths; slots past a node's GPU
    count hold -1 so that they never fit anything.

    Invariant (kept by allocate, release and set_up): ``full_free[n]`` is the count of node n's
    slots at GPU_MILLI and ``free_total[n]`` the sum of its slots' free shares; ``_full_free_count``,
    ``total_full_free`` and ``_free_up_milli`` count the nodes that are up only, and
    ``_max_full_free`` is the highest k whose count is nonzero (0 when none is).
    """

    spec: ClusterSpec  # the topology (shared by clones; never changed)
    free_milli: np.ndarray = field(init=False)  # (nodes, most GPUs on a node) int32: free thousandths per GPU slot
    full_free: np.ndarray = field(init=False)  # GPUs with nothing on them, per node
    smallest_node_gpus: int = field(init=False)  # the fewest GPUs any node has (a gang of at most this may fit on one)
    free_total: np.ndarray = field(init=False)  # free GPU share per node, in milli (partial GPUs too)
    cpu_free: np.ndarray = field(init=False)  # free CPU per node, in thousandths of a core
    mem_free: np.ndarray = field(init=False)  # free memory per node, in MiB
    up: np.ndarray = field(init=False)  # per node: whether it is up (the free totals below count up nodes only)
    gpus: np.ndarray = field(init=False)  # GPUs per node (the spec's, as an int32 array)
    rack_id: np.ndarray = field(init=False)  # per node: its rack's index in spec.racks
    model_id: np.ndarray = field(init=False)  # per node: its GPU model's index in model_names
    owner_vc: list[str | None] = field(init=False)  # dedicated node -> VC
    node_index: dict[str, int] = field(init=False)  # node name -> its index
    model_names: tuple[str, ...] = field(init=False)  # the GPU models, sorted (spec.gpu_models)
    vc_used: dict[str, float] = field(init=False)  # GPUs held, per VC
    touched: set[int] = field(init=False)  # nodes changed since a cache (e.g. fragmentation) last looked
    # How many up nodes have exactly k whole GPUs free: the scheduling pass asks for the most
    # free on one node after every event, and a scan of the arrays cost more than the pass.
    _full_free_count: list[int] = field(init=False)
    # The largest k with a nonzero count, kept as the counts change: a scan of the counts from the
    # top costs O(GPUs per node) per question (6,500 steps on a one-node 6,500-GPU cluster).
    _max_full_free: int = field(init=False)
    # Whole free GPUs over all up nodes: a gang asking for more cannot be placed, whatever its
    # constraints, and is passed over without a placement attempt.
    total_full_free: int = field(init=False)
    # free_total summed over up nodes: EASY backfilling's reservations start from it.
    _free_up_milli: int = field(init=False)
    gang_sizes: dict = field(init=False)  # placement.gang_size's answers (topology only)

    def __post_init__(self) -> None:
        nodes = self.spec.nodes
        n = len(nodes)
        gmax = max((x.gpus for x in nodes), default=1) or 1
        self.free_milli = np.full((n, gmax), -1, dtype=np.int32)
        for i, x in enumerate(nodes):
            self.free_milli[i, : x.gpus] = GPU_MILLI
        self.gpus = np.array([x.gpus for x in nodes], dtype=np.int32)
        self.full_free = self.gpus.copy()
        self.smallest_node_gpus = int(self.gpus.min()) if len(self.gpus) else 0
        self.free_total = self.gpus.astype(np.int64) * GPU_MILLI
        self.cpu_free = np.array([x.cpu_milli for x in nodes], dtype=np.int64)
        self.mem_free = np.array([x.memory_mib for x in nodes], dtype=np.int64)
        self.up = np.ones(n, dtype=bool)
        racks = {r: i for i, r in enumerate(self.spec.racks)}
        self.rack_id = np.array([racks[x.rack] for x in nodes], dtype=np.int32)
        self.model_names = self.spec.gpu_models
        models = {m: i for i, m in enumerate(self.model_names)}
        self.model_id = np.array([models[x.gpu_model] for x in nodes], dtype=np.int32)
        self.node_index = {x.name: i for i, x in enumerate(nodes)}
        self.owner_vc = [None] * n
        for vc in self.spec.vcs:
            for name in vc.nodes:
                self.owner_vc[self.node_index[name]] = vc.name
        self.vc_used = {v.name: 0.0 for v in self.spec.vcs}
        self.touched = set()
        self._full_free_count = [0] * (gmax + 1)
        for g in self.gpus.tolist():
            self._full_free_count[g] += 1
        self._max_full_free = self._highest_count_from(gmax)
        self.total_full_free = int(self.gpus.sum())
        self._free_up_milli = int(self.free_total.sum())
        self.gang_sizes = {}

    @property
    def num_nodes(self) -> int:
        return len(self.spec.nodes)

    def allocate(self, node: int, gpu_slots: tuple[int, ...], milli: int, cpu: int, mem: int) -> None:
        self.touched.add(node)
        row = self.free_milli[node]
        k = len(gpu_slots)
        if milli == GPU_MILLI and k > 1:
            # A whole-GPU job's slots go from whole to empty: one indexing for them all, not a
            # numpy scalar read and write per slot (a 20-GPU request made 100 of them).
            at = list(gpu_slots)
            if (row[at] != GPU_MILLI).any() or len(set(at)) != k:
                g = next((g for g in at if row[g] != GPU_MILLI), at[-1])
                raise AssertionError(f"GPU {g} of node {node} over-allocated")
            row[at] = 0
            self._count_full_free(node, -k)
        else:
            for g in gpu_slots:
                if row[g] == GPU_MILLI:
                    self._count_full_free(node, -1)
                row[g] -= milli
                if row[g] < 0:
                    raise AssertionError(f"GPU {g} of node {node} over-allocated")
        self.free_total[node] -= milli * k
        if self.up[node]:
            self._free_up_milli -= milli * k
        self.cpu_free[node] -= cpu
        self.mem_free[node] -= mem

    def release(self, node: int, gpu_slots: tuple[int, ...], milli: int, cpu: int, mem: int) -> None:
        self.touched.add(node)
        row = self.free_milli[node]
        k = len(gpu_slots)
        if milli == GPU_MILLI and k > 1:
            # (as in allocate: a GPU a whole-GPU job holds has nothing else on it, so each slot
            # goes from empty to whole)
            row[list(gpu_slots)] = GPU_MILLI
            self._count_full_free(node, k)
        else:
            for g in gpu_slots:
                row[g] += milli
                if row[g] == GPU_MILLI:
                    self._count_full_free(node, +1)
        self.free_total[node] += milli * k
        if self.up[node]:
            self._free_up_milli += milli * k
        self.cpu_free[node] += cpu
        self.mem_free[node] += mem

    def _count_full_free(self, node: int, delta: int) -> None:
        old = int(self.full_free[node])
        new = old + delta
        self.full_free[node] = new
        if self.up[node]:
            counts = self._full_free_count
            counts[old] -= 1
            counts[new] += 1
            self.total_full_free += delta
            # When the top bucket empties, the node just moved |delta| below it, and its new
            # bucket is not empty: the scan down takes at most |delta| steps (one for a slot).
            if new > self._max_full_free:
                self._max_full_free = new
            elif old == self._max_full_free and not counts[old]:
                self._max_full_free = self._highest_count_from(old)

    def set_up(self, node: int, up: bool) -> None:
        """Mark a node up or down (its allocation is the caller's business)."""
        if bool(self.up[node]) == up:
            return
        self.up[node] = up
        self._free_up_milli += int(self.free_total[node]) * (1 if up else -1)
        k = int(self.full_free[node])
        self._full_free_count[k] += 1 if up else -1
        self.total_full_free += k if up else -k
        if up:
            self._max_full_free = max(self._max_full_free, k)
        elif k == self._max_full_free and not self._full_free_count[k]:
            # A failure is rare beside allocations; the scan down is paid only then.
            self._max_full_free = self._highest_count_from(k)

    def _highest_count_from(self, k: int) -> int:
        counts = self._full_free_count
        while k > 0 and not counts[k]:
            k -= 1
        return k

    def max_full_free(self) -> int:
        """The most whole free GPUs on one node that is up (0 when none is)."""
        return self._max_full_free

    def nodes_with_full_free(self, k: int) -> int:
        """How many up nodes have exactly ``k`` whole GPUs free."""
        return self._full_free_count[k] if 0 <= k < len(self._full_free_count) else 0

    def free_gpus_total(self) -> float:
        """Free GPU capacity on nodes that are up, fractional shares included."""
        return self._free_up_milli / GPU_MILLI

    def clone(self) -> ClusterState:
        """A copy whose allocation can be changed freely (to test a what-if), sharing the topology."""
        new = copy.copy(self)
        new.free_milli = self.free_milli.copy()
        new.full_free = self.full_free.copy()
        new.free_total = self.free_total.copy()
        new.cpu_free = self.cpu_free.copy()
        new.mem_free = self.mem_free.copy()
        new.up = self.up.copy()
        new.vc_used = dict(self.vc_used)
        new.touched = set(self.touched)
        new._full_free_count = list(self._full_free_count)
        return new
