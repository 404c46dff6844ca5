"""The control-plane model (analysim.core.control_plane) and the preemption cost, each on a case
computed by hand and run through ``analysim simulate``: cycles a period apart, one head per
ClusterQueue per cycle (and the what-if of more), the inadmissible pool released by capacity, the
API's write rate holding quota before work starts, and what a victim keeps of its work."""

from __future__ import annotations

import csv
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysim.cli import main
from analysim.core.control_plane import ApiClient
from tests.kueue_yaml import flavor_doc, preemption, priority_doc, queue_docs, resource_groups

GPU = "nvidia.com/gpu"


def _partition(nominal: int, extra: str = "") -> str:
    return (flavor_doc("f") + priority_doc("low", 50) + priority_doc("high", 200)
            + queue_docs("a", None, resource_groups([([GPU], [("f", {GPU: {"nominalQuota": nominal}})])]) + extra))


def _simulate(tmp_path, partition: str, jobs: list[tuple], *flags: str) -> dict[str, dict[str, str]]:
    """Run the jobs (id, submit, duration, gpus, priority class) on one 8-GPU node; jobs.csv's rows by id."""
    (tmp_path / "p.yaml").write_text(partition)
    with open(tmp_path / "t.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job_id", "submit_s", "duration_s", "num_gpus", "vc", "qos"])
        for job_id, submit, duration, gpus, qos in jobs:
            w.writerow([job_id, submit, duration, gpus, "a", qos])
    out = tmp_path / "out"
    assert main(["simulate", "--trace", str(tmp_path / "t.csv"), "--cluster", "1x8", "--partition",
                 str(tmp_path / "p.yaml"), "--no-plots", "--no-progress", "--out", str(out), *flags]) == 0
    with open(out / "jobs.csv") as f:
        return {r["job_id"]: r for r in csv.DictReader(f)}


def _starts(rows: dict[str, dict[str, str]]) -> dict[str, float]:
    return {k: float(r["first_start_s"]) for k, r in rows.items()}


THREE = [("j0", 0, 10, 1, "low"), ("j1", 0, 10, 1, "low"), ("j2", 0, 10, 1, "low")]


def test_without_the_model_every_workload_that_fits_is_admitted_at_once(tmp_path):
    assert _starts(_simulate(tmp_path, _partition(2), THREE)) == {"j0": 0, "j1": 0, "j2": 10}


def test_one_head_per_cluster_queue_per_cycle(tmp_path):
    # Cycles 1 s apart: j0 at 0, j1 at the next cycle; j2 does not fit (quota 2), is parked, and
    # comes back when j0 releases its quota at 10: admitted in the cycle then.
    rows = _simulate(tmp_path, _partition(2), THREE, "--control-plane", "kueue,cycle_s=1,api_qps=1000,requeue_batch_s=0")
    starts = _starts(rows)
    assert starts["j0"] == 0 and starts["j1"] == 1
    assert starts["j2"] == pytest.approx(10, abs=0.01)  # (j0 ends 10 + its write's 1 ms)


def test_the_inadmissible_pool_comes_back_a_batch_period_after_a_release(tmp_path):
    rows = _simulate(tmp_path, _partition(2), THREE, "--control-plane", "kueue,cycle_s=1,api_qps=1000,requeue_batch_s=3")
    assert _starts(rows)["j2"] == pytest.approx(13, abs=0.01)


def test_more_heads_per_cycle_is_the_what_if(tmp_path):
    rows = _simulate(tmp_path, _partition(2), THREE, "--control-plane", "kueue,cycle_s=1,heads_per_queue=2,api_qps=1000")
    assert _starts(rows)["j0"] == _starts(rows)["j1"] == 0


def test_the_api_rate_holds_quota_before_the_work_starts(tmp_path):
    # Three admitted in one cycle; one write a second, no burst: the writes go at 0, 1 and 2, and
    # each job runs its 10 s from then, holding its quota meanwhile.
    rows = _simulate(tmp_path, _partition(3), THREE, "--control-plane", "kueue,heads_per_queue=3,api_qps=1,api_burst=1")
    assert _starts(rows) == {"j0": 0, "j1": 0, "j2": 0}
    assert sorted(float(r["end_s"]) for r in rows.values()) == [10, 11, 12]


VICTIM = [("low", 0, 100, 1, "low"), ("high", 40, 10, 1, "high")]


