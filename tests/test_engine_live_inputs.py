"""The engine's live-only inputs: "held, not infeasible" (submit with hold), job_failed and
resume_running. None of them changes an offline schedule."""

from __future__ import annotations

import pytest

from analysim.core.engine import Engine, EngineConfig, InfeasibleJob
from analysim.core.job import JobStatus
from analysim.core.metrics import MetricsRecorder
from analysim.core.policies import build_policy
from tests.simhelpers import cluster, job


def _engine(nodes: int = 2, gpus: int = 8) -> Engine:
    return Engine(cluster(nodes, gpus), build_policy("fifo", "consolidate"), EngineConfig(predict_completions=False),
                  recorder=MetricsRecorder(sample_interval_s=1.0))


def test_not_now_is_held_until_nodes_return_and_never_is_refused() -> None:
    e = _engine()
    e.node_down("n1", at=0.0)
    e.run(until=0.0)
    wide = job("wide", 0.0, 16, 100.0)
    with pytest.raises(InfeasibleJob):
        e.submit(wide)  # without hold: refused, as before
    held = e.submit(wide, hold=True)
    assert held.status is JobStatus.PENDING and "wide" in e.table.held and e.pending_count == 0
    with pytest.raises(InfeasibleJob, match="more than the cluster can ever hold"):
        e.submit(job("huge", 0.0, 17, 100.0), hold=True)  # never, whatever comes back
    e.run(until=50.0)
    assert held.first_start_s is None
    e.node_up("n1", at=60.0)
    e.run(until=60.0)
    assert (held.status, held.first_start_s) == (JobStatus.RUNNING, 60.0) and not e.table.held


def test_a_held_job_can_be_cancelled() -> None:
    e = _engine()
    e.node_down("n1", at=0.0)
    e.run(until=0.0)
    e.submit(job("wide", 0.0, 16, 100.0), hold=True)
    e.cancel("wide", at=5.0)
    e.node_up("n1", at=6.0)
    e.run(until=10.0)
    assert e.jobs["wide"].status is JobStatus.CANCELLED and e.jobs["wide"].end_s == 5.0
    assert [d.kind for d in e.decisions] == ["cancel"] and not e.table.held


def test_job_failed_ends_a_running_job_as_failed() -> None:
    e = _engine()
    e.submit(job("a", 0.0, 8, 100.0))
    e.run(until=0.0)
    e.job_failed("a", at=40.0)
    e.run(until=40.0)
    a = e.jobs["a"]
    assert (a.status, a.end_s) == (JobStatus.FAILED, 40.0)
    assert [d.kind for d in e.decisions] == ["launch", "fail"]
    assert e.recorder.jobs[-1]["status"] == "failed" and e.allocated_gpus == 0


def test_resume_running_ends_when_it_would_have() -> None:
    e = _engine()
    e.run(until=500.0)
    a = e.resume_running(job("a", 100.0, 8, 1000.0), ((0, tuple(range(8))),), 1.0, started_s=200.0,
                         remaining_s=1000.0, overhead_s=0.0)
    assert a.status is JobStatus.RUNNING and e.expected_end(a) == 1200.0 and a.first_start_s == 200.0
    assert e.decisions[-1].kind == "resume"
    with pytest.raises(InfeasibleJob, match="not free"):  # the same GPUs twice
        e.resume_running(job("b", 100.0, 8, 10.0), ((0, tuple(range(8))),), 1.0, 200.0, 10.0, 0.0)
    e.job_finished("a", at=1200.0)
    e.run(until=1200.0)
    assert (a.status, a.end_s, e.recorder.jobs[-1]["jct_s"]) == (JobStatus.COMPLETED, 1200.0, 1100.0)
