"""The per-ClusterQueue report (issue 30: compare and sweep over partitions): its figures on a small
case computed by hand, ``--partition-set``, ``analysim compare --partitions`` and a sweep over a
partition field, with their one-line errors."""

from __future__ import annotations

import csv
import dataclasses
import html
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysim.core.cluster import ClusterSpec, NodeSpec
from analysim.core.job import JobRun, JobSpec
from analysim.core.plugins.kueue import KueueState
from analysim.core.queue_metrics import EVICTION_REASONS, QueueMeter, eviction_reasons
from analysim.errors import UserError
from analysim.partitions import assign_queues, load_partition
from analysim.report import cluster_queue_rows, cluster_queue_table
from analysim.simulation import RunOptions, run
from analysim.sweep.spec import SpecError, expand

ROOT = Path(__file__).resolve().parent.parent
PHILLY_YAML = ROOT / "examples" / "kueue" / "philly.yaml"

# One node of 8 GPUs, 16 cores and 256Gi.
NODE = ClusterSpec("one", (NodeSpec("n0", "r0", "V100", 8, 16_000, 256 * 1024),))


def _queues(flavor: str, cohort: str, queues: tuple[tuple[str, str, str], ...]) -> str:
    """A partition of one flavor over every node: per (name, covered resources, quotas) a
    ClusterQueue in ``cohort`` and its LocalQueue of the same name."""
    return f"""\
apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata: {{name: {flavor}}}
""" + "".join(f"""---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata: {{name: {q}}}
spec:
  cohort: {cohort}
  resourceGroups:
  - coveredResources: [{covered}]
    flavors:
    - name: {flavor}
      resources: [{quota}]
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: LocalQueue
metadata: {{name: {q}}}
spec: {{clusterQueue: {q}}}
""" for q, covered, quota in queues)


# ClusterQueues a and b of nominal 4 GPUs each in cohort ab, no limits.
TWO_QUEUES = _queues("gpu", "ab", tuple((q, "nvidia.com/gpu", "{name: nvidia.com/gpu, nominalQuota: 4}") for q in "ab"))
# j1: a, 6 GPUs at 0 for 100 s: admitted at once, borrowing 2 of b's idle 4.
# j2: b, 4 GPUs at 10 for 50 s: within b's nominal, but only 8 - 6 = 2 GPUs are left in the
#     cohort and nothing is preempted: waits until j1 ends at 100, ends at 150.
# j3: a, 2 GPUs at 20 for 30 s: the cohort's last 2 (a borrows 4), admitted at once, ends at 50.
JOBS = [JobSpec("j1", 0.0, 100.0, 6, vc="a"), JobSpec("j2", 10.0, 50.0, 4, vc="b"),
        JobSpec("j3", 20.0, 30.0, 2, vc="a")]


def _summary(tmp_path: Path, settings: tuple[str, ...] = ()) -> dict:
    path = tmp_path / "two.yaml"
    path.write_text(TWO_QUEUES)
    part, warnings = load_partition(str(path), NODE, settings)
    assert not warnings
    jobs, filtered = assign_queues(JOBS, part)
    assert not filtered
    return run(jobs, dataclasses.replace(NODE, partition=part), RunOptions()).summary


