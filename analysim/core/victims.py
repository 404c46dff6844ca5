"""Victim search: which running jobs to evict so that a waiting job can run.

One rule, for every post-filter (priority preemption, quota reclaim), for one-node jobs and
gangs, whole and fractional GPUs. A plugin hands over its candidates least important first (its
queue's preemption rank, lowest first; a reclaim's newest first); a candidate's *position* in
that list is its importance. Among the sets of candidates whose eviction lets the job run, the
one chosen has

1. the least important most-important victim (the lowest highest position);
2. then the fewest victims;
3. then the fewest GPUs freed beyond need: the victims' GPUs (all of them, on every node they
   hold), less those the job needed freed on its node (a one-node job of whole GPUs; else none);
4. then the lowest node index (a one-node job: the node it goes to);
5. then, so that the choice is a total order, the least important victims, compared from the
   most important down.

This is the order in which the Kubernetes scheduler's DefaultPreemption picks a node (lowest
highest-priority victim, then fewer victims, ...); docs/simulation.md ("Victims") says where ours
differs and why.

How it is found. Placement is monotone in free capacity, so a set fits only if the prefix of the
candidates up to its most important member fits: the shortest prefix that fits (on some node,
for a one-node job) ends at the lowest most-important victim ``m`` there is (rule 1). Rules 2-5
then choose among the subsets of that prefix that keep ``m`` (without ``m`` none fits): exactly,
by size, while the prefix holds at most ``EXACT_LIMIT`` others; beyond that greedily, sparing the
most important first while the job still fits (Kubernetes' "reprieve"), which gives a set none
of whose victims could be spared, not always the smallest. The prefix search is the hot part (most
searches fail); the choice within a prefix runs only for a search that finds victims.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, cast

import numpy as np

from analysim.core import placement
from analysim.core.job import GPU_MILLI, JobRun, JobSpec
from analysim.core.placement import cpu_mem_on

if TYPE_CHECKING:
    from analysim.core.framework import Handle

# Up to this many candidates besides the most important victim, the fewest victims are found
# exactly (2**12 subsets at most, and only for a search that finds victims); beyond, greedily.
EXACT_LIMIT: Final = 12

# Candidates grouped by node (see candidates_by_node): the candidates on each node open to the job,
# in their order; the GPUs they hold there; and their positions in the candidate list. The nodes
# are in the order of their first candidate (_one_node stops at the first past the best found).
ByNode = tuple[dict[int, list[JobRun]], dict[int, int], dict[int, list[int]]]


def candidates_by_node(ctx: Handle, spec: JobSpec, candidates: list[JobRun]) -> ByNode:
    """The candidates on each node open to the job, in their order, the GPUs they hold there, and
    their positions among ``candidates``: what victims_that_fit reads for a job that fits on one
    node (a plugin that also reads it passes it on)."""
    allowed = ctx.open_nodes(spec)
    by_node: dict[int, list[JobRun]] = {}
    held: dict[int, int] = {}
    at: dict[int, list[int]] = {}
    for i, v in enumerate(candidates):
        for n, slots in v.placed.gpus:
            if allowed[n]:
                on = by_node.get(n)
                if on is None:
                    by_node[n] = [v]
                    held[n] = len(slots)
                    at[n] = [i]
                else:
                    on.append(v)
                    held[n] += len(slots)
                    at[n].append(i)
    return by_node, held, at


def _held_by_node(ctx: Handle, spec: JobSpec, candidates: list[JobRun]) -> dict[int, int]:
    """The GPUs the candidates hold on each node open to the job: candidates_by_node's second part
    alone, for a gang's eviction bound (7 % of tiresias + both over the whole extract went into
    building all three parts, py-spy)."""
    allowed = ctx.open_nodes(spec)
    held: dict[int, int] = {}
    for v in candidates:
        for n, slots in v.placed.gpus:
            if allowed[n]:
                held[n] = held.get(n, 0) + len(slots)
    return held


def victims_that_fit(ctx: Handle, job: JobRun, candidates: list[JobRun], by_node_of: ByNode | None = None) -> list[JobRun] | None:
    """The victims the rule above chooses among ``candidates`` (least important first), in their
    order, or None when evicting them all would not let ``job`` run (``by_node_of``:
    candidates_by_node of these, if the caller has it)."""
    if not candidates:
        return None
    spec = job.spec
    k = ctx.gang_size(spec)
    whole = not spec.is_fractional
    if k == 1:
        got = by_node_of if by_node_of is not None else candidates_by_node(ctx, spec, candidates)
        if spec.num_gpus and whole and eviction_hopeless(ctx, spec, k, got[1]):
            return None
        return _one_node(ctx, spec, candidates, got)
    if spec.num_gpus and whole and eviction_hopeless(ctx, spec, k, _held_by_node(ctx, spec, candidates)):
        return None
    if whole and not spec.cpu_milli and not spec.memory_mib and all(v.spec.gpu_milli == GPU_MILLI for v in candidates):
        return _counted_gang(ctx, spec, k, candidates)
    length = _shortest_prefix_by_trial(ctx, spec, candidates)
    return _fewest_within(candidates[:length], _gang_trial_fit(ctx, spec), 0) if length else None


# ------------------------------------------------------------------ one-node jobs


def _one_node(ctx: Handle, spec: JobSpec, candidates: list[JobRun], got: ByNode) -> list[JobRun] | None:
    by_node, _held, at = got
    st = ctx.state
    whole = not spec.is_fractional
    best = len(candidates)  # the lowest most-important position found (rule 1); none yet
    ends: list[tuple[int, int, bool]] = []  # the nodes that reach it: prefix length, counted
    for n, on in by_node.items():
        pos = at[n]
        if pos[0] > best:
            break  # (nodes come in the order of their first candidate: no later one reaches best)
        counted = whole and all(v.spec.gpu_milli == GPU_MILLI for v in on)
        if counted:
            length = _prefix_counted(ctx, spec, n, on, pos, best)
        else:
            length = _prefix_by_row(ctx, spec, n, on, pos, best)
        if length:
            p = pos[length - 1]
            if p < best:
                best, ends = p, [(n, length, counted)]
            elif p == best:
                ends.append((n, length, counted))  # (the same victim, a gang, on several nodes)
    if not ends:
        return None
    choice: tuple[tuple[int, int, int], list[JobRun]] | None = None
    for n, length, counted in ends:
        need = max(0, spec.num_gpus - int(st.full_free[n])) * GPU_MILLI if whole else 0
        fits = _node_counted_fit(ctx, spec, n) if counted else _node_fit(ctx, spec, n)
        victims = _fewest_within(by_node[n][:length], fits, need)
        key = (len(victims), _milli(victims) - need, n)
        if choice is None or key < choice[0]:
            choice = (key, victims)
    assert choice is not None
    return choice[1]


def _prefix_counted(ctx: Handle, spec: JobSpec, n: int, on: list[JobRun], pos: list[int], best: int) -> int:
    """The length of the shortest prefix of ``on`` (whole-GPU candidates on node ``n``) whose
    eviction lets the whole-GPU job ``spec`` fit on ``n``, if it ends at a position no higher than
    ``best``; else 0. Each GPU such an eviction frees is wholly free, so the node's count of wholly
    free GPUs is counted on, without its row."""
    st = ctx.state
    full = int(st.full_free[n])
    cpu, mem = int(st.cpu_free[n]), int(st.mem_free[n])
    for i, v in enumerate(on):
        if pos[i] > best:
            return 0  # its most important victim would rank above the best found
        freed, freed_cpu, freed_mem = _held_on(v, n)
        full += freed
        cpu += freed_cpu
        mem += freed_mem
        if cpu >= spec.cpu_milli and mem >= spec.memory_mib and full >= spec.num_gpus:
            return i + 1
    return 0


def _held_on(v: JobRun, n: int) -> tuple[int, int, int]:
    """The GPUs, CPU and memory a running job holds on node ``n``."""
    vs, vpl = v.spec, v.placed
    gpus = cpu = mem = 0
    for vn, slots in vpl.gpus:
        if vn == n:
            gpus += len(slots)
            freed_cpu, freed_mem = cpu_mem_on(vs, slots, len(vpl.gpus))
            cpu += freed_cpu
            mem += freed_mem
    return gpus, cpu, mem


def _prefix_by_row(ctx: Handle, spec: JobSpec, n: int, on: list[JobRun], pos: list[int], best: int) -> int:
    """_prefix_counted for any job and candidates: what node ``n`` would have free after each
    eviction, as one row (not a whole clone of the allocation)."""
    st = ctx.state
    row = st.free_milli[n].copy()
    cpu, mem = int(st.cpu_free[n]), int(st.mem_free[n])
    for i, v in enumerate(on):
        if pos[i] > best:
            return 0
        freed_cpu, freed_mem = _release_on_row(v, n, row)
        cpu += freed_cpu
        mem += freed_mem
        if _fits_row(spec, row, cpu, mem):
            return i + 1
    return 0


def _fits_row(spec: JobSpec, row: np.ndarray, cpu: int, mem: int) -> bool:
    """Whether ``spec`` fits on one node with ``row`` (its free thousandths per GPU), ``cpu`` and
    ``mem`` free."""
    if cpu < spec.cpu_milli or mem < spec.memory_mib:
        return False
    if spec.is_fractional:
        return bool((row >= spec.gpu_milli).any())
    return int((row == GPU_MILLI).sum()) >= spec.num_gpus


def _release_on_row(v: JobRun, n: int, row: np.ndarray) -> tuple[int, int]:
    """Give back on ``row`` (node ``n``'s free thousandths per GPU, a copy) what ``v`` holds there;
    the CPU and memory it holds there."""
    vs, vpl = v.spec, v.placed
    cpu = mem = 0
    for vn, slots in vpl.gpus:
        if vn == n:
            row[list(slots)] += vs.gpu_milli
            freed_cpu, freed_mem = cpu_mem_on(vs, slots, len(vpl.gpus))
            cpu += freed_cpu
            mem += freed_mem
    return cpu, mem


def _node_fit(ctx: Handle, spec: JobSpec, n: int) -> Callable[[list[JobRun]], bool]:
    """Whether ``spec`` fits on node ``n`` with a given set of its candidates evicted."""
    st = ctx.state

    def fits(evicted: list[JobRun]) -> bool:
        row = st.free_milli[n].copy()
        cpu, mem = int(st.cpu_free[n]), int(st.mem_free[n])
        for v in evicted:
            freed_cpu, freed_mem = _release_on_row(v, n, row)
            cpu += freed_cpu
            mem += freed_mem
        return _fits_row(spec, row, cpu, mem)

    return fits


def _node_counted_fit(ctx: Handle, spec: JobSpec, n: int) -> Callable[[list[JobRun]], bool]:
    """_node_fit for a whole-GPU job among whole-GPU candidates, counted as _prefix_counted counts
    (each GPU they free is wholly free): a tenth of the instructions of the row's copy and
    numpy reads (callgrind, tiresias + both at 20,000 jobs: 31,000 a call)."""
    st = ctx.state
    full0, cpu0, mem0 = int(st.full_free[n]), int(st.cpu_free[n]), int(st.mem_free[n])
    g, cpu_need, mem_need = spec.num_gpus, spec.cpu_milli, spec.memory_mib

    def fits(evicted: list[JobRun]) -> bool:
        full, cpu, mem = full0, cpu0, mem0
        for v in evicted:
            freed, freed_cpu, freed_mem = _held_on(v, n)
            full += freed
            cpu += freed_cpu
            mem += freed_mem
        return cpu >= cpu_need and mem >= mem_need and full >= g

    return fits


# ------------------------------------------------------------------ gangs


def _counted_gang(ctx: Handle, spec: JobSpec, k: int, candidates: list[JobRun]) -> list[JobRun] | None:
    """victims_that_fit for a whole-GPU gang that asks for no CPU or memory among whole-GPU
    candidates: the shortest prefix and the choice within it both by counts, read once."""
    allowed = ctx.open_nodes(spec)
    base, every = _gang_counts(ctx, allowed, k)
    length = _shortest_gang_prefix(spec.num_gpus, allowed, k, candidates, list(base), every)
    if not length:
        return None
    return _fewest_within(candidates[:length], _gang_counted_fit(spec.num_gpus, allowed, k, base, every), 0)


def _shortest_gang_prefix(g: int, allowed: list[bool], k: int, candidates: list[JobRun], cap: list[int],
                          every: bool) -> int:
    """The length of the shortest prefix of ``candidates`` whose eviction lets a gang of ``g``
    whole GPUs over at least ``k`` nodes that asks for no CPU or memory fit, among whole-GPU
    candidates (0: none does); ``cap`` and ``every`` as _gang_counts gives them (``cap`` is
    raised in place). What can_place reads of a trial allocation is then each allowed
    node's count of wholly free GPUs, which an eviction raises by its slots there. So the counts
    are kept sorted and the gang fits once the ``k`` largest (all of them, with relaxed locality)
    hold ``g`` (see placement.gang_fits)."""
    counts = sorted(cap)
    total = sum(cap)
    for i, v in enumerate(candidates):
        for n, slots in v.placed.gpus:
            if allowed[n]:
                c = cap[n]
                cap[n] = c + len(slots)
                total += len(slots)
                del counts[bisect.bisect_left(counts, c)]
                bisect.insort(counts, c + len(slots))
        if (total if every else sum(counts[-k:])) >= g:
            return i + 1
    return 0


def _gang_counts(ctx: Handle, allowed: list[bool], k: int) -> tuple[list[int], bool]:
    """Each node's wholly free GPUs (0 on a node not ``allowed``), and whether a gang over at least
    ``k`` nodes may then take all of them (relaxed locality, or no fewer nodes than ``k``) rather
    than only the ``k`` largest counts."""
    # (An index loop over tolist's ints: the comprehension over zip(..., strict=True) with int()
    # of each cost 49,000 instructions a call, 4.25 G of tiresias + both's whole extract, callgrind.)
    cap = cast(list[int], ctx.state.full_free.tolist())
    for n, ok in enumerate(allowed):
        if not ok:
            cap[n] = 0
    return cap, ctx.config.relaxed_locality or k >= len(cap)


def _gang_counted_fit(g: int, allowed: list[bool], k: int, base: list[int], every: bool) -> Callable[[list[JobRun]], bool]:
    """Whether a gang of ``g`` whole GPUs fits with a set evicted, by the counts
    _shortest_gang_prefix reads (``base`` and ``every``: _gang_counts, left as they are)."""
    total = sum(base)
    # The nodes, most wholly free GPUs first (ties by index: only the counts are summed). A set's
    # k largest counts are among its raised nodes' and the k largest of the rest, so a trial reads
    # k + (the nodes it raises) counts, not a sort of every node's (_fewest_within tries up to
    # 2**12 sets: the sort was most of tiresias + both's choice of a gang's victims, py-spy).
    most_first = [] if every else sorted(range(len(base)), key=base.__getitem__, reverse=True)

    def fits(evicted: list[JobRun]) -> bool:
        raised: dict[int, int] = {}
        for v in evicted:
            for n, slots in v.placed.gpus:
                if allowed[n]:
                    raised[n] = raised.get(n, 0) + len(slots)
        if every:
            return total + sum(raised.values()) >= g
        tops = [base[n] + r for n, r in raised.items()]
        rest = 0
        for n in most_first:
            if rest == k:
                break
            if n not in raised:
                tops.append(base[n])
                rest += 1
        tops.sort(reverse=True)
        return sum(tops[:k]) >= g

    return fits


def _shortest_prefix_by_trial(ctx: Handle, spec: JobSpec, candidates: list[JobRun]) -> int:
    """The length of the shortest prefix of ``candidates`` whose eviction lets the job fit, by a
    trial allocation (0: none does)."""
    static = ctx.static_mask(spec)
    trial = ctx.state.clone()
    for i, v in enumerate(candidates):
        placement.release_on(trial, v)
        if placement.can_place(ctx, spec, static, trial):
            return i + 1
    return 0


def _gang_trial_fit(ctx: Handle, spec: JobSpec) -> Callable[[list[JobRun]], bool]:
    static = ctx.static_mask(spec)

    def fits(evicted: list[JobRun]) -> bool:
        trial = ctx.state.clone()
        for v in evicted:
            placement.release_on(trial, v)
        return placement.can_place(ctx, spec, static, trial)

    return fits


# ------------------------------------------------------------------ the choice within a prefix


def _fewest_within(prefix: list[JobRun], fits: Callable[[list[JobRun]], bool], need: int) -> list[JobRun]:
    """Rules 2, 3 and 5 within ``prefix``, the shortest prefix that fits: the subsets that keep its
    last (most important) candidate and fit, by fewest victims, then fewest GPUs freed (``need``
    is the same for all of them), then the least important; in candidate order."""
    m, others = prefix[-1], prefix[:-1]
    if len(others) > EXACT_LIMIT:
        return reprieved(m, others, lambda _, evicted: fits(evicted))
    for size in range(len(others) + 1):
        best: tuple[int, tuple[int, ...]] | None = None
        for combo in itertools.combinations(range(len(others)), size):
            chosen = [others[i] for i in combo]
            chosen.append(m)
            if fits(chosen):
                key = (_milli(chosen) - need, tuple(reversed(combo)))
                if best is None or key < best:
                    best = key
        if best is not None:
            picked = sorted(best[1])
            return [others[i] for i in picked] + [m]
    raise AssertionError("the shortest prefix that fits does not fit")


def reprieved(m: JobRun, others: list[JobRun], spare: Callable[[JobRun, list[JobRun]], bool]) -> list[JobRun]:
    """Kubernetes' reprieve (Kueue's fill back): from the most important of ``others`` down, spare
    each candidate whose eviction the job does not need; ``m``, the last, is always kept.
    ``spare(v, evicted)`` tells whether the job fits with ``evicted`` (the victims still kept,
    ``v`` not among them) evicted: a trial that keeps state may restore ``v`` and leave it so on
    True, evict it again on False, so each step costs one candidate, not all those spared."""
    kept = list(others)
    for i in range(len(others) - 1, -1, -1):
        trial = kept[:i] + kept[i + 1:]
        if spare(others[i], trial + [m]):
            kept = trial
    return kept + [m]


def _milli(jobs: list[JobRun]) -> int:
    """The GPUs (in thousandths) the jobs hold, on every node."""
    return sum(v.spec.num_gpus * v.spec.gpu_milli for v in jobs)


# ------------------------------------------------------------------ bounds


def eviction_hopeless(ctx: Handle, spec: JobSpec, k: int, held: dict[int, int]) -> bool:
    """Whether even evicting every candidate leaves too few whole GPUs for a job that needs
    ``spec.num_gpus`` of them on ``k`` nodes (any number with relaxed locality): a bound from
    the GPUs the candidates hold per node open to the job (``held``: see candidates_by_node),
    so a hopeless job skips the trials of every prefix. (Placement is monotone in free
    capacity: no prefix fits where all of them do not.)"""
    if k == 0:
        return True
    st = ctx.state
    g = spec.num_gpus
    if k == 1:  # (the general bound below with one node: no node reaches g)
        return st.max_full_free() < g and all(int(st.full_free[n]) + h < g for n, h in held.items())
    if ctx.config.relaxed_locality:
        return st.total_full_free + sum(held.values()) < g
    # At most: a touched node's whole GPUs free plus those its candidates hold; any other
    # node's, the largest free whole-GPU block.
    # (From tolist's ints: an int() of each numpy element read cost more than converting them all;
    # with the gang counts' change, eviction_hopeless went 1.78 -> 1.13 G over tiresias + both's
    # whole extract, callgrind.)
    free = cast(list[int], st.full_free.tolist())
    most = sorted([free[n] + h for n, h in held.items()] + [st.max_full_free()] * k, reverse=True)
    return sum(most[:k]) < g


def free_after_evicting(ctx: Handle, held: list[np.ndarray]) -> np.ndarray:
    """Each node's whole GPUs free once every candidate is evicted, from the GPUs the candidates
    hold on each of the cluster's nodes (arrays to add up, as ``Handle.gpus_of_vc`` keeps them per
    VC, of ``full_free``'s dtype). A new array: the caller may keep it while the allocation and
    the running jobs stay the same (a plugin memo)."""
    free = ctx.state.full_free
    if not held:
        return free.copy()
    after = free + held[0]
    for gpus in held[1:]:
        after += gpus
    return after


def eviction_hopeless_over(ctx: Handle, spec: JobSpec, k: int, free_after: np.ndarray) -> bool:
    """eviction_hopeless from each node's whole GPUs free once every candidate is evicted
    (``free_after``: free_after_evicting), for a plugin that can bound a search before it gathers
    its candidates. Each node open to the job is counted with that figure, untouched ones too: a
    tighter bound than eviction_hopeless's largest free block for them, as sound, in a few array
    operations. (Callgrind over tiresias + both's whole extract: 3.20 G, 41,700 instructions a
    call, while each call added the lenders' arrays itself, int64 into int32 with a cast in each
    ``+=``, then copied and masked; 1.07 G with the sum kept per memo.)"""
    st = ctx.state
    g = spec.num_gpus
    if k == 0:
        return True
    if k == 1 and st.max_full_free() >= g:
        return False  # (a node has them free already: the bound cannot tell)
    # each open node's GPUs free after evicting every candidate (most jobs may use every node)
    reach = free_after if ctx.open_to_every_node(spec) else free_after[ctx.static_mask(spec)]
    if k == 1:
        return int(reach.max(initial=0)) < g
    if ctx.config.relaxed_locality or k >= len(reach):
        return int(reach.sum()) < g
    return int(np.partition(reach, len(reach) - k)[len(reach) - k:].sum()) < g
