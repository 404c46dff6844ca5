"""Fragmentation measure and FGD placement (analysim.core.fragmentation)."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysim.core.cluster import ClusterSpec, ClusterState, NodeSpec
from analysim.core.fragmentation import (
    FragmentationIndex,
    TaskClass,
    WorkloadDistribution,
    best_fit_choose,
    fgd_choose,
    fits_mask,
    gpu_slots_for,
)
from analysim.core.job import JobSpec
from tests.shared import TRACES, needs_shared

# ---------------------------------------------------------------------------------------------------
# helpers


def job(
    num_gpus: int, milli: int = 1000, cpu: int = 0, mem: int = 0, models: tuple[str, ...] = ()
) -> JobSpec:
    return JobSpec("j", 0.0, None, num_gpus, milli, cpu, mem, gpu_models=models)


def as_job(tc: TaskClass) -> JobSpec:
    return job(tc.num_gpus, tc.gpu_milli, tc.cpu_milli, tc.memory_mib, tc.gpu_models)


def put(
    state: ClusterState, node: int, slots: tuple[int, ...], milli: int, cpu: int = 0, mem: int = 0
) -> None:
    state.allocate(node, slots, milli, cpu, mem)


def naive_weighted_frag(state: ClusterState, n: int, wl: WorkloadDistribution) -> int:
    """W_total x F_n straight from the definition, one class at a time."""
    free = [int(x) for x in state.free_milli[n][: state.gpus[n]]]
    total = sum(f for f in free if f > 0)
    model = state.model_names[state.model_id[n]]
    out = 0
    for c, w in zip(wl.classes, wl.weights, strict=True):
        can = (
            c.num_gpus > 0
            and bool(state.up[n])
            and state.cpu_free[n] >= c.cpu_milli
            and state.mem_free[n] >= c.memory_mib
            and (not c.gpu_models or model in c.gpu_models)
            and sum(f >= c.gpu_milli for f in free) >= c.num_gpus
        )
        out += w * (sum(f for f in free if 0 < f < c.gpu_milli) if can else total)
    return out


def brute_force_fgd(
    state: ClusterState, wl: WorkloadDistribution, j: JobSpec, cand: np.ndarray
) -> tuple[int, tuple[int, ...]] | None:
    """Try every allowed placement for real (allocate, measure naively, release); the lexicographic
    minimum of (ΔF, node, slots)."""
    tc = TaskClass.of(j)
    best = None
    for n in np.flatnonzero(cand & fits_mask(state, j)):
        n = int(n)
        if tc.num_gpus == 0:
            options: list[tuple[int, ...]] = [()]
        elif tc.num_gpus == 1:
            options = [(g,) for g in range(state.gpus[n]) if state.free_milli[n, g] >= tc.gpu_milli]
        else:
            slots = gpu_slots_for(state, n, j)
            options = [] if slots is None else [slots]
        before = naive_weighted_frag(state, n, wl)
        for slots in options:
            milli = tc.gpu_milli if slots else 0
            state.allocate(n, slots, milli, tc.cpu_milli, tc.memory_mib)
            delta = naive_weighted_frag(state, n, wl) - before
            state.release(n, slots, milli, tc.cpu_milli, tc.memory_mib)
            key = (delta, n, slots)
            if best is None or key < best:
                best = key
    return None if best is None else (best[1], best[2])


# ---------------------------------------------------------------------------------------------------
# a small hand-made cluster
#
# n0: model A, 2 GPUs, 8000 CPU, 16384 MiB; GPU 0 holds 700 -> free [300, 1000], cpu 7000
# n1: model B, 4 GPUs, 4000 CPU, 8192 MiB; GPUs hold 200, 600, 1000, 0 -> free [800, 400, 0, 1000],
#     cpu 1500
# classes (popularity): m1 = 1 x 500, 1000 CPU (1/2); m2 = 1 x 1000, 2000 CPU (1/4);
#                       m3 = 2 x 1000, 6000 CPU, model A only (1/4)

M1 = TaskClass(1, 500, 1000, 1024)
M2 = TaskClass(1, 1000, 2000, 2048)
M3 = TaskClass(2, 1000, 6000, 4096, ("A",))
WL = WorkloadDistribution((M1, M2, M3), (2, 1, 1))


def small_cluster() -> ClusterState:
    spec = ClusterSpec(
        "small",
        (NodeSpec("n0", "r0", "A", 2, 8000, 16384), NodeSpec("n1", "r0", "B", 4, 4000, 8192)),
    )
    state = ClusterState(spec)
    put(state, 0, (0,), 700, cpu=1000)
    put(state, 1, (0,), 200, cpu=500)
    put(state, 1, (1,), 600, cpu=1000)
    put(state, 1, (2,), 1000, cpu=1000)
    return state


def test_hand_computed_node_fragmentation() -> None:
    idx = FragmentationIndex(small_cluster(), WL)
    # n0, 1300 free: m1 fits (GPU 1), GPU 0's 300 < 500 is fragmented -> 300
    #                m2 fits (GPU 1), GPU 0's 300 < 1000 -> 300
    #                m3 needs 2 free GPUs, has 1 -> all 1300
    #   F = 0.5*300 + 0.25*300 + 0.25*1300 = 150 + 75 + 325 = 550
    # n1, 2200 free: m1 fits (GPU 0 or 3); GPU 1's 400 < 500 -> 400
    #                m2 needs 2000 CPU, has 1500 -> all 2200
    #                m3 not allowed on model B -> all 2200
    #   F = 0.5*400 + 0.25*2200 + 0.25*2200 = 200 + 550 + 550 = 1300
    assert idx.node_frag().tolist() == [550.0, 1300.0]
    assert idx.cluster_frag_gpus() == pytest.approx(1.85)  # (550 + 1300) / 1000


def test_down_node_is_all_fragmented() -> None:
    state = small_cluster()
    idx = FragmentationIndex(state, WL)
    state.up[0] = False
    idx.refresh([0])
    assert idx.node_frag()[0] == 1300.0  # every class: all of 300 + 1000


def test_cpu_only_class_fragments_all_free_gpu() -> None:
    cpu_only = TaskClass(0, 0, 100, 0)
    wl = WorkloadDistribution((M1, cpu_only), (1, 1))
    idx = FragmentationIndex(small_cluster(), wl)
    # n0: m1 -> 300, cpu-only -> 1300: 0.5*300 + 0.5*1300 = 800
    # n1: m1 -> 400, cpu-only -> 2200: 0.5*400 + 0.5*2200 = 1300
    assert idx.node_frag().tolist() == [800.0, 1300.0]


def test_empty_node_has_no_fragmentation_and_full_node_none_left() -> None:
    spec = ClusterSpec("c", (NodeSpec("a", "r", "A", 2, 8000, 16384),))
    state = ClusterState(spec)
    idx = FragmentationIndex(state, WorkloadDistribution((M1, M2), (1, 1)))
    assert idx.node_frag().tolist() == [0.0]
    put(state, 0, (0, 1), 1000)
    idx.refresh([0])
    assert idx.node_frag().tolist() == [0.0]


def test_fgd_picks_hand_computed_node_and_gpu_with_tie_break() -> None:
    state = small_cluster()
    idx = FragmentationIndex(state, WL)
    j = job(1, 300, cpu=500)
    # n0 (F 550), cpu 7000 -> 6500:
    #   GPU 0 -> free [0, 1000]: m1 0, m2 0, m3 all 1000: 0.25*1000 = 250      ΔF = -300
    #   GPU 1 -> free [300, 700]: m1 300, m2 all 1000, m3 all 1000: 150 + 250 + 250 = 650  ΔF = +100
    # n1 (F 1300), cpu 1500 -> 1000, 1900 free after; m2 and m3 all 1900 -> 0.5*1900 = 950:
    #   GPU 0 -> [500, 400, 0, 1000]: m1 400 -> 950 + 200 = 1150               ΔF = -150
    #   GPU 1 -> [800, 100, 0, 1000]: m1 100 -> 950 + 50 = 1000                ΔF = -300
    #   GPU 3 -> [800, 400, 0, 700]:  m1 400 -> 1150                           ΔF = -150
    # tie at -300 between n0/GPU 0 and n1/GPU 1: lowest node index wins
    assert idx.deltas(j).tolist() == [-300.0, -300.0]
    assert fgd_choose(idx, state, j, np.array([True, True])) == (0, (0,))
    assert fgd_choose(idx, state, j, np.array([False, True])) == (1, (1,))
    assert brute_force_fgd(state, WL, j, np.array([True, True])) == (0, (0,))


def test_fgd_verifies_fit_and_returns_none() -> None:
    state = small_cluster()
    idx = FragmentationIndex(state, WL)
    # 2 whole GPUs: n0 has one fully free GPU, n1 one too
    assert fgd_choose(idx, state, job(2), np.array([True, True])) is None
    # 1 whole GPU but 5000 CPU: only n0 has the CPU; candidates say n1 only
    assert fgd_choose(idx, state, job(1, cpu=5000), np.array([False, True])) is None
    assert fgd_choose(idx, state, job(1, cpu=5000), np.array([True, True])) == (0, (1,))
    # model restriction
    assert fgd_choose(idx, state, job(1, 100, models=("B",)), np.array([True, True]))[0] == 1


def test_fgd_multi_gpu_takes_lowest_free_gpus() -> None:
    spec = ClusterSpec(
        "c", (NodeSpec("a", "r", "A", 4, 8000, 16384), NodeSpec("b", "r", "A", 4, 8000, 16384))
    )
    state = ClusterState(spec)
    put(state, 0, (1,), 500)
    idx = FragmentationIndex(state, WL)
    choice = fgd_choose(idx, state, job(2), np.ones(2, dtype=bool))
    # node a: free [1000, 500, 1000, 1000] -> takes GPUs 0 and 2 -> [0, 500, 0, 1000]
    #   m1 fits, 0 frag; m2 fits, frag 500; m3 needs 2 free GPUs -> all 1500
    #   F = 0.5*0 + 0.25*500 + 0.25*1500 = 500; before: m1 0, m2 500, m3 fits -> 500: 0.25*500*2 = 250
    #   ΔF = +250
    # node b: empty -> [0, 0, 1000, 1000]: nothing fragmented for anyone, ΔF = 0
    assert choice == (1, (0, 1))
    assert brute_force_fgd(state, WL, job(2), np.ones(2, dtype=bool)) == choice


def test_best_fit_and_gpu_slots_for() -> None:
    state = small_cluster()
    # job 300: left after = n0 1300 - 300 = 1000, n1 2200 - 300 = 1900 -> n0; best-fit GPU: free 300
    assert best_fit_choose(state, job(1, 300), np.array([True, True])) == (0, (0,))
    # job 350 on n1: GPUs with >= 350 free: 800, 400, 1000 -> the 400 one
    assert gpu_slots_for(state, 1, job(1, 350)) == (1,)
    assert gpu_slots_for(state, 1, job(1, 1000)) == (3,)
    assert gpu_slots_for(state, 1, job(2, 1000)) is None
    assert gpu_slots_for(state, 1, job(0, 0, cpu=1000)) == ()
    assert gpu_slots_for(state, 1, job(0, 0, cpu=2000)) is None
    assert best_fit_choose(state, job(1, 300), np.array([False, False])) is None


def test_cpu_only_job_placement() -> None:
    state = small_cluster()
    idx = FragmentationIndex(state, WL)
    # CPU-only job of 1500 CPU: on n1 it would leave 0 CPU, making m1 unrunnable there
    # (ΔF = 0.5 * (2200 - 400) = 900); on n0 m3 already cannot run, m1/m2 still fit: ΔF = 0
    assert fgd_choose(idx, state, job(0, 0, cpu=1500), np.array([True, True])) == (0, ())


def test_no_gpu_classes_means_no_fragmentation() -> None:
    state = small_cluster()
    idx = FragmentationIndex(state, WorkloadDistribution((), ()))
    assert idx.cluster_frag_gpus() == 0.0
    assert fgd_choose(idx, state, job(1, 300), np.array([True, True])) == (0, (0,))


# ---------------------------------------------------------------------------------------------------
# workload distribution


def test_from_jobs_groups_and_counts() -> None:
    jobs = [job(1, 500, 1000)] * 3 + [job(1)] + [job(0, 1000, cpu=100)] * 4  # CPU-only: gpu_milli ignored
    wl = WorkloadDistribution.from_jobs(jobs)
    assert wl.classes == (TaskClass(1, 500, 1000), TaskClass(1, 1000))
    assert wl.weights == (3, 1)
    assert wl.popularity == (0.75, 0.25)
    wl2 = WorkloadDistribution.from_jobs(jobs, include_cpu_only=True)
    assert wl2.classes[0] == TaskClass(0, 0, 100) and wl2.weights[0] == 4


def test_from_jobs_buckets_cpu_memory_when_too_many() -> None:
    jobs = [job(1, 500, cpu=1000 + i, mem=4000 + 3 * i) for i in range(40)] + [
        job(2, cpu=c) for c in range(1, 30)
    ]
    wl = WorkloadDistribution.from_jobs(jobs, max_classes=5)
    assert len(wl) <= 5
    assert wl.total_weight == len(jobs)
    assert {(c.num_gpus, c.gpu_milli) for c in wl.classes} == {(1, 500), (2, 1000)}  # GPU shapes kept
    big = next(c for c in wl.classes if c.gpu_milli == 500)
    assert 1000 <= big.cpu_milli <= 1039 and 4000 <= big.memory_mib <= 4117  # a mean of its members
    # more GPU shapes than allowed: the most popular are kept
    jobs = [job(1, m) for m in (100, 200, 300) for _ in range(m // 100)]
    assert WorkloadDistribution.from_jobs(jobs, max_classes=2).classes == (
        TaskClass(1, 300),
        TaskClass(1, 200),
    )


def test_from_popularity_and_validation() -> None:
    wl = WorkloadDistribution.from_popularity((M1, M2), (0.25, 0.75))
    assert wl.popularity == pytest.approx((0.25, 0.75))
    with pytest.raises(ValueError):
        TaskClass(0, 500)
    with pytest.raises(ValueError):
        TaskClass(1, 1500)
    with pytest.raises(ValueError):
        WorkloadDistribution((M1, M1), (1, 1))
    assert TaskClass.of(job(0, 1000, cpu=5)) == TaskClass(0, 0, 5)
    assert TaskClass.of(job(1, 500, models=("B", "A", "B"))).gpu_models == ("A", "B")


# ---------------------------------------------------------------------------------------------------
# properties: incremental index == full recomputation == the definition; FGD == brute force

MODELS = ("A", "B")
task_classes = st.builds(
    lambda k, milli, cpu, mem, models: TaskClass(
        k, 0 if k == 0 else (1000 if k > 2 else milli), cpu, mem, models
    ),
    st.sampled_from([0, 1, 1, 1, 2, 4]),
    st.sampled_from([100, 250, 300, 500, 700, 1000]),
    st.sampled_from([0, 500, 1000, 3000]),
    st.sampled_from([0, 1024, 4096]),
    st.sampled_from([(), ("A",), ("B",), ("A", "B")]),
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[ClusterSpec, WorkloadDistribution, list[tuple]]:
    nodes = tuple(
        NodeSpec(
            f"n{i}",
            "r",
            draw(st.sampled_from(MODELS)),
            draw(st.integers(1, 4)),
            draw(st.sampled_from([2000, 4000, 8000])),
            draw(st.sampled_from([4096, 8192])),
        )
        for i in range(draw(st.integers(1, 5)))
    )
    classes = draw(st.lists(task_classes, min_size=1, max_size=6, unique=True))
    weights = draw(st.lists(st.integers(1, 5), min_size=len(classes), max_size=len(classes)))
    ops = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("place"), task_classes, st.integers(0, 31)),
                st.tuples(st.just("release"), st.integers(0, 1000)),
                st.tuples(st.just("toggle"), st.integers(0, 1000)),
            ),
            max_size=30,
        )
    )
    return ClusterSpec("h", nodes), WorkloadDistribution(tuple(classes), tuple(weights)), ops


def check_index(state: ClusterState, wl: WorkloadDistribution, idx: FragmentationIndex) -> None:
    fresh = FragmentationIndex(state, wl).node_frag()
    assert np.array_equal(idx.node_frag(), fresh)
    naive = [naive_weighted_frag(state, n, wl) / wl.total_weight for n in range(state.num_nodes)]
    assert np.array_equal(fresh, np.array(naive))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_incremental_refresh_and_fgd_match_brute_force(scenario) -> None:
    spec, wl, ops = scenario
    state = ClusterState(spec)
    idx = FragmentationIndex(state, wl)
    placed: list[tuple[int, tuple[int, ...], int, int, int]] = []
    n = state.num_nodes
    for op in ops:
        if op[0] == "place":
            _, tc, mask_bits = op
            j = as_job(tc)
            cand = np.array([(mask_bits >> i) & 1 == 1 or mask_bits == 0 for i in range(n)])
            choice = fgd_choose(idx, state, j, cand)
            assert choice == brute_force_fgd(state, wl, j, cand)
            if choice is not None:
                node, slots = choice
                milli = tc.gpu_milli if slots else 0
                state.allocate(node, slots, milli, tc.cpu_milli, tc.memory_mib)
                placed.append((node, slots, milli, tc.cpu_milli, tc.memory_mib))
                idx.refresh([node])
        elif op[0] == "release" and placed:
            node, slots, milli, cpu, mem = placed.pop(op[1] % len(placed))
            state.release(node, slots, milli, cpu, mem)
            idx.refresh([node])
        elif op[0] == "toggle":
            node = op[1] % n
            state.up[node] = not state.up[node]
            idx.refresh(np.array([node]))
        check_index(state, wl, idx)


def test_deterministic_runs() -> None:
    spec = ClusterSpec(
        "d", tuple(NodeSpec(f"n{i}", "r", "AB"[i % 2], 1 + i % 4, 16000, 65536) for i in range(12))
    )
    rng = np.random.default_rng(7)
    jobs = [
        job(int(k), int(m) if k == 1 else 1000, int(c))
        for k, m, c in zip(
            rng.choice([0, 1, 1, 1, 2], 200),
            rng.choice([200, 300, 500, 1000], 200),
            rng.choice([0, 1000, 4000], 200),
            strict=True,
        )
    ]
    wl = WorkloadDistribution.from_jobs(jobs)

    def run() -> list:
        state = ClusterState(spec)
        idx = FragmentationIndex(state, wl)
        out = []
        for j in jobs:
            choice = fgd_choose(idx, state, j, np.ones(state.num_nodes, dtype=bool))
            out.append(choice)
            if choice is not None:
                node, slots = choice
                state.allocate(node, slots, j.gpu_milli if slots else 0, j.cpu_milli, j.memory_mib)
                idx.refresh([node])
        return out + [idx.cluster_frag_gpus()]

    first = run()
    assert first == run()
    assert any(c is None for c in first[:-1]) and any(c is not None for c in first[:-1])


# ---------------------------------------------------------------------------------------------------
# the openb trace, when ../shared is there

@needs_shared(TRACES / "openb_pod_list_default.csv", TRACES / "openb_node_list_gpu_node.csv")
def test_openb_prefix_stays_consistent() -> None:
    with open(TRACES / "openb_node_list_gpu_node.csv", newline="") as fh:
        nodes = tuple(
            NodeSpec(r["sn"], "r", r["model"], int(r["gpu"]), int(r["cpu_milli"]), int(r["memory_mib"]))
            for r in csv.DictReader(fh)
        )
    with open(TRACES / "openb_pod_list_default.csv", newline="") as fh:
        jobs = [
            job(int(r["num_gpu"]), int(r["gpu_milli"]), int(r["cpu_milli"]), int(r["memory_mib"]))
            for r in csv.DictReader(fh)
        ]
    state = ClusterState(ClusterSpec("openb", nodes))
    wl = WorkloadDistribution.from_jobs(jobs)
    assert 10 <= len(wl) <= 64
    idx = FragmentationIndex(state, wl)
    for j in jobs[:1500]:
        choice = fgd_choose(idx, state, j, fits_mask(state, j))
        assert choice is not None
        node, slots = choice
        state.allocate(node, slots, j.gpu_milli if slots else 0, j.cpu_milli, j.memory_mib)
        idx.refresh([node])
    assert np.array_equal(idx.node_frag(), FragmentationIndex(state, wl).node_frag())


def test_refresh_accepts_indexes_sets_and_masks() -> None:
    state = small_cluster()
    idx = FragmentationIndex(state, WL)
    put(state, 0, (1,), 1000)
    put(state, 1, (3,), 1000)
    idx.refresh(np.array([False, True]))
    idx.refresh({0})
    assert np.array_equal(idx.node_frag(), FragmentationIndex(state, WL).node_frag())
