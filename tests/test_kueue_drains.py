"""Drained passes under a partition (KueueQueue.order over pass_streams.ShapeStream): the
runs of jobs whose visits change nothing that a pass leaves out give the reference engine's
decisions, on crowded queues of a few hundred jobs where most of them wait for quota."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from analysim.core.engine import Engine
from analysim.core.plugins.kueue import KueueQueue
from analysim.core.plugins.kueue_preemption import KueuePreemption
from tests.kueue_yaml import preemption as _preemption
from tests.test_kueue import (
    FLAVOR,
    TWO_RACKS_AND_ROOT,
    _cohort_doc,
    _cq,
    _gpu_groups,
    _gpu_job,
    _nodes,
    _queue_docs,
    _read,
)
from tests.test_kueue_preemption import PRIORITIES, _preempting_partitions, _run, _run_preempting

QUEUES = ["c0q0", "c0q1", "c1q0", "c1q1"]
PREEMPTING = "{withinClusterQueue: LowerPriority, reclaimWithinCohort: Any, borrowWithinCohort: {policy: Never}}"


@st.composite
def _crowded(draw, sizes: tuple[int, ...] = (1, 1, 2, 2, 3, 4, 6, 8), forest: bool = False,
             classes: tuple[str, ...] = ("low", "normal", "normal", "high"), flavors: tuple[str, ...] = ("f0", "f1")):
    """test_kueue_preemption's random trees and policies, with 120-300 jobs arriving over a span
    short enough that most of them wait: ``sizes`` GPUs (on 8-GPU nodes), priorities
    low/normal/high. The jobs come from a drawn seed (Hypothesis then shrinks the tree and the
    count, not each job). ``forest``: the two cohorts are the roots of two trees (no root cohort
    over them), so that a change in one leaves the other's usage as it was, and every queue is
    BestEffortFIFO (a StrictFIFO queue's head holds the rest, which no pass leaves out).
    ``classes``: the priority classes drawn from ("": none, priority 0). ``flavors``: those the
    queues use."""
    text, _ = draw(_preempting_partitions(flavors=flavors))
    if forest:
        text = text.replace("\n  parent: root", "").replace("StrictFIFO", "BestEffortFIFO")
        if draw(st.booleans()):
            text = re.sub(r"\n  preemption: [^\n]*", "", text)  # (no queue preempts: a refusal is its quota's)
    n = draw(st.integers(120, 300))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    span = draw(st.sampled_from([300.0, 1000.0, 3000.0]))
    jobs = [(rng.choice(QUEUES), rng.choice(sizes), round(rng.uniform(0, span), 1),
             round(rng.uniform(20, 600), 1), rng.choice(classes)) for _ in range(n)]
    return text, jobs


def _queue(engine: Engine) -> KueueQueue:
    q = engine.policy.queue
    assert isinstance(q, KueueQueue)
    return q


def _against_reference(tmp_path, drawn) -> Engine:
    """The drawn run with the pass's shortcuts on, checked against the reference engine's (which
    walks every job: it drains no run and leaves no queue out): the same decisions."""
    fast = _run_preempting(tmp_path, drawn)
    reference = _run_preempting(tmp_path, drawn, shortcuts=False)
    event(f"preempting: {fast.scheduler.can_preempt}")
    event(f"drains: {'some' if _queue(fast).drains else 'none'}")
    event(f"queues left out: {'some' if _queue(fast).left_out else 'none'}")
    event(f"preemptions: {'some' if any(d.kind == 'preempt' for d in fast.decisions) else 'none'}")
    assert _queue(reference).drains == 0 and _queue(reference).left_out == 0
    assert fast.decisions == reference.decisions
    return fast


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(_crowded())
def test_drained_passes_make_the_reference_engine_s_decisions(tmp_path, drawn):
    _against_reference(tmp_path, drawn)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(_crowded(sizes=(2, 4, 8, 12, 16, 16)))
def test_passes_over_gangs_make_the_reference_engine_s_decisions(tmp_path, drawn):
    # Gangs (wider than a node) that fail are passed over for the same request and signature
    # until a launch or stop in the pass (CycleState.failed_exact); the reference makes each attempt.
    fast = _against_reference(tmp_path, drawn)
    event(f"gangs run: {'some' if any(d.kind == 'launch' and len(d.nodes) > 1 for d in fast.decisions) else 'none'}")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(_crowded(forest=True))
def test_passes_that_leave_refused_queues_out_make_the_reference_engine_s_decisions(tmp_path, drawn):
    # Two cohort trees: a queue all of whose jobs its quota refused stays out of the passes while
    # its tree's usage does not change (KueueQueue's inadmissible pool), and comes back in the pass
    # where it does (a launch in its tree can make a borrower there a candidate for its jobs).
    _against_reference(tmp_path, drawn)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_crowded(sizes=(1, 2, 4, 6, 8, 8, 12, 16), classes=("", "", "", "normal")))
def test_searches_answered_by_a_replayed_room_refutation_make_the_reference_engine_s_decisions(tmp_path, drawn):
    # Most jobs of the lowest priority (no class: 0), as in Philly's trace: a launch of one is
    # first in candidate order, and a room refutation may outlive it (kueue_room).
    fast = _against_reference(tmp_path, drawn)
    replayed = sum(p.replayed for p in fast.policy.post_filters if isinstance(p, KueuePreemption))
    event(f"searches answered by a replayed refutation: {'some' if replayed else 'none'}")


@st.composite
def _one_flavor_crowd(draw):
    """_crowded's jobs on queues of one flavor, as Philly's are: f0 on every node (32 GPUs) and each
    quota three times as large, so that the nodes run out before the quotas and searches end at
    the room bound (with f0 on half the nodes, the other half's free GPUs keep that bound open)."""
    text, jobs = draw(_crowded(sizes=(1, 2, 4, 6, 8, 8, 12, 16), classes=("", "", "", "normal"), flavors=("f0",)))
    rack = "\nspec: {nodeLabels: {analysim.io/rack: r0}}"  # (TWO_RACKS_AND_ROOT's f0: half the nodes)
    assert rack in text
    text = text.replace(rack, "")
    text = re.sub(r"(nominalQuota|borrowingLimit|lendingLimit): (\d+)", lambda m: f"{m[1]}: {3 * int(m[2])}", text)
    return text, jobs


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_one_flavor_crowd())
def test_jobs_the_gate_fails_by_a_replayed_room_refutation_make_the_reference_engine_s_decisions(tmp_path, drawn):
    # A job waiting for quota whose search a refutation still answers fails at the gate
    # (KueuePreemption.finds_none_until, for queues of one flavor), and a pass drains a run of
    # such jobs instead of visiting each; the reference engine searches for each.
    fast = _against_reference(tmp_path, drawn)
    hinted = sum(p.hinted for p in fast.policy.post_filters if isinstance(p, KueuePreemption))
    event(f"jobs the gate failed by a replayed refutation: {'some' if hinted else 'none'}")


@pytest.mark.parametrize("preemption", [PREEMPTING, "{}"], ids=["preempting", "not preempting"])
def test_a_crowded_partition_drains_and_leaves_out_most_visits(tmp_path, preemption):
    # Every queue BestEffortFIFO, 300 jobs in 300 s on 32 GPUs: most wait for quota or room.
    drawn = _fixed_crowd(preemption)
    fast = _run_preempting(tmp_path, drawn)
    reference = _run_preempting(tmp_path, drawn, shortcuts=False)
    assert fast.decisions == reference.decisions
    assert _queue(fast).drains > 0
    assert _queue(fast).given < _queue(reference).given / 2  # (the visits a drain leaves out)


def _fixed_crowd(preemption: str) -> tuple[str, list]:
    docs = [TWO_RACKS_AND_ROOT]
    for c in ("c0", "c1"):
        docs.append(_cohort_doc(c, "\n  parent: root"))
        for k in range(2):
            docs.append(_queue_docs(f"{c}q{k}", c, f"\n  preemption: {preemption}\n  queueingStrategy: BestEffortFIFO"
                                    + _gpu_groups({"f0": {"nominalQuota": 4}, "f1": {"nominalQuota": 4}})))
    rng = random.Random(30)
    jobs = [(rng.choice(QUEUES), rng.choice([1, 2, 4, 8]), round(rng.uniform(0, 300), 1),
             round(rng.uniform(20, 600), 1), rng.choice(["low", "normal", "high"])) for _ in range(300)]
    return "".join(docs) + PRIORITIES, jobs


def test_a_refused_queue_left_out_comes_back_in_the_pass_that_frees_its_quota(tmp_path):
    # Two nodes of 4 GPUs; a root cohort over q1 (nominal 2, preempts lower priorities of its
    # own) and q2 (nominal 4, does not preempt). At t=0 V (q1, low, 4 GPUs: it borrows 2 of q2's)
    # and Q (q2, 2) start: the root's 6 GPUs are all held. At t=1 J (q2, 2), within q2's nominal
    # quota, finds none of it free: refused, and q2 goes into the inadmissible pool. At t=1.5 R
    # (q1, low, 1) is refused too (V, of its own priority, is no candidate). At t=2 P (q1, high,
    # 1) arrives: the pass leaves q2 out (its tree has not changed since t=1.5) and takes P first,
    # which evicts V and starts. That gives q2's quota back, so the same pass takes J again, before
    # R (J ranks first by priority): J then R start at 2. A pass that kept q2 out would start R
    # first, and J in a pass after it.
    two = _nodes((2, "V100", 4, 16))
    gpu = "nvidia.com/gpu"
    part = _read(tmp_path, FLAVOR + _cohort_doc("root", "")
                 + _cq("q1", "root", {gpu: {"nominalQuota": 2}}, extra=_preemption(withinClusterQueue="LowerPriority"))
                 + _cq("q2", "root", {gpu: {"nominalQuota": 4}}) + PRIORITIES, two)[0]
    jobs = [_gpu_job("V", "q1", 4, duration=1000, qos="low"), _gpu_job("Q", "q2", 2, duration=1000, qos="normal"),
            _gpu_job("J", "q2", 2, submit=1.0, duration=100, qos="normal"), _gpu_job("R", "q1", 1, submit=1.5, duration=100, qos="low"),
            _gpu_job("P", "q1", 1, submit=2.0, duration=100, qos="high")]
    fast = _run(part, jobs, until=10, cluster=two)
    reference = _run(part, jobs, until=10, cluster=two, shortcuts=False)
    assert fast.decisions == reference.decisions
    assert _queue(fast).left_out == 2  # (q2, in the passes at 1.5 and 2)
    assert [(d.time, d.kind, d.job_id) for d in fast.decisions if d.time == 2.0] == [
        (2.0, "preempt", "V"), (2.0, "launch", "P"), (2.0, "launch", "J"), (2.0, "launch", "R")]


def test_a_queue_left_out_as_failing_on_nodes_comes_back_in_the_pass_that_frees_a_node(tmp_path):
    # Two nodes of 4 GPUs; a root cohort over q1 (nominal 6, no borrowing, preempts lower
    # priorities of its own) and q2 (nominal 8, does not preempt). At t=0 V and W (q1, low, 3
    # each) start, one on each node. At t=1 J (q2, 4) fits q2's quota within nominal, but no node
    # has 4 GPUs free: its attempt fails on the nodes (no search: its quota fits), nothing changes
    # after it, and q2 goes into the inadmissible pool on the running jobs and the nodes. At t=2 P
    # (q1, high, 1) arrives: the pass leaves q2 out (nothing has launched or stopped since) and
    # takes P first (its priority), which is over q1's quota and evicts the most recently started
    # of V and W, freeing that node; P starts on the other node's free GPU. That launch brings q2
    # back in the same pass: J starts on the freed node at 2, before R (q3, 4 GPUs, arriving at 2
    # within its own quota), which J's earlier creation puts after it. A pass that kept q2 out
    # would start R there instead, and leave J waiting.
    two = _nodes((2, "V100", 4, 16))
    gpu = "nvidia.com/gpu"
    part = _read(tmp_path, FLAVOR + _cohort_doc("root", "")
                 + _cq("q1", "root", {gpu: {"nominalQuota": 6, "borrowingLimit": 0}},
                       extra=_preemption(withinClusterQueue="LowerPriority"))
                 + _cq("q2", "root", {gpu: {"nominalQuota": 8}})
                 + _cq("q3", "root", {gpu: {"nominalQuota": 4}}) + PRIORITIES, two)[0]
    jobs = [_gpu_job("V", "q1", 3, duration=1000, qos="low"), _gpu_job("W", "q1", 3, duration=1000, qos="low"),
            _gpu_job("J", "q2", 4, submit=1.0, duration=100, qos="normal"),
            _gpu_job("P", "q1", 1, submit=2.0, duration=100, qos="high"),
            _gpu_job("R", "q3", 4, submit=2.0, duration=100, qos="normal")]
    fast = _run(part, jobs, until=10, cluster=two)
    reference = _run(part, jobs, until=10, cluster=two, shortcuts=False)
    assert fast.decisions == reference.decisions
    # (q2 in the first pass at 2; q3 in the second, after R failed on the nodes in the first:
    # the evicted W queued again at 2 brings that one)
    assert _queue(fast).left_out == 2
    at_two = [(d.kind, d.job_id) for d in fast.decisions if d.time == 2.0]
    assert at_two == [("preempt", "W"), ("launch", "P"), ("launch", "J")]
