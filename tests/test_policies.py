"""Hand-computed schedules, one small trace per policy and mechanism.

Each expected (start, end) is worked out in the comment above it. Overheads in these tests:
restore after preemption 5 s, migration 7 s (tests/simhelpers.py).
"""

from __future__ import annotations

import pytest

from analysim.core.cluster import VCSpec
from analysim.core.plugins.queue import Tiresias
from tests.simhelpers import cluster, job, run_engine, times


def test_fifo_head_of_line_blocks():
    # One node, 4 GPUs. A takes 2 GPUs 0-100. B needs 4: waits for A, runs 100-150.
    # C (1 GPU) arrives at 20 and would fit, but FIFO keeps it behind B: 150-160.
    e = run_engine(cluster(1, 4), [job("A", 0, 2, 100), job("B", 10, 4, 50), job("C", 20, 1, 10)], "fifo")
    assert times(e) == {"A": (0, 100), "B": (100, 150), "C": (150, 160)}


def test_fifo_easy_backfill():
    # Same trace. B's reservation: A ends at 100, so B's shadow time is 100 with 0 spare GPUs.
    # C (10 s) ends at 30 <= 100, so it backfills at 20. B still starts at 100.
    e = run_engine(cluster(1, 4), [job("A", 0, 2, 100), job("B", 10, 4, 50), job("C", 20, 1, 10)],
                   "fifo", backfill=True)
    assert times(e) == {"A": (0, 100), "B": (100, 150), "C": (20, 30)}


def test_backfill_never_delays_the_head():
    # D (1 GPU, 500 s) would fit at 20 but end after the shadow time 100 while B needs all 4 GPUs:
    # it must wait until B is done (150-650), and B still starts at 100.
    e = run_engine(cluster(1, 4), [job("A", 0, 2, 100), job("B", 10, 4, 50), job("D", 20, 1, 500)],
                   "fifo", backfill=True)
    assert times(e) == {"A": (0, 100), "B": (100, 150), "D": (150, 650)}


def test_sjf_runs_the_shortest_waiting_job_first():
    # One node, 2 GPUs, every job takes both. A 0-100; at 100 C (10 s) goes before B (50 s).
    trace = [job("A", 0, 2, 100), job("B", 10, 2, 50), job("C", 20, 2, 10)]
    assert times(run_engine(cluster(1, 2), trace, "sjf")) == {"A": (0, 100), "C": (100, 110), "B": (110, 160)}
    assert times(run_engine(cluster(1, 2), trace, "fifo")) == {"A": (0, 100), "B": (100, 150), "C": (150, 160)}


def test_srtf_preempts_the_longer_job():
    # A (2 GPUs, 100 s) starts at 0. At 10, B (20 s) has less work left than A (90 s): A is
    # checkpointed and evicted; B runs 10-30. A resumes at 30, pays the 5 s restore, then its
    # 90 s: ends at 125.
    e = run_engine(cluster(1, 2), [job("A", 0, 2, 100), job("B", 10, 2, 20)], "srtf", preemption=True)
    assert times(e) == {"A": (0, 125), "B": (10, 30)}
    assert e.jobs["A"].preemptions == 1 and e.jobs["B"].preemptions == 0
    kinds = [(d.kind, d.job_id, d.time) for d in e.decisions]
    assert kinds == [("launch", "A", 0), ("preempt", "A", 10), ("launch", "B", 10), ("complete", "B", 30),
                     ("launch", "A", 30), ("complete", "A", 125)]


def test_srtf_without_preemption_waits():
    e = run_engine(cluster(1, 2), [job("A", 0, 2, 100), job("B", 10, 2, 20)], "srtf")
    assert times(e) == {"A": (0, 100), "B": (100, 120)}


def test_tiresias_demotes_and_preempts_across_levels():
    # Thresholds: one, at 100 GPU-seconds. A (2 GPUs, 200 s) crosses it at t=50 and drops to level 1.
    # B (1 GPU, 30 s) arrives at 60 in level 0 and evicts A; B runs 60-90. A needs both GPUs, so it
    # resumes at 90: 5 s restore + 140 s left (it ran 60 of 200) -> ends at 235.
    e = run_engine(cluster(1, 2), [job("A", 0, 2, 200), job("B", 60, 1, 30)], "tiresias", preemption=True,
                   queue_options={"thresholds_gpu_s": (100.0,)})
    assert times(e) == {"A": (0, 235), "B": (60, 90)}
    assert e.jobs["A"].preemptions == 1


