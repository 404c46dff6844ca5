"""`analysim sweep --engine ray` on a real local Ray cluster (`ray start --head`, two worker CPUs):
results identical to `analysim simulate` and to the local engine; a Ray worker killed with
SIGKILL mid-sweep does not stop the sweep; a re-run of a finished sweep does no work."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.polling import wait_until
from tests.test_sweep import analysim, digest, rows, simulate_argv

pytest.importorskip("ray")
RAY = Path(sys.executable).with_name("ray")


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="module")
def ray_cluster():
    """A Ray head on 127.0.0.1 with 2 CPUs (two worker processes at a time), every port our own,
    its own auth token (in the environment: ~/.ray is left alone), stopped by ending the
    `ray start --block` process we started (which stops its children)."""
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths live under it
    gcs, client, dash, agent, agent_grpc, metrics, env_agent, nm, om = free_ports(9)
    log = (temp / "start.log").open("w")
    proc = subprocess.Popen(
        [str(RAY), "start", "--head", "--block", "--num-cpus=2", "--node-ip-address=127.0.0.1", f"--port={gcs}",
         f"--ray-client-server-port={client}", "--include-dashboard=false", f"--dashboard-port={dash}",
         f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
         f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={env_agent}",
         f"--node-manager-port={nm}", f"--object-manager-port={om}", f"--temp-dir={temp}",
         "--disable-usage-stats"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        wait_until(lambda: "Ray runtime started" in (temp / "start.log").read_text() or proc.poll() is not None,
                   120, "ray start")
        assert proc.poll() is None, (temp / "start.log").read_text()
        yield {"address": f"127.0.0.1:{gcs}", "pid": proc.pid, "env": env}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


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
    procs = {t["cell"]: subprocess.Popen([sys.executable, "-m", "analysim", "simulate", *simulate_argv(t), "--out",
                                          str(tmp_path / "sim" / t["cell"])], cwd=tmp_path, stdout=subprocess.DEVNULL)
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
    sweep = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=ray_cluster["env"])

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
