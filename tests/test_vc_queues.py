"""Per-VC queues: a blocking (FIFO) queue is one queue per virtual cluster, and a tenant waits for
another tenant's head of line only when both draw on the same GPUs (shared pool, borrowing)."""

from __future__ import annotations

import contextlib
import heapq
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysim.core.cluster import ClusterSpec, NodeSpec, VCSpec
from analysim.core.engine import Engine, EngineConfig, InfeasibleJob
from analysim.core.job import JobSpec
from analysim.core.metrics import MetricsRecorder
from analysim.core.plugins.queue import FairShare
from analysim.core.policies import build_policy
from tests.simhelpers import cluster, job, run_engine, times


def _two_dedicated_vcs() -> ClusterSpec:
    return cluster(2, 8, vcs=(VCSpec("a", nodes=("n0",)), VCSpec("b", nodes=("n1",))))


TWO_VC_TRACE = [job("a1", 0, 8, 10000, vc="a"), job("a2", 10, 8, 100, vc="a"), job("b1", 20, 1, 100, vc="b")]


@pytest.mark.parametrize("policy", ["fifo", "fifo-backfill", "sjf"])
def test_a_vc_with_its_own_nodes_does_not_wait_for_another_vcs_head(policy):
    # VC b's node is idle throughout: b1 starts when it arrives, whatever a's queue holds.
    e = run_engine(_two_dedicated_vcs(), TWO_VC_TRACE, policy)
    t = times(e)
    assert t["b1"] == (20.0, 120.0)
    assert t["a2"] == (10000.0, 10100.0)  # FIFO within a VC still holds


def test_dedicated_vcs_report_their_gpus_as_quota():
    e = run_engine(_two_dedicated_vcs(), TWO_VC_TRACE, "fifo")
    per_vc = e.recorder.summary(e)["per_vc"]
    assert per_vc["a"]["quota_gpus"] == 8.0 and per_vc["b"]["quota_gpus"] == 8.0


def _mixed() -> ClusterSpec:
    # Shared pool n0, n1 (16 GPUs) split by quota a 8, b 4, d 4, borrowing on; VC c owns n2.
    return cluster(3, 8, vcs=(VCSpec("a", 8), VCSpec("b", 4), VCSpec("d", 4), VCSpec("c", nodes=("n2",))))


MIXED_TRACE = [
    job("b1", 0, 4, 10000, vc="b"),    # within b's quota: n0
    job("b2", 5, 8, 10000, vc="b"),    # borrows: n1
    job("a1", 10, 8, 100, vc="a"),     # within a's quota, but no node has 8 free: blocks
    job("c1", 15, 8, 100, vc="c"),     # its own node: not behind a1
    job("d1", 15, 2, 100, vc="d"),     # within d's quota: not behind a1
    job("b3", 20, 2, 100, vc="b"),     # would borrow the free GPUs a1 waits for: behind a1
]


def test_a_job_that_would_borrow_still_waits_behind_a_blocked_head():
    t = times(run_engine(_mixed(), MIXED_TRACE, "fifo"))
    assert t["c1"][0] == 15.0 and t["d1"][0] == 15.0
    assert t["a1"][0] == 10000.0  # b1 ends, n0 frees up
    assert t["b3"][0] >= t["a1"][0]
    # It could have run at once: a queue that does not block starts it at 20.
    assert times(run_engine(_mixed(), MIXED_TRACE, "sjf"))["b3"][0] == 20.0


def test_one_pool_keeps_one_fifo_across_vcs():
    # No VCs in the cluster: jobs of different VCs draw on the same GPUs, FIFO blocks as ever.
    trace = [job("a1", 0, 8, 10000, vc="a"), job("a2", 10, 8, 100, vc="a"), job("b1", 20, 1, 100, vc="b")]
    t = times(run_engine(cluster(2, 8), [job("x", 0, 8, 10000, vc="x"), *trace], "fifo"))
    assert t["b1"][0] == t["a2"][0] == 10000.0


def test_unknown_vc_is_refused_by_a_cluster_that_names_its_vcs():
    e = Engine(_mixed(), build_policy("fifo"))
    with pytest.raises(InfeasibleJob) as err:
        e.check_feasible(job("z", 0, 1, 10, vc="zz"))
    assert err.value.reason == "unknown_vc"
    Engine(cluster(1, 8), build_policy("fifo")).check_feasible(job("z", 0, 1, 10, vc="zz"))  # no VCs: one pool


