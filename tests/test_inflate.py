"""The FGD paper's inflate experiment as Weng et al. run it, and CPU-only pods as openb has them."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

from analysim.core.engine import Engine
from analysim.core.job import JobSpec
from analysim.core.policies import build_policy
from analysim.simulation import RunOptions, run
from tests.simhelpers import cluster, run_engine, times

# One 1-GPU node of model A, three 8-GPU nodes of model B: 25 GPUs.
CLUSTER = """nodes:
  - {count: 1, gpus: 1, gpu_model: A, name_prefix: a}
  - {count: 3, gpus: 8, gpu_model: B, name_prefix: b}
"""
# In trace order: the second A task finds no A GPU left at 8% of capacity arrived; the B tasks behind
# it still fit, until the cluster is full.
TRACE = "job_id,submit_s,duration_s,num_gpus,gpu_models\na1,0,,1,A\na2,0,,1,A\nb1,0,,8,B\nb2,0,,8,B\nb3,0,,8,B\nb4,0,,8,B\n"


def inflate(tmp_path: Path, *extra: str) -> tuple[dict, list[dict]]:
    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "t.csv").write_text(TRACE)
    out = tmp_path / "o"
    r = subprocess.run([sys.executable, "-m", "analysim", "simulate", "--trace", "t.csv", "--cluster", "c.yaml",
                        "--mode", "inflate", "--inflate-order", "trace", "--out", str(out), *extra],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    with (out / "inflate.csv").open() as f:
        return json.loads((out / "summary.json").read_text()), list(csv.DictReader(f))


def test_inflate_keeps_going_past_an_early_failure(tmp_path):
    s, rows = inflate(tmp_path)
    assert s["first_failure_arrived_pct"] == 8.0
    assert (s["tasks_arrived"], s["tasks_placed"], s["tasks_failed"]) == (5, 4, 1)  # b4 never arrives
    assert s["arrived_gpus"] == 26 and s["gpu_allocation_ratio"] == 1.0
    ratios = [float(r["gpu_allocation_ratio"]) for r in rows]
    assert ratios == sorted(ratios) and ratios[-1] == 1.0
    assert [float(r["arrived_pct"]) for r in rows] == [4.0, 8.0, 40.0, 72.0, 104.0]
    assert [int(r["tasks_failed"]) for r in rows] == [0, 1, 1, 1, 1]
    assert (tmp_path / "o" / "inflate.png").stat().st_size > 0


def test_stop_at_first_failure_is_the_old_reading(tmp_path):
    s, _ = inflate(tmp_path, "--stop-at-first-failure")
    assert (s["tasks_placed"], s["tasks_failed"]) == (1, 1) and s["gpu_allocation_ratio"] == 1 / 25


def test_inflate_until_sets_the_bound(tmp_path):
    s, _ = inflate(tmp_path, "--inflate-until", "50")
    assert s["arrived_gpus"] == 18 and s["tasks_arrived"] == 4 and s["inflate_until_pct"] == 50.0


def _pod(jid: str, submit: float, gpus: int, cpu: int, duration: float) -> JobSpec:
    return JobSpec(job_id=jid, submit_s=submit, duration_s=duration, num_gpus=gpus, gpu_milli=1000 if gpus else 0,
                   cpu_milli=cpu)


def test_a_cpu_only_pod_takes_cpu_a_gpu_pod_then_lacks():
    # One node, 2 GPUs, 64 CPUs (simhelpers). The CPU-only pod holds 60 of them until 1000 s: the GPU
    # pod, asking for 8, finds both GPUs free but not its CPUs, and waits.
    spec = cluster(1, 2)
    pods = [_pod("cpu", 0, 0, 60000, 1000), _pod("gpu", 10, 1, 8000, 100)]
    t = times(run_engine(spec, pods, "fifo"))
    assert t["cpu"] == (0.0, 1000.0) and t["gpu"] == (1000.0, 1100.0)
    assert times(run_engine(spec, pods[1:], "fifo"))["gpu"] == (10.0, 110.0)


def test_cpu_only_pods_are_counted_in_replay_and_inflate():
    spec = cluster(1, 2)
    pods = [_pod("cpu", 0, 0, 60000, 1000), _pod("gpu", 10, 1, 8000, 100)]
    s = run(pods, spec, RunOptions()).summary
    assert (s["jobs_total"], s["jobs_cpu_only"]) == (2, 1)
    inflated = run([_pod(p.job_id, 0, p.num_gpus, p.cpu_milli, 0) for p in pods], spec,
                   RunOptions(mode="inflate", inflate_order="trace")).summary
    # Trace order: the CPU-only pod is placed, then the GPU pod fails for lack of CPU.
    assert (inflated["cpu_only_tasks_placed"], inflated["tasks_failed"], inflated["jobs_cpu_only"]) == (1, 1, 1)
    assert Engine(spec, build_policy("fifo")).place_now(_pod("x", 0, 1, 8000, 0))  # alone, it fits
