"""``analysim kueue-perf``: Kueue's performance scenarios read as its generator creates them, the
recorder's figures of a replay computed by hand on a tiny scenario, real Kueue's recorded averages
read from its rangespec's comments, and both upstream scenarios end to end."""

from __future__ import annotations

import csv
import json
import re
from itertools import pairwise
from pathlib import Path

import pytest
import yaml

from analysim.cli import main
from analysim.errors import UserError
from analysim.kueue_perf import read_generator, read_rangespec

REFERENCE = Path(__file__).resolve().parent.parent.parent / "shared" / "reference" / "kueue"

TINY = """
cohorts:
  - className: co
    count: 1
    queuesSets:
    - className: cq
      count: 2
      nominalQuota: 4
      borrowingLimit: 0
      reclaimWithinCohort: Never
      withinClusterQueue: Never
      workloadsSets:
      - count: 2
        creationIntervalMs: 1000
        workloads:
        - {className: big, runtimeMs: 3000, priority: 10, request: 4}
      - count: 1
        creationIntervalMs: 500
        workloads:
        - {className: small, runtimeMs: 500, priority: 5, request: "1"}
"""


def test_the_generator_s_objects_and_creation_times(tmp_path):
    (tmp_path / "g.yaml").write_text(TINY)
    s = read_generator(tmp_path / "g.yaml")
    assert sorted(s.nominal) == ["cq-0-0-co-0", "cq-0-1-co-0"]
    mine = [(w.name, w.created_s, w.runtime_s, w.request, w.priority) for w in s.workloads if w.queue == "cq-0-0-co-0"]
    # each set sleeps its interval before each creation; the sets of a queue run side by side
    assert mine == [("small-1-0-0", 0.5, 0.5, 1, 5), ("big-0-0-0", 1.0, 3.0, 4, 10), ("big-0-1-0", 2.0, 3.0, 4, 10)]
    docs = list(yaml.safe_load_all(s.partition_yaml))
    assert [d["kind"] for d in docs].count("ClusterQueue") == 2
    assert {d["metadata"]["name"]: d["value"] for d in docs if d["kind"] == "WorkloadPriorityClass"} == {"p5": 5, "p10": 10}


# 30 queues, each creating 100 workloads a millisecond apart: 30,000 creates a second asked for,
# where the runner's client allows 1,000 a second after a burst of 2,000.
CROWD = """
cohorts:
  - className: co
    count: 1
    queuesSets:
    - className: cq
      count: 30
      nominalQuota: 100
      workloadsSets:
      - count: 100
        creationIntervalMs: 1
        workloads:
        - {className: w, runtimeMs: 10, priority: 1, request: 1}
"""


def test_creates_past_the_runner_s_rate_are_created_later(tmp_path):
    (tmp_path / "g.yaml").write_text(CROWD)
    s = read_generator(tmp_path / "g.yaml")
    times = sorted(w.created_s for w in s.workloads)
    # Until about 0.069 s every ask goes at once (30 a millisecond from 0.001, against the burst's
    # 2,000 and 1,000 a second: 2,068 by then); the rest follow one a millisecond, the last at
    # about 1.0 s, where unpaced it would be at 0.1 s.
    assert times[-1] == pytest.approx(1.0, abs=0.005)
    assert sum(t <= 0.069 for t in times) == pytest.approx(2068, abs=3)
    for i in range(0, len(times), 97):  # never more than the burst plus the rate over any span
        for j in range(i + 1, len(times), 89):
            assert j - i + 1 <= 2000 + 1000 * (times[j] - times[i]) + 1e-6
    for q in {w.queue for w in s.workloads}:  # each queue's goroutine: in order, an interval apart at least
        mine = sorted((int(w.name.split("-")[2]), w.created_s) for w in s.workloads if w.queue == q)
        assert all(b[1] - a[1] >= 0.001 - 1e-9 for a, b in pairwise(mine))


def test_the_recorder_s_figures_of_a_tiny_replay(tmp_path, capsys):
    (tmp_path / "g.yaml").write_text(TINY)
    assert main(["kueue-perf", str(tmp_path / "g.yaml"), "--out", str(tmp_path / "out")]) == 0
    s = yaml.safe_load((tmp_path / "out" / "summary.yaml").read_text())
    # Per queue: small at 0.5 runs to 1.0; big-0 at 1.0 waits for it (4 of 4), runs 1.0-4.0;
    # big-1 created at 2.0 waits until 4.0. Time to admission: small 0, big (0 + 2000) / 2.
    assert s["workloadClasses"]["small"]["averageTimeToAdmissionMs"] == 0
    assert s["workloadClasses"]["big"]["averageTimeToAdmissionMs"] == 1000
    assert s["wallMs"] == 7000
    # usage per queue: 1 × 0.5 s + 4 × 6 s = 24.5 core-seconds of 4 cores over 7 s
    cq = s["clusterQueueClasses"]["cq"]
    assert cq["usagePercent"] == pytest.approx(100 * 2 * 24.5 / (8 * 7))
    assert "time to admission, big (ms)" in capsys.readouterr().out
    assert not (tmp_path / "out" / "events.csv").exists()  # (only with --events)


