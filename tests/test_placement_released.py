"""The placement questions a preemption search asks of a cluster with some running jobs released
(placement.can_place_released, placement.can_place_on) answer as ``can_place`` does on a copy
of the cluster with those jobs released: the definition they shortcut."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from analysim.core.cluster import ClusterSpec, ClusterState, NodeSpec
from analysim.core.engine import Engine, EngineConfig
from analysim.core.job import GPU_MILLI, JobRun, JobSpec, JobStatus, Placement
from analysim.core.placement import (
    can_place,
    can_place_on,
    can_place_released,
    default_slots,
    gang_size,
    release_on,
    single_node_fit,
)
from analysim.core.policies import build_policy
from analysim.core.tally import Tally


@st.composite
def job_specs(draw, i: int, most_gpus: int, cpus: list[int], mems: list[int], sharing: bool = True) -> JobSpec:
    kind = draw(st.sampled_from(["whole", "whole", "fractional", "cpu-only"] if sharing else ["whole", "whole", "cpu-only"]))
    gpus = {"whole": draw(st.integers(1, most_gpus)), "fractional": 1, "cpu-only": 0}[kind]
    milli = draw(st.sampled_from([250, 500, 700])) if kind == "fractional" else GPU_MILLI
    # Most trace jobs ask for no CPU or memory (the shortcut for those is one of the paths).
    cpu = draw(st.sampled_from(cpus))
    mem = draw(st.sampled_from(mems))
    return JobSpec(f"j{i}", 0.0, 100.0, gpus, gpu_milli=milli, cpu_milli=cpu, memory_mib=mem)


@st.composite
def trials(draw):
    """A cluster with jobs running on it, some of them released, and a job that does not fit
    as the cluster is."""
    nodes = tuple(NodeSpec(f"n{k}", f"r{k % 2}", "V100", draw(st.sampled_from([2, 4, 8])),
                           draw(st.sampled_from([8_000, 16_000, 32_000])), draw(st.sampled_from([16_384, 65_536])))
                  for k in range(draw(st.integers(2, 6))))  # fmt: skip
    spec = ClusterSpec("t", nodes)
    state = ClusterState(spec)
    tally = Tally(state)
    running: list[JobRun] = []
    sharing = draw(st.booleans())  # (whether GPU-sharing jobs run: without, the count of whole GPUs is exact)
    for i in range(draw(st.integers(0, 30))):
        js = draw(job_specs(i, 8, [0, 0, 2_000, 8_000], [0, 0, 4_096, 16_384], sharing))
        fit = single_node_fit(state, js).nonzero()[0]
        if not len(fit):
            continue
        n = int(draw(st.sampled_from(list(fit))))
        job = JobRun(js, i, status=JobStatus.RUNNING)
        job.placement = Placement(((n, default_slots(state, n, js)),))
        tally.charge(job, job.placement)
        running.append(job)
    # (most of them: a job that did not fit then fits more often than not)
    released = [j for j in running if draw(st.sampled_from([True, True, True, False]))]
    wanted = draw(job_specs(99, 16, [0, 0, 4_000, 16_000, 48_000], [0, 0, 8_192, 65_536]))
    mask = np.array(draw(st.lists(st.booleans(), min_size=len(nodes), max_size=len(nodes))))
    relaxed = draw(st.booleans())
    return spec, state, released, wanted, mask, relaxed


@settings(max_examples=600, deadline=None)
@given(trials())
def test_the_released_cluster_places_as_a_copy_with_the_jobs_released(t):
    spec, state, released, wanted, mask, relaxed = t
    ctx = Engine(spec, build_policy("fifo", "consolidate"), EngineConfig(relaxed_locality=relaxed))
    assume(not can_place(ctx, wanted, mask, state))  # (both are asked only of a job that does not fit now)
    before = (state.free_milli.copy(), state.cpu_free.copy(), state.mem_free.copy())
    trial = state.clone()
    for v in released:
        release_on(trial, v)
    expected = can_place(ctx, wanted, mask, trial)
    event(f"{'a gang' if gang_size(state, wanted, mask) > 1 else 'one node'}, "
          f"{'whole GPUs alone' if wanted.num_gpus and not wanted.is_fractional and not wanted.cpu_milli and not wanted.memory_mib else 'other'}"
          f"{', sharing released' if any(v.spec.is_fractional for v in released) else ''}: {expected}")  # fmt: skip
    assert can_place_released(ctx, wanted, mask, state, released) == expected
    changed = {n for v in released for n, _ in v.placed.gpus}
    assert can_place_on(ctx, wanted, mask, trial, changed) == expected
    # (and neither changed the cluster it was asked of)
    assert all(np.array_equal(a, b) for a, b in zip(before, (state.free_milli, state.cpu_free, state.mem_free), strict=True))