def test_tiresias_does_not_preempt_within_a_level():
    # A (2 GPUs, 40 s) never reaches 100 GPU-s: it stays in level 0 with B, which waits for it.
    e = run_engine(cluster(1, 2), [job("A", 0, 2, 40), job("B", 10, 1, 30)], "tiresias", preemption=True,
                   queue_options={"thresholds_gpu_s": (100.0,)})
    assert times(e) == {"A": (0, 40), "B": (40, 70)}


def test_tiresias_starvation_guard_promotes():
    # Thresholds at 10 GPU-s, starve factor 2; one GPU.
    #  0: A (100 s) starts; at 10 it passes 10 GPU-s -> level 1.
    # 20: B (100 s, level 0) evicts A (A has run 20 s: promotion due at 20 + 2*20 = 60).
    # 30: B passes 10 GPU-s -> level 1: equals, no eviction.
    # 60: A is promoted to level 0 (attained counted afresh) and evicts B (B ran 40 s: due 60+80=140).
    #     A resumes: 5 s restore, then 80 s of work left; at 70 it is level 1 again.
    # 140: B is promoted and evicts A. A ran 60-140: 75 s of progress, 5 s left (has run 100 s).
    #     B resumes: 5 s restore + 60 s -> ends 205. A resumes at 205: 5 + 5 -> ends 215.
    e = run_engine(cluster(1, 1), [job("A", 0, 1, 100), job("B", 20, 1, 100)], "tiresias", preemption=True,
                   queue_options={"thresholds_gpu_s": (10.0,), "starve_factor": 2.0})
    assert times(e) == {"A": (0, 215), "B": (20, 205)}
    assert (e.jobs["A"].preemptions, e.jobs["B"].preemptions) == (2, 1)


def test_tiresias_at_the_production_defaults():
    # Thresholds 3,600 and 36,000 GPU-s, starve factor 10 (Tiresias' defaults); one node, 4 GPUs,
    # every job takes all 4, restore 5 s.
    #     0: A (20,000 s) starts. B (2,000 s) arrives at 10, level 0 like A: waits.
    #   900: A has 900 x 4 = 3,600 GPU-s -> level 1; B (level 0) evicts it. A: 19,100 s left.
    #  1800: B passes 3,600 GPU-s -> level 1, A waits in level 1 too: no eviction. B ends at 2,900.
    #  2900: A resumes (5 s restore). At 5,000, C (20,000 s, level 0) evicts A (level 1: 12,000
    #        GPU-s): A made 2,095 s of progress, 17,005 s left.
    #  5900: C -> level 1, same as A: runs on. 14000: C passes 36,000 GPU-s -> level 2, and A
    #        (level 1) evicts it; C has 11,000 s left.
    # 14000: A resumes: 5 + 17,005 -> ends 31,010. At 20,000 A reaches level 2 too: equal, no
    #        eviction. 31010: C resumes: 5 + 11,000 -> ends 42,015. (A's starvation promotion,
    #        due 30,000 s after its stop at 5,000, never comes: it runs again first.)
    trace = [job("A", 0, 4, 20000), job("B", 10, 4, 2000), job("C", 5000, 4, 20000)]
    e = run_engine(cluster(1, 4), trace, "tiresias", preemption=True)
    assert times(e) == {"A": (0, 31010), "B": (900, 2900), "C": (5000, 42015)}
    assert [(d.time, d.kind, d.job_id) for d in e.decisions if d.kind == "preempt"] == [
        (900, "preempt", "A"), (5000, "preempt", "A"), (14000, "preempt", "C")]
    assert isinstance(e.policy.queue, Tiresias) and e.policy.queue.thresholds == (3600.0, 36000.0)


def test_build_policy_refuses_options_a_queue_does_not_take():
    from analysim.core.policies import build_policy

    with pytest.raises(ValueError, match="fifo"):
        build_policy("fifo", queue_options={"thresholds_gpu_s": (1.0,)})