@pytest.mark.parametrize(("text", "message"), [
    ("cohorts: []", "cohorts: expected a non-empty list"),
    ("topology: {levels: [a]}\ncohorts: [{}]", "topology: not supported"),
    ("cohorts: [{className: c, count: -1, queuesSets: []}]", "cohorts[0].count: expected an integer >= 1"),
    ("cohorts: [{className: c, count: 1, queuesSets: [{className: q, count: 1, nominalQuota: 500m}]}]",
     "nominalQuota: expected a whole number of cores"),
    ("cohorts: [{className: c, count: 1, colour: red}]", "unknown field 'colour'"),
])
def test_bad_generators_are_one_line_errors(tmp_path, text, message):
    (tmp_path / "g.yaml").write_text(text)
    with pytest.raises(UserError, match=re.escape(message)):
        read_generator(tmp_path / "g.yaml")


needs_reference = pytest.mark.skipif(not REFERENCE.is_dir(), reason="../shared/reference/kueue is not there")


@needs_reference
def test_real_kueue_s_recorded_averages_are_read_from_the_rangespec_comments():
    base = read_rangespec(REFERENCE / "baseline" / "rangespec.yaml")
    assert base["wall"] == (425_000, 351116.4)
    assert base["usage"] == {"cq": (50.0, 55.9)}
    assert base["admission"] == {"large": (23_000, 16501), "medium": (90_000, 76768), "small": (260_000, 215468)}
    large = read_rangespec(REFERENCE / "large-scale" / "rangespec.yaml")
    assert large["wall"] == (1_416_000, 1179411)
    assert large["usage"] == {"cq": (31.6, 38.64)}
    assert large["admission"]["small"] == (841_000, 700379)


@needs_reference
def test_the_baseline_scenario_end_to_end(tmp_path):
    out = tmp_path / "base"
    assert main(["kueue-perf", str(REFERENCE / "baseline" / "generator.yaml"), "--rangespec",
                 str(REFERENCE / "baseline" / "rangespec.yaml"), "--events", "--out", str(out)]) == 0
    report = json.loads((out / "kueue-perf.json").read_text())
    classes = report["summary"]["workloadClasses"]
    assert {c: e["count"] for c, e in classes.items()} == {"large": 1500, "medium": 3000, "small": 10500}
    with open(out / "run" / "jobs.csv") as f:
        assert sum(1 for line in f if ",completed," in line) == 15_000
    # The recorder followed the run's decisions; the events file wrote them: from the file and the
    # trace, each class's mean time from creation to last admission, and the run's last event.
    with open(out / "trace.csv", newline="") as f:
        created = {r["job_id"]: float(r["submit_s"]) for r in csv.DictReader(f)}
    with open(out / "events.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    admitted = {r["job_id"]: float(r["time_s"]) for r in rows if r["event"] == "admit"}
    waits: dict[str, list[float]] = {}
    for job, t in admitted.items():
        waits.setdefault(job.split("/")[1].split("-")[0], []).append(t - created[job])
    assert {c: round(1000 * sum(w) / len(w)) for c, w in waits.items()} == {
        c: e["averageTimeToAdmissionMs"] for c, e in classes.items()}
    assert report["summary"]["wallMs"] == round(1000 * max(float(r["time_s"]) for r in rows))
    assert {r["figure"] for r in report["comparison"]} >= {"wall (ms)", "ClusterQueue usage, cq (%)"}


@needs_reference
def test_the_baseline_under_kueue_s_control_plane_lands_near_real_kueue_s_recorded_figures(tmp_path):
    # An outside oracle: the averages real Kueue recorded (rangespec.yaml's comments), against the
    # control-plane model with Kueue's defaults (docs/kueue.md's table). Within 25 % for the medium
    # and small classes' time to admission and the wall, 10 points for the usage; the large class
    # is not matched yet (the table says so).
    out = tmp_path / "paced"
    assert main(["kueue-perf", str(REFERENCE / "baseline" / "generator.yaml"), "--rangespec",
                 str(REFERENCE / "baseline" / "rangespec.yaml"), "--control-plane", "kueue", "--out", str(out)]) == 0
    rows = {r["figure"]: r for r in json.loads((out / "kueue-perf.json").read_text())["comparison"]}
    for figure in ("time to admission, medium (ms)", "time to admission, small (ms)", "wall (ms)"):
        assert abs(rows[figure]["difference"]) <= 0.25, rows[figure]
    assert abs(rows["ClusterQueue usage, cq (%)"]["difference"]) <= 10, rows["ClusterQueue usage, cq (%)"]