def test_per_cluster_queue_figures_by_hand(tmp_path):
    s = _summary(tmp_path)
    a, b = s["per_cluster_queue"]["a"], s["per_cluster_queue"]["b"]
    assert s["makespan_s"] == 150.0  # first event at 0, last end at 150
    # Admission wait: a's jobs start when they arrive; b's j2 waits 100 - 10 = 90 s.
    assert (a["avg_admission_wait_s"], a["p95_admission_wait_s"]) == (0.0, 0.0)
    assert (b["avg_admission_wait_s"], b["median_admission_wait_s"], b["p99_admission_wait_s"]) == (90.0, 90.0, 90.0)
    # JCT: a's 100 and 30 (mean 65; p95 by linear interpolation 30 + 0.95 * 70 = 96.5); b's 150 - 10 = 140.
    assert (a["avg_jct_s"], a["median_jct_s"], a["jobs_completed"]) == (65.0, 65.0, 2)
    assert a["p95_jct_s"] == pytest.approx(96.5)
    assert b["avg_jct_s"] == 140.0
    # Usage: a holds 6 x 100 + 2 x 30 = 660 GPU-s, 660 / 150 = 4.4 GPUs on average, 110 % of its 4;
    # b holds 4 x 50 = 200 GPU-s, 1.33 GPUs, a third of its 4.
    assert a["nominal_gpus"] == b["nominal_gpus"] == 4.0
    assert a["gpu_time_s"] == pytest.approx(660.0) and a["avg_gpus"] == pytest.approx(4.4)
    assert a["usage_of_nominal"] == pytest.approx(1.1)
    assert b["gpu_time_s"] == pytest.approx(200.0) and b["usage_of_nominal"] == pytest.approx(1 / 3)
    # Borrowing, past a's nominal 4: 2 GPUs over [0, 20), 6 + 2 - 4 = 4 over [20, 50), 2 over
    # [50, 100): 40 + 120 + 100 = 260 GPU-s, 260 / 150 = 1.73 GPUs on average; b never borrows.
    assert a["borrowed_gpu_time_s"] == pytest.approx(260.0)
    assert a["avg_borrowed_gpus"] == pytest.approx(260 / 150)
    assert b["borrowed_gpu_time_s"] == 0.0
    # No preemption under a partition yet: every Kueue reason at zero.
    assert a["evictions"] == dict.fromkeys(EVICTION_REASONS, 0) and a["evictions_total"] == 0
    assert (a["cohort"], a["local_queues"]) == ("ab", ["a"])
    # The run's own figures are over the same jobs: JCT (100 + 140 + 30) / 3 = 90.
    assert s["avg_jct_s"] == 90.0
    table = cluster_queue_table([("run", s)])
    assert table.splitlines()[2].split() == ["a", "2", "0.00", "0.00", "0.00", "0.02", "0.03", "4", "4.4", "110%",
                                             "1.7", "0/0/0/0"]


def test_a_borrowing_limit_set_on_the_command_line_changes_the_queue_s_wait(tmp_path):
    # borrowingLimit 2 on a: j1 takes 4 + 2 = 6; j3 would make a hold 8 > 4 + 2 and waits for j1
    # to end at 100, when it fits within a's nominal beside j2 (2 + 4 <= 8): waits 80 s.
    s = _summary(tmp_path, ("ClusterQueue/a/gpu/nvidia.com/gpu/borrowingLimit=2",))
    a, b = s["per_cluster_queue"]["a"], s["per_cluster_queue"]["b"]
    assert a["avg_admission_wait_s"] == 40.0  # (0 + 80) / 2
    assert b["avg_admission_wait_s"] == 90.0
    assert a["borrowed_gpu_time_s"] == pytest.approx(2 * 100)  # 2 over nominal while j1 runs
    # none: the limit removed again, as in the file.
    s = _summary(tmp_path, ("ClusterQueue/a/gpu/nvidia.com/gpu/borrowingLimit=2",
                            "ClusterQueue/a/gpu/nvidia.com/gpu/borrowingLimit=none"))
    assert s["per_cluster_queue"]["a"]["avg_admission_wait_s"] == 0.0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(1, 8), st.integers(0, 300), st.integers(1, 200)),
                min_size=1, max_size=25))
def test_queue_usage_is_its_jobs_work_and_borrowing_is_bounded(tmp_path, raw):
    # An outside oracle, the jobs themselves: with no preemption, on one node (no slowdown), a
    # queue holds each of its jobs' GPUs for exactly the job's duration, so its GPU-time is the
    # sum of GPUs x duration of its jobs, and the run's GPU-time the sum over queues. What it
    # borrows is at most what it holds, and at least what it holds past nominal x makespan.
    jobs = [JobSpec(f"j{i}", float(t), float(d), g, vc=q) for i, (q, g, t, d) in enumerate(raw)]
    path = tmp_path / "two.yaml"
    path.write_text(TWO_QUEUES)
    part, _ = load_partition(str(path), NODE)
    s = run(jobs, dataclasses.replace(NODE, partition=part), RunOptions()).summary
    makespan = s["makespan_s"]
    for name, q in s["per_cluster_queue"].items():
        work = sum(j.num_gpus * j.duration_s for j in jobs if j.vc == name)
        assert q["gpu_time_s"] == pytest.approx(work)
        assert q["jobs_completed"] == sum(j.vc == name for j in jobs)
        assert max(0.0, work - 4 * makespan) - 1e-6 <= q["borrowed_gpu_time_s"] <= work + 1e-6
    total = sum(q["gpu_time_s"] for q in s["per_cluster_queue"].values())
    assert total == pytest.approx(s["gpu_utilization"] * 8 * makespan)