def test_a_queue_whose_keys_differ_in_length_is_refused():
    # The engine's merges compare queue keys laid out flat (orders.merge_entry), which orders
    # keys of different lengths unlike tuples do: such a queue is refused by name, not obeyed wrongly.
    from analysim.core.engine import Engine, EngineConfig
    from analysim.core.plugins.queue import _QueueSort
    from analysim.core.policies import build_policy

    class Ragged(_QueueSort):
        name = "ragged"

        def key(self, job, ctx):
            return (job.spec.submit_s,) if job.spec.num_gpus == 1 else (job.spec.submit_s, 0.0)

    policy = build_policy("sjf")
    policy.queue = Ragged()
    engine = Engine(cluster(1, 8), policy, EngineConfig())
    engine.submit(job("a", 0.0, 1, 10.0))
    with pytest.raises(ValueError, match="'ragged' gave keys of 1 and 2 fields"):
        engine.submit(job("b", 0.0, 2, 10.0))
        engine.run()


def test_qssf_orders_by_predicted_not_true_duration():
    # One GPU. V (user c, 100 s) runs 0-100; X (user a, 10 s) waits, runs 100-110; W (user b,
    # 1000 s) arrives at 105 and runs 110-1110. Then Y (user c, truly 5 s) arrives at 200 and is
    # predicted from c's history: 100 s; Z (user a, truly 500 s) arrives at 300, predicted from
    # a's: 10 s. At 1110 QSSF runs Z first (1110-1610), then Y (1610-1615) — where oracle SJF runs
    # Y first (1110-1115).
    trace = [job("V", 0, 1, 100, user="c"), job("X", 1, 1, 10, user="a"), job("W", 105, 1, 1000, user="b"),
             job("Y", 200, 1, 5, user="c"), job("Z", 300, 1, 500, user="a")]
    e = run_engine(cluster(1, 1), trace, "qssf")
    assert times(e) == {"V": (0, 100), "X": (100, 110), "W": (110, 1110), "Z": (1110, 1610), "Y": (1610, 1615)}
    assert (e.jobs["Y"].estimate_s, e.jobs["Z"].estimate_s) == (100, 10)
    s = run_engine(cluster(1, 1), trace, "sjf")
    assert times(s)["Y"] == (1110, 1115)


def test_fair_share_alternates_between_vcs():
    # Two GPUs, two VCs without quotas (equal shares). vc1 submits A1-A3 at 0, vc2 submits B1 at 0.
    # FIFO would run A1, A2 first. Fair share: A1 (both VCs idle: vc1 by name), then B1 (vc2 uses
    # less), both 0-100; at 100 A2 and A3 (vc2 has nothing waiting): 100-200.
    trace = [job("A1", 0, 1, 100, vc="vc1"), job("A2", 0, 1, 100, vc="vc1"), job("A3", 0, 1, 100, vc="vc1"),
             job("B1", 0, 1, 100, vc="vc2")]
    e = run_engine(cluster(1, 2), trace, "fair")
    assert times(e) == {"A1": (0, 100), "B1": (0, 100), "A2": (100, 200), "A3": (100, 200)}
    f = run_engine(cluster(1, 2), trace, "fifo")
    assert times(f)["B1"] == (100, 200)


def test_consolidate_packs_and_spread_spreads():
    trace = [job("a", 0, 1, 100), job("b", 0, 1, 100)]
    packed = run_engine(cluster(2, 4), trace, "fifo", "consolidate")
    assert [packed.jobs[j].placements_seen[0] for j in "ab"] == [(0,), (0,)]
    spread = run_engine(cluster(2, 4), trace, "fifo", "spread")
    assert [spread.jobs[j].placements_seen[0] for j in "ab"] == [(0,), (1,)]


def test_gang_job_spans_the_fewest_nodes_in_one_rack():
    # Four 4-GPU nodes, racks of two. An 8-GPU job takes two whole nodes of one rack.
    e = run_engine(cluster(4, 4, rack_size=2), [job("g", 0, 8, 10)])
    assert e.jobs["g"].placements_seen[0] == (0, 1)
    assert e.jobs["g"].end_s == 10


def test_cross_rack_gang_runs_slower():
    # Racks of one node: an 8-GPU job must cross racks and runs 25 % slower: 100 s -> 125 s.
    spec = cluster(2, 4, rack_size=1, cross_rack_slowdown=0.25)
    e = run_engine(spec, [job("g", 0, 8, 100)])
    assert e.jobs["g"].end_s == pytest.approx(125.0)