@pytest.mark.parametrize(("cost", "low_end"), [
    ("keep", 40 + 10 + 30 + 60),  # back at 50 with 60 s left, after a 30 s restore
    ("restart", 50 + 100),  # back at 50 from zero, nothing to restore
    ("checkpoint", 50 + 30 + 75),  # back to its checkpoint at 25 s of progress (of 40), restored first
])
def test_what_a_victim_keeps_is_the_preemption_cost(tmp_path, cost, low_end):
    part = _partition(1, preemption(withinClusterQueue="LowerPriority"))
    rows = _simulate(tmp_path, part, VICTIM, "--preemption-cost", cost, "--checkpoint-interval", "25")
    assert rows["low"]["preemptions"] == "1"
    assert float(rows["low"]["end_s"]) == pytest.approx(low_end)


def _two_queues(tmp_path, jobs: list[tuple], control: str) -> tuple[dict[str, dict[str, str]], dict, list[dict]]:
    """Queue a (quota 2, evicts lower priority) and queue b (quota 3) on one 8-GPU node, each job
    (id, submit, duration, queue, priority class) asking 1 GPU; jobs.csv's rows, the summary and
    the events file's rows."""
    import json

    rg = resource_groups([([GPU], [("f", {GPU: {"nominalQuota": 2}})])])
    part = (flavor_doc("f") + priority_doc("low", 50) + priority_doc("high", 200)
            + queue_docs("a", None, rg + preemption(withinClusterQueue="LowerPriority"))
            + queue_docs("b", None, resource_groups([([GPU], [("f", {GPU: {"nominalQuota": 3}})])])))
    (tmp_path / "p.yaml").write_text(part)
    with open(tmp_path / "t.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job_id", "submit_s", "duration_s", "num_gpus", "vc", "qos"])
        w.writerows([(job_id, submit, duration, 1, queue, qos) for job_id, submit, duration, queue, qos in jobs])
    out = tmp_path / "out"
    assert main(["simulate", "--trace", str(tmp_path / "t.csv"), "--cluster", "1x8", "--partition",
                 str(tmp_path / "p.yaml"), "--no-plots", "--no-progress", "--preemption-cost", "restart",
                 "--control-plane", control, "--events", str(tmp_path / "events.csv"), "--out", str(out)]) == 0
    with open(out / "jobs.csv") as f:
        rows = {r["job_id"]: r for r in csv.DictReader(f)}
    with open(tmp_path / "events.csv") as f:
        events = list(csv.DictReader(f))
    return rows, json.loads((out / "summary.json").read_text())["control_plane"], events


# One write a second, no burst, cycles 1 s apart, five heads a cycle: the five admissions of the
# cycle at 0 are written at 0, 1, 2, 3 and 4. "high" arrives at 0.5; the cycle at 1 evicts a low
# workload of a for it, whose write waits its turn behind them, to 5.
BUSY = "kueue,cycle_s=1,heads_per_queue=5,api_qps=1,api_burst=1,requeue_batch_s=0"
BEHIND = [("l0", 0, 10, "a", "low"), ("l1", 0, 10, "a", "low"), ("b0", 0, 10, "b", "low"),
          ("b1", 0, 10, "b", "low"), ("b2", 0, 10, "b", "low")]


def test_an_eviction_takes_its_write_s_time_and_the_preemptor_waits_for_it(tmp_path):
    rows, control, events = _two_queues(tmp_path, [*BEHIND, ("high", 0.5, 10, "a", "high")], BUSY)
    evicted = [e for e in events if e["event"] == "evict"]
    assert len(evicted) == 1 and evicted[0]["preemptor"] == "high"
    # The victim keeps its quota until its eviction is written at 5; no cycle runs in between
    # (Kueue writes a cycle's evictions from the cycle), and the one at 5 admits the preemptor.
    assert float(evicted[0]["time_s"]) == pytest.approx(5)
    assert float(rows["high"]["first_start_s"]) == pytest.approx(5)
    assert rows[evicted[0]["job_id"]]["preemptions"] == "1"
    assert control["api_writes"]["eviction"] == 1


def test_a_victim_that_ends_before_its_eviction_is_written_ends_as_it_would_have(tmp_path):
    # l0 and l1 run 3 s from their writes at 0 and 1: both end before the eviction goes at 5.
    short = [(j, t, 3 if q == "a" else d, q, c) for j, t, d, q, c in BEHIND]
    rows, control, events = _two_queues(tmp_path, [*short, ("high", 0.5, 10, "a", "high")], BUSY)
    assert not [e for e in events if e["event"] == "evict"]
    assert rows["l0"]["preemptions"] == rows["l1"]["preemptions"] == "0"
    assert rows["l0"]["status"] == rows["l1"]["status"] == "completed"
    # the write still went, and the cycles waited for it: the preemptor is admitted at 5, not at 3
    assert control["api_writes"]["eviction"] == 1
    assert float(rows["high"]["first_start_s"]) == pytest.approx(5)


