"""Feasibility and binding: which nodes can host a job, and the exact GPUs it gets.

Plugins rank nodes; this module turns a ranking into a concrete placement, including gang
placement over several nodes (fewest nodes, one rack when possible).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from analysim.core.cluster import ClusterState
from analysim.core.job import GPU_MILLI, JobRun, JobSpec, Placement

if TYPE_CHECKING:
    from analysim.core.framework import Handle


def single_node_fit(state: ClusterState, spec: JobSpec) -> np.ndarray:
    """Nodes that can host the whole job alone (free GPUs, CPU and memory; not up/model/VC)."""
    ok: np.ndarray
    if spec.is_fractional:
        ok = np.asarray((state.free_milli >= spec.gpu_milli).any(axis=1))
    elif spec.num_gpus:
        ok = state.full_free >= spec.num_gpus
    else:
        ok = np.ones(len(state.gpus), dtype=bool)
    # Most trace jobs ask for no CPU or memory: skip the comparisons that cannot fail.
    if spec.cpu_milli:
        ok &= state.cpu_free >= spec.cpu_milli
    if spec.memory_mib:
        ok &= state.mem_free >= spec.memory_mib
    return ok


def default_slots(state: ClusterState, node: int, spec: JobSpec) -> tuple[int, ...]:
    """GPU slots on ``node``: the lowest-numbered free GPUs for whole-GPU jobs; for a
    GPU-sharing job, best fit — the GPU whose free share is the smallest that still fits."""
    row = state.free_milli[node]
    if spec.num_gpus == 0:
        return ()
    if spec.is_fractional:
        ok = (row >= spec.gpu_milli).nonzero()[0]
        best = ok[np.argmin(row[ok])]  # argmin returns the first minimum: lowest slot on ties
        return (int(best),)
    return _lowest_free(row, spec.num_gpus)


def _lowest_free(row: np.ndarray, count: int) -> tuple[int, ...]:
    """The ``count`` lowest-numbered wholly free GPUs of a node's row (fewer if it has fewer)."""
    # (ndarray.nonzero and tolist: np.flatnonzero and a numpy scalar per slot cost more than the
    # rest of a placement on the usual 8-GPU node.)
    return tuple((row == GPU_MILLI).nonzero()[0][:count].tolist())


def cpu_mem_on(spec: JobSpec, slots: tuple[int, ...], nodes: int) -> tuple[int, int]:
    """The CPU and memory a job holds on a node where it holds ``slots``, of the ``nodes`` it spans:
    in proportion to its GPUs there (evenly for a CPU-only job), as a launch takes them and a
    stop gives them back."""
    share = len(slots) / max(spec.num_gpus, 1) if spec.num_gpus else 1.0 / nodes
    return round(spec.cpu_milli * share), round(spec.memory_mib * share)


def gang_size(state: ClusterState, spec: JobSpec, candidates: np.ndarray) -> int:
    """The fewest nodes a job can span: 1 when some candidate node is big enough."""
    if spec.num_gpus <= 1 or spec.num_gpus <= state.smallest_node_gpus:
        return 1
    # The answer depends on the topology alone: remembered (on the state, shared by its clones),
    # as it is asked for every gang a pass looks at.
    key = (spec.num_gpus, candidates.tobytes())
    k = state.gang_sizes.get(key)
    if k is None:
        biggest = int(state.gpus[candidates].max()) if candidates.any() else 0
        k = state.gang_sizes[key] = math.ceil(spec.num_gpus / biggest) if biggest > 0 else 0
    return k


def bind(ctx: Handle, job: JobRun, static_ok: np.ndarray) -> Placement | None:
    """The placement the policy's score plugin prefers, or None when the job cannot run now."""
    spec, state = job.spec, ctx.state
    k_min = gang_size(state, spec, static_ok)
    if k_min == 0:
        return None
    if k_min > 1:
        return _bind_gang(ctx, spec, static_ok, state, k_min)
    if spec.num_gpus > state.max_full_free() and not spec.is_fractional:
        return None  # no up node has that many whole GPUs free
    feasible = static_ok & single_node_fit(state, spec)
    # (ndarray.nonzero and .argmax are numpy's C; .any() and np.argmax go through Python-level
    # wrappers, a few percent of a run that places a job per pass)
    nodes = feasible.nonzero()[0]
    if not len(nodes):
        return None
    score = ctx.policy.score
    chosen = score.choose(job, feasible, ctx)
    if chosen is None:
        node = int(nodes[int(score.score(job, nodes, ctx).argmax())])  # first max: lowest index
        chosen = (node, default_slots(state, node, spec))
    return Placement(gpus=(chosen,), slowdown=1.0)


