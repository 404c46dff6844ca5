"""Kueue's preemption under a partition (issue 30): the scenarios of Kueue's documentation
("Preemption", "Cluster Queue" / preemption), each computed by hand and replayed through the engine;
the reader's preemption fields; the quota invariants with preemption on; a failed search is not
repeated while nothing it read changes."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysim.core.engine import Engine, EngineConfig
from analysim.core.partition import NEVER, Preemption
from analysim.core.plugins.kueue_preemption import KueuePreemption
from analysim.core.policies import partition_policy
from analysim.errors import InputFileError
from analysim.partitions import assign_queues
from tests.kueue_yaml import cohort_doc as _cohort_doc
from tests.kueue_yaml import fair_sharing_config as _config
from tests.kueue_yaml import preemption as _preemption
from tests.kueue_yaml import resource_groups
from tests.test_kueue import (
    CPU_NODES,
    FLAVOR,
    RANDOM_NODES,
    _cpu_job,
    _cq,
    _gpu_job,
    _nodes,
    _partitions,
    _read,
    _started,
    _Usage,
)

PRIORITIES = """
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: WorkloadPriorityClass
metadata: {name: low}
value: 50
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: WorkloadPriorityClass
metadata: {name: normal}
value: 100
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: WorkloadPriorityClass
metadata: {name: high}
value: 200
"""


def _run(part, jobs, until: float | None = None, cluster=CPU_NODES, shortcuts: bool = True) -> Engine:
    spec = dataclasses.replace(cluster, vcs=(), partition=part)
    kept, filtered = assign_queues(jobs, part)
    assert not filtered, filtered
    engine = Engine(spec, partition_policy(spec), EngineConfig(keep_decisions=True), shortcuts=shortcuts)
    for j in kept:
        engine.submit(j)
    engine.run(until if until is not None else float("inf"))
    return engine


def _preempted(engine: Engine) -> list[tuple[float, str, str, str]]:
    """Each preemption: (time, victim, reason, preempting ClusterQueue)."""
    return [(d.time, d.job_id, d.reason, d.by) for d in engine.decisions if d.kind == "preempt"]


# --- reclaimWithinCohort --------------------------------------------------------------------------


def _team_ab(tmp_path, reclaim: str):
    # Kueue's cohort example: team-a-cq 9 CPUs and team-b-cq 12 CPUs in cohort team-ab.
    return _read(tmp_path, FLAVOR + _cq("team-a-cq", "team-ab", {"cpu": {"nominalQuota": 9}})
                 + _cq("team-b-cq", "team-ab", {"cpu": {"nominalQuota": 12}},
                       extra=_preemption(reclaimWithinCohort=reclaim)), CPU_NODES)[0]


def test_reclaim_within_cohort_takes_back_what_the_borrower_holds_most_recent_first(tmp_path):
    # team-a-cq admits 7 jobs of 3 CPUs at t=0..6 (one a second): 21 CPUs, 12 of them borrowed
    # from team-b-cq. At t=10 team-b-cq's job of 12 CPUs (within its nominal quota) arrives:
    # available to b = 21 - 21 = 0. Candidates: team-a-cq's workloads (it borrows), the most
    # recently admitted first: a6, a5, a4, a3, ... Evicting a6: a holds 18, b may take 21-18 = 3;
    # a5: 6; a4: 9; a3: a holds 9, b may take 12 = its request (and within its nominal quota, as
    # Kueue requires for reclaim). Before each, a still borrows (21, 18, 15, 12 > 9). Fill back:
    # sparing any of a4, a5, a6 leaves b 9 < 12. So a3..a6 go, InCohortReclamation, for team-b-cq.
    part = _team_ab(tmp_path, "Any")
    jobs = [_cpu_job(f"a{i}", "team-a-cq", 3, submit=float(i), duration=1000) for i in range(7)]
    jobs.append(_cpu_job("b", "team-b-cq", 12, submit=10))
    e = _run(part, jobs, until=20)
    assert sorted(_preempted(e)) == [(10.0, f"a{i}", "InCohortReclamation", "team-b-cq") for i in (3, 4, 5, 6)]
    assert _started(e)["b"] == 10.0
    state = e.policy.admission.state
    assert state.preempted == {("team-b-cq", "InCohortReclamation"): 4}


def test_reclaim_never_leaves_the_borrower_its_loan(tmp_path):
    # The same with reclaimWithinCohort: Never: b waits for 4 of a's jobs to end (at 1000 + 0..3:
    # the first ends at 1000 and frees 3, b needs 12: the fourth, a3, ends at 1003).
    part = _team_ab(tmp_path, "Never")
    jobs = [_cpu_job(f"a{i}", "team-a-cq", 3, submit=float(i), duration=1000) for i in range(7)]
    jobs.append(_cpu_job("b", "team-b-cq", 12, submit=10))
    e = _run(part, jobs)
    assert _preempted(e) == []
    assert _started(e)["b"] == 1003.0


def test_reclaim_lower_priority_spares_the_borrower_s_equal_priority_work(tmp_path):
    # reclaimWithinCohort: LowerPriority: a's workloads are of priority normal (100), b's of 100
    # too: none is lower, nothing is evicted; with a's of priority low (50) the same four go as
    # with Any.
    part, _ = _read(tmp_path, FLAVOR + PRIORITIES + _cq("team-a-cq", "team-ab", {"cpu": {"nominalQuota": 9}})
                    + _cq("team-b-cq", "team-ab", {"cpu": {"nominalQuota": 12}},
                          extra=_preemption(reclaimWithinCohort="LowerPriority")), CPU_NODES)
    for qos, victims in (("normal", []), ("low", ["a3", "a4", "a5", "a6"])):
        jobs = [_cpu_job(f"a{i}", "team-a-cq", 3, submit=float(i), duration=1000, qos=qos) for i in range(7)]
        jobs.append(_cpu_job("b", "team-b-cq", 12, submit=10, qos="normal"))
        e = _run(part, jobs, until=20)
        assert sorted(v for _, v, _, _ in _preempted(e)) == victims


# --- withinClusterQueue ---------------------------------------------------------------------------


def _one_queue(tmp_path, within: str):
    return _read(tmp_path, FLAVOR + PRIORITIES + _cq("q", None, {"cpu": {"nominalQuota": 8}},
                                                     extra=_preemption(withinClusterQueue=within)), CPU_NODES)[0]


def test_within_cluster_queue_lower_priority_evicts_only_what_is_needed_most_recent_first(tmp_path):
    # q: 8 CPUs, no cohort. low0 (4 CPUs) admitted at t=0, low1 (4) at t=5: q full. At t=10 high
    # (4 CPUs, priority 200) arrives: available 0. Candidates (priority 50 < 200), most recently
    # admitted first: low1, low0. Evicting low1 frees 4 = the request: one victim, InClusterQueue.
    part = _one_queue(tmp_path, "LowerPriority")
    jobs = [_cpu_job("low0", "q", 4, 0, 1000, qos="low"), _cpu_job("low1", "q", 4, 5, 1000, qos="low"),
            _cpu_job("high", "q", 4, 10, 100, qos="high")]
    e = _run(part, jobs, until=20)
    assert _preempted(e) == [(10.0, "low1", "InClusterQueue", "q")]
    assert _started(e)["high"] == 10.0


def test_within_cluster_queue_lower_priority_never_evicts_equal_priority(tmp_path):
    # The same with every job of priority normal: no candidate; high (normal) waits until low1
    # ends at 5 + 1000.
    part = _one_queue(tmp_path, "LowerPriority")
    jobs = [_cpu_job("low0", "q", 4, 0, 1000, qos="normal"), _cpu_job("low1", "q", 4, 5, 1000, qos="normal"),
            _cpu_job("high", "q", 4, 10, 100, qos="normal")]
    e = _run(part, jobs)
    assert _preempted(e) == []
    assert _started(e)["high"] == 1000.0  # (low0 ends first, at 1000: 4 CPUs free)


def test_lower_or_newer_equal_priority_evicts_a_newer_workload_of_equal_priority(tmp_path):
    # q: 8 CPUs. old (4 CPUs, t=0, 50 s), big (8 CPUs, t=1), small (4 CPUs, t=2): big does not fit
    # beside old; small, created after big, does (BestEffortFIFO) and runs from t=2. When old ends
    # at t=50: big needs 8, q holds 4 (small): LowerOrNewerEqualPriority makes small (equal
    # priority, created at 2 > 1) a candidate; evicting it, 0 + 8 <= 8: big starts at 50. Under
    # LowerPriority small is no candidate and big waits for it to end at 2 + 100 = 102.
    jobs = [_cpu_job("old", "q", 4, 0, 50), _cpu_job("big", "q", 8, 1, 100), _cpu_job("small", "q", 4, 2, 100)]
    e = _run(_one_queue(tmp_path, "LowerOrNewerEqualPriority"), jobs)
    assert _preempted(e) == [(50.0, "small", "InClusterQueue", "q")]
    assert _started(e)["big"] == 50.0
    e = _run(_one_queue(tmp_path, "LowerPriority"), jobs)
    assert _preempted(e) == []
    assert _started(e)["big"] == 102.0


# --- borrowWithinCohort ---------------------------------------------------------------------------


def _three_teams(tmp_path, threshold: int | None, policy: str = "LowerPriority"):
    # a, b, c: 4 CPUs each in cohort abc (12). a may reclaim lower priority work and, while it
    # borrows, preempt other queues' borrowing workloads of priority <= threshold.
    borrow = f"{{policy: {policy}" + (f", maxPriorityThreshold: {threshold}" if threshold is not None else "") + "}"
    a = _cq("a", "abc", {"cpu": {"nominalQuota": 4}},
            extra=_preemption(reclaimWithinCohort="LowerPriority", borrowWithinCohort=borrow))
    return _read(tmp_path, FLAVOR + PRIORITIES + a + _cq("b", "abc", {"cpu": {"nominalQuota": 4}})
                 + _cq("c", "abc", {"cpu": {"nominalQuota": 4}}), CPU_NODES)[0]


_ABC_JOBS = [_cpu_job("b1", "b", 4, 0, 1000, qos="low"), _cpu_job("b2", "b", 4, 1, 1000, qos="low"),
             _cpu_job("a1", "a", 4, 2, 1000, qos="high"), _cpu_job("a2", "a", 4, 10, 100, qos="high")]


def test_borrow_within_cohort_preempts_a_borrower_below_the_threshold(tmp_path):
    # b holds 8 (b1, b2: priority 50; 4 borrowed from idle c), a holds its nominal 4 (a1). At t=10
    # a2 (4 CPUs, priority 200) would borrow: available to a = 12 - 12 = 0. a is at its nominal
    # quota (4, not under it), so only borrowWithinCohort can help: other queues' candidates below
    # min(200, maxPriorityThreshold 100 + 1) = 101: b's (it borrows: 8 > 4), most recent first: b2.
    # Evicting b2: b holds 4, a may take 12 - 8 = 4: fits, borrowing. b2 goes,
    # InCohortReclaimWhileBorrowing.
    e = _run(_three_teams(tmp_path, 100), _ABC_JOBS, until=20)
    assert _preempted(e) == [(10.0, "b2", "InCohortReclaimWhileBorrowing", "a")]
    assert _started(e)["a2"] == 10.0


def test_borrow_within_cohort_spares_workloads_above_the_threshold(tmp_path):
    # maxPriorityThreshold 40: b's workloads (50) are above it: no candidate; a2 waits (a's own
    # workloads are no candidates: withinClusterQueue Never) until the first job to end, b1 at
    # 0 + 1000, gives the cohort 4 CPUs back (a then borrows them: 12 - 8 = 4).
    e = _run(_three_teams(tmp_path, 40), _ABC_JOBS)
    assert _preempted(e) == []
    assert _started(e)["a2"] == 1000.0


def test_without_borrow_within_cohort_a_queue_at_nominal_does_not_reclaim(tmp_path):
    # borrowWithinCohort Never: a is not under its nominal quota in CPU (4 of 4), so reclaiming
    # from b (which would leave a borrowing) is not Kueue's: a2 waits as above.
    e = _run(_three_teams(tmp_path, None, policy="Never"), _ABC_JOBS)
    assert _preempted(e) == []
    assert _started(e)["a2"] == 1000.0


# --- the reader -------------------------------------------------------------------------------------


def test_the_reader_keeps_the_preemption_policies(tmp_path):
    part = _three_teams(tmp_path, 100)
    a = part.node("a")
    assert a.preemption == Preemption(NEVER, "LowerPriority", "LowerPriority", 100)
    assert part.node("b").preemption == Preemption()
    assert part.preempts


@pytest.mark.parametrize("extra, message", [
    ("\n  preemption: {withinClusterQueue: Sometimes}",
     "spec.preemption.withinClusterQueue: expected one of Never, LowerPriority, LowerOrNewerEqualPriority, got 'Sometimes'"),
    ("\n  preemption: {reclaimWithinCohort: LowerOrNewerEqualPriority}",
     "spec.preemption.reclaimWithinCohort: expected one of Never, LowerPriority, Any"),
    ("\n  preemption: {borrowWithinCohort: {policy: Any}}",
     "spec.preemption.borrowWithinCohort.policy: expected one of Never, LowerPriority, got 'Any'"),
    ("\n  preemption: {borrowWithinCohort: {policy: LowerPriority, maxPriorityThreshold: high}}",
     "spec.preemption.borrowWithinCohort.maxPriorityThreshold: expected a whole number"),
    ("\n  preemption: {reclaimWithinCohort: Any, withinCohort: Any}",
     "spec.preemption.withinCohort: unknown field"),
])
def test_a_bad_preemption_value_is_one_line_naming_document_line_and_field(tmp_path, extra, message):
    with pytest.raises(InputFileError) as e:
        _read(tmp_path, FLAVOR + _cq("q", None, {"cpu": {"nominalQuota": 8}}, extra=extra), CPU_NODES)
    text = str(e.value)
    assert "\n" not in text
    assert re.search(r"kueue\.yaml, line \d+: document 2 \(ClusterQueue 'q'\): ", text), text
    assert message in text


def test_a_partition_without_preemption_has_no_post_filter():
    from analysim.clusters import parse_cluster
    from analysim.partitions.kueue import read_kueue
    from tests.test_kueue import ROOT

    for name in ("philly", "philly-capped"):
        part, _ = read_kueue(ROOT / f"examples/kueue/{name}.yaml", parse_cluster("philly"))
        spec = dataclasses.replace(parse_cluster("philly"), vcs=(), partition=part)
        assert partition_policy(spec).post_filters == []
        assert not Engine(spec, partition_policy(spec), EngineConfig()).scheduler.can_preempt


# --- the quota invariants with preemption on ------------------------------------------------------


@st.composite
def _preempting_partitions(draw, flavors: tuple[str, ...] = ("f0", "f1")):
    """test_kueue's random trees and jobs, each ClusterQueue with random preemption policies, and
    the jobs with random priority classes."""
    text, jobs = draw(_partitions(flavors=flavors))
    parts = text.split("\n  queueingStrategy:")
    out = parts[0]
    for rest in parts[1:]:
        within = draw(st.sampled_from(["Never", "LowerPriority", "LowerOrNewerEqualPriority"]))
        reclaim = draw(st.sampled_from(["Never", "LowerPriority", "Any"]))
        borrow = draw(st.sampled_from(["Never", "LowerPriority"]))
        threshold = draw(st.sampled_from(["", ", maxPriorityThreshold: 100"]))
        out += (f"\n  preemption: {{withinClusterQueue: {within}, reclaimWithinCohort: {reclaim}, "
                f"borrowWithinCohort: {{policy: {borrow}{threshold}}}}}\n  queueingStrategy:" + rest)
    qos = draw(st.lists(st.sampled_from(["low", "normal", "high"]), min_size=len(jobs), max_size=len(jobs)))
    return out + PRIORITIES, [(*j, q) for j, q in zip(jobs, qos, strict=True)]


def _run_preempting(tmp_path, drawn, recorder=None, shortcuts: bool = True) -> Engine:
    text, raw = drawn
    part, _ = _read(tmp_path, text, RANDOM_NODES)
    jobs = [_gpu_job(f"j{i}", vc, g, submit=round(s, 1), duration=round(d, 1), qos=q)
            for i, (vc, g, s, d, q) in enumerate(raw)]
    kept, _ = assign_queues(jobs, part)
    spec = dataclasses.replace(RANDOM_NODES, partition=part)
    engine = Engine(spec, partition_policy(spec), EngineConfig(keep_decisions=True), recorder=recorder,
                    shortcuts=shortcuts)
    for j in kept:
        engine.submit(j)
    engine.run()
    return engine


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_preempting_partitions())
def test_with_preemption_no_queue_exceeds_its_limits_and_every_job_runs(tmp_path, drawn):
    part, _ = _read(tmp_path, drawn[0], RANDOM_NODES)
    checker = _Usage(part, [n.name for n in RANDOM_NODES.nodes])
    engine = _run_preempting(tmp_path, drawn, recorder=checker)
    assert all(j.end_s is not None for j in engine.jobs.values())  # every admissible job ran
    for d in engine.decisions:
        if d.kind == "preempt":
            assert d.reason in ("InClusterQueue", "InCohortReclamation", "InCohortReclaimWhileBorrowing")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_preempting_partitions())
def test_with_preemption_decisions_are_those_of_the_reference_engine(tmp_path, drawn):
    fast = _run_preempting(tmp_path, drawn)
    reference = _run_preempting(tmp_path, drawn, shortcuts=False)
    assert fast.decisions == reference.decisions


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_preempting_partitions(flavors=("f0",)))
def test_with_one_flavor_per_group_preemption_decisions_are_those_of_the_reference_engine(tmp_path, drawn):
    # One flavor per resource group: the searches the refusal answers from its path counts
    # (_no_candidate) and those the room bound ends before their walks (SearchBounds.room), which
    # the reference engine (shortcuts off) makes in full.
    fast = _run_preempting(tmp_path, drawn)
    reference = _run_preempting(tmp_path, drawn, shortcuts=False)
    assert fast.decisions == reference.decisions


def test_a_gang_reclaims_the_loans_on_both_nodes_it_needs(tmp_path):
    # Two 8-GPU nodes. b (no quota of its own) borrows all 16 GPUs, a's nominal quota, with four
    # jobs of 4 GPUs, two on each node. At t=10 a's gang of 16 GPUs arrives: within a's nominal
    # quota, and it needs both nodes whole, so every one of b's jobs goes, the most recent first.
    # (The room bound's count for a gang: the two nodes with the most whole GPUs once b's are
    # freed, 8 + 8, exactly the gang's 16.)
    two = _nodes((2, "V100", 8, 16))
    part = _read(tmp_path, FLAVOR + _cq("a", "ab", {"nvidia.com/gpu": {"nominalQuota": 16}},
                                        extra=_preemption(reclaimWithinCohort="Any"))
                 + _cq("b", "ab", {"nvidia.com/gpu": {"nominalQuota": 0}}), two)[0]
    jobs = [_gpu_job(f"b{i}", "b", 4, submit=float(i), duration=1000) for i in range(4)]
    jobs.append(_gpu_job("gang", "a", 16, submit=10))
    e = _run(part, jobs, until=20, cluster=two)
    assert sorted(_preempted(e)) == [(10.0, f"b{i}", "InCohortReclamation", "a") for i in range(4)]
    assert _started(e)["gang"] == 10.0


def test_a_launch_that_puts_a_cohort_over_nominal_opens_a_search_that_failed_in_the_pass(tmp_path):
    # Three nodes of 4 GPUs. Cohort X (under root) holds x1 (nominal 2) and x2 (3); y (nominal 6,
    # reclaims) and w (1) hang from root: 12 GPUs of quota. One after another from t=0, x1 runs A
    # (4 GPUs, n0: it borrows x2's unused quota, X holds 5 of its 5), y runs Y (2, n1), w runs W
    # (2, n1: it borrows 1) and x2 runs D (1, n2). At t=1 come, in this order, J1 (y, 4), L (x2, 1) and J2
    # (y, 4). J1 needs 1 GPU of quota back: its only candidate is W (X is within its nominal
    # quota, so A is not one), and W's GPUs leave no node with 4 free: J1 fails. L fits (X now
    # borrows 1 of root's) and starts on n2, which puts X over its nominal quota: A becomes a
    # candidate. J2, the same request in the same queue as J1, reclaims W, then A (n0 free), and
    # W is spared: J2 starts at 1 on n0, A goes. A pass that took J2 for failed with J1 would
    # leave that to the next pass, where J1 would take A instead; the reference engine, which
    # makes every attempt, is the judge.
    three = _nodes((3, "V100", 4, 16))
    gpu = "nvidia.com/gpu"
    part = _read(tmp_path, FLAVOR + _cohort_doc("root", "") + _cohort_doc("X", "\n  parent: root")
                 + _cq("x1", "X", {gpu: {"nominalQuota": 2}}) + _cq("x2", "X", {gpu: {"nominalQuota": 3}})
                 + _cq("y", "root", {gpu: {"nominalQuota": 6}}, extra=_preemption(reclaimWithinCohort="Any"))
                 + _cq("w", "root", {gpu: {"nominalQuota": 1}}), three)[0]
    jobs = [_gpu_job("A", "x1", 4, duration=1000), _gpu_job("Y", "y", 2, submit=0.1, duration=1000),
            _gpu_job("W", "w", 2, submit=0.2, duration=1000), _gpu_job("D", "x2", 1, submit=0.3, duration=1000),
            _gpu_job("J1", "y", 4, submit=1.0), _gpu_job("L", "x2", 1, submit=1.0), _gpu_job("J2", "y", 4, submit=1.0)]
    fast = _run(part, jobs, until=2, cluster=three)
    reference = _run(part, jobs, until=2, cluster=three, shortcuts=False)
    assert fast.decisions == reference.decisions
    assert _preempted(fast) == [(1.0, "A", "InCohortReclamation", "y")]
    assert _started(fast)["J2"] == 1.0 and _started(fast)["J1"] is None
    assert fast.running["J2"].placement.nodes == (0,)


# --- a search with nothing to find is not repeated ------------------------------------------------


def test_a_cohort_gives_back_only_what_it_borrows_and_the_room_bound_takes_exactly_that(tmp_path):
    # Two nodes of 4 GPUs; cohorts c0 and c1 under root, without quota of their own. a (in c0)
    # has 6 GPUs nominal; b0 (in c1) 2 and b1 (in c1) none, so c1's subtree quota is 2. a runs
    # 2 GPUs (t=0); b1 runs four 1-GPU jobs (t=1..4), the last two on n1: b1 borrows 4, and c1
    # borrows 2 of root's. At t=10 a's job of 4 GPUs (within a's nominal quota) finds 2 GPUs left
    # in the root, so it reclaims from b1, the most recent first, while b1 and every cohort up to
    # the common ancestor (root) are over nominal: b1-4 (c1 then holds 3, over its 2) and b1-3
    # (c1 then holds 2: within), then no more. Those two free n1 whole, where the job goes.
    # The room bound asks first whether the job could be placed with every workload a walk may
    # take released: of c1, those two (one fewer, and it would refuse the search).
    two = _nodes((2, "V100", 4, 16))
    gpu = "nvidia.com/gpu"
    part = _read(tmp_path, FLAVOR + _cohort_doc("c0", "\n  parent: root") + _cohort_doc("c1", "\n  parent: root")
                 + _cq("a", "c0", {gpu: {"nominalQuota": 6}}, extra=_preemption(reclaimWithinCohort="Any"))
                 + _cq("b0", "c1", {gpu: {"nominalQuota": 2}}) + _cq("b1", "c1", {gpu: {"nominalQuota": 0}}), two)[0]
    jobs = [_gpu_job("a-1", "a", 2, submit=0.0, duration=1000)]
    jobs += [_gpu_job(f"b1-{i}", "b1", 1, submit=float(i), duration=1000) for i in range(1, 5)]
    jobs.append(_gpu_job("a-2", "a", 4, submit=10.0, duration=100))
    e = _run(part, jobs, until=20, cluster=two)
    assert sorted(_preempted(e)) == [(10.0, "b1-3", "InCohortReclamation", "a"), (10.0, "b1-4", "InCohortReclamation", "a")]
    assert _started(e)["a-2"] == 10.0
    assert e.running["a-2"].placement.nodes == (1,)


def test_a_cohort_s_usage_falls_by_what_its_queue_held_above_its_guarantee(tmp_path):
    # Two nodes of 4 GPUs. a (in c0) has 7 GPUs nominal. In c1 (no quota of its own), b has 2
    # with lendingLimit 0, so it keeps both (its guarantee) and only what it uses past them counts
    # in c1; d has none. a runs 3 GPUs and b 1 on n0 (t=0, 1); d runs 1 and b 3 more on n1
    # (t=2, 3): b uses 4, 2 past its guarantee, so c1 holds 2 + 1 = 3 of root's 7. At t=10 a's job
    # of 4 GPUs (within a's nominal quota) finds 1 left, so it reclaims from c1, the most recent
    # first: b's 3-GPU job (b is over nominal, c1 over its 0), which takes c1 down by 2, not 3
    # (b drops under its guarantee), then d's (c1 still over), which frees n1 whole. A room bound
    # that took c1 down by each job's whole charge would stop after b's job and refuse.
    two = _nodes((2, "V100", 4, 16))
    gpu = "nvidia.com/gpu"
    part = _read(tmp_path, FLAVOR + _cohort_doc("c0", "\n  parent: root") + _cohort_doc("c1", "\n  parent: root")
                 + _cq("a", "c0", {gpu: {"nominalQuota": 7}}, extra=_preemption(reclaimWithinCohort="Any"))
                 + _cq("b", "c1", {gpu: {"nominalQuota": 2, "lendingLimit": 0}})
                 + _cq("d", "c1", {gpu: {"nominalQuota": 0}}), two)[0]
    jobs = [_gpu_job("a-1", "a", 3, submit=0.0, duration=1000), _gpu_job("b-1", "b", 1, submit=1.0, duration=1000),
            _gpu_job("d-1", "d", 1, submit=2.0, duration=1000), _gpu_job("b-2", "b", 3, submit=3.0, duration=1000),
            _gpu_job("a-2", "a", 4, submit=10.0, duration=100)]
    e = _run(part, jobs, until=20, cluster=two)
    assert sorted(_preempted(e)) == [(10.0, "b-2", "InCohortReclamation", "a"), (10.0, "d-1", "InCohortReclamation", "a")]
    assert _started(e)["a-2"] == 10.0


@pytest.mark.parametrize("within, looked, asked", [
    # LowerOrNewerEqualPriority: q's equal-priority jobs might be candidates (they are not: older
    # than big), so the search is made once, finds none, and is answered from the memo after.
    ("LowerOrNewerEqualPriority", 1, True),
    # LowerPriority: no job of q can be a candidate and q has no cohort: the admission knows it
    # from the counts on q's path, and big waits as in a queue that does not preempt (its visits
    # change nothing, and the pass leaves them out): the plugin is never asked.
    ("LowerPriority", 0, False),
])
def test_a_failed_search_is_not_repeated_while_the_usage_it_read_stands(tmp_path, within, looked, asked):
    # q (8 CPUs) runs two normal jobs of 4 CPUs; big (normal, 6 CPUs, created after them) does
    # not fit and has no candidate. Then 40 small jobs of another, unrelated queue r (no cohort)
    # arrive and end one by one: every launch and stop runs a pass that attempts big again, and
    # the plugin answers without searching (q's usage has not changed): the number of full
    # searches stays 0 where each pass would otherwise make one.
    part, _ = _read(tmp_path, FLAVOR + PRIORITIES + _cq("q", None, {"cpu": {"nominalQuota": 8}},
                                                        extra=_preemption(withinClusterQueue=within))
                    + _cq("r", None, {"cpu": {"nominalQuota": 4}}), CPU_NODES)
    jobs = [_cpu_job("n0", "q", 4, 0, 5000, qos="normal"), _cpu_job("n1", "q", 4, 0, 5000, qos="normal"),
            _cpu_job("big", "q", 6, 1, 100, qos="normal")]
    jobs += [_cpu_job(f"r{i}", "r", 4, 2 + 10 * i, 10) for i in range(40)]
    e = _run(part, jobs)
    plugin = e.policy.post_filters[0]
    assert isinstance(plugin, KueuePreemption)
    assert _preempted(e) == []
    if asked:
        assert plugin.calls >= 40  # asked again after every launch and stop of r's jobs
    else:
        assert plugin.calls == 0
    assert plugin.looked == looked
    assert plugin.searches == 0


def _room_refuted(tmp_path, *, stop_on_n1: bool):
    # Two nodes of 4 GPUs; a root cohort over q1 (nominal 4, reclaims Any), q2 (nominal 0: all it
    # runs is borrowed) and q3 (nominal 4, does not preempt); no priority classes (all 0). At 0, C1
    # (q3, 2) and B1 (q2, 2) fill n0; at 0.1 C2 (q3, 2) starts on n1. At 1 J (q1, 4) has 2 GPUs of
    # quota left: its one candidate is B1, and with B1 released no node has 4 free: the room bound
    # refuses the search. At 2 D (q2, 1) starts on n1: D is first in candidate order and no cohort
    # below the root comes to borrow, so the refutation stands. At 2.5 E (q1, 4, behind J) brings a
    # pass in which the gate fails J without a search: the refutation, replayed, still refutes it
    # (KueuePreemption.finds_none_until; the reference engine searches). Then C2 ends (at 3, or at 5000):
    # not a candidate, its 2 GPUs freed on n1 reach 4 with D's released, which ends the refutation:
    # J reclaims D and starts on n1 in the pass of that stop.
    two = _nodes((2, "V100", 4, 16))
    gpu = "nvidia.com/gpu"
    part = _read(tmp_path, FLAVOR + _cohort_doc("root", "")
                 + _cq("q1", "root", {gpu: {"nominalQuota": 4}}, extra=_preemption(reclaimWithinCohort="Any"))
                 + _cq("q2", "root", {gpu: {"nominalQuota": 0}})
                 + _cq("q3", "root", {gpu: {"nominalQuota": 4}}), two)[0]
    jobs = [_gpu_job("C1", "q3", 2, duration=5000), _gpu_job("B1", "q2", 2, duration=5000),
            _gpu_job("C2", "q3", 2, submit=0.1, duration=2.9 if stop_on_n1 else 5000),
            _gpu_job("J", "q1", 4, submit=1.0), _gpu_job("D", "q2", 1, submit=2.0, duration=5000),
            _gpu_job("E", "q1", 4, submit=2.5)]
    fast = _run(part, jobs, until=10, cluster=two)
    reference = _run(part, jobs, until=10, cluster=two, shortcuts=False)
    assert fast.decisions == reference.decisions
    return fast


def test_a_room_refutation_outlives_a_launch_first_in_candidate_order_and_ends_at_a_stop_that_frees_enough(tmp_path):
    fast = _room_refuted(tmp_path, stop_on_n1=True)
    plugin = fast.policy.post_filters[0]
    assert isinstance(plugin, KueuePreemption)
    # At 2.5 the gate fails J (and E, of its shape) by the refutation, replayed, without a search:
    # the searches are J's at 1 (refused, the refutation kept) and at 3 (D found).
    assert plugin.hinted >= 1 and plugin.replayed == 0 and plugin.looked == 2
    assert _preempted(fast) == [(3.0, "D", "InCohortReclamation", "q1")]
    assert _started(fast)["J"] == 3.0 and fast.running["J"].placement.nodes == (1,)


def test_without_the_stop_the_replayed_refutation_keeps_the_job_waiting(tmp_path):
    fast = _room_refuted(tmp_path, stop_on_n1=False)
    plugin = fast.policy.post_filters[0]
    assert isinstance(plugin, KueuePreemption)
    assert plugin.hinted >= 1 and plugin.looked == 1  # (J's search at 1 only: then the gate fails it)
    assert _preempted(fast) == [] and _started(fast)["J"] is None


def test_a_stop_that_takes_a_source_out_of_its_cohort_s_share_lets_another_source_s_candidate_in(tmp_path):
    # A root cohort over qa (nominal 4, reclaims Any), qc (nominal 1, does not preempt) and cohort
    # B (nominal 1) over b1 (nominal 0) and b2 (nominal 2); two nodes of 4 GPUs, priorities all 0
    # (candidate order: newest first). n0 runs Z (b1, 2, at 0) and Z2 (b1, 2, at 0.1); n1 runs T
    # (b2, 1, at 0.15), C (qc, 1) and S (b2, 2, at 0.2). B borrows 4: a walk for J (qa, 4 on one
    # node, at 1) may take S, then Z2, and then B is back within its quota: with both released, no
    # node has 4 free, and the search fails. At 3 T ends: b2 is back within its quota, no longer a
    # source, and B borrows 3: the walk takes Z2, then Z (B still over), and J starts on n0. T was
    # not counted and frees 1 GPU on n1 only; a refutation that counted S and Z2 alone (the
    # cohort's share) would say n0 reaches 2 still, and keep J waiting.
    two = _nodes((2, "V100", 4, 16))
    gpu = "nvidia.com/gpu"
    part = _read(tmp_path, FLAVOR + _cohort_doc("root", "")
                 + _cohort_doc("B", "\n  parent: root" + resource_groups([([gpu], [("default-flavor", {gpu: {"nominalQuota": 1}})])]))
                 + _cq("qa", "root", {gpu: {"nominalQuota": 4}}, extra=_preemption(reclaimWithinCohort="Any"))
                 + _cq("qc", "root", {gpu: {"nominalQuota": 1}})
                 + _cq("b1", "B", {gpu: {"nominalQuota": 0}})
                 + _cq("b2", "B", {gpu: {"nominalQuota": 2}}), two)[0]
    jobs = [_gpu_job("Z", "b1", 2, duration=5000), _gpu_job("Z2", "b1", 2, submit=0.1, duration=5000),
            _gpu_job("T", "b2", 1, submit=0.15, duration=2.85), _gpu_job("C", "qc", 1, submit=0.16, duration=5000),
            _gpu_job("S", "b2", 2, submit=0.2, duration=5000), _gpu_job("J", "qa", 4, submit=1.0)]
    fast = _run(part, jobs, until=10, cluster=two)
    reference = _run(part, jobs, until=10, cluster=two, shortcuts=False)
    assert [(d.job_id, d.nodes) for d in reference.decisions if d.kind == "launch"][:5] == [
        ("Z", ("n0",)), ("Z2", ("n0",)), ("T", ("n1",)), ("C", ("n1",)), ("S", ("n1",))]
    assert fast.decisions == reference.decisions
    assert sorted(_preempted(fast)) == [(3.0, "Z", "InCohortReclamation", "qa"), (3.0, "Z2", "InCohortReclamation", "qa")]
    assert _started(fast)["J"] == 3.0


# --- fair sharing ------------------------------------------------------------------------------------


def _fair_ab(tmp_path, *strategies: str, weight_a: str | None = None):
    # a and b: 6 CPUs each in cohort ab (12 lendable), reclaimWithinCohort: Any, fair sharing on.
    fs = f"\n  fairSharing: {{weight: {weight_a}}}" if weight_a is not None else ""
    return _read(tmp_path, FLAVOR + _config(*strategies)
                 + _cq("a", "ab", {"cpu": {"nominalQuota": 6}}, extra=_preemption(reclaimWithinCohort="Any") + fs)
                 + _cq("b", "ab", {"cpu": {"nominalQuota": 6}}, extra=_preemption(reclaimWithinCohort="Any")),
                 CPU_NODES)[0]


def test_the_share_is_borrowed_over_lendable_divided_by_weight(tmp_path):
    # a holds 9 of its 6 CPUs: 3 borrowed over the cohort's 12 lendable = 0.25; with weight 2, 0.125;
    # with weight 0 any borrowing is an infinite share; b, within its quota, 0.
    from analysim.core.plugins.kueue import KueueState
    from analysim.core.plugins.kueue_share import Shares

    for weight, want in (("1", 0.25), ("2", 0.125), ("0", float("inf"))):
        part = _fair_ab(tmp_path, weight_a=weight)
        assert part.fair_sharing is not None and part.fair_sharing.strategies == (
            "LessThanOrEqualToFinalShare", "LessThanInitialShare")
        state = KueueState(part, [n.name for n in CPU_NODES.nodes])
        a, b = state.tree.index["a"], state.tree.index["b"]
        state.tree.add(a, ("default-flavor", "cpu"), 9000)
        state.tree.add(b, ("default-flavor", "cpu"), 3000)
        shares = Shares(state.tree)
        assert shares.share(a) == want
        assert shares.share(b) == 0.0
        assert shares.share(b, ((("default-flavor", "cpu"), 4000),)) == 1 / 12  # (b at 7: 1 borrowed)


_A_NINE = [_cpu_job(f"a{i}", "a", 1, submit=float(i), duration=1000) for i in range(9)]


def test_fair_sharing_preempts_the_highest_share_down_to_the_preemptor_s(tmp_path):
    # a runs 9 jobs of 1 CPU (t=0..8; 3 borrowed: share 3/12), b runs 3 (t=9..11). At t=20 b asks
    # for 3 more: b would hold 6, within its quota: share 0. Available to b: 12 - 12 = 0. The
    # highest share with candidates is a's; its candidates most recent first: a8 (a after: 2/12,
    # 0 <= 2/12: evicted), a7 (1/12: evicted), a6 (a at 6: 0, 0 <= 0: evicted): b may take 3: fits.
    # b stays within its nominal quota (6 of 6) with the job, so since Kueue 0.17
    # (FairSharingPreemptWithinNominal, on by default) the reason is InCohortReclamation.
    jobs = _A_NINE + [_cpu_job(f"b{i}", "b", 1, submit=9.0 + i, duration=1000) for i in range(3)]
    jobs.append(_cpu_job("b-more", "b", 3, submit=20))
    e = _run(_fair_ab(tmp_path), jobs, until=30)
    assert sorted(_preempted(e)) == [(20.0, f"a{i}", "InCohortReclamation", "b") for i in (6, 7, 8)]
    assert _started(e)["b-more"] == 20.0


# b runs 3 jobs of 1 CPU from t=0..2; a five of 1 CPU (t=3..7) and a-big of 4 (t=8): a holds 9,
# 3 borrowed, share 3/12. At t=20 b asks for 4 more: with it b would hold 7, share 1/12.
_FAIR_BIG = ([_cpu_job(f"b{i}", "b", 1, submit=float(i), duration=1000) for i in range(3)]
             + [_cpu_job(f"a{i}", "a", 1, submit=3.0 + i, duration=1000) for i in range(5)]
             + [_cpu_job("a-big", "a", 4, submit=8, duration=1000), _cpu_job("b-more", "b", 4, submit=20, duration=100)])


def test_less_than_or_equal_to_final_share_refuses_to_take_the_target_below_the_preemptor(tmp_path):
    # a's first candidate is a-big: without it a holds 5, share 0: 1/12 <= 0 is false, a is left
    # alone, no other candidate: b-more waits. At t=1000 b0 ends: b holds 2, with b-more 6, share
    # 0; available 12 - 11 = 1 < 4; b within its nominal quota with b-more (6 of 6): a-big is
    # evicted whatever the strategy, for InCohortReclamation (Kueue >= 0.17,
    # FairSharingPreemptWithinNominal), and b-more starts.
    e = _run(_fair_ab(tmp_path, "LessThanOrEqualToFinalShare"), _FAIR_BIG)
    assert _preempted(e) == [(1000.0, "a-big", "InCohortReclamation", "b")]
    assert _started(e)["b-more"] == 1000.0


def test_less_than_initial_share_takes_the_big_workload_the_first_strategy_refused(tmp_path):
    # The same with Kueue's default strategies: at t=20 LessThanOrEqualToFinalShare finds nothing,
    # then LessThanInitialShare compares b's 1/12 with a's share before the eviction, 3/12: a-big
    # is evicted; b may then take 12 - 5 - 3 = 4: fits.
    e = _run(_fair_ab(tmp_path), _FAIR_BIG, until=30)
    assert _preempted(e) == [(20.0, "a-big", "InCohortFairSharing", "b")]
    assert _started(e)["b-more"] == 20.0


def test_a_bad_configuration_is_one_line(tmp_path):
    text = FLAVOR + _cq("q", None, {"cpu": {"nominalQuota": 8}}) + """