@pytest.mark.parametrize(("flag", "message"), [
    ("foo", "expected 'kueue'"),
    ("kueue,api_qps=-1", "api_qps must be"),
    ("kueue,heads=2", "FIELD one of"),
    ("kueue,heads_per_queue=x", "a number for heads_per_queue"),
])
def test_bad_control_plane_values_are_one_line_errors(tmp_path, capsys, flag, message):
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--control-plane", flag, "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_model_needs_a_partition(tmp_path, capsys):
    assert main(["simulate", "--jobs", "10", "--control-plane", "kueue", "--no-plots", "--no-progress",
                 "--out", str(tmp_path / "o")]) == 2
    assert "needs --partition" in capsys.readouterr().err


@settings(max_examples=60, deadline=None)
@given(qps=st.floats(0.5, 100), burst=st.integers(1, 20), asks=st.lists(st.floats(0, 50), min_size=1, max_size=60))
def test_the_api_client_never_sends_faster_than_its_rate_nor_more_than_its_burst(qps, burst, asks):
    api = ApiClient(qps, burst)
    sent = [api.write(t, "x") for t in sorted(asks)]
    assert all(s >= t for s, t in zip(sent, sorted(asks), strict=True))
    assert sent == sorted(sent)  # in order
    for i in range(len(sent)):  # writes i..j, n of them, take at least (n - burst) / qps
        for j in range(i + burst, len(sent)):
            assert sent[j] - sent[i] >= (j - i + 1 - burst) / qps - 1e-6
    assert not math.isinf(api.tat)


def test_the_summary_says_what_pacing_did(tmp_path):
    import json

    _simulate(tmp_path, _partition(2), THREE, "--control-plane", "kueue,cycle_s=1,requeue_batch_s=0",
              "--preemption-cost", "restart")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    # j0 admitted in the cycle at 0, j1 at 1; j2 not admitted at 2 (its one Pending status) and
    # parked, then admitted in the cycle after j0's release: 3 admissions.
    assert summary["control_plane"]["api_writes"] == {"admission": 3, "pending": 1}
    assert summary["control_plane"]["heads_per_queue"] == 1
    assert summary["preemption_cost"] == "restart"


def test_a_paced_run_with_an_events_file_is_explained_by_replaying_it(tmp_path, capsys):
    # The events file records the run's options; explain --at replays them, the pacing included,
    # and says why: j1's quota fits at 0.5 s, but the next cycle is at 1 s.
    _simulate(tmp_path, _partition(2), THREE, "--control-plane", "kueue,cycle_s=1,requeue_batch_s=0",
              "--events", str(tmp_path / "events.csv"))
    capsys.readouterr()
    assert main(["explain", str(tmp_path / "out"), "j1", "--at", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "at 0.5 s: pending" in out  # (unpaced, it would run from 0)
    assert "waiting for a scheduling cycle" in out and "cycles at least 1 s apart" in out, out


def test_a_pending_status_is_written_from_the_cycle_and_the_next_cycle_waits_for_it(tmp_path):
    # One write a second, no burst, cycles 0.1 s apart, one head a cycle: a0's admission is written
    # at 0, a1's at 1; a2 does not fit a's quota of 2 in the cycle at 0.2, and its Pending status
    # takes the next slot, 2. Kueue writes it from the cycle (requeueAndUpdate waits for its
    # patch), so b0, arriving at 0.5 with b's quota free, is admitted by the cycle at 2, not at 0.5.
    jobs = [("a0", 0, 10, "a", "low"), ("a1", 0, 10, "a", "low"), ("a2", 0, 10, "a", "low"),
            ("b0", 0.5, 10, "b", "low")]
    rows, control, _ = _two_queues(tmp_path, jobs, "kueue,cycle_s=0.1,api_qps=1,api_burst=1,requeue_batch_s=0")
    assert control["api_writes"] == {"admission": 4, "pending": 1}
    assert float(rows["a1"]["first_start_s"]) == pytest.approx(0.1)
    assert float(rows["b0"]["first_start_s"]) == pytest.approx(2)
