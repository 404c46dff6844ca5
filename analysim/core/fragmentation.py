"""GPU fragmentation and Fragmentation Gradient Descent (FGD) placement.

Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient
Descent", USENIX ATC'23. Pure, deterministic, no I/O.

Definitions (all amounts in GPU milli):

* The workload is a distribution over task classes m with popularity p_m (``WorkloadDistribution``).
* F_n(m), the fragmentation of node n for class m: when m cannot run on n at all (node down, too little
  CPU or memory, GPU model not allowed, fewer than ``m.num_gpus`` GPUs with ``m.gpu_milli`` free), all
  of n's free GPU capacity; otherwise the free capacity on the GPUs that cannot host m, i.e. the GPUs
  with 0 < free < ``m.gpu_milli`` (for a whole-GPU class: the partially used GPUs). A class asking for
  no GPU can use none of the free GPU capacity, so all of it is fragmented for that class (the paper's
  "x-axis" case, as in its reference simulator).
* F_n = sum_m p_m F_n(m); the cluster's fragmentation is sum_n F_n.
* FGD places a task where the increase of F_n is smallest (``fgd_choose``; ``FragmentationIndex.deltas``
  gives the increases themselves, for scoring).

Helpers that other placement code can share live here too: ``fits_mask`` (can a job run on each node
now), ``gpu_slots_for`` (best-fit GPUs within one node) and ``best_fit_choose`` (the paper's best-fit
baseline).

Popularity is carried as integer weights (job counts, or probabilities quantised to 2**-30), so every
fragmentation value is an exact integer in weight x milli: equal placements tie exactly, and ties are
broken by index alone, never by float rounding.

Speed: the per-class test reduces to per-shape sums. With shapes s = distinct (gpu_milli, num_gpus)
of the GPU classes, K_n(s) = #GPUs with free >= milli_s and R_n(s) = their free capacity,
C_n(s) = total weight of the classes of shape s whose CPU/memory/model/up conditions hold on n::

    W F_n = W_total T_n - sum_s [K_n(s) >= k_s] C_n(s) R_n(s)

so a placement on one GPU changes K and R by the contribution of that GPU alone, and evaluating every
(node, GPU) pair costs O(nodes x GPUs x shapes). On top of that, the best placement of a request
shape on a node depends only on that node's state, so it is cached per request shape and recomputed
only for nodes refreshed since (one or two per placement in a simulation).
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from analysim.core.cluster import ClusterState
from analysim.core.job import GPU_MILLI, JobSpec, by_fields

DEFAULT_MAX_CLASSES = 64
_QUANTUM = 1 << 30  # total integer weight used for popularity given as floats
_NO_FIT = np.iinfo(np.int64).max
_CACHE_SHAPES = 128  # request shapes whose per-node ΔF is kept (LRU)


@dataclass(frozen=True, slots=True, order=True)
class TaskClass:
    """A request shape: ``num_gpus`` GPUs each at ``gpu_milli``/1000, plus CPU and memory.

    A class asking for no GPU has ``num_gpus == 0`` and ``gpu_milli == 0``. ``gpu_models``: allowed
    GPU models, sorted (empty: any).
    """

    num_gpus: int  # GPUs, >= 0
    gpu_milli: int  # thousandths of each GPU, in 1..GPU_MILLI (0 when num_gpus is 0)
    cpu_milli: int = 0  # CPU, in thousandths of a core, >= 0
    memory_mib: int = 0  # memory, in MiB, >= 0
    gpu_models: tuple[str, ...] = ()  # (above)

    def __post_init__(self) -> None:
        if self.num_gpus < 0 or self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(f"negative request in {self}")
        if self.num_gpus == 0:
            if self.gpu_milli != 0:
                raise ValueError(f"a class with no GPU must have gpu_milli 0: {self}")
        elif not 0 < self.gpu_milli <= GPU_MILLI:
            raise ValueError(f"gpu_milli must be in 1..{GPU_MILLI}: {self}")

    @classmethod
    def of(cls, job: JobSpec) -> TaskClass:
        """The class of a job. A job with no GPU share (``num_gpus == 0`` or ``gpu_milli <= 0``)
        counts as asking for no GPU, whatever its other field says, since readers disagree on it."""
        return cls.of_request(job.num_gpus, job.gpu_milli, job.cpu_milli, job.memory_mib, job.gpu_models)

    @classmethod
    def of_request(cls, num_gpus: int, gpu_milli: int, cpu_milli: int, memory_mib: int,
                   gpu_models: tuple[str, ...]) -> TaskClass:
        """The class of a job asking for these (see ``of``)."""
        models = tuple(sorted(set(gpu_models)))
        if num_gpus <= 0 or gpu_milli <= 0:
            return cls(0, 0, cpu_milli, memory_mib, models)
        return cls(num_gpus, gpu_milli, cpu_milli, memory_mib, models)

    @property
    def gpu_demand_milli(self) -> int:
        return self.num_gpus * self.gpu_milli

    def __reduce__(self) -> tuple:
        return by_fields(self)


@dataclass(frozen=True, slots=True)
class WorkloadDistribution:
    """Task classes with integer weights; popularity p_m = weight_m / sum(weights). Invariant
    (checked on creation): as many weights as classes, none negative, no class twice.

    Integer weights keep fragmentation values exact (see the module doc). ``from_jobs`` uses job
    counts; ``from_popularity`` quantises floats.
    """

    classes: tuple[TaskClass, ...]  # distinct
    weights: tuple[int, ...]  # weights[m]: class m's, >= 0 (as many as classes)

    def __post_init__(self) -> None:
        if len(self.classes) != len(self.weights):
            raise ValueError("classes and weights differ in length")
        if any(w < 0 for w in self.weights):
            raise ValueError("negative weight")
        if len(set(self.classes)) != len(self.classes):
            raise ValueError("duplicate task class")

    @property
    def total_weight(self) -> int:
        return sum(self.weights)

    @property
    def popularity(self) -> tuple[float, ...]:
        total = self.total_weight
        return tuple(w / total for w in self.weights) if total else tuple(0.0 for _ in self.weights)

    def __len__(self) -> int:
        return len(self.classes)

    @classmethod
    def from_popularity(
        cls, classes: Sequence[TaskClass], popularity: Sequence[float]
    ) -> WorkloadDistribution:
        """Classes with float popularity (normalised here), quantised to integer weights summing to
        about 2**30: precise to ~1e-9, small enough that weight x milli sums stay exact in int64."""
        total = float(sum(popularity))
        if not total > 0 or any(p < 0 or not math.isfinite(p) for p in popularity):
            raise ValueError("popularity must be non-negative, finite and not all zero")
        return cls(tuple(classes), tuple(round(p / total * _QUANTUM) for p in popularity))

    @classmethod
    def from_jobs(
        cls,
        jobs: Iterable[JobSpec],
        max_classes: int | None = DEFAULT_MAX_CLASSES,
        include_cpu_only: bool = False,
    ) -> WorkloadDistribution:
        """The task-size distribution of a trace: identical request shapes grouped, weight = count.

        Jobs asking for no GPU are left out unless ``include_cpu_only``: all free GPU capacity is
        fragmented for them on every node, so they add the same p·(free GPU capacity) everywhere,
        change no FGD decision, and would make an empty cluster look fragmented.

        When there are more than ``max_classes`` shapes (None: no limit), CPU and memory are bucketed
        on a log2 grid, ever coarser (steps of 2^(1/8), 2^(1/4), 2^(1/2), 2, 4, 16, then one bucket),
        until few enough remain; GPU demand and allowed models are never merged, because they decide
        which GPUs are fragmented. A bucket is represented by its members' count-weighted mean CPU and
        memory (rounded). A log grid keeps relative precision, which is what decides whether a request
        fits next to others. If the GPU shapes alone are too many, the most popular ``max_classes``
        are kept (as the reference simulator keeps its most popular "typical pods").
        """
        # Jobs counted by their raw request first, each distinct one made a class once: a trace
        # has few shapes and many jobs.
        raw: dict[tuple, int] = {}
        for job in jobs:
            key = (job.num_gpus, job.gpu_milli, job.cpu_milli, job.memory_mib, job.gpu_models)
            raw[key] = raw.get(key, 0) + 1
        counts: Counter[TaskClass] = Counter()
        for request, n in raw.items():
            tc = TaskClass.of_request(*request)
            if tc.num_gpus > 0 or include_cpu_only:
                counts[tc] += n
        if max_classes is not None:
            if max_classes < 1:
                raise ValueError("max_classes must be at least 1")
            if len(counts) > max_classes:
                counts = _coarsen(counts, max_classes)
        ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return cls(tuple(c for c, _ in ordered), tuple(n for _, n in ordered))

    def __reduce__(self) -> tuple:
        return by_fields(self)


_LOG_STEPS: tuple[float | None, ...] = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, None)


def _bucket(x: int, step: float | None) -> int:
    if step is None:
        return 0
    return -1 if x <= 0 else math.floor(math.log2(x) / step)


def _coarsen(counts: Counter[TaskClass], max_classes: int) -> Counter[TaskClass]:
    groups: dict[tuple, list[tuple[TaskClass, int]]] = {}
    for step in _LOG_STEPS:
        groups = {}
        for tc, n in sorted(counts.items()):
            key = (
                tc.num_gpus,
                tc.gpu_milli,
                tc.gpu_models,
                _bucket(tc.cpu_milli, step),
                _bucket(tc.memory_mib, step),
            )
            groups.setdefault(key, []).append((tc, n))
        if len(groups) <= max_classes:
            break
    merged: Counter[TaskClass] = Counter()
    for members in groups.values():
        total = sum(n for _, n in members)
        # round-half-up integer mean, so the result does not depend on float formatting
        cpu = (2 * sum(tc.cpu_milli * n for tc, n in members) + total) // (2 * total)
        mem = (2 * sum(tc.memory_mib * n for tc, n in members) + total) // (2 * total)
        head = members[0][0]
        merged[TaskClass(head.num_gpus, head.gpu_milli, cpu, mem, head.gpu_models)] += total
    if len(merged) > max_classes:
        merged = Counter(dict(sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))[:max_classes]))
    return merged


# ---------------------------------------------------------------------------------------------------
# Fit tests and GPU choice within a node (shared by FGD and the best-fit baseline)


def _job_model_ok(state: ClusterState, models: Sequence[str]) -> np.ndarray:
    """Per GPU model id of ``state``: may a request restricted to ``models`` use it."""
    if not models:
        return np.ones(len(state.model_names), dtype=bool)
    allowed = set(models)
    return np.array([m in allowed for m in state.model_names], dtype=bool)


def fits_mask(state: ClusterState, job: JobSpec) -> np.ndarray:
    """bool[node]: the job fits there now (node up, CPU, memory, GPU model, enough GPUs with
    ``gpu_milli`` free). Vectorised over all nodes."""
    tc = TaskClass.of(job)
    ok = state.up & (state.cpu_free >= tc.cpu_milli) & (state.mem_free >= tc.memory_mib)
    ok &= _job_model_ok(state, tc.gpu_models)[state.model_id]
    if tc.num_gpus:
        ok &= (state.free_milli >= tc.gpu_milli).sum(axis=1) >= tc.num_gpus
    return ok


def _best_fit_slots(free: np.ndarray, milli: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """For rows of free capacity: the k GPUs with the least free capacity that still fits ``milli``
    (ties: lowest slot), as sorted slot indexes (rows x k), and whether the row has k such GPUs."""
    b, g = free.shape
    if k > g:
        return np.zeros((b, k), dtype=np.int64), np.zeros(b, dtype=bool)
    big = np.int64(GPU_MILLI + 1) * g
    key = np.where(free >= milli, free.astype(np.int64) * g + np.arange(g), big)
    order = np.argsort(key, axis=1, kind="stable")[:, :k]
    ok = np.take_along_axis(key, order[:, -1:], axis=1)[:, 0] < big
    return np.sort(order, axis=1), ok


def gpu_slots_for(state: ClusterState, node: int, job: JobSpec) -> tuple[int, ...] | None:
    """Best-fit GPUs for ``job`` on ``node``, or None when the job does not fit there at all.

    Fractional or multi-GPU share: the GPUs with the least free capacity that still fit, ties to the
    lowest slot (for whole GPUs: the lowest-numbered fully free GPUs). No GPU asked: ``()``. This is
    the paper's best-fit GPU choice; FGD instead evaluates every GPU (see ``fgd_choose``).
    """
    tc = TaskClass.of(job)
    if not (
        state.up[node]
        and state.cpu_free[node] >= tc.cpu_milli
        and state.mem_free[node] >= tc.memory_mib
        and _job_model_ok(state, tc.gpu_models)[state.model_id[node]]
    ):
        return None
    if tc.num_gpus == 0:
        return ()
    slots, ok = _best_fit_slots(state.free_milli[node : node + 1], tc.gpu_milli, tc.num_gpus)
    return tuple(int(s) for s in slots[0]) if ok[0] else None


def best_fit_choose(
    state: ClusterState, job: JobSpec, candidates: np.ndarray
) -> tuple[int, tuple[int, ...]] | None:
    """The paper's best-fit baseline: among candidate nodes where the job fits, the one with the least
    free GPU capacity left after placement (ties: lowest node index), GPUs by ``gpu_slots_for``."""
    cand = np.asarray(candidates, dtype=bool) & fits_mask(state, job)
    if not cand.any():
        return None
    tc = TaskClass.of(job)
    left = np.maximum(state.free_milli, 0).sum(axis=1, dtype=np.int64) - tc.gpu_demand_milli
    node = int(np.argmin(np.where(cand, left, _NO_FIT)))
    slots = gpu_slots_for(state, node, job)
    return None if slots is None else (node, slots)


# ---------------------------------------------------------------------------------------------------
# The fragmentation index


@dataclass(slots=True)
class _ShapeCache:
    """Best FGD placement of one request shape on each node, valid where ``ver`` matches the node's."""

    ver: np.ndarray  # int64[node]; -1: never computed
    delta: np.ndarray  # int64[node], weighted milli; _NO_FIT where the shape does not fit
    slots: np.ndarray  # int16[node, num_gpus]
    model_ok: np.ndarray  # bool[model id]: the shape may use that GPU model


