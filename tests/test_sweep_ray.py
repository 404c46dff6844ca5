"""`analysim sweep --engine ray` on a real local Ray cluster (`ray start --head`, two worker CPUs):
results identical to `analysim simulate` and to the local engine; a Ray worker killed with
SIGKILL mid-sweep does not stop the sweep; a re-run of a finished sweep does no work."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys

import pytest

from tests.polling import wait_until
from tests.procs import cmdline, descendants, started
from tests.rayhead import ray_head
from tests.test_sweep import analysim, digest, rows, simulate_argv

pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_cluster():
    """A Ray head with 2 CPUs: two worker processes at a time."""
    with ray_head(num_cpus=2) as head:
        yield {"address": head.address, "pid": head.pid, "env": head.env}


SPEC = "jobs: {jobs}\ncluster: tiny\npolicy: [fifo, srtf]\npreemption: [false, true]\nseed: [1, 2]\n"


def test_ray_sweep_equals_simulate_and_local_engine(tmp_path, ray_cluster):
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC.format(jobs=150))
    r = analysim("sweep", str(spec), "--engine", "ray", "--address", ray_cluster["address"], "--out",
                 str(tmp_path / "ray"), cwd=tmp_path, env=ray_cluster["env"])
    assert r.returncode == 0, r.stderr
    assert "8 cells ran" in r.stdout and "2 CPUs in 1 node(s)" in r.stdout, r.stdout
    r = analysim("sweep", str(spec), "--workers", "2", "--out", str(tmp_path / "local"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    table = rows(tmp_path / "ray")
    assert len(table) == 8 and {t["status"] for t in table} == {"ok"}
    procs = {t["cell"]: started(subprocess.Popen([sys.executable, "-m", "analysim", "simulate", *simulate_argv(t), "--out",
                                                  str(tmp_path / "sim" / t["cell"])], cwd=tmp_path, stdout=subprocess.DEVNULL))
             for t in table}
    assert all(p.wait(timeout=120) == 0 for p in procs.values())
    for t in table:
        ray_jobs = digest(tmp_path / "ray" / "cells" / t["cell"] / "jobs.csv")
        assert ray_jobs == digest(tmp_path / "local" / "cells" / t["cell"] / "jobs.csv")
        assert ray_jobs == digest(tmp_path / "sim" / t["cell"] / "jobs.csv")
    assert len({digest(tmp_path / "ray" / "cells" / t["cell"] / "jobs.csv") for t in table}) > 1


def test_killed_ray_worker_does_not_stop_the_sweep(tmp_path, ray_cluster):
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC.format(jobs=1500))
    out = tmp_path / "ray"
    argv = [sys.executable, "-m", "analysim", "sweep", str(spec), "--engine", "ray", "--address",
            ray_cluster["address"], "--out", str(out)]
    sweep = started(subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=ray_cluster["env"]))

    def running_cell() -> int | None:
        return next((p for p in descendants(ray_cluster["pid"]) if cmdline(p).startswith("ray::_run_on_ray")), None)

    victim = wait_until(running_cell, 120, "a Ray worker running a cell", poll_s=0.005)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: not cmdline(victim), 30, "the killed worker to be gone")
    stdout, stderr = sweep.communicate(timeout=300)
    assert sweep.returncode == 0, stderr
    assert "8 cells ran" in stdout and "0 lost" in stdout, stdout
    assert [t["status"] for t in rows(out)] == ["ok"] * 8
    before = {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/jobs.csv")}
    r = analysim("sweep", str(spec), "--engine", "ray", "--address", ray_cluster["address"], "--out", str(out),
                 cwd=tmp_path, env=ray_cluster["env"])
    assert r.returncode == 0, r.stderr
    assert "0 cells ran" in r.stdout and "8 skipped" in r.stdout, r.stdout
    assert before == {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/jobs.csv")}


def test_ray_sweep_over_a_partition_field(tmp_path, ray_cluster):
    # The local engine's end-to-end case (tests/test_kueue_report.py) on Ray: the same per-ClusterQueue
    # waits. The partition file is read by each cell on its worker: an absolute path.
    from tests.test_kueue_report import TWO_QUEUES

    (tmp_path / "two.yaml").write_text(TWO_QUEUES)
    (tmp_path / "trace.csv").write_text("job_id,submit_s,duration_s,num_gpus,vc\nj1,0,100,6,a\nj2,10,50,4,b\nj3,20,30,2,a\n")
    key = "ClusterQueue/a/gpu/nvidia.com/gpu/borrowingLimit"
    (tmp_path / "s.yaml").write_text(f"trace: trace.csv\ncluster: 1x8\npartition: {tmp_path / 'two.yaml'}\n"
                                     f"partition_set:\n  {key}: [null, 2]\n")
    r = analysim("sweep", "s.yaml", "--engine", "ray", "--address", ray_cluster["address"], "--out", "out",
                 cwd=tmp_path, env=ray_cluster["env"])
    assert r.returncode == 0, r.stderr
    assert "2 cells ran" in r.stdout, r.stdout
    queues = {(q["run"], q["cluster_queue"]): float(q["avg_admission_wait_s"])
              for q in csv.DictReader((tmp_path / "out" / "cluster_queues.csv").open())}
    assert queues == {(f"{key}=default", "a"): 0.0, (f"{key}=default", "b"): 90.0,
                      (f"{key}=2", "a"): 40.0, (f"{key}=2", "b"): 90.0}