class _AllowedNodes(MetricsRecorder):
    """After every pass: each running job sits only on nodes its VC may use, and without borrowing
    each VC stays within its quota."""

    def after_pass(self, engine: Engine) -> None:
        super().after_pass(engine)
        spec = engine.spec
        owner = {name: v.name for v in spec.vcs for name in v.nodes}
        for j in engine.running.values():
            vc = j.spec.vc
            for n in j.placement.nodes:
                assert owner.get(spec.nodes[n].name) == (vc if any(v.name == vc and v.nodes for v in spec.vcs)
                                                         else None), (j.job_id, vc, spec.nodes[n].name)
        if not spec.allow_borrowing:
            for v in spec.vcs:
                if v.quota_gpus is not None:
                    assert engine.state.vc_used.get(v.name, 0.0) <= v.quota_gpus + 1e-9


@st.composite
def vc_scenario(draw):
    gpus = draw(st.sampled_from([2, 4, 8]))
    n_nodes = draw(st.integers(2, 5))
    nodes = tuple(NodeSpec(f"n{i}", "r0", "V100", gpus, 32000, 64000) for i in range(n_nodes))
    n_dedicated = draw(st.integers(0, n_nodes - 1))
    shared_gpus = (n_nodes - n_dedicated) * gpus
    vcs = [VCSpec(f"d{i}", nodes=(f"n{i}",)) for i in range(n_dedicated)]
    if draw(st.booleans()):
        vcs += [VCSpec("qa", shared_gpus / 2), VCSpec("qb", shared_gpus / 2)]
    else:
        vcs += [VCSpec("qa"), VCSpec("qb")]
    spec = ClusterSpec("h", nodes, tuple(vcs), allow_borrowing=draw(st.booleans()))
    names = [v.name for v in vcs]
    jobs = [JobSpec(job_id=f"j{i}", submit_s=float(draw(st.integers(0, 300))),
                    duration_s=float(draw(st.integers(1, 500))), num_gpus=draw(st.sampled_from([1, 2, gpus, 2 * gpus])),
                    vc=draw(st.sampled_from(names)))
            for i in range(draw(st.integers(1, 16)))]
    policy = draw(st.sampled_from(["fifo", "fifo-backfill", "sjf", "srtf", "tiresias", "fair"]))
    config = EngineConfig(preemption=draw(st.booleans()), migration=draw(st.booleans()))
    return spec, jobs, policy, config


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vc_scenario())
def test_per_vc_queues_never_start_a_job_on_gpus_its_vc_may_not_use(sc):
    spec, jobs, policy, config = sc
    engine = Engine(spec, build_policy(policy), config, recorder=_AllowedNodes(sample_interval_s=100.0))
    accepted = []
    for j in jobs:
        try:
            engine.submit(j)
            accepted.append(j.job_id)
        except InfeasibleJob:
            pass
    engine.run()
    assert all(engine.jobs[j].end_s is not None for j in accepted)  # and nobody waits forever


def _WalkEveryJob(*args, **kw) -> Engine:
    """The reference reading of per-VC queues (Engine's ``shortcuts`` off): every pass walks every
    waiting job and skips those behind a blocked head one by one (the engine leaves out whole VCs,
    and jumps over a VC's jobs that would borrow while the shared queue is blocked, for speed)."""
    return Engine(*args, shortcuts=False, **kw)


def _decisions(cls: type[Engine], spec: ClusterSpec, jobs: list[JobSpec], policy: str, config: EngineConfig):
    engine = cls(spec, build_policy(policy), config)
    for j in jobs:
        with contextlib.suppress(InfeasibleJob):
            engine.submit(j)
    engine.run()
    return engine.decisions


def test_a_vc_left_out_as_borrowing_comes_back_when_reclaim_lowers_its_usage():
    # One 4-GPU node; quotas a 1, b 2, c 1. b1 borrows the whole node. At 10, in FIFO order: a1 would
    # borrow and cannot fit (blocks the shared queue); b2 would borrow too (b is over quota) and
    # waits; c1 is within quota and reclaims b1's GPUs; now b3 is within b's quota and runs at once.
    spec = cluster(1, 4, vcs=(VCSpec("a", 1), VCSpec("b", 2), VCSpec("c", 1)))
    trace = [job("b1", 0, 4, 1000, vc="b"), job("a1", 10, 2, 10, vc="a"), job("b2", 10, 1, 10, vc="b"),
             job("c1", 10, 1, 10, vc="c"), job("b3", 10, 1, 10, vc="b")]
    config = EngineConfig(preemption=True)
    ours = _decisions(Engine, spec, trace, "fifo", config)
    assert ours == _decisions(_WalkEveryJob, spec, trace, "fifo", config)
    assert [(d.time, d.kind, d.job_id) for d in ours if d.time == 10.0] == [
        (10.0, "preempt", "b1"), (10.0, "launch", "c1"), (10.0, "launch", "b3")]