# In cohort gc, ClusterQueue g with GPU, CPU and memory
# quota (4 GPUs, 8 cores, 64Gi) and the CPU-only c (8 cores, borrowing at most 2 more, and 128Gi).
GIB = 2**30
GPU_AND_CPU = _queues("any", "gc", (
    ("g", "nvidia.com/gpu, cpu, memory",
     "{name: nvidia.com/gpu, nominalQuota: 4}, {name: cpu, nominalQuota: 8}, {name: memory, nominalQuota: 64Gi}"),
    ("c", "cpu, memory", "{name: cpu, nominalQuota: 8, borrowingLimit: 2}, {name: memory, nominalQuota: 128Gi}")))


def _gpu_and_cpu_run(tmp_path: Path, jobs: list[JobSpec]) -> dict:
    path = tmp_path / "gc.yaml"
    path.write_text(GPU_AND_CPU)
    part, _ = load_partition(str(path), NODE)
    kept, filtered = assign_queues(jobs, part)
    assert not filtered
    return run(kept, dataclasses.replace(NODE, partition=part), RunOptions()).summary


def _cpu_job(job_id: str, submit: float, duration: float, cores: int, gib: int, gpus: int = 0) -> JobSpec:
    return JobSpec(job_id, submit, duration, gpus, gpu_milli=1000 if gpus else 0, cpu_milli=cores * 1000,
                   memory_mib=gib * 1024, vc="g" if gpus else "c")


def test_every_covered_resource_by_hand(tmp_path):
    # g's j1: 2 GPUs, 4 cores, 16Gi over [0, 100). c's j2: 10 cores (2 borrowed, its limit), 32Gi
    # over [0, 50); c's j3 at 20 asks 6 cores: c would hold 16, past its 8 + 2, and the node's 16
    # cores hold 14: waits for j2, runs [50, 100).
    s = _gpu_and_cpu_run(tmp_path, [_cpu_job("j1", 0, 100, 4, 16, gpus=2), _cpu_job("j2", 0, 50, 10, 32),
                                    _cpu_job("j3", 20, 50, 6, 8)])
    assert s["makespan_s"] == 100.0
    g, c = s["per_cluster_queue"]["g"], s["per_cluster_queue"]["c"]
    assert list(g["resources"]) == ["nvidia.com/gpu", "cpu", "memory"] and list(c["resources"]) == ["cpu", "memory"]
    # c's CPU in cores: 10 x 50 + 6 x 50 = 800 core-s, 8 cores on average, all of its nominal 8;
    # 10 at most; 2 past nominal over [0, 50): 100 core-s, 1 core on average.
    assert c["resources"]["cpu"] == {
        "unit": "core", "flavors": ["any"], "borrowing_limit": 2.0, "lending_limit": None, "nominal": 8.0,
        "usage_time_s": 800.0, "avg_usage": 8.0, "peak_usage": 10.0, "usage_of_nominal": 1.0,
        "borrowed_time_s": 100.0, "avg_borrowed": 1.0}
    # c's memory in bytes: 32Gi x 50 + 8Gi x 50 = 2000 GiB-s, 20Gi on average, of 128Gi; never past it.
    mem = c["resources"]["memory"]
    assert (mem["unit"], mem["nominal"], mem["usage_time_s"], mem["avg_usage"], mem["peak_usage"]) == (
        "byte", 128.0 * GIB, 2000.0 * GIB, 20.0 * GIB, 32.0 * GIB)
    assert mem["usage_of_nominal"] == pytest.approx(20 / 128) and mem["borrowed_time_s"] == 0.0
    assert mem["borrowing_limit"] is None
    # No GPU quota: the GPU keys at 0, as before.
    assert (c["nominal_gpus"], c["gpu_time_s"], c["avg_gpus"], c["usage_of_nominal"]) == (0.0, 0.0, 0.0, None)
    # g: its GPU keys are its GPU resource's figures; its CPU 4 x 100 core-s, half its nominal.
    gpu = g["resources"]["nvidia.com/gpu"]
    assert (g["nominal_gpus"], g["gpu_time_s"], g["avg_gpus"], g["usage_of_nominal"]) == (4.0, 200.0, 2.0, 0.5)
    assert (gpu["nominal"], gpu["usage_time_s"], gpu["peak_usage"], gpu["unit"]) == (4.0, 200.0, 2.0, "GPU")
    assert (g["resources"]["cpu"]["usage_time_s"], g["resources"]["cpu"]["usage_of_nominal"]) == (400.0, 0.5)
    assert g["resources"]["memory"]["peak_usage"] == 16.0 * GIB
    # The table: g's quota columns are its GPUs; c's, having none, its CPU, in cores.
    lines = {line.split()[0]: line.split() for line in cluster_queue_table([("run", s)]).splitlines()[2:]}
    assert lines["g"][7:11] == ["4", "2.0", "50%", "0.0"]
    assert lines["c"][7:11] == ["8cpu", "8.0cpu", "100%", "1.0cpu"]
    # cluster_queues.csv: every resource's figures, a column each, empty for a queue without it.
    rows = {r["cluster_queue"]: r for r in cluster_queue_rows([("run", s)])}
    assert list(rows["g"]) == list(rows["c"])
    assert (rows["c"]["cpu_avg_usage"], rows["c"]["cpu_flavors"], rows["c"]["nvidia.com/gpu_nominal"]) == (8.0, "any", None)
    assert rows["g"]["memory_peak_usage"] == 16.0 * GIB


