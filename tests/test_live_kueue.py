"""The live scheduler under a Kueue partition (--partition), beyond a replay's identity with the
offline run (tests/test_live_identity.py) and the stack's metrics through Prometheus
(tests/test_deploy_stack.py): a bad file is the same one-line error as for analysim simulate, and
a client's job is refused, with its reason and field, when no LocalQueue takes it or its
ClusterQueue could never admit it; one it can admit is counted in its ClusterQueue's metrics."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from analysim.clusters import parse_cluster
from analysim.core.partition import GPU
from analysim.rpc_status import refusal_of
from scheduler_svc.launcher import ROOT
from scheduler_svc.metrics import AGENT_REFUSALS, CALL_REFUSALS, IGNORED_REPORTS, SUBMISSION_REFUSALS
from tests.polling import scaled
from tests.test_kueue import _cq
from tests.test_live_helpers import http_get, live, sample_sum, scrape, wait_until

DEMO = ROOT / "examples" / "kueue" / "demo.yaml"


def _refused_offline_and_live(tmp_path: Path, bad: Path) -> str:
    """The one-line error both `analysim simulate` and the live scheduler give for partition
    ``bad`` at start (the same one), before the scheduler serves anything."""
    errors = {}
    for prog, argv in (("analysim simulate", ["-m", "analysim", "simulate", "--no-plots", "--no-progress",
                                              "--out", str(tmp_path / "out")]),
                       ("scheduler_svc", ["-m", "scheduler_svc", "serve", "--journal", str(tmp_path / "j.db"),
                                          "--port-file", str(tmp_path / "port.json")])):
        r = subprocess.run([sys.executable, *argv, "--jobs", "10", "--cluster", "demo", "--partition", str(bad)],
                           cwd=ROOT, capture_output=True, text=True, timeout=scaled(120))
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        errors[prog] = r.stderr.removeprefix(f"{prog}: error: ")
    assert not (tmp_path / "port.json").exists()  # never served, so never acknowledged anything
    assert errors["analysim simulate"] == errors["scheduler_svc"]
    return errors["scheduler_svc"]


def test_a_bad_partition_is_the_same_one_line_error_as_offline(tmp_path: Path) -> None:
    bad = tmp_path / "kueue.yaml"
    bad.write_text(DEMO.read_text().replace("nominalQuota: 31", "nominalQuota: 31\n        borrowLimit: 4", 1))
    line = next(i for i, t in enumerate(bad.read_text().splitlines(), 1) if "borrowLimit" in t)
    error = _refused_offline_and_live(tmp_path, bad)
    assert error.startswith(f"{bad}, line {line}: document ") and "borrowLimit: unknown field" in error


def _first_cq_spec(text: str, extra: str) -> str:
    """The demo partition with ``extra`` lines at the top of its first ClusterQueue's spec."""
    i = text.index("spec:", text.index("kind: ClusterQueue"))
    return text[:i] + "spec:\n" + extra + text[i + len("spec:"):]


_CQ = """---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata: {name: q%d}
spec:
  resourceGroups:
  - coveredResources: ["nvidia.com/gpu"]
    flavors:
    - name: v100
      resources:
      - {name: "nvidia.com/gpu", nominalQuota: 1}
"""


@pytest.mark.parametrize(("edit", "says"), [
    (lambda t: t.replace("nominalQuota: 31", "nominalQuota: 1e400", 1),
     "nominalQuota: 1e400 is more than any cluster could hold (at most 1e+06 for nvidia.com/gpu)"),
    (lambda t: t.replace("nominalQuota: 31", "nominalQuota: 1e999999", 1),
     "nominalQuota: 1e999999 is more than any cluster could hold"),
    (lambda t: t.replace("nominalQuota: 31", "nominalQuota: 31\n        borrowingLimit: 1e400", 1),
     "borrowingLimit: 1e400 is more than any cluster could hold"),
    (lambda t: _first_cq_spec(t, "  fairSharing: {weight: 1e400}"),
     "fairSharing.weight: 1e400 is more than any cluster could hold (at most 1e+06 for fairSharing.weight)"),
    (lambda t: t.replace("nominalQuota: 31", "nominalQuota: !foo 31", 1),
     "could not determine a constructor for the tag '!foo'"),
    (lambda t: t + "---\nnested: " + "[" * 20000 + "]" * 20000 + "\n", "nested too deeply to be a Kueue object"),
    (lambda t: t + "".join(_CQ % i for i in range(100_000)), "a partition file may have at most 4,194,304"),
    (lambda t: t + "---\n~\n" * 6000, "more than 5,000 documents"),
], ids=["nominal-1e400", "nominal-1e999999", "borrowing-1e400", "weight-1e400", "unknown-tag", "deep-nesting",
        "100k-cluster-queues", "too-many-documents"])