def test_quota_reclaim_preempts_borrowed_gpus():
    # vcA and vcB each have 2 of the node's 4 GPUs. B1 (vcB, 4 GPUs) borrows vcA's idle 2 at 0.
    # At 10, A1 (vcA, 2 GPUs) is within quota: B1 is evicted. A1 runs 10-20. B1 resumes at 20:
    # 5 s restore + 90 s left -> 115.
    spec = cluster(1, 4, vcs=(VCSpec("vcA", 2), VCSpec("vcB", 2)))
    trace = [job("B1", 0, 4, 100, vc="vcB"), job("A1", 10, 2, 10, vc="vcA")]
    e = run_engine(spec, trace, "fifo", preemption=True)
    assert times(e) == {"B1": (0, 115), "A1": (10, 20)}
    without = run_engine(spec, trace, "fifo")
    assert times(without) == {"B1": (0, 100), "A1": (100, 110)}


def test_no_borrowing_keeps_jobs_within_quota():
    spec = cluster(1, 4, vcs=(VCSpec("vcA", 2), VCSpec("vcB", 2)), allow_borrowing=False)
    e = run_engine(spec, [job("B1", 0, 2, 100, vc="vcB"), job("B2", 0, 2, 100, vc="vcB")], "fifo")
    assert times(e) == {"B1": (0, 100), "B2": (100, 200)}


def test_dedicated_nodes_only_run_their_vc():
    spec = cluster(2, 2, vcs=(VCSpec("own", nodes=("n1",)), VCSpec("other")))
    e = run_engine(spec, [job("x", 0, 1, 10, vc="own"), job("y", 0, 1, 10, vc="other")])
    assert e.jobs["x"].placements_seen[0] == (1,) and e.jobs["y"].placements_seen[0] == (0,)


def test_migration_defragments_for_a_blocked_job():
    # Two 4-GPU nodes, consolidate. At 0: a (2 GPUs) and b (1 GPU, 10 s) and c (1 GPU) fill n0;
    # d (2), e (1 GPU, 10 s), f (1) fill n1. At 10, b and e end: one free GPU on each node.
    # At 20, g (2 GPUs, 100 s) fits nowhere. With migration, c (one GPU: the smallest job that frees
    # enough) moves from n0 to n1; g runs on n0 20-120. c ran 20 of 1000 s: 7 s migration overhead
    # + 980 s -> ends 1007.
    trace = [job("a", 0, 2, 1000), job("b", 0, 1, 10), job("c", 0, 1, 1000),
             job("d", 0, 2, 1000), job("e", 0, 1, 10), job("f", 0, 1, 1000), job("g", 20, 2, 100)]
    e = run_engine(cluster(2, 4), trace, "fifo", migration=True)
    assert e.jobs["c"].migrations == 1 and e.jobs["c"].placements_seen == [(0,), (1,)]
    assert times(e)["g"] == (20, 120)
    assert times(e)["c"] == (0, 1007)
    without = run_engine(cluster(2, 4), trace, "fifo")
    assert times(without)["g"] == (1000, 1100)


def test_node_failure_requeues_from_the_last_checkpoint():
    # A (2 GPUs, 1000 s) runs on n0 from 0. n0 fails at 250; checkpoints every 100 s of progress,
    # so 200 s are kept. A restarts on n1 at 250: 5 s restore + 800 s -> ends 1055.
    spec = cluster(2, 2)
    from analysim.core.engine import Engine, EngineConfig
    from analysim.core.policies import build_policy

    e = Engine(spec, build_policy("fifo"), EngineConfig(checkpoint_interval_s=100.0, restore_overhead_s=5.0))
    e.submit(job("A", 0, 2, 1000))
    e.node_down("n0", at=250)
    e.run()
    assert times(e) == {"A": (0, 1055)}
    assert e.jobs["A"].restarts == 1
    assert [d.kind for d in e.decisions] == ["launch", "requeue", "launch", "complete"]


def test_node_recovery_returns_capacity():
    from analysim.core.engine import Engine, EngineConfig
    from analysim.core.policies import build_policy

    e = Engine(cluster(1, 2), build_policy("fifo"), EngineConfig(checkpoint_interval_s=None, restore_overhead_s=5.0))
    e.submit(job("A", 0, 2, 100))
    e.node_down("n0", at=50)
    e.node_up("n0", at=70)
    e.run()
    # No checkpoint: all 50 s are lost and no restore is paid; A reruns 70-170.
    assert times(e) == {"A": (0, 170)}
