"""The events file (``--events FILE``) through the command line: hand-computed admissions with
their flavors and borrowed GPUs, an eviction with its preemptor and Kueue's reason, the VC model's
reasons, and that the run keeps no event in memory."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysim.cli import main as analysim
from analysim.core.partition import GPU
from analysim.events import EVENT_FIELDS
from tests.polling import scaled
from tests.test_kueue import _cq

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "kueue" / "demo.yaml"
TRACE_COLUMNS = "job_id,submit_s,duration_s,num_gpus,vc"

# Two ClusterQueues of 8 GPUs each in one cohort, on 2 nodes x 8 GPUs. ``a`` reclaims what it
# lends; ``b`` may borrow at most 4.
RECLAIM = """
apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata: {name: gpu}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata: {name: a}
spec:
  cohort: co
  preemption: {reclaimWithinCohort: Any}
  resourceGroups:
  - coveredResources: [nvidia.com/gpu]
    flavors:
    - name: gpu
      resources: [{name: nvidia.com/gpu, nominalQuota: 8}]
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata: {name: b}
spec:
  cohort: co
  resourceGroups:
  - coveredResources: [nvidia.com/gpu]
    flavors:
    - name: gpu
      resources: [{name: nvidia.com/gpu, nominalQuota: 8, borrowingLimit: 4}]
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: LocalQueue
metadata: {name: a}
spec: {clusterQueue: a}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: LocalQueue
metadata: {name: b}
spec: {clusterQueue: b}
"""


def write_trace(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join([TRACE_COLUMNS, *rows]) + "\n")
    return path


def simulate_events(tmp_path: Path, rows: list[str], *extra: str, cluster: str = "2x8") -> list[dict]:
    """Run ``analysim simulate --events`` on these trace rows; the events file's rows."""
    trace = write_trace(tmp_path / "trace.csv", rows)
    events = tmp_path / "events.csv"
    assert analysim(["simulate", "--trace", str(trace), "--cluster", cluster, *extra, "--no-plots", "--no-progress",
                     "--out", str(tmp_path / "out"), "--events", str(events)]) == 0
    with events.open(newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == EVENT_FIELDS
        return list(reader)


def test_admissions_borrowing_and_a_reclaim_as_kueue_decides_them(tmp_path):
    part = tmp_path / "part.yaml"
    part.write_text(RECLAIM)
    # t=0  b1 (12 GPUs) into b: nominal 8, so it borrows 12 - 8 = 4 (= b's borrowingLimit) of a's.
    # t=10 a1 (4 GPUs) into a: a uses 0 + 4 <= 8, no borrowing; the cohort's 16 are now all used.
    # t=20 a2 (4 GPUs): a would use 8 <= 8 nominal, but the cohort has 0 left: a reclaims from
    #      b, which borrows: b1 is evicted (InCohortReclamation) and a2 admitted, not borrowing.
    # t=110 a1 ends: a uses 4; b1 (12) fits again, b using 12, borrowing 4. Then a2 and b1 end.
    events = simulate_events(tmp_path, ["b1,0,1000,12,b", "a1,10,100,4,a", "a2,20,100,4,a"],
                             "--partition", str(part))
    rows = [(e["time_s"], e["event"], e["job_id"], e["queue"], e["flavors"], e["borrowed_gpus"], e["preemptor"],
             e["preemptor_queue"], e["reason"]) for e in events]
    assert rows[:5] == [
        ("0.0", "admit", "b1", "b", "nvidia.com/gpu=gpu", "4", "", "", ""),
        ("10.0", "admit", "a1", "a", "nvidia.com/gpu=gpu", "0", "", "", ""),
        ("20.0", "evict", "b1", "b", "", "", "a2", "a", "InCohortReclamation"),
        ("20.0", "admit", "a2", "a", "nvidia.com/gpu=gpu", "0", "", "", ""),
        ("110.0", "complete", "a1", "a", "", "", "", "", ""),
    ]
    assert rows[5][1:6] == ("admit", "b1", "b", "nvidia.com/gpu=gpu", "4")
    assert [r[1] for r in rows].count("complete") == 3
    assert not [r for r in rows if r[1] == "pending"]  # every job ended
    assert all(e["nodes"] for e in events if e["event"] in ("admit", "evict", "complete"))


def test_the_vc_model_names_its_preemptions(tmp_path):
    # No partition: srtf with --preemption on one 8-GPU node. long (8 GPUs, 1000 s) runs; short
    # (8 GPUs, 10 s) arrives at 5 and has less left: the priority post-filter evicts long for it.
    events = simulate_events(tmp_path, ["long,0,1000,8,v", "short,5,10,8,v"], "--policy", "srtf",
                             "--preemption", cluster="1x8")
    evict = [e for e in events if e["event"] == "evict"]
    assert [(e["time_s"], e["job_id"], e["queue"], e["preemptor"], e["preemptor_queue"], e["reason"])
            for e in evict] == [("5.0", "long", "v", "short", "v", "priority")]
    assert all(e["flavors"] == "" for e in events)


def test_events_refused_for_inflate_and_for_an_unwritable_path(tmp_path):
    cli = [sys.executable, "-m", "analysim", "simulate", "--jobs", "50", "--cluster", "4x8", "--no-plots",
           "--no-progress", "--out", str(tmp_path / "out")]
    run = subprocess.run([*cli, "--mode", "inflate", "--events", str(tmp_path / "e.csv")], capture_output=True,
                         text=True)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "--events" in run.stderr, run.stderr
    (tmp_path / "file").write_text("")
    run = subprocess.run([*cli, "--events", str(tmp_path / "file" / "e.csv")], capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr


def test_compare_writes_one_events_file_per_run_and_a_sweep_cell_its_own(tmp_path):
    trace = write_trace(tmp_path / "trace.csv", ["long,0,1000,8,v", "short,5,10,8,v"])
    assert analysim(["compare", "--trace", str(trace), "--cluster", "1x8", "--policies", "fifo,srtf", "--preemption",
                     "--no-progress", "--out", str(tmp_path / "cmp"), "--events"]) == 0
    evicted = {}
    for events in sorted((tmp_path / "cmp").glob("*/events.csv")):
        with events.open(newline="") as f:
            evicted[events.parent.name] = [e["job_id"] for e in csv.DictReader(f) if e["event"] == "evict"]
    assert evicted == {"fifo_consolidate+preempt": [], "srtf_consolidate+preempt": ["long"]}, evicted
    said = subprocess.run([sys.executable, "-m", "analysim", "explain", str(tmp_path / "cmp" / "srtf_consolidate+preempt"),
                           "long"], capture_output=True, text=True)
    assert said.returncode == 0 and "5 s: evicted (priority) to make room for short of v" in said.stdout, said
    said = subprocess.run([sys.executable, "-m", "analysim", "explain", str(tmp_path / "cmp" / "srtf_consolidate+preempt"),
                           "long", "--at", "10"], capture_output=True, text=True)
    assert said.returncode == 2 and "did not record the options" in said.stderr, said
    spec = tmp_path / "s.yaml"
    spec.write_text(f"trace: {trace}\ncluster: 1x8\npreemption: true\npolicy: [fifo, srtf]\nevents: ev.csv\n")
    run = subprocess.run([sys.executable, "-m", "analysim", "sweep", str(spec), "--out", str(tmp_path / "sweep")],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    cells = sorted((tmp_path / "sweep" / "cells").glob("*/ev.csv"))
    assert len(cells) == 2 and not (tmp_path / "ev.csv").exists()
    assert sorted(sum(1 for line in c.open() if ",evict," in line) for c in cells) == [0, 1]
    # A cell's summary names its events file by its place in the cell's folder, where explain finds it.
    summary = json.loads((cells[0].parent / "summary.json").read_text())
    assert summary["events"]["file"] == "ev.csv" and "out" not in summary["events"]["args"]
    said = subprocess.run([sys.executable, "-m", "analysim", "explain", str(cells[0].parent), "long"],
                          capture_output=True, text=True)
    assert said.returncode == 0 and said.stdout.startswith("long: submitted at 0 s\n0 s: admitted to v"), said


def _queue(name: str, nominal: int, extra: str = "") -> str:
    """A ClusterQueue of nominal GPUs in the one flavor ``gpu``, outside any cohort, with its LocalQueue."""
    return _cq(name, None, {GPU: {"nominalQuota": nominal}}, flavor="gpu", extra=extra)


GPU_FLAVOR = "apiVersion: kueue.x-k8s.io/v1beta1\nkind: ResourceFlavor\nmetadata: {name: gpu}"
RECLAIM_WITHOUT_PREEMPTION = RECLAIM.replace("  preemption: {reclaimWithinCohort: Any}\n", "")

# Each reason code, from a situation built for it, asked at 50 s (every job here runs 100 s or more).
REASONS = {
    # q holds 4 GPUs and no cohort: r runs 4; w (4) finds no flavor with the quota.
    "no_flavor_quota": (GPU_FLAVOR + _queue("q", 4), "2x8", ["r,0,100,4,q", "w,10,100,4,q"],
                        "insufficient unused quota for nvidia.com/gpu in flavor gpu, 4 more needed"),
    # b1 runs 12 of b's 8 + borrowingLimit 4; w (2) would make b borrow 6 > 4 while a lends 4 unused.
    "borrowing_limit": (RECLAIM, "2x8", ["b1,0,1000,12,b", "w,10,100,2,b"],
                        "borrowing limit for nvidia.com/gpu in flavor gpu exceeded"),
    # b1 (12) runs; a1 (4) fills the cohort's 16; w of b (2) has none left to borrow.
    "cohort_exhausted": (RECLAIM_WITHOUT_PREEMPTION, "2x8", ["b1,0,1000,12,b", "a1,5,1000,4,a", "w,10,100,1,b"],
                         "(cohort co exhausted)"),
    # StrictFIFO q (4): r runs 2; the older h (4) cannot be admitted and heads the queue; w (2) would fit.
    "strict_fifo": (GPU_FLAVOR + _queue("q", 4, extra="\n  queueingStrategy: StrictFIFO"), "1x8",
                    ["r,0,100,2,q", "h,1,100,4,q", "w,2,100,2,q"], "workload h"),
    # a (8) may not preempt: a1 (4) runs, b1 borrows 4 of a's; w of a (4) is within a's nominal
    # quota and would fit by reclaiming b1's loan.
    "preemption_forbidden": (RECLAIM_WITHOUT_PREEMPTION, "2x8", ["b1,0,1000,12,b", "a1,5,1000,4,a", "w,10,100,4,a"],
                             "preemption policies"),
    # q (16) on 2 x 8 GPUs: r1 and r2 take 6 on each node; w (4) has the quota but no node has 4 free.
    "no_node_room": (GPU_FLAVOR + _queue("q", 16), "2x8", ["r1,0,100,6,q", "r2,0,100,6,q", "w,10,100,4,q"],
                     "no node of it has room for 4 GPUs"),
}


@pytest.mark.parametrize("code", sorted(REASONS))
def test_each_pending_reason_from_a_situation_built_for_it(tmp_path, code, capsys):
    partition, cluster, rows, words = REASONS[code]
    part = tmp_path / "part.yaml"
    part.write_text(partition)
    simulate_events(tmp_path, rows, "--partition", str(part), cluster=cluster)
    capsys.readouterr()
    assert analysim(["explain", str(tmp_path / "out"), "w", "--at", "50"]) == 0
    answer = capsys.readouterr().out.strip().splitlines()[-1]
    assert answer.startswith(f"at 50 s: pending: {code}: "), answer
    assert words in answer, answer


def test_explain_tells_admissions_evictions_and_refuses_bad_input(tmp_path):
    part = tmp_path / "part.yaml"
    part.write_text(RECLAIM)
    simulate_events(tmp_path, ["b1,0,1000,12,b", "a1,10,100,4,a", "a2,20,100,4,a"], "--partition", str(part))
    out = str(tmp_path / "out")
    cli = [sys.executable, "-m", "analysim", "explain"]
    run = subprocess.run([*cli, out, "b1"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "b1: submitted at 0 s",
        "0 s: admitted to b on nvidia.com/gpu=gpu, borrowing 4 GPUs (nodes node-0000, node-0001)",
        "20 s: evicted (InCohortReclamation) to make room for a2 of a",
        "110 s: admitted to b on nvidia.com/gpu=gpu, borrowing 4 GPUs (nodes node-0000, node-0001)",
        "1120 s: complete on node-0000, node-0001",
    ]
    run = subprocess.run([*cli, out, "b1", "--at", "50"], capture_output=True, text=True)
    assert run.stdout.splitlines()[-1] == ("at 50 s: pending: cohort_exhausted: couldn't assign flavors to pod set "
                                           "main: insufficient unused quota for nvidia.com/gpu in flavor gpu, 4 more "
                                           "needed (cohort co exhausted)")
    run = subprocess.run([*cli, out, "b1", "--at", "500"], capture_output=True, text=True)
    assert run.stdout.splitlines()[-1] == "at 500 s: running"
    for bad, words in (([out, "nobody"], "no job 'nobody'"), ([str(tmp_path / "none"), "b1"], "no summary.json"),
                       ([out, "b1", "--at", "5000"], "outside the run"), ([out, "b1", "--at", "-1"], "--at")):
        run = subprocess.run([*cli, *bad], capture_output=True, text=True)
        assert run.returncode == 2 and run.stderr.count("\n") == 1 and words in run.stderr, run.stderr


def test_a_streaming_run_keeps_no_event(tmp_path):
    # The events go to the file as the engine decides them: neither the engine's log nor the
    # writer holds any (the writer's state is a few fixed fields, whatever the run's length).
    from analysim.clusters import parse_cluster
    from analysim.events import EventsCsv
    from analysim.report import JobsCsv
    from analysim.simulation import RunOptions, run
    from analysim.traces.synthetic import generate

    jobs = generate(400, seed=1).jobs
    with JobsCsv(tmp_path / "jobs.csv") as sink, EventsCsv(tmp_path / "events.csv") as events:
        result = run(jobs, parse_cluster("4x8"), RunOptions(policy="srtf", preemption=True), job_sink=sink,
                     event_sinks=[events])
        assert result.decisions == [] and events.engine.decisions == []
        assert not [k for k, v in vars(events).items() if isinstance(v, list | dict | set | tuple)]
    lines = (tmp_path / "events.csv").read_text().splitlines()
    assert sum(",complete," in line for line in lines) == result.summary["jobs_completed"] > 0


def test_a_running_replay_explains_a_pending_job_over_grpc(tmp_path):
    # team-a and team-b: 8 GPUs each in cohort ab (test_live_kueue's). team-a runs two jobs of 8,
    # the second borrowing team-b's 8; a third of team-a's (8) finds the cohort's 16 all used, and
    # nothing it may preempt (same priority, no policy): cohort_exhausted, 8 more needed.
    from tests.test_live_helpers import live, wait_until
    from tests.test_live_kueue import TWO_TEAMS

    path = tmp_path / "two.yaml"
    path.write_text(TWO_TEAMS)
    events = tmp_path / "events.csv"
    with live(tmp_path, ["--jobs", "0", "--speed", "1", "--partition", str(path), "--events", str(events)], "demo",
              nodes=16, agents=1, auth=False) as (run, client):
        # No trace job: the replay is over at once, its events file written; the clients' jobs
        # after it open the run again and are not added to it.
        wait_until(lambda: events.exists(), 60, "the empty replay's events file")
        running = [client.submit(num_gpus=8, duration_s=36000.0, vc="team-a").job_id for _ in range(2)]
        wait_until(lambda: all(client.get_job(j).HasField("first_start_s") for j in running), 60, "team-a's two jobs")
        waiting = client.submit(num_gpus=8, duration_s=36000.0, vc="team-a").job_id
        wait_until(lambda: client.explain(waiting).reason, 60, "the third job's reason")
        answer = client.explain(waiting)
        assert (answer.reason, answer.queue) == ("cohort_exhausted", "team-a"), answer
        assert "insufficient unused quota for nvidia.com/gpu in flavor any, 8 more needed" in answer.detail
        assert client.explain(running[0]).reason == ""
        address = f"{run.scheduler.info['host']}:{run.scheduler.info['grpc']}"
        cli = [sys.executable, "-m", "analysim", "explain", "--scheduler", address]
        said = subprocess.run([*cli, waiting], capture_output=True, text=True, timeout=scaled(60))
        assert said.returncode == 0, said.stderr
        assert said.stdout.startswith(f"{waiting} (team-a) at ") and ": pending: cohort_exhausted: " in said.stdout
        said = subprocess.run([*cli, "nobody"], capture_output=True, text=True, timeout=scaled(60))
        assert said.returncode == 2 and said.stderr.count("\n") == 1 and "NOT_FOUND" in said.stderr, said.stderr
    assert events.read_text() == ",".join(EVENT_FIELDS) + "\n"


def test_the_vc_model_names_its_migrations(tmp_path):
    # The live identity test's tiresias case (300 synthetic jobs on 16 x 4 GPUs, preemption and
    # migration on) moves jobs: each move says why, and one made for a waiting job names it.
    out, events = tmp_path / "out", tmp_path / "events.csv"
    assert analysim(["simulate", "--jobs", "300", "--seed", "3", "--policy", "tiresias", "--preemption", "--migration",
                     "--cluster", "16x4", "--no-plots", "--no-progress", "--out", str(out), "--events", str(events)]) == 0
    with events.open(newline="") as f:
        rows = list(csv.DictReader(f))
    moves = [r for r in rows if r["event"] == "migrate"]
    summary = json.loads((out / "summary.json").read_text())
    assert len(moves) == summary["migrations"] > 0
    assert "unblock" in {r["reason"] for r in moves} <= {"unblock", "rebalance"}
    assert all(r["preemptor"] and r["preemptor_queue"] for r in moves if r["reason"] == "unblock")
    assert sum(r["event"] == "evict" for r in rows) == summary["preemptions"]
    assert {r["reason"] for r in rows if r["event"] == "evict"} <= {"priority", "reclaim"}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), jobs=st.integers(5, 80),
       policy=st.sampled_from([("fifo", ()), ("srtf", ("preemption",)), ("tiresias", ("preemption", "migration"))]),
       partition=st.booleans())
def test_the_events_tell_each_job_s_story_as_jobs_csv_sums_it(tmp_path, seed, jobs, policy, partition):
    # Per job: one admission at its first start, then one more after each eviction and each
    # requeue; as many evictions as preemptions and moves as migrations; the ended ones end once.
    from analysim.cli.common import load_inputs, run_options
    from analysim.cli.simulate import simulate_namespace
    from analysim.events import EventsCsv
    from analysim.simulation import run

    name, mechanisms = policy
    given = {"jobs": jobs, "seed": seed, "rate_scale": 4.0, "cluster": "4x8", "policy": name,
             **dict.fromkeys(mechanisms, True)}
    if partition:  # (the live identity test's Kueue case: the demo cluster's partition)
        given = {"jobs": jobs, "seed": seed, "rate_scale": 4.0, "cluster": "demo", "partition": str(DEMO)}
    args = simulate_namespace(given)
    trace, cluster = load_inputs(args)
    opts = run_options(args, args.policy, args.placement)
    path = tmp_path / f"events-{seed}-{jobs}.csv"
    with EventsCsv(path) as events:
        result = run(trace.jobs, cluster, opts, trace_filtered=trace.filtered, event_sinks=[events])
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    by_job: dict[str, list[dict]] = {}
    for r in rows:
        by_job.setdefault(r["job_id"], []).append(r)
    for job in result.jobs:
        story = by_job.get(job["job_id"], [])
        kinds = [r["event"] for r in story]
        assert kinds.count("admit") == 1 + job["preemptions"] + job["restarts"], (job, kinds)
        assert kinds.count("evict") == job["preemptions"] and kinds.count("migrate") == job["migrations"]
        assert float(story[0]["time_s"]) == job["first_start_s"] and kinds[0] == "admit"
        assert kinds.count({"completed": "complete", "failed": "fail", "cancelled": "cancel"}[job["status"]]) == 1
        assert [float(r["time_s"]) for r in story] == sorted(float(r["time_s"]) for r in story)


# The VC model's reasons, each from a situation built for it, asked at 50 s: one node of 8 GPUs,
# FIFO. queue_order: r (4) runs, the head h (8) does not fit, w (2) would but FIFO keeps it behind h.
# no_node_room: h itself. vc_quota: VC v's quota is 4 and it may not borrow; r (4) runs, w (2) waits.
VC_CLUSTER = "nodes:\n  - {count: 1, gpus: 8, gpu_model: V100}\nvcs:\n  - {name: v, quota_gpus: 4}\n  - {name: u}\n" \
             "allow_borrowing: false\n"
VC_REASONS = {
    "queue_order": (["r,0,100,4,u", "h,1,100,8,u", "w,2,100,2,u"], "w", "runs the jobs it ranks first"),
    "no_node_room": (["r,0,100,4,u", "h,1,100,8,u", "w,2,100,2,u"], "h", "has room for 8 GPUs now"),
    "vc_quota": (["r,0,100,4,v", "w,2,100,2,v"], "w", "VC v uses 4 of its 4 GPUs and may not borrow"),
}


@pytest.mark.parametrize("code", sorted(VC_REASONS))
def test_each_vc_model_pending_reason(tmp_path, code, capsys):
    rows, job, words = VC_REASONS[code]
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(VC_CLUSTER)
    simulate_events(tmp_path, rows, cluster=str(cluster))
    capsys.readouterr()
    assert analysim(["explain", str(tmp_path / "out"), job, "--at", "50"]) == 0
    answer = capsys.readouterr().out.strip().splitlines()[-1]
    assert answer.startswith(f"at 50 s: pending: {code}: ") and words in answer, answer