def test_a_partition_beyond_any_cluster_or_reader_is_refused_at_start(tmp_path: Path, edit, says: str) -> None:
    bad = tmp_path / "kueue.yaml"
    bad.write_text(edit(DEMO.read_text()))
    error = _refused_offline_and_live(tmp_path, bad)
    assert error.startswith(str(bad)) and says in error, error


@pytest.mark.parametrize(("vc", "gpus", "reason", "field", "says"), [
    ("", 1, "no_local_queue", "vc", "vc is required under a partition"),
    ("nope", 1, "no_local_queue", "vc", "no LocalQueue 'nope' in the partition; its LocalQueues: 0e4a51, 103959"),
    # 925e2b: nominal 1 GPU and a borrowing limit of 8: at most 9 GPUs ever, on a 128-GPU cluster.
    ("925e2b", 16, "larger_than_queue_quota", "num_gpus", "larger than ClusterQueue '925e2b' can ever admit"),
])
def test_client_jobs_reach_a_cluster_queue_or_are_refused(tmp_path: Path, vc: str, gpus: int, reason: str,
                                                          field: str, says: str) -> None:
    with live(tmp_path, ["--jobs", "0", "--partition", str(DEMO)], "demo", nodes=16, agents=1) as (run, client):
        with pytest.raises(grpc.RpcError) as e:
            client.submit(num_gpus=gpus, duration_s=60.0, vc=vc)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in e.value.details(), e.value.details()
        refusal = refusal_of(e.value)
        assert (refusal["code"], refusal.get("field")) == (reason, field), refusal
        # 9 GPUs is what 925e2b may hold, borrowing all it may: admitted, and counted under Kueue's names.
        job = client.submit(num_gpus=9, duration_s=60.0, vc="925e2b").job_id
        wait_until(lambda: client.get_job(job).end_s > 0, 60, "the admitted job done")
        m = scrape(run.scheduler.info["host"], run.scheduler.info["metrics"])
    assert sample_sum(m["analysim_jobs_rejected"], "analysim_jobs_rejected_total", reason=reason) == 1
    assert sample_sum(m["kueue_admitted_workloads"], "kueue_admitted_workloads_total", cluster_queue="925e2b") == 1
    assert sample_sum(m["kueue_admitted_workloads"], "kueue_admitted_workloads_total") == 1


TWO_TEAMS = """
apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata: {name: any}""" + _cq("team-a", "ab", {GPU: {"nominalQuota": 8}}, flavor="any") + _cq(
    "team-b", "ab", {GPU: {"nominalQuota": 8}}, flavor="any", extra="\n  preemption: {reclaimWithinCohort: Any}")


def test_a_reclaim_is_counted_by_preempting_queue_and_reason(tmp_path: Path) -> None:
    # team-a and team-b: 8 GPUs each in cohort ab. team-a takes all 16 (two jobs of 8: the second
    # borrows team-b's 8); then team-b asks for its 8: reclaimWithinCohort: Any evicts team-a's most
    # recently admitted job, and the live scheduler counts it under Kueue's names: one preemption
    # by team-b for InCohortReclamation, one eviction of team-a's for Preempted. (Paced at one
    # virtual second a second: the 10-hour jobs stay running while the test looks.)
    path = tmp_path / "two.yaml"
    path.write_text(TWO_TEAMS)
    with live(tmp_path, ["--jobs", "0", "--speed", "1", "--partition", str(path)], "demo", nodes=16,
              agents=1) as (run, client):
        first = client.submit(num_gpus=8, duration_s=36000.0, vc="team-a").job_id
        wait_until(lambda: client.get_job(first).HasField("first_start_s"), 60, "team-a's first job running")
        second = client.submit(num_gpus=8, duration_s=36000.0, vc="team-a").job_id
        wait_until(lambda: client.get_job(second).HasField("first_start_s"), 60, "team-a's borrowing job running")
        reclaim = client.submit(num_gpus=8, duration_s=36000.0, vc="team-b").job_id
        wait_until(lambda: client.get_job(reclaim).HasField("first_start_s"), 60, "team-b's job admitted by a reclaim")
        assert client.get_job(second).preemptions == 1 and client.get_job(first).preemptions == 0
        m = scrape(run.scheduler.info["host"], run.scheduler.info["metrics"])
    preempted = m["kueue_preempted_workloads"]
    assert sample_sum(preempted, "kueue_preempted_workloads_total", preempting_cluster_queue="team-b",
                      reason="InCohortReclamation") == 1
    assert sample_sum(preempted, "kueue_preempted_workloads_total") == 1
    assert sample_sum(m["kueue_evicted_workloads"], "kueue_evicted_workloads_total", cluster_queue="team-a",
                      reason="Preempted") == 1