def test_a_memory_only_queue_shows_its_memory_in_the_table():
    q = {"nominal_gpus": 0.0, "avg_gpus": 0.0, "usage_of_nominal": None, "avg_borrowed_gpus": 0.0,
         "resources": {"memory": {"nominal": 64.0 * GIB, "avg_usage": 16.0 * GIB, "usage_of_nominal": 0.25,
                                  "avg_borrowed": 0.0}}}
    line = cluster_queue_table([("run", {"per_cluster_queue": {"m": q}})]).splitlines()[2].split()
    assert line[7:11] == ["64Gi", "16.0Gi", "25%", "0.0Gi"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 10), st.integers(1, 32), st.integers(0, 300),
                          st.integers(1, 200)), min_size=1, max_size=20))
def test_every_resource_s_usage_is_its_jobs_requests_times_their_durations(tmp_path, raw):
    # The outside oracle of the GPU test above, for every resource: on one node, without
    # preemption, a queue holds each job's requests for exactly the job's duration; and it never
    # holds more at once than its nominal quota plus what it may borrow.
    jobs = [_cpu_job(f"j{i}", t, d, cores, gib, gpus) for i, (gpus, cores, gib, t, d) in enumerate(raw)]
    s = _gpu_and_cpu_run(tmp_path, jobs)
    units = {"nvidia.com/gpu": lambda j: j.num_gpus, "cpu": lambda j: j.cpu_milli / 1000,
             "memory": lambda j: j.memory_mib * 2**20}
    for name, q in s["per_cluster_queue"].items():
        ours = [j for j in jobs if j.vc == name]
        for resource, r in q["resources"].items():
            ask = units[resource]
            assert r["usage_time_s"] == pytest.approx(sum(ask(j) * j.duration_s for j in ours))
            assert max((ask(j) for j in ours), default=0) <= r["peak_usage"]
            if r["borrowing_limit"] is not None:
                assert r["peak_usage"] <= r["nominal"] + r["borrowing_limit"]
            assert r["borrowed_time_s"] <= r["usage_time_s"] + 1e-6