def test_a_vc_s_jobs_that_would_borrow_are_jumped_over_to_one_within_quota():
    # Two 4-GPU nodes, quotas a 4, b 4; a0 holds n0, b0 half of n1. At 10, in FIFO order: a1 would
    # borrow and cannot fit (blocks the shared queue); b1 (4) and b2 (3) would take b over its quota
    # and wait behind it; b3 (2) is within b's quota and runs on n1's two free GPUs.
    spec = cluster(2, 4, vcs=(VCSpec("a", 4), VCSpec("b", 4)))
    trace = [job("a0", 0, 4, 1000, vc="a"), job("b0", 0, 2, 1000, vc="b"), job("a1", 10, 4, 10, vc="a"),
             job("b1", 10, 4, 10, vc="b"), job("b2", 10, 3, 10, vc="b"), job("b3", 10, 2, 10, vc="b")]
    ours = _decisions(Engine, spec, trace, "fifo", EngineConfig())
    assert ours == _decisions(_WalkEveryJob, spec, trace, "fifo", EngineConfig())
    assert [(d.time, d.kind, d.job_id) for d in ours if d.time == 10.0] == [(10.0, "launch", "b3")]


@st.composite
def fifo_scenario(draw):
    """FIFO on a busy shared pool with quotas (and maybe a dedicated node): heads block often."""
    gpus = draw(st.sampled_from([4, 8]))
    n_nodes = draw(st.integers(2, 4))
    nodes = tuple(NodeSpec(f"n{i}", "r0", "V100", gpus, 32000, 64000) for i in range(n_nodes))
    shared = (n_nodes - 1) * gpus
    quotas = draw(st.lists(st.integers(1, 3), min_size=3, max_size=3))
    vcs = tuple(VCSpec(f"q{i}", shared * q / sum(quotas)) for i, q in enumerate(quotas))
    vcs += (VCSpec("d", nodes=(f"n{n_nodes - 1}",)),)
    spec = ClusterSpec("f", nodes, vcs, allow_borrowing=draw(st.booleans()))
    jobs = [JobSpec(job_id=f"j{i}", submit_s=float(draw(st.integers(0, 100))),
                    duration_s=float(draw(st.integers(1, 300))), num_gpus=draw(st.integers(0, gpus)),
                    cpu_milli=draw(st.sampled_from([0, 8000])), vc=draw(st.sampled_from([v.name for v in vcs])))
            for i in range(draw(st.integers(4, 24)))]
    config = EngineConfig(preemption=draw(st.booleans()), migration=draw(st.booleans()))
    return spec, jobs, draw(st.sampled_from(["fifo", "fifo-backfill"])), config


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(vc_scenario(), fifo_scenario()))
def test_leaving_out_blocked_vcs_changes_no_decision(sc):
    spec, jobs, policy, config = sc
    assert _decisions(Engine, spec, jobs, policy, config) == _decisions(_WalkEveryJob, spec, jobs, policy, config)


def test_a_failure_that_asked_for_cpu_does_not_cover_a_later_job_that_asks_for_none():
    # One 4-GPU node with 32 cores; VC q0 (quota 4). r1 (2 GPUs, every core) runs to 100. At 1, in
    # FIFO order: H (4 GPUs) cannot fit and blocks both of q0's queues, reserving the node at 100
    # (spare none); A (1 GPU, 16 cores, 5 s) may backfill but finds no cores and fails; C (1 GPU,
    # 1000 s) may not backfill, and the merge jumps over q0's jobs that would have no effect; B
    # (1 GPU, no cores, 5 s) is not as large as A's failed request (it asks no CPU), may backfill,
    # and runs at once on a free GPU. The jump must stop at it.
    spec = ClusterSpec("h", (NodeSpec("n0", "r0", "V100", 4, 32000, 64000),), vcs=(VCSpec("q0", 4),))
    jobs = [JobSpec("r1", 0, 100, 2, cpu_milli=32000, vc="q0"), JobSpec("H", 1, 10, 4, vc="q0"),
            JobSpec("A", 1, 5, 1, cpu_milli=16000, vc="q0"), JobSpec("C", 1, 1000, 1, vc="q0"),
            JobSpec("B", 1, 5, 1, vc="q0")]
    ours = _decisions(Engine, spec, jobs, "fifo-backfill", EngineConfig())
    assert ours == _decisions(_WalkEveryJob, spec, jobs, "fifo-backfill", EngineConfig())
    assert [(d.time, d.kind, d.job_id) for d in ours if d.time == 1.0] == [(1.0, "launch", "B")]