# The scheduler's reason-labelled counters and their reasons.
REASON_COUNTERS = {"analysim_jobs_rejected": SUBMISSION_REFUSALS, "analysim_grpc_calls_refused": CALL_REFUSALS,
                   "analysim_agent_reports_ignored": IGNORED_REPORTS, "analysim_agents_refused": AGENT_REFUSALS}

# Labelled gauges with no series on a run whose VCs have no quota: under a partition the quotas
# are the ClusterQueues' (kueue_cluster_queue_nominal_quota), not the VCs'.
NO_VC_QUOTAS = {"analysim_vc_quota_gpus", "analysim_vc_free_quota_gpus"}


@pytest.mark.parametrize("partition", [True, False], ids=["partition", "vcs"])
def test_every_labelled_gauge_has_each_series_at_zero_when_nothing_happens(tmp_path: Path, partition: bool) -> None:
    # Nothing submitted: every per-VC gauge (a VC being a LocalQueue under a partition) and every
    # per-ClusterQueue one is there at 0, so that sums, dashboards and absent() alerts read "none",
    # not "no data"; the stack's "Kueue's pending = the scheduler's pending" then holds at 0 too.
    args = ["--jobs", "0", *(["--partition", str(DEMO)] if partition else [])]
    with live(tmp_path, args, "demo", nodes=16, agents=1) as (run, _):
        status, text = http_get(run.scheduler.info["host"], run.scheduler.info["metrics"], "/metrics")
    assert status == 200
    families = list(text_string_to_metric_families(text))
    m = {f.name: f.samples for f in families}
    if partition:
        vcs = sorted(d["metadata"]["name"] for d in yaml.safe_load_all(DEMO.read_text()) if d and d["kind"] == "LocalQueue")
        queues = sorted(d["metadata"]["name"] for d in yaml.safe_load_all(DEMO.read_text())
                        if d and d["kind"] == "ClusterQueue")
    else:
        vcs, queues = sorted(v.name for v in parse_cluster("demo").vcs), []
    assert vcs
    models = sorted({s.labels["gpu_model"] for s in m["analysim_cluster_gpus"]})
    per_vc = {"analysim_pending_jobs": [{}], "analysim_pending_gpus": [{}],
              "analysim_allocated_gpus": [{"gpu_model": g} for g in models]}
    if not partition:
        per_vc |= {"analysim_vc_quota_gpus": [{}], "analysim_vc_free_quota_gpus": [{}]}
    for family, extra in per_vc.items():
        series = {tuple(sorted(s.labels.items())): s.value for s in m[family]}
        for vc in vcs:
            for labels in extra:
                key = tuple(sorted({"vc": vc, **labels}.items()))
                assert key in series, (family, key)
                if "quota" not in family:
                    assert series[key] == 0, (family, key)
    for vc in vcs:
        assert sample_sum(m["analysim_jobs_started"], "analysim_jobs_started_total", vc=vc) == 0
        assert any(s.labels.get("vc") == vc for s in m["analysim_jobs_started"]), vc
    for q in queues:
        for status in ("active", "inadmissible"):
            assert [s.value for s in m["kueue_pending_workloads"]
                    if s.labels == {"cluster_queue": q, "status": status}] == [0.0], (q, status)
        assert [s.value for s in m["kueue_admitted_active_workloads"] if s.labels["cluster_queue"] == q] == [0.0]
    # No labelled gauge of the scheduler is left without series.
    empty = sorted(f.name for f in families if f.type == "gauge" and not f.samples)
    assert empty == (sorted(NO_VC_QUOTAS) if partition else []), empty
    # Every reason-labelled counter has each known reason's series, at 0 (auth refusals aside:
    # the test's own client presents a valid token, but none was refused).
    for family, reasons in REASON_COUNTERS.items():
        series = {s.labels["reason"]: s.value for s in m[family] if s.name == family + "_total"}
        assert series == dict.fromkeys(reasons, 0.0), (family, series)


