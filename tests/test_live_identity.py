"""Lockstep identity: a live replay (scheduler + 2 agent processes, 16 nodes) gives exactly the
per-job start and end times of ``analysim simulate`` on the same trace, cluster, policy and
seed — jobs.csv and the events file byte for byte — with preemption and migration too. Also:
the Prometheus metrics of both kinds of process, health checking and reflection."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysim.cli import main as analysim
from analysim.clusters import parse_cluster
from analysim.core.job import JobSpec
from analysim.traces import Trace, write_canonical
from scheduler_svc.kueue_metrics import PREEMPTION_REASONS
from scheduler_svc.launcher import ROOT
from tests.polling import scaled
from tests.reflection import reflected_file_package, reflected_services
from tests.test_live_helpers import live, sample_sum, scrape

DEMO_PARTITION = ROOT / "examples" / "kueue" / "demo.yaml"

CASES = {
    "fifo": ("16x8", ["--jobs", "300", "--seed", "3"]),
    "tiresias-preempt-migrate": ("16x4", ["--jobs", "300", "--seed", "3", "--policy", "tiresias", "--preemption",
                                          "--migration"]),
    "srtf-fgd-preempt": ("16x2", ["--jobs", "300", "--seed", "2", "--policy", "srtf", "--placement", "fgd",
                                  "--preemption"]),
    # Under a Kueue partition (the demo cluster's two-level cohort tree), loaded enough that jobs wait.
    "kueue-partition": ("demo", ["--jobs", "300", "--seed", "3", "--rate-scale", "4", "--partition", str(DEMO_PARTITION)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_lockstep_replay_matches_offline_simulation(case: str, tmp_path: Path) -> None:
    cluster, args = CASES[case]
    live_out, offline_out = tmp_path / "live", tmp_path / "offline"
    assert analysim(["simulate", *args, "--cluster", cluster, "--out", str(offline_out), "--no-plots",
                     "--no-progress", "--events", str(offline_out / "events.csv")]) == 0
    with live(tmp_path, [*args, "--out", str(live_out), "--events", str(live_out / "events.csv")], cluster, nodes=16,
              agents=2) as (run, client):
        summary = client.wait_done(120)
        sched = scrape(run.scheduler.info["host"], run.scheduler.info["metrics"])
        agent = scrape(run.agents[1].info["host"], run.agents[1].info["metrics"])
    offline = (offline_out / "jobs.csv").read_text()
    assert (live_out / "jobs.csv").read_text() == offline
    # Every decision too, in the order made, with its flavors, borrowing, preemptor and reason.
    events = (offline_out / "events.csv").read_text()
    assert (live_out / "events.csv").read_text() == events
    assert events.count(",admit,") >= 300 and events.count(",complete,") == 300
    assert summary["jobs_completed"] == summary["jobs_total"] == 300
    assert summary["fidelity"]["identical_jobs"] == 300
    assert summary["fidelity"]["max_abs_delta_jct_s"] == 0.0
    assert summary["live"]["diverged_from_offline"] is None  # no agent lost: nothing says it diverged
    if "preempt" in case:
        assert summary["preemptions"] > 0  # the case exercises what it claims to
    if "migrate" in case:
        assert summary["migrations"] > 0

    # Scheduler metrics agree with the run.
    assert sample_sum(sched["analysim_jobs_completed"], "analysim_jobs_completed_total") == 300
    assert sample_sum(sched["analysim_jobs_submitted"], "analysim_jobs_submitted_total", source="trace") == 300
    assert sample_sum(sched["analysim_jobs_preempted"], "analysim_jobs_preempted_total") == summary["preemptions"]
    assert sample_sum(sched["analysim_job_completion_time_seconds"], "analysim_job_completion_time_seconds_count") == 300
    assert sample_sum(sched["analysim_scheduler_decision_latency_seconds"],
                      "analysim_scheduler_decision_latency_seconds_count") > 0
    gpus = parse_cluster(cluster).total_gpus
    assert sample_sum(sched["analysim_cluster_gpus"], "analysim_cluster_gpus") == gpus
    assert sample_sum(sched["analysim_free_gpus"], "analysim_free_gpus") == gpus  # all done: all free
    assert sample_sum(sched["analysim_virtual_time_seconds"], "analysim_virtual_time_seconds") > 0
    assert sample_sum(sched["analysim_stream_messages"], "analysim_stream_messages_total", direction="sent") > 0
    # Agent 1 holds nodes 8..15: per-GPU gauges, idle at the end.
    util = [s for s in agent["analysim_gpu_utilization_ratio"]]
    assert len(util) == 8 * (gpus // 16)
    assert {s.labels["node"] for s in util} == {f"node-{i:04d}" for i in range(8, 16)}
    assert all(s.value == 0.0 for s in util)
    mem = {(s.labels["node"], s.labels["gpu"]): s.value for s in agent["analysim_gpu_memory_used_bytes"]}
    total = {(s.labels["node"], s.labels["gpu"]): s.value for s in agent["analysim_gpu_memory_total_bytes"]}
    assert all(0 <= mem[k] <= total[k] for k in total)
    if "kueue" in case:
        assert_kueue_metrics_at_the_end(sched, offline_out / "jobs.csv")


def assert_kueue_metrics_at_the_end(sched: dict[str, list], jobs_csv: Path) -> None:
    """Kueue's metrics of a finished replay under examples/kueue/demo.yaml, against outside oracles:
    the YAML's own numbers (read here with a plain YAML parser) and the offline run's jobs.csv."""
    docs = [d for d in yaml.safe_load_all(DEMO_PARTITION.read_text()) if d]
    cqs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterQueue"}
    assert len(cqs) == 15

    def per_queue(family: str, name: str, **labels: str) -> dict[str, float]:
        return {s.labels["cluster_queue"]: s.value for s in sched[family]
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())}

    # Quotas as the file gives them, in Kubernetes' units (GPUs, cores, bytes), with each queue's cohort.
    for family in ("kueue_cluster_queue_nominal_quota", "kueue_cluster_queue_borrowing_limit",
                   "kueue_cluster_queue_lending_limit"):
        field = {"nominal": "nominalQuota", "borrowing": "borrowingLimit", "lending": "lendingLimit"}[family.split("_")[3]]
        got = {(s.labels["cohort"], s.labels["cluster_queue"], s.labels["flavor"], s.labels["resource"]): s.value
               for s in sched[family]}
        want = {}
        for name, d in cqs.items():
            for r in d["spec"]["resourceGroups"][0]["flavors"][0]["resources"]:
                v = r.get(field)
                v = math.inf if v is None else float(str(v).removesuffix("Gi")) * (2**30 if str(v).endswith("Gi") else 1)
                want[(d["spec"]["cohort"], name, "v100", r["name"])] = v
        assert got == want, family
    assert per_queue("kueue_cluster_queue_nominal_quota", "kueue_cluster_queue_nominal_quota", resource="nvidia.com/gpu")["ee9e8c"] == 31
    # One admission per job (no preemption under a partition yet), per ClusterQueue as the offline run has them.
    with jobs_csv.open() as f:
        rows = list(csv.DictReader(f))
    by_vc = Counter(r["vc"] for r in rows)
    admitted = per_queue("kueue_admitted_workloads", "kueue_admitted_workloads_total", priority_class="")
    assert admitted == {q: float(by_vc[q]) for q in cqs} and sum(admitted.values()) == 300
    waits = per_queue("kueue_admission_wait_time_seconds", "kueue_admission_wait_time_seconds_sum")
    for q in cqs:
        assert waits[q] == pytest.approx(sum(float(r["first_start_s"]) - float(r["submit_s"]) for r in rows if r["vc"] == q))
    assert sum(waits.values()) > 0  # the case is loaded enough that jobs wait
    inf = per_queue("kueue_admission_wait_time_seconds", "kueue_admission_wait_time_seconds_bucket", le="+Inf")
    assert inf == admitted
    # All done: nothing pending, running or used; every eviction and preemption counter there, at 0.
    assert set(per_queue("kueue_pending_workloads", "kueue_pending_workloads", status="active").values()) == {0.0}
    assert set(per_queue("kueue_pending_workloads", "kueue_pending_workloads", status="inadmissible").values()) == {0.0}
    assert {s.value for s in sched["kueue_cluster_queue_resource_usage"]} == {0.0}
    assert set(per_queue("kueue_admitted_active_workloads", "kueue_admitted_active_workloads").values()) == {0.0}
    for reason in ("Preempted", "NodeFailures"):
        assert per_queue("kueue_evicted_workloads", "kueue_evicted_workloads_total", reason=reason) == dict.fromkeys(cqs, 0.0)
    assert {(s.labels["preempting_cluster_queue"], s.labels["reason"]) for s in sched["kueue_preempted_workloads"]
            if s.name == "kueue_preempted_workloads_total"} == {(q, r) for q in cqs for r in PREEMPTION_REASONS}


def test_health_and_reflection(tmp_path: Path) -> None:
    with live(tmp_path, ["--jobs", "0"], "2x8", nodes=2, agents=0) as (run, _), grpc.insecure_channel(run.target) as ch:
        h = health_pb2_grpc.HealthStub(ch)
        for svc in ("", "analysim.v1.SchedulerService", "analysim.v1.AgentService"):
            assert h.Check(health_pb2.HealthCheckRequest(service=svc), timeout=scaled(5)).status == \
                health_pb2.HealthCheckResponse.SERVING
        # Both reflection versions, with no metadata at all (as grpcurl sends): the schema is public.
        for version in ("v1", "v1alpha"):
            names = reflected_services(ch, version)
            assert {"analysim.v1.SchedulerService", "analysim.v1.AgentService", "grpc.health.v1.Health",
                    "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"} <= names
            assert reflected_file_package(ch, version, "grpc.reflection.v1.ServerReflection") == "grpc.reflection.v1"


def test_analysim_up_end_to_end(tmp_path: Path) -> None:
    """The `make demo` path: `analysim up` as a user runs it, with --out, against `simulate`."""
    out, ref = tmp_path / "up", tmp_path / "sim"
    args = ["--jobs", "150", "--seed", "7", "--cluster", "16x4"]
    p = subprocess.run([sys.executable, "-m", "analysim", "up", *args, "--out", str(out), "--no-progress",
                        "--workdir", str(tmp_path / "w")], cwd=ROOT, capture_output=True, text=True, timeout=scaled(120))
    assert p.returncode == 0, p.stderr
    assert "scheduler  grpc 127.0.0.1:" in p.stdout and "/metrics" in p.stdout
    assert "accounted for: 150 completed, 0 failed, 0 cancelled of 150 jobs" in p.stdout
    assert "150/150 jobs with identical start and end" in p.stdout
    assert analysim(["simulate", *args, "--out", str(ref), "--no-plots", "--no-progress"]) == 0
    assert (out / "jobs.csv").read_text() == (ref / "jobs.csv").read_text()
    # Everything it started is gone: no process still holds the port files' pids.
    for f in (tmp_path / "w").glob("*.json"):
        pid = json.loads(f.read_text())["pid"]
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"process {pid} ({f.name}) still running after analysim up returned")


@st.composite
def small_config(draw):
    """A small cluster (4 nodes x 4 GPUs, maybe two VCs with quotas, borrowing on or off), a trace
    of whole and fractional GPU jobs, and a policy, placement and mechanisms."""
    quotas = draw(st.booleans())
    cluster = {"name": "p", "nodes": [{"count": 4, "gpus": 4, "rack_size": 2}]}
    if quotas:
        cluster |= {"vcs": [{"name": "a", "quota_gpus": 8}, {"name": "b", "quota_gpus": 8}],
                    "allow_borrowing": draw(st.booleans())}
    jobs = []
    for i in range(draw(st.integers(5, 25))):
        frac = draw(st.integers(0, 3)) == 0
        jobs.append(JobSpec(f"j{i}", float(draw(st.integers(0, 600))), float(draw(st.integers(10, 900))),
                            1 if frac else draw(st.sampled_from([1, 2, 4, 8])),
                            gpu_milli=draw(st.sampled_from([250, 500])) if frac else 1000,
                            vc=draw(st.sampled_from(["a", "b"])) if quotas else "default"))
    policy = draw(st.sampled_from(["fifo", "fifo-backfill", "sjf", "srtf", "tiresias", "qssf", "fair"]))
    args = ["--policy", policy, "--placement", draw(st.sampled_from(["consolidate", "spread", "fgd", "random"]))]
    args += [flag for flag in ("--preemption", "--migration") if draw(st.booleans())]
    return cluster, jobs, args


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(small_config())
def test_live_equals_offline_on_small_random_configurations(tmp_path_factory, config):
    """Live (scheduler + 2 agent processes) and offline give the same jobs.csv, byte for byte,
    over policies x placements x mechanisms x fractional GPUs x quotas."""
    cluster, jobs, args = config
    tmp = tmp_path_factory.mktemp("live-prop")
    (tmp / "cluster.json").write_text(json.dumps(cluster))
    write_canonical(Trace(jobs=jobs, source="prop", format="canonical", filtered={}), tmp / "trace.csv")
    run_args = ["--trace", str(tmp / "trace.csv"), *args]
    spec = str(tmp / "cluster.json")
    assert analysim(["simulate", *run_args, "--cluster", spec, "--out", str(tmp / "offline"), "--no-plots",
                     "--no-progress"]) == 0
    with live(tmp, [*run_args, "--out", str(tmp / "live")], spec, nodes=4, agents=2) as (_, client):
        client.wait_done(120)
    assert (tmp / "live" / "jobs.csv").read_text() == (tmp / "offline" / "jobs.csv").read_text()