def test_jumps_over_jobs_that_fail_as_worse_are_taken_again_after_a_reclaim():
    # Two 4-GPU nodes; VCs q0, q1, q2 (quota 8/3 each); EASY backfilling with preemption; every job
    # arrives at 0. a0-a3 (1 GPU each, on n0) and then j0 (4 GPUs, on n1) borrow both nodes for q0;
    # a4 cannot fit and blocks q0's queues; a5 would fail as no smaller than a4, and the merge jumps
    # over q0's jobs. b (q1, within quota) reclaims from q0, newest first: j0 is the least
    # important victim that frees room for it, so j0's node is reclaimed (j0 then waits for the
    # next event, holding q0's reservation). That clears the pass's failures: the jump must be
    # taken again, so that c is launched in this pass, in its place before a4 and a5 are tried again.
    spec = ClusterSpec("b", tuple(NodeSpec(f"n{i}", "r0", "V100", 4, 32000, 64000) for i in range(2)),
                       tuple(VCSpec(f"q{i}", 8 / 3) for i in range(3)))
    jobs = ([JobSpec(f"a{i}", 0, 5, 1, vc="q0") for i in range(4)] + [JobSpec("j0", 0, 5, 4, vc="q0")]
            + [JobSpec(f"a{i}", 0, 5, 1, vc="q0") for i in range(4, 6)]
            + [JobSpec("b", 0, 5, 1, vc="q1"), JobSpec("c", 0, 5, 1, vc="q0")])
    config = EngineConfig(preemption=True)
    ours = _decisions(Engine, spec, jobs, "fifo-backfill", config)
    assert ours == _decisions(_WalkEveryJob, spec, jobs, "fifo-backfill", config)
    assert [(d.kind, d.job_id) for d in ours if d.time == 0.0][5:] == [
        ("preempt", "j0"), ("launch", "b"), ("launch", "c"), ("launch", "a4"), ("launch", "a5")]


def test_a_boundary_read_cut_short_by_an_earlier_answer_is_not_kept():
    # Found by the property test below (shrunk): EASY on two 4-GPU nodes, one VC over its quota
    # with a long queue of 5 s, 400 s and 2,000 s jobs. A read of a work bucket that stops at the
    # best key found so far in another bucket has not looked past it: were it kept as "nothing
    # passes here", a later ask would jump over a job that may backfill.
    spec = ClusterSpec("b", tuple(NodeSpec(f"n{i}", "r0", "V100", 4, 32000, 64000) for i in range(2)),
                       tuple(VCSpec(f"q{i}", 8 / 3) for i in range(3)))
    shapes = [(1, 5, 5), (0, 5, 1), (0, 5, 1), (0, 5, 1), (2, 2000, 1), (0, 5, 1), (0, 2000, 2), (0, 5, 1),
              (0, 2000, 1), (0, 5, 1), (0, 5, 1), (0, 5, 1), (0, 5, 1), (0, 5, 1), (0, 5, 1), (2, 400, 1),
              (0, 5, 1), (0, 5, 1), (0, 5, 1), (1, 2000, 1), (0, 5, 1), (0, 5, 1), (0, 5, 1), (0, 5, 1),
              (0, 5, 1), (0, 5, 1), (0, 400, 1), (1, 5, 1)]
    jobs = [JobSpec(f"j{i}", submit, duration, gpus, vc="q0") for i, (submit, duration, gpus) in enumerate(shapes)]
    assert (_decisions(Engine, spec, jobs, "fifo-backfill", EngineConfig())
            == _decisions(_WalkEveryJob, spec, jobs, "fifo-backfill", EngineConfig()))