# cpu-team: CPU and memory quota only (16 cores, borrowing at most 4 more; 64Gi, lending at most
# 32Gi of it); gpu-team: GPUs, CPU and memory; one cohort.
CPU_AND_GPU = """
apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata: {name: any}""" + _cq(
    "cpu-team", "cg", {"cpu": {"nominalQuota": 16, "borrowingLimit": 4},
                       "memory": {"nominalQuota": "64Gi", "lendingLimit": "32Gi"}}, flavor="any") + _cq(
    "gpu-team", "cg", {GPU: {"nominalQuota": 8}, "cpu": {"nominalQuota": "40500m"},
                       "memory": {"nominalQuota": "256Gi"}}, flavor="any")
GIB = 2**30


def test_every_covered_resource_is_exported_in_kueue_s_units(tmp_path: Path) -> None:
    # A CPU-only job of cpu-team's (the trace's: a client's job asks for a GPU) takes 18 cores (2
    # borrowed from gpu-team) and 6Gi; a client's job of gpu-team's 2 GPUs, 3 cores and 10Gi.
    # Kueue exports every flavor-resource a ClusterQueue has quota for, CPU in cores and memory in
    # bytes (resources.Amount.AsApproximateFloat64): so here.
    path = tmp_path / "cg.yaml"
    path.write_text(CPU_AND_GPU)
    trace = tmp_path / "cpu.csv"
    trace.write_text("job_id,submit_s,duration_s,num_gpus,gpu_milli,cpu_milli,memory_mib,vc\n"
                     f"cpu-job,0,36000,0,0,18000,{6 * 1024},cpu-team\n")
    with live(tmp_path, ["--trace", str(trace), "--speed", "1", "--partition", str(path)], "demo", nodes=16,
              agents=1) as (run, client):
        cpu_job = "cpu-job"
        gpu_job = client.submit(num_gpus=2, duration_s=36000.0, vc="gpu-team", cpu_milli=3000,
                                memory_mib=10 * 1024).job_id
        def running(job: str) -> bool:
            try:
                return client.get_job(job).HasField("first_start_s")
            except grpc.RpcError as e:  # the trace's job is not submitted before the clock starts
                if e.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                return False

        for job in (cpu_job, gpu_job):
            wait_until(lambda job=job: running(job), 60, f"{job} running")
        m = scrape(run.scheduler.info["host"], run.scheduler.info["metrics"])

    def gauge(name: str) -> dict[tuple[str, str], float]:
        samples = m[f"kueue_cluster_queue_{name}"]
        assert {s.labels["cohort"] for s in samples} == {"cg"} and {s.labels["flavor"] for s in samples} == {"any"}
        return {(s.labels["cluster_queue"], s.labels["resource"]): s.value for s in samples}

    inf = float("inf")
    assert gauge("nominal_quota") == {("cpu-team", "cpu"): 16.0, ("cpu-team", "memory"): 64.0 * GIB,
                                      ("gpu-team", GPU): 8.0, ("gpu-team", "cpu"): 40.5,
                                      ("gpu-team", "memory"): 256.0 * GIB}
    assert gauge("borrowing_limit") == {("cpu-team", "cpu"): 4.0, ("cpu-team", "memory"): inf,
                                        ("gpu-team", GPU): inf, ("gpu-team", "cpu"): inf, ("gpu-team", "memory"): inf}
    assert gauge("lending_limit")[("cpu-team", "memory")] == 32.0 * GIB
    held = {("cpu-team", "cpu"): 18.0, ("cpu-team", "memory"): 6.0 * GIB, ("gpu-team", GPU): 2.0,
            ("gpu-team", "cpu"): 3.0, ("gpu-team", "memory"): 10.0 * GIB}
    assert gauge("resource_usage") == held
    assert gauge("resource_reservation") == held
