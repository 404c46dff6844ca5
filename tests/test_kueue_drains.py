"""Drained passes under a partition (KueueQueue.order over pass_streams.ShapeStream): the
runs of jobs whose visits change nothing that a pass leaves out give the reference engine's
decisions, on crowded queues of a few hundred jobs where most of them wait for quota."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from analysim.core.engine import Engine, EngineConfig
from analysim.core.plugins.kueue import KueueQueue
from analysim.core.policies import partition_policy
from analysim.partitions import assign_queues
from tests.test_kueue import (
    RANDOM_NODES,
    TWO_RACKS_AND_ROOT,
    _cohort_doc,
    _gpu_groups,
    _gpu_job,
    _queue_docs,
    _read,
)
from tests.test_kueue_preemption import PRIORITIES, _preempting_partitions

QUEUES = ["c0q0", "c0q1", "c1q0", "c1q1"]
PREEMPTING = "{withinClusterQueue: LowerPriority, reclaimWithinCohort: Any, borrowWithinCohort: {policy: Never}}"


@st.composite
def _crowded(draw, sizes: tuple[int, ...] = (1, 1, 2, 2, 3, 4, 6, 8)):
    """test_kueue_preemption's random trees and policies, with 120-300 jobs arriving over a span
    short enough that most of them wait: ``sizes`` GPUs (on 8-GPU nodes), priorities
    low/normal/high. The jobs come from a drawn seed (Hypothesis then shrinks the tree and the
    count, not each job)."""
    text, _ = draw(_preempting_partitions())
    n = draw(st.integers(120, 300))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    span = draw(st.sampled_from([300.0, 1000.0, 3000.0]))
    jobs = [(rng.choice(QUEUES), rng.choice(sizes), round(rng.uniform(0, span), 1),
             round(rng.uniform(20, 600), 1), rng.choice(["low", "normal", "normal", "high"])) for _ in range(n)]
    return text, jobs


def _run(tmp_path, drawn, shortcuts: bool) -> Engine:
    text, raw = drawn
    part, _ = _read(tmp_path, text, RANDOM_NODES)
    jobs = [_gpu_job(f"j{i}", vc, g, submit=s, duration=d, qos=q) for i, (vc, g, s, d, q) in enumerate(raw)]
    kept, _ = assign_queues(jobs, part)
    spec = dataclasses.replace(RANDOM_NODES, partition=part)
    engine = Engine(spec, partition_policy(spec), EngineConfig(keep_decisions=True), shortcuts=shortcuts)
    for j in kept:
        engine.submit(j)
    engine.run()
    return engine


def _queue(engine: Engine) -> KueueQueue:
    q = engine.policy.queue
    assert isinstance(q, KueueQueue)
    return q


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(_crowded())
def test_drained_passes_make_the_reference_engine_s_decisions(tmp_path, drawn):
    fast = _run(tmp_path, drawn, shortcuts=True)
    reference = _run(tmp_path, drawn, shortcuts=False)
    event(f"preempting: {fast.scheduler.can_preempt}")
    event(f"drains: {'some' if _queue(fast).drains else 'none'}")
    event(f"preemptions: {'some' if any(d.kind == 'preempt' for d in fast.decisions) else 'none'}")
    assert _queue(reference).drains == 0  # (the reference walks every job)
    assert fast.decisions == reference.decisions


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(_crowded(sizes=(2, 4, 8, 12, 16, 16)))
def test_passes_over_gangs_make_the_reference_engine_s_decisions(tmp_path, drawn):
    # Gangs (wider than a node) that fail are passed over for the same request and signature
    # until a launch or stop in the pass (CycleState.failed_exact); the reference makes each attempt.
    fast = _run(tmp_path, drawn, shortcuts=True)
    reference = _run(tmp_path, drawn, shortcuts=False)
    event(f"preemptions: {'some' if any(d.kind == 'preempt' for d in fast.decisions) else 'none'}")
    event(f"gangs run: {'some' if any(d.kind == 'launch' and len(d.nodes) > 1 for d in fast.decisions) else 'none'}")
    assert fast.decisions == reference.decisions


@pytest.mark.parametrize("preemption", [PREEMPTING, "{}"], ids=["preempting", "not preempting"])
def test_a_crowded_partition_drains_and_leaves_out_most_visits(tmp_path, preemption):
    # Every queue BestEffortFIFO, 300 jobs in 300 s on 32 GPUs: most wait for quota or room.
    drawn = _fixed_crowd(preemption)
    fast = _run(tmp_path, drawn, shortcuts=True)
    reference = _run(tmp_path, drawn, shortcuts=False)
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