def test_jumps_in_a_pass_that_only_launches_are_taken_again_after_each_job():
    # Found by the property test below (shrunk; it needs thousands of examples): EASY without
    # preemption on two 4-GPU nodes, quotas 2, 2 and 4, q0 borrowing with a long queue. In a pass
    # that only launches, a launch or a failure can turn a job of a VC jumped over as borrowing
    # into one that blocks (one that cannot fit, or fails as no smaller than a failed request of
    # any VC): such jumps must be taken again after each job (see backfill.backfill_order).
    spec = ClusterSpec("b", tuple(NodeSpec(f"n{i}", "r0", "V100", 4, 32000, 64000) for i in range(2)),
                       (VCSpec("q0", 2), VCSpec("q1", 2), VCSpec("q2", 4)))
    shapes = [
              (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'),
              (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'),
              (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'),
              (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'),
              (2, 5, 1, 'q0'), (2, 30, 2, 'q2'), (2, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'),
              (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'),
              (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'),
              (0, 5, 1, 'q0'), (2, 5, 1, 'q0'), (1, 400, 4, 'q2'), (0, 400, 4, 'q0'), (0, 5, 1, 'q0'),
              (0, 5, 1, 'q0'), (1, 30, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'),
              (0, 5, 1, 'q0'), (0, 5, 1, 'q0'), (3, 30, 1, 'q2'), (0, 5, 1, 'q0'), (0, 5, 1, 'q0'),
              (0, 5, 1, 'q0'), (0, 5, 5, 'q0'), (2, 30, 2, 'q2'), (1, 30, 1, 'q0'), (0, 5, 1, 'q0')]
    jobs = [JobSpec(f"j{i}", submit, duration, gpus, vc=vc) for i, (submit, duration, gpus, vc) in enumerate(shapes)]
    assert (_decisions(Engine, spec, jobs, "fifo-backfill", EngineConfig())
            == _decisions(_WalkEveryJob, spec, jobs, "fifo-backfill", EngineConfig()))


@st.composite
def backfill_scenario(draw):
    """EASY backfilling under load (borrowing on; maybe preemption and migration): long queues,
    where a pass jumps over many jobs. Mostly no CPU asks and no GPU model named; sometimes
    nodes of two models, with some jobs naming one or asking for CPU (a failed request then
    covers only some of the jobs as large)."""
    gpus = draw(st.sampled_from([4, 8]))
    n_nodes = draw(st.integers(2, 4))
    mixed = draw(st.booleans())
    nodes = tuple(NodeSpec(f"n{i}", "r0", "P100" if mixed and i % 2 else "V100", gpus, 32000, 64000)
                  for i in range(n_nodes))
    quotas = draw(st.lists(st.integers(1, 3), min_size=3, max_size=3))
    vcs = tuple(VCSpec(f"q{i}", n_nodes * gpus * q / sum(quotas)) for i, q in enumerate(quotas))
    spec = ClusterSpec("b", nodes, vcs)
    jobs = [JobSpec(job_id=f"j{i}", submit_s=float(draw(st.integers(0, 200))),
                    duration_s=float(draw(st.sampled_from([5, 30, 100, 400, 2000]))),
                    num_gpus=draw(st.sampled_from([1, 1, 1, 2, gpus, gpus + 1])),
                    vc=draw(st.sampled_from([v.name for v in vcs])),
                    gpu_models=draw(st.sampled_from([(), (), ("V100",)])) if mixed else (),
                    cpu_milli=draw(st.sampled_from([0, 0, 16000])) if mixed else 0)
            for i in range(draw(st.integers(10, 60)))]
    return spec, jobs, "fifo-backfill", EngineConfig(preemption=draw(st.booleans()), migration=draw(st.booleans()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(backfill_scenario())
def test_backfill_jumps_change_no_decision(sc):
    spec, jobs, policy, config = sc
    assert _decisions(Engine, spec, jobs, policy, config) == _decisions(_WalkEveryJob, spec, jobs, policy, config)


class _FairSortingEveryPass(FairShare):
    """The reference fair share: each pass groups every pending job by VC and sorts each group by
    (submit time, seq), instead of reading the engine's per-VC lists."""

    per_vc_order = False

    def order(self, pending, ctx):
        by_vc: dict[str, list] = {}
        for j in pending:
            by_vc.setdefault(j.spec.vc, []).append(j)
        queues = {vc: deque(sorted(js, key=lambda j: (j.spec.submit_s, j.seq))) for vc, js in by_vc.items()}
        heap = [(self._usage(vc, ctx), vc) for vc in sorted(queues)]
        heapq.heapify(heap)
        while heap:
            _, vc = heapq.heappop(heap)
            yield queues[vc].popleft()
            if queues[vc]:
                heapq.heappush(heap, (self._usage(vc, ctx), vc))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vc_scenario())
def test_fair_share_from_per_vc_lists_changes_no_decision(sc):
    spec, jobs, _, config = sc
    reference = build_policy("fair")
    reference.queue = _FairSortingEveryPass()
    ours = _decisions(Engine, spec, jobs, "fair", config)
    engine = Engine(spec, reference, config)
    for j in jobs:
        with contextlib.suppress(InfeasibleJob):
            engine.submit(j)
    engine.run()
    assert ours == engine.decisions
