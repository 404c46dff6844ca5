"""Invariants of the engine over random small traces, clusters, policies and mechanisms."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysim.core.cluster import ClusterSpec, NodeSpec, VCSpec
from analysim.core.engine import Engine, EngineConfig, InfeasibleJob
from analysim.core.job import GPU_MILLI, JobSpec, JobStatus
from analysim.core.metrics import MetricsRecorder
from analysim.core.policies import build_policy

POLICIES = ["fifo", "fifo-backfill", "sjf", "srtf", "tiresias", "qssf", "fair"]
PLACEMENTS = ["consolidate", "spread", "random", "fgd"]


class CheckingRecorder(MetricsRecorder):
    """Checks the allocation against the running jobs after every scheduling pass."""

    def after_pass(self, engine: Engine) -> None:
        super().after_pass(engine)
        st_ = engine.state
        used = np.zeros_like(st_.free_milli)
        for job in engine.running.values():
            for n, slots in job.placement.gpus:
                assert st_.up[n], "a job runs on a node that is down"
                for g in slots:
                    used[n, g] += job.spec.gpu_milli
        exists = st_.free_milli >= 0
        cap = np.where(np.arange(st_.free_milli.shape[1])[None, :] < st_.gpus[:, None], GPU_MILLI, -1)
        assert (used[exists] <= GPU_MILLI).all(), "a GPU is over-allocated"
        assert (st_.free_milli[cap >= 0] == GPU_MILLI - used[cap >= 0]).all(), "free GPU share disagrees with jobs"
        assert (st_.full_free == (st_.free_milli == GPU_MILLI).sum(axis=1)).all()
        assert st_.max_full_free() == (int(st_.full_free[st_.up].max()) if st_.up.any() else 0)
        assert abs(engine.allocated_gpus - used.sum() / GPU_MILLI) < 1e-6


@st.composite
def scenario(draw):
    n_nodes = draw(st.integers(1, 4))
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    rack = draw(st.integers(1, 2))
    vcs: tuple[VCSpec, ...] = ()
    vc_names = ["a", "b"]
    if draw(st.booleans()):
        total = n_nodes * gpus
        vcs = (VCSpec("a", total / 2), VCSpec("b", total / 2))
    spec = ClusterSpec(
        name="h", nodes=tuple(NodeSpec(f"n{i}", f"r{i // rack}", "V100", gpus, 32000, 64000) for i in range(n_nodes)),
        vcs=vcs, allow_borrowing=draw(st.booleans()) or not vcs, cross_rack_slowdown=draw(st.sampled_from([0.0, 0.5])),
    )
    jobs = []
    for i in range(draw(st.integers(1, 18))):
        frac = draw(st.booleans()) and draw(st.booleans())
        g = 1 if frac else draw(st.sampled_from([1, 1, 2, 4, 8, 16]))
        jobs.append(JobSpec(
            job_id=f"j{i}", submit_s=float(draw(st.integers(0, 400))), duration_s=float(draw(st.integers(1, 600))),
            num_gpus=g, gpu_milli=draw(st.integers(100, 900)) if frac else GPU_MILLI,
            cpu_milli=draw(st.sampled_from([0, 1000, 4000])), memory_mib=draw(st.sampled_from([0, 1024])),
            vc=draw(st.sampled_from(vc_names)), user=draw(st.sampled_from(["u", "v"])),
        ))
    policy = draw(st.sampled_from(POLICIES))
    placement = draw(st.sampled_from(PLACEMENTS))
    config = EngineConfig(
        preemption=draw(st.booleans()), migration=draw(st.booleans()),
        restore_overhead_s=float(draw(st.integers(0, 20))), migration_overhead_s=float(draw(st.integers(0, 20))),
        checkpoint_interval_s=draw(st.sampled_from([None, 50.0])), seed=draw(st.integers(0, 3)),
        rebalance_interval_s=draw(st.sampled_from([None, 100.0])),
    )
    failures = []
    if draw(st.booleans()):
        node = draw(st.integers(0, n_nodes - 1))
        down = float(draw(st.integers(0, 500)))
        failures.append((f"n{node}", down, down + draw(st.integers(1, 300))))
    return spec, jobs, policy, placement, config, failures


def simulate(spec, jobs, policy, placement, config, failures):
    engine = Engine(spec, build_policy(policy, placement), config, recorder=CheckingRecorder(sample_interval_s=50.0),
                    workload=jobs)
    accepted = []
    for j in jobs:
        try:
            engine.submit(j)
            accepted.append(j)
        except InfeasibleJob:
            pass
    for node, down, up in failures:
        engine.node_down(node, at=down)
        engine.node_up(node, at=up)
    engine.run()
    return engine, accepted


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_every_job_completes_once_and_nothing_is_over_allocated(sc):
    engine, accepted = simulate(*sc)
    done = Counter(d.job_id for d in engine.decisions if d.kind == "complete")
    assert done == Counter({j.job_id: 1 for j in accepted})
    assert all(engine.jobs[j.job_id].status is JobStatus.COMPLETED for j in accepted)
    st_ = engine.state
    assert not engine.running and engine.pending_count == 0
    assert (st_.free_milli[st_.free_milli >= 0] == GPU_MILLI).all(), "GPUs left allocated at the end"
    assert (st_.cpu_free == [n.cpu_milli for n in sc[0].nodes]).all()
    assert (st_.mem_free == [n.memory_mib for n in sc[0].nodes]).all()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_gpu_seconds_are_conserved(sc):
    engine, accepted = simulate(*sc)
    by_jobs = sum(engine.jobs[j.job_id].executed_s * j.gpu_demand for j in accepted)
    assert abs(engine.recorder.alloc_gpu_s - by_jobs) <= 1e-6 * max(1.0, by_jobs)
    for j in accepted:
        run = engine.jobs[j.job_id]
        # A job never finishes faster than its ideal duration, nor starts before it is submitted.
        assert run.first_start_s >= j.submit_s
        assert run.executed_s >= j.duration_s - 1e-6
        assert run.end_s - j.submit_s >= j.duration_s - 1e-6


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_same_inputs_same_decisions(sc):
    a, _ = simulate(*sc)
    b, _ = simulate(*sc)
    assert a.decisions == b.decisions
    assert a.recorder.jobs == b.recorder.jobs
    assert a.recorder.samples == b.recorder.samples