---
apiVersion: config.kueue.x-k8s.io/v1beta1
kind: Configuration
fairSharing:
  enable: true
  preemptionStrategies: [LessThanFinalShare]
"""
    with pytest.raises(InputFileError) as e:
        _read(tmp_path, text, CPU_NODES)
    assert "\n" not in str(e.value)
    assert "(Configuration): fairSharing.preemptionStrategies[0]: expected one of LessThanOrEqualToFinalShare, " \
           "LessThanInitialShare, got 'LessThanFinalShare'" in str(e.value)


def test_fair_sharing_orders_admission_by_the_share_each_queue_would_have(tmp_path):
    # a, b: 4 CPUs each, c: 8, in cohort abc (16). a holds 8 (4 borrowed), b 4, c 4 of its 8 (two
    # jobs, ending at 100 and 200): the cohort is full. a asks for 2 more at t=5, b at t=6. At
    # t=100, 2 CPUs free: both would borrow. Without fair sharing, priority then creation: a's job
    # first (t=5), b's at 200. With it, the share each queue would have with its job: a 6/16,
    # b 2/16: b's first, a's at 200.
    def part(fair: bool):
        text = FLAVOR + (_config() if fair else "") + "".join(
            _cq(n, "abc", {"cpu": {"nominalQuota": q}}) for n, q in (("a", 4), ("b", 4), ("c", 8)))
        return _read(tmp_path, text, CPU_NODES)[0]

    jobs = ([_cpu_job(f"a{i}", "a", 2, 0, 1000) for i in range(4)] + [_cpu_job(f"b{i}", "b", 2, 0, 1000) for i in range(2)]
            + [_cpu_job("c0", "c", 2, 0, 100), _cpu_job("c1", "c", 2, 0, 200)]
            + [_cpu_job("a-next", "a", 2, 5, 500), _cpu_job("b-next", "b", 2, 6, 500)])
    plain = _started(_run(part(False), jobs))
    assert (plain["a-next"], plain["b-next"]) == (100.0, 200.0)
    fair = _started(_run(part(True), jobs))
    assert (fair["a-next"], fair["b-next"]) == (200.0, 100.0)