def can_place(ctx: Handle, spec: JobSpec, static_ok: np.ndarray, state: ClusterState) -> bool:
    """Whether the job would fit on ``state`` (a hypothetical copy, e.g. after evicting victims)."""
    k_min = gang_size(state, spec, static_ok)
    if k_min == 0:
        return False
    if k_min == 1:
        return bool((static_ok & single_node_fit(state, spec)).any())
    return gang_fits(gang_capacity(state, spec, static_ok), spec.num_gpus, k_min, ctx.config.relaxed_locality)


def can_place_on(ctx: Handle, spec: JobSpec, static_ok: np.ndarray, state: ClusterState, changed: set[int]) -> bool:
    """``can_place`` on a ``state`` that differs only at the nodes ``changed``, by capacity freed,
    from one the job could not be placed on (a trial copy as evictions are added to it). A job
    that fits on one node can then fit only on one of those, so only they are looked at (most
    trials release a few jobs on a cluster of hundreds of nodes); a gang is asked of the whole
    state."""
    k_min = gang_size(state, spec, static_ok)
    if k_min != 1:
        return can_place(ctx, spec, static_ok, state)
    for n in changed:
        if static_ok[n] and _fits_node(spec, state.free_milli[n].tolist(), int(state.cpu_free[n]), int(state.mem_free[n])):
            return True
    return False


def can_place_released(ctx: Handle, spec: JobSpec, static_ok: np.ndarray, state: ClusterState,
                       released: list[JobRun]) -> bool:
    """``can_place`` on ``state`` with the running jobs ``released`` given back, for a job that
    cannot be placed on ``state`` as it is, without copying the cluster: only the nodes they
    hold have changed, so those alone are rebuilt, each by the releases ClusterState.release
    makes (a job that fits on one node could fit only on one of them; a gang reads the other
    nodes as they are)."""
    k_min = gang_size(state, spec, static_ok)
    if k_min == 0:
        return False
    relaxed = ctx.config.relaxed_locality
    if not spec.is_fractional and spec.num_gpus and not spec.cpu_milli and not spec.memory_mib:
        got = _whole_gpus_released(spec, static_ok, state, released, k_min, relaxed)
        if got is not None:
            return got
    rows: dict[int, tuple[list[int], list[int]]] = {}  # node -> (free milli per GPU slot, [CPU, memory] free)
    for v in released:
        vs, pl = v.spec, v.placed
        for n, slots in pl.gpus:
            if not static_ok[n]:
                continue  # (a node the job may not use: what is freed there does not matter)
            row = rows.get(n)
            if row is None:
                row = rows[n] = (state.free_milli[n].tolist(), [int(state.cpu_free[n]), int(state.mem_free[n])])
            cpu, mem = cpu_mem_on(vs, slots, len(pl.gpus))
            milli = row[0]
            for g in slots:
                milli[g] += vs.gpu_milli
            row[1][0] += cpu
            row[1][1] += mem
    if k_min == 1:
        return any(_fits_node(spec, milli, cpu, mem) for milli, (cpu, mem) in rows.values())
    cap = gang_capacity(state, spec, static_ok)
    for n, (milli, (cpu, mem)) in rows.items():
        cap[n] = _gang_capacity_of(spec, milli, cpu, mem)
    return gang_fits(cap, spec.num_gpus, k_min, relaxed)


def _whole_gpus_released(spec: JobSpec, static_ok: np.ndarray, state: ClusterState, released: list[JobRun],
                         k_min: int, relaxed: bool) -> bool | None:
    """can_place_released for a job of whole GPUs that asks for no CPU or memory (the usual
    trace job), when no GPU-sharing job is released (None otherwise): a GPU a whole-GPU job
    holds is whole again once it is released, nothing else sharing it, so the GPUs freed per
    node are counted; on one node, the first that would have enough answers."""
    full_free, g = state.full_free, spec.num_gpus
    whole: dict[int, int] = {}
    for v in released:
        if v.spec.gpu_milli != GPU_MILLI:
            return None
        for n, slots in v.placed.gpus:
            if static_ok[n]:
                k = whole[n] = whole.get(n, 0) + len(slots)
                if k_min == 1 and int(full_free[n]) + k >= g:
                    return True  # (what the rest would free only adds to it)
    if k_min == 1:
        return False
    cap = np.where(static_ok, full_free, 0).astype(np.int64)
    for n, k in whole.items():
        cap[n] += k
    return gang_fits(cap, g, k_min, relaxed)