class FragmentationIndex:
    """Expected fragmentation F_n of every node of ``state`` for ``workload``, kept up to date.

    Call ``refresh(nodes)`` after anything changes on those nodes (allocate, release, up/down): the
    index reads ``state`` only then, and when choosing a placement. ``refresh_all()`` recomputes every
    node. The index keeps a reference to ``state`` and never modifies it.

    Invariant: for every node n, ``_frag[n]``, ``_t[n]``, ``_k[n]`` and ``_r[n]`` are those of
    ``state`` as of n's last refresh, which ``_node_ver[n]`` numbers (a ``_tick``); a cached
    shape's answer for n stands while its ``ver[n]`` equals ``_node_ver[n]``.
    """

    def __init__(self, state: ClusterState, workload: WorkloadDistribution) -> None:
        self.state = state  # the nodes measured (read only)
        self.workload = workload  # the task classes F_n is expected over
        self._w_total = int(workload.total_weight)  # W_total: the weights' sum (F values are kept times it)
        gpu = [(c, w) for c, w in zip(workload.classes, workload.weights, strict=True) if c.num_gpus > 0]
        gpu.sort(key=lambda cw: (cw[0].gpu_milli, cw[0].num_gpus))  # grouped by shape, for reduceat
        shapes = sorted({(c.gpu_milli, c.num_gpus) for c, _ in gpu})
        shape_of = {s: i for i, s in enumerate(shapes)}
        # The GPU shapes (gpu_milli, num_gpus) of the GPU classes, sorted. Per shape: its milli.
        self._s_milli = np.array([s[0] for s in shapes], dtype=np.int64)
        self._s_k = np.array([s[1] for s in shapes], dtype=np.int64)  # per shape: its GPU count
        self._n_shapes = len(shapes)  # the shapes' count
        cls_shape = np.array([shape_of[(c.gpu_milli, c.num_gpus)] for c, _ in gpu], dtype=np.int64)
        # Where each shape's classes begin in the class arrays below (for reduceat).
        self._shape_starts = (
            np.flatnonzero(np.r_[True, cls_shape[1:] != cls_shape[:-1]]) if gpu else cls_shape
        )
        # Per GPU class, grouped by shape: its CPU (thousandths of a core), memory (MiB) and weight.
        self._c_cpu = np.array([c.cpu_milli for c, _ in gpu], dtype=np.int64)
        self._c_mem = np.array([c.memory_mib for c, _ in gpu], dtype=np.int64)  # (above)
        self._c_w = np.array([w for _, w in gpu], dtype=np.int64)  # (above)
        # model_ok[model_id, class]: the class may use that GPU model
        self._model_ok = (
            np.stack([_job_model_ok(state, c.gpu_models) for c, _ in gpu], axis=1)
            if gpu
            else (np.zeros((len(state.model_names), 0), dtype=bool))
        )
        n = state.num_nodes
        self._frag = np.zeros(n, dtype=np.int64)  # W_total x F_n, exact
        # per node, as of its last refresh: free GPU capacity, and per shape K and R (module doc)
        self._t = np.zeros(n, dtype=np.int64)
        self._k = np.zeros((n, self._n_shapes), dtype=np.int64)  # (above) per node and shape
        self._r = np.zeros((n, self._n_shapes), dtype=np.int64)  # (above) per node and shape, milli
        self._node_ver = np.zeros(n, dtype=np.int64)  # per node: the tick of its last refresh
        self._tick = 0  # refreshes so far
        # [i, j]: slot i comes before slot j. Built on the first single-GPU placement choice: it is
        # GPUs-per-node squared (42 MB on one 6,500-GPU node), and a run that only samples the
        # fragmentation metric never needs it.
        self._earlier: np.ndarray | None = None
        # Each recently asked request shape's best placement per node, least recently used first
        # (at most _CACHE_SHAPES).
        self._cache: OrderedDict[TaskClass, _ShapeCache] = OrderedDict()
        self.refresh_all()

    # -- the measure -----------------------------------------------------------------------------

    def _shape_weights(
        self, cpu: np.ndarray, mem: np.ndarray, model: np.ndarray, up: np.ndarray
    ) -> np.ndarray:
        """C[b, s]: weight of the GPU classes of shape s whose non-GPU conditions hold on row b."""
        if not self._n_shapes:
            return np.zeros((cpu.shape[0], 0), dtype=np.int64)
        ok = (cpu[:, None] >= self._c_cpu) & (mem[:, None] >= self._c_mem) & self._model_ok[model]
        ok &= up[:, None]
        return np.add.reduceat(ok * self._c_w, self._shape_starts, axis=1)

    def _gpu_sums(self, free: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row: T (free capacity), and per shape s, K (GPUs with milli_s free) and R (their free)."""
        pos = np.maximum(free, 0).astype(np.int64)
        ge = free[:, :, None] >= self._s_milli
        return pos.sum(axis=1), ge.sum(axis=1), np.einsum("bg,bgs->bs", pos, ge.astype(np.int64))

    def _combine(self, t: np.ndarray, k: np.ndarray, r: np.ndarray, c: np.ndarray) -> np.ndarray:
        """W_total x F from T, K, R and C (any matching leading shape)."""
        return self._w_total * t - ((k >= self._s_k) * c * r).sum(axis=-1)

    def refresh(self, nodes: Iterable[int] | np.ndarray) -> None:
        """Recompute F_n for ``nodes`` (indexes, or a bool mask) from the state, after allocate,
        release or up/down on them."""
        idx = nodes if isinstance(nodes, np.ndarray) else np.fromiter(nodes, dtype=np.int64)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        if idx.size > 1:
            idx = np.unique(idx)  # repeated nodes would be harmless but wasted work
        elif idx.size == 0:
            return
        s = self.state
        t, k, r = self._gpu_sums(s.free_milli[idx])
        self._t[idx], self._k[idx], self._r[idx] = t, k, r
        c = self._shape_weights(s.cpu_free[idx], s.mem_free[idx], s.model_id[idx], s.up[idx])
        self._frag[idx] = self._combine(t, k, r, c)
        self._tick += 1
        self._node_ver[idx] = self._tick

    def refresh_all(self) -> None:
        self.refresh(np.arange(self.state.num_nodes))

    def node_frag(self) -> np.ndarray:
        """F_n per node, in GPU milli (float64; a copy)."""
        if not self._w_total:
            return np.zeros(self._frag.shape, dtype=np.float64)
        return self._frag / self._w_total

    def cluster_frag_gpus(self) -> float:
        """sum_n F_n, in GPUs."""
        if not self._w_total:
            return 0.0
        return float(int(self._frag.sum()) / self._w_total / GPU_MILLI)

    # -- placement deltas --------------------------------------------------------------------------

    def _entry(self, tc: TaskClass) -> _ShapeCache:
        e = self._cache.get(tc)
        if e is None:
            n = self.state.num_nodes
            e = _ShapeCache(
                np.full(n, -1, dtype=np.int64),
                np.full(n, _NO_FIT, dtype=np.int64),
                np.zeros((n, tc.num_gpus), dtype=np.int16),
                _job_model_ok(self.state, tc.gpu_models),
            )
            self._cache[tc] = e
            if len(self._cache) > _CACHE_SHAPES:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(tc)
        return e

    def _update(self, tc: TaskClass, e: _ShapeCache, need: np.ndarray) -> None:
        """Recompute the best placement of ``tc`` on the nodes of bool mask ``need`` whose entry is stale."""
        idx = np.flatnonzero(need & (e.ver != self._node_ver))
        if idx.size == 0:
            return
        s = self.state
        free = s.free_milli[idx]
        cpu = s.cpu_free[idx] - tc.cpu_milli
        mem = s.mem_free[idx] - tc.memory_mib
        model, up = s.model_id[idx], s.up[idx]
        node_ok = up & (cpu >= 0) & (mem >= 0) & e.model_ok[model]
        c = self._shape_weights(cpu, mem, model, up)
        if tc.num_gpus == 1:
            after, slot = self._single_gpu_after(idx, free, c, tc.gpu_milli)
            slots = slot[:, None]
            node_ok &= after != _NO_FIT
        elif tc.num_gpus == 0:
            after = self._combine(self._t[idx], self._k[idx], self._r[idx], c)
            slots = np.zeros((idx.size, 0), dtype=np.int64)
        else:
            slots, ok = _best_fit_slots(free, tc.gpu_milli, tc.num_gpus)
            node_ok &= ok
            rows = free.copy()
            np.subtract.at(rows, (np.arange(idx.size)[:, None], slots), tc.gpu_milli)
            after = self._combine(*self._gpu_sums(rows), c)
        e.delta[idx] = np.where(node_ok, after - self._frag[idx], _NO_FIT)
        e.slots[idx] = slots
        e.ver[idx] = self._node_ver[idx]

    def _single_gpu_after(
        self, idx: np.ndarray, free: np.ndarray, c: np.ndarray, d: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """For each node of ``idx``, the least W_total x F after taking ``d`` milli of one of its GPUs,
        and that GPU (lowest slot on ties); _NO_FIT when no GPU has ``d`` free. ``c``: shape weights
        with the task's CPU/memory already taken.

        Only the chosen GPU's contribution to the cached K and R changes, so a (node, GPU) pair is
        evaluated without rebuilding the node; and GPUs with the same free capacity are equivalent, so
        only the lowest slot of each distinct free value is evaluated (fresh nodes: one pair)."""
        b, g = free.shape
        fits = free >= d
        if self._earlier is None:
            n = self.state.free_milli.shape[1]
            self._earlier = np.triu(np.ones((n, n), dtype=bool), 1)
        # dup[b, j]: an earlier slot of row b has the same free capacity as slot j
        dup = ((free[:, :, None] == free[:, None, :]) & self._earlier).any(axis=1)
        rows, cols = np.nonzero(fits & ~dup)
        out = np.full((b, g), _NO_FIT, dtype=np.int64)
        if rows.size:
            f = free[rows, cols].astype(np.int64)[:, None]
            fa = f - d
            sm = self._s_milli
            ge, ge_a = f >= sm, fa >= sm
            k2 = self._k[idx[rows]] - ge + ge_a
            r2 = self._r[idx[rows]] - f * ge + fa * ge_a
            out[rows, cols] = self._combine(self._t[idx[rows]] - d, k2, r2, c[rows])
        slot = np.argmin(out, axis=1)
        return out[np.arange(b), slot], slot

    def deltas(self, job: JobSpec, nodes: np.ndarray | None = None) -> np.ndarray:
        """ΔF_n (GPU milli, float64) of the best placement of ``job`` on each node of bool mask ``nodes``
        (None: all); +inf where it does not fit or is not asked for. For scoring plugins."""
        n = self.state.num_nodes
        need = np.ones(n, dtype=bool) if nodes is None else np.asarray(nodes, dtype=bool)
        tc = TaskClass.of(job)
        e = self._entry(tc)
        self._update(tc, e, need)
        ok = need & (e.delta != _NO_FIT)
        out = np.full(n, np.inf)
        out[ok] = e.delta[ok] / self._w_total if self._w_total else 0.0
        return out


class FragmentationTracker:
    """A cluster's FragmentationIndex, built when first asked for (over the workload given then)
    and brought up to date with the allocation at each ask after (ClusterState.touched: the nodes
    changed since, which it empties).

    Invariant: once built, ``index`` is up to date with ``state`` but for ``state.touched``."""

    def __init__(self, state: ClusterState, workload: Sequence[JobSpec] | None = None) -> None:
        self.state = state  # the allocation it follows
        self.workload = workload  # the task sizes it measures against (None or empty: the jobs')
        self.index: FragmentationIndex | None = None  # (None until first asked for)

    def current(self, jobs: Callable[[], Iterable[JobSpec]]) -> FragmentationIndex:
        if self.index is None:
            self.index = FragmentationIndex(self.state, WorkloadDistribution.from_jobs(self.workload or jobs()))
        elif self.state.touched:
            self.index.refresh(sorted(self.state.touched))
        self.state.touched.clear()
        return self.index


def fgd_choose(
    index: FragmentationIndex, state: ClusterState, job: JobSpec, candidates: np.ndarray
) -> tuple[int, tuple[int, ...]] | None:
    """FGD: the (node, GPU slots) among ``candidates`` (bool[node]) that least increases the node's
    expected fragmentation, or None when the job fits on no candidate (fit is checked again here).

    One GPU (fractional or whole): every GPU of the node is evaluated. Several GPUs: the best-fit
    GPUs of ``gpu_slots_for`` (for whole GPUs any fully free ones are equivalent; the lowest are
    taken). No GPU: ``()``. Ties: lowest node index, then lowest slot. ``state`` must be the index's
    state, refreshed for every node changed since.
    """
    if state is not index.state:
        raise ValueError("fgd_choose: state is not the one the index was built over")
    cand = np.asarray(candidates, dtype=bool)
    if cand.shape != (state.num_nodes,):
        raise ValueError(f"candidates must be bool[{state.num_nodes}], got shape {cand.shape}")
    tc = TaskClass.of(job)
    e = index._entry(tc)
    index._update(tc, e, cand)
    d = np.where(cand, e.delta, _NO_FIT)
    node = int(np.argmin(d))
    if d[node] == _NO_FIT:
        return None
    return node, tuple(int(g) for g in e.slots[node])