@pytest.mark.parametrize("setting, message", [
    ("ClusterQueue/c/gpu/nvidia.com/gpu/borrowingLimit=2", "has no ClusterQueue 'c'; it has a, b"),
    ("Cohort/a/gpu/nvidia.com/gpu/borrowingLimit=2", "has no Cohort 'a'; it has ab"),
    ("ClusterQueue/a/v100/nvidia.com/gpu/borrowingLimit=2", "no quota of flavor 'v100' and resource 'nvidia.com/gpu'; it has gpu/nvidia.com/gpu"),
    ("ClusterQueue/a/gpu/cpu/borrowingLimit=2", "no quota of flavor 'gpu' and resource 'cpu'"),
    ("ClusterQueue/a/gpu/nvidia.com/gpu/borrowLimit=2", "'borrowLimit' is not a quota field; known: nominalQuota, borrowingLimit, lendingLimit"),
    ("LocalQueue/a/gpu/nvidia.com/gpu/borrowingLimit=2", "'LocalQueue' is not a kind with quotas"),
    ("ClusterQueue/a/borrowingLimit=2", "expected KIND/NAME/FLAVOR/RESOURCE/FIELD"),
    ("ClusterQueue/a/gpu/nvidia.com/gpu/borrowingLimit", "expected KIND/NAME/FLAVOR/RESOURCE/FIELD=VALUE"),
    ("ClusterQueue/a/gpu/nvidia.com/gpu/borrowingLimit=lots", "expected a quantity (e.g. 8, 500m, 36Gi), got 'lots'"),
    ("ClusterQueue/a/gpu/nvidia.com/gpu/lendingLimit=5", "would lend more than its nominalQuota (5000 > 4000"),
    ("ClusterQueue/a/gpu/nvidia.com/gpu/nominalQuota=none", "a nominalQuota is a quantity"),
])
def test_a_setting_that_names_nothing_is_one_error(tmp_path, setting, message):
    with pytest.raises(UserError) as e:
        _summary(tmp_path, (setting,))
    assert str(e.value).startswith(f"--partition-set {setting.split('=')[0]}")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_evictions_are_read_by_reason_per_cluster_queue(tmp_path):
    # Kueue's preemption records each eviction's reason with the state; an eviction it did not
    # record counts as Unknown, in its queue's column.
    path = tmp_path / "two.yaml"
    path.write_text(TWO_QUEUES)
    part, _ = load_partition(str(path), NODE)
    state = KueueState(part, ["n0"])
    meter = QueueMeter(state)
    job = JobRun(JOBS[1], 0, preemptions=3)
    state.record_eviction(job, 0, "InCohortReclamation")
    state.record_eviction(job, 0, "InCohortReclamation")
    assert eviction_reasons(job, state) == {"InCohortReclamation": 2, "Unknown": 1}
    assert eviction_reasons(JobRun(JOBS[1], 0, preemptions=2)) == {"Unknown": 2}
    meter.job_ended(job)
    meter.job_ended(JobRun(JOBS[0], 1))
    assert meter.evictions == [{}, {"InCohortReclamation": 2, "Unknown": 1}]  # a, b
    assert job.job_id not in state.reasons  # (read once, when it ends)


# --- the command line ------------------------------------------------------------------------------