def _gang_capacity_of(spec: JobSpec, milli: list[int], cpu: int, mem: int) -> int:
    """gang_capacity for one node, given its free thousandths per GPU slot, CPU and memory."""
    g = spec.num_gpus
    cap = sum(1 for m in milli if m == GPU_MILLI)
    per_gpu_cpu = spec.cpu_milli / g
    if per_gpu_cpu:
        cap = min(cap, int(cpu // per_gpu_cpu))
    per_gpu_mem = spec.memory_mib / g
    if per_gpu_mem:
        cap = min(cap, int(mem // per_gpu_mem))
    return cap


def _fits_node(spec: JobSpec, milli: list[int], cpu: int, mem: int) -> bool:
    """single_node_fit for one node, given its free thousandths per GPU slot, CPU and memory."""
    if spec.is_fractional:
        ok = any(m >= spec.gpu_milli for m in milli)
    elif spec.num_gpus:
        ok = sum(1 for m in milli if m == GPU_MILLI) >= spec.num_gpus
    else:
        ok = True
    return ok and (not spec.cpu_milli or cpu >= spec.cpu_milli) and (not spec.memory_mib or mem >= spec.memory_mib)


def gang_capacity(state: ClusterState, spec: JobSpec, static_ok: np.ndarray) -> np.ndarray:
    """GPUs each node can give a whole-GPU gang: its whole free GPUs, fewer if CPU or memory run
    out first; 0 on nodes the job may not use."""
    g = spec.num_gpus
    per_gpu_cpu = spec.cpu_milli / g
    per_gpu_mem = spec.memory_mib / g
    cap = state.full_free
    if per_gpu_cpu:
        cap = np.minimum(cap, np.floor_divide(state.cpu_free, per_gpu_cpu).astype(np.int64))
    if per_gpu_mem:
        cap = np.minimum(cap, np.floor_divide(state.mem_free, per_gpu_mem).astype(np.int64))
    return np.where(static_ok, cap, 0)


def gang_fits(cap: np.ndarray, g: int, k_min: int, relaxed: bool) -> bool:
    """Whether ``_bind_gang`` finds a placement, without finding it. It succeeds exactly when
    filling the nodes with the most capacity first, over the whole cluster, reaches ``g`` GPUs
    within ``k_min`` nodes (any number, relaxed): a rack that takes the gang alone does so with
    nodes of at most the same capacities, so racks never succeed where the whole cluster fails.
    So: the ``k_min`` largest capacities hold ``g``."""
    if relaxed or k_min >= len(cap):
        return int(cap.sum()) >= g
    return int(np.partition(cap, -k_min)[-k_min:].sum()) >= g


def _bind_gang(ctx: Handle, spec: JobSpec, static_ok: np.ndarray, state: ClusterState, k_min: int) -> Placement | None:
    """Whole GPUs over several nodes: fill the emptiest nodes first so the job spans as few as
    possible, inside one rack when one rack can take it (best-fit across racks)."""
    g = spec.num_gpus
    if g > state.total_full_free:
        return None  # (the nodes it may use have no more whole GPUs free than all up nodes)
    cap = gang_capacity(state, spec, static_ok)
    relaxed = ctx.config.relaxed_locality
    if not gang_fits(cap, g, k_min, relaxed):
        return None  # (most attempts on a busy cluster fail: the racks are not walked for them)
    rack_cap = np.bincount(state.rack_id, weights=cap)

    def take(nodes: np.ndarray) -> list[tuple[int, int]] | None:
        order = nodes[np.lexsort((nodes, -cap[nodes]))]  # emptiest first, then lowest index
        chosen, need = [], g
        for n in order:
            c = int(cap[n])
            if c <= 0:
                break
            use = min(c, need)
            chosen.append((int(n), use))
            need -= use
            if need == 0:
                break
        if need > 0 or (not relaxed and len(chosen) > k_min):
            return None
        return chosen

    best: tuple[int, list[tuple[int, int]]] | None = None
    has_cap = cap > 0
    for rack in (rack_cap >= g).nonzero()[0].tolist():  # a rack with fewer cannot take it alone
        nodes = ((state.rack_id == rack) & has_cap).nonzero()[0]
        chosen = take(nodes)
        if chosen is not None:
            leftover = int(rack_cap[rack]) - g
            if best is None or leftover < best[0]:
                best = (leftover, chosen)
    cross_rack = best is None
    chosen = best[1] if best is not None else take(has_cap.nonzero()[0])
    if chosen is None:
        return None
    gpus = []
    for n, use in chosen:
        gpus.append((n, _lowest_free(state.free_milli[n], use)))
    slowdown = 1.0
    if len(chosen) > k_min:
        slowdown += ctx.spec.cross_node_slowdown
    if cross_rack:
        slowdown += ctx.spec.cross_rack_slowdown
    return Placement(gpus=tuple(gpus), slowdown=slowdown)


def release_on(state: ClusterState, job: JobRun) -> None:
    """Release a running job's GPUs, CPU and memory on ``state`` (the cluster's, or a trial copy)."""
    spec, pl = job.spec, job.placed
    for n, slots in pl.gpus:
        cpu, mem = cpu_mem_on(spec, slots, len(pl.gpus))
        state.release(n, slots, spec.gpu_milli, cpu, mem)