def analysim(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analysim", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_compare_over_two_partition_files_and_a_bad_one(tmp_path):
    capped = tmp_path / "capped.yaml"
    capped.write_text(PHILLY_YAML.read_text().replace("        nominalQuota: 131\n",
                                                      "        nominalQuota: 131\n        borrowingLimit: 0\n"))
    common = ["--jobs", "300", "--cluster", "philly", "--no-progress", "--workers", "2"]
    r = analysim("compare", *common, "--partitions", f"{PHILLY_YAML},{capped}", "--out", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    runs = json.loads((out / "compare.json").read_text())["runs"]
    assert list(runs) == ["philly", "capped"]
    queues = list(csv.DictReader((out / "cluster_queues.csv").open()))
    assert len(queues) == 2 * 15 and {q["run"] for q in queues} == {"philly", "capped"}
    ee = {q["run"]: q for q in queues if q["cluster_queue"] == "ee9e8c"}
    assert float(ee["capped"]["borrowed_gpu_time_s"]) == 0.0  # borrowingLimit 0: never past its 131
    assert ee["philly"]["preempted_InCohortReclamation"] == "0"
    for name, q in runs["capped"]["per_cluster_queue"].items():  # the table shows the JSON's figures
        line = next(x for x in r.stdout.splitlines() if x.split()[:2] == [name, "capped"])
        assert line.split()[2] == str(q["jobs_completed"])
    assert (out / "cluster_queues.png").stat().st_size > 10_000
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: kueue.x-k8s.io/v1beta1\nkind: ClusterQueue\nmetadata: {name: q}\nspec: {cohrt: x}\n")
    r = analysim("compare", *common, "--partitions", f"{PHILLY_YAML},{bad}", "--out", "out2", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert f"{bad}, line 4: document 1 (ClusterQueue 'q'): spec.cohrt: unknown field" in r.stderr
    assert not (tmp_path / "out2").exists()  # refused before any run
    r = analysim("compare", *common, "--partitions", f"{PHILLY_YAML},{PHILLY_YAML}", cwd=tmp_path)
    assert r.returncode == 2 and "--partitions: a file is named twice" in r.stderr


def test_sweep_over_a_borrowing_limit_end_to_end(tmp_path):
    (tmp_path / "two.yaml").write_text(TWO_QUEUES)
    (tmp_path / "trace.csv").write_text("job_id,submit_s,duration_s,num_gpus,vc\nj1,0,100,6,a\nj2,10,50,4,b\nj3,20,30,2,a\n")
    spec = textwrap.dedent("""\
        trace: trace.csv
        cluster: 1x8
        partition: two.yaml
        partition_set:
          ClusterQueue/a/gpu/nvidia.com/gpu/borrowingLimit: [null, 2]
        """)
    (tmp_path / "s.yaml").write_text(spec)
    r = analysim("sweep", "s.yaml", "--out", "out", "--workers", "2", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = {q["label"]: q for q in csv.DictReader((tmp_path / "out" / "results.csv").open())}
    key = "ClusterQueue/a/gpu/nvidia.com/gpu/borrowingLimit"
    assert set(rows) == {f"{key}=default", f"{key}=2"}
    queues = {(q["run"], q["cluster_queue"]): q for q in csv.DictReader((tmp_path / "out" / "cluster_queues.csv").open())}
    assert float(queues[f"{key}=default", "a"]["avg_admission_wait_s"]) == 0.0  # the hand-computed case above
    assert float(queues[f"{key}=2", "a"]["avg_admission_wait_s"]) == 40.0
    assert float(queues[f"{key}=2", "b"]["avg_admission_wait_s"]) == 90.0
    assert f"a             {key}=2" in r.stdout  # the per-ClusterQueue table
    r = analysim("report", "out", cwd=tmp_path)  # and in the sweep's HTML report
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<h2>Per ClusterQueue</h2>" in page and html.escape(f"a             {key}=2") in page
    groups = list(csv.DictReader((tmp_path / "out" / "aggregate.csv").open()))
    assert sorted(g[key] for g in groups) == ["", "2"]  # one group per value of the axis
    # A path that names nothing: one line, before any cell runs.
    (tmp_path / "bad.yaml").write_text(spec.replace("ClusterQueue/a/", "ClusterQueue/team-a/"))
    r = analysim("sweep", "bad.yaml", "--out", "out3", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert ("bad.yaml: partition: --partition-set ClusterQueue/team-a/gpu/nvidia.com/gpu/borrowingLimit: "
            "two.yaml has no ClusterQueue 'team-a'; it has a, b") in r.stderr
    assert not (tmp_path / "out3" / "cells").exists()


def test_a_partition_set_key_that_is_not_a_field_path_is_a_spec_error():
    with pytest.raises(SpecError, match=r"SPEC: partition_set: ClusterQueue/a/borrowingLimit: expected"):
        expand({"partition": "x.yaml", "partition_set": {"ClusterQueue/a/borrowingLimit": [0, 1]}})
    sweep = expand({"jobs": 10, "partition": "x.yaml",
                    "partition_set": {"ClusterQueue/a/gpu/nvidia.com/gpu/borrowingLimit": [0, "none"]}})
    assert [c.args.partition_set for c in sweep.cells] == [["ClusterQueue/a/gpu/nvidia.com/gpu/borrowingLimit=0"],
                                                           ["ClusterQueue/a/gpu/nvidia.com/gpu/borrowingLimit=none"]]
