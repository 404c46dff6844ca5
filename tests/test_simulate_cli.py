"""`analysim simulate` and `analysim compare` as a user runs them: real processes, real files."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.polling import wait_until
from tests.procs import descendants, started
from tests.shared import TRACES, needs_shared


def analysim(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analysim", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_simulate_writes_every_output_and_is_byte_identical_per_seed(tmp_path):
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        r = analysim("simulate", "--jobs", "300", "--seed", "3", "--policy", "tiresias", "--preemption",
                     "--migration", "--placement", "random", "--out", str(out), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        runs.append(out)
    a, b = runs
    for f in ("summary.json", "jobs.csv", "timeseries.csv", "utilization.png", "jct_cdf.png"):
        assert (a / f).stat().st_size > 0
    assert (a / "jobs.csv").read_bytes() == (b / "jobs.csv").read_bytes()
    assert (a / "timeseries.csv").read_bytes() == (b / "timeseries.csv").read_bytes()
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in runs)
    sa.pop("wall_s"), sb.pop("wall_s")
    assert sa == sb
    for key in ("jobs_total", "jobs_completed", "jobs_filtered", "avg_jct_s", "median_jct_s", "p95_jct_s",
                "p99_jct_s", "avg_queue_s", "makespan_s", "gpu_utilization", "avg_fragmentation", "preemptions",
                "migrations", "per_vc", "jain_fairness"):
        assert key in sa, key
    assert sa["jobs_completed"] == sa["jobs_total"] == 300
    rows = list(csv.DictReader((a / "jobs.csv").open()))
    assert len(rows) == 300 and {r["status"] for r in rows} == {"completed"}
    assert 0 < sa["gpu_utilization"] <= 1


def test_simulate_on_a_terminal_shows_progress_and_finishes(tmp_path):
    # On a terminal the progress bar counts ended jobs through the recorder's on_job_end hook
    # (the compiled recorder's methods cannot be replaced on an instance).
    import pty

    master, terminal = pty.openpty()
    try:
        r = subprocess.run([sys.executable, "-m", "analysim", "simulate", "--jobs", "300", "--no-plots",
                            "--out", str(tmp_path)], stdout=subprocess.PIPE, stderr=terminal, text=True,
                           cwd=tmp_path, timeout=300)
    finally:
        os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # (the terminal's other end is closed: all read)
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    assert r.returncode == 0, shown.decode(errors="replace")
    assert b"Traceback" not in shown
    assert len(list(csv.DictReader((tmp_path / "jobs.csv").open()))) == 300


def test_another_seed_gives_another_trace(tmp_path):
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / seed
        assert analysim("simulate", "--jobs", "100", "--seed", seed, "--no-plots", "--out", str(out),
                        cwd=tmp_path).returncode == 0
        outs.append((out / "jobs.csv").read_bytes())
    assert outs[0] != outs[1]


def test_filtered_jobs_are_counted_not_dropped(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,submit_s,duration_s,num_gpus,gpu_milli,cpu_milli,memory_mib,vc,user,gpu_models,qos\n"
        "ok,0,10,8,1000,0,0,a,u,,\n"
        "huge,1,10,64,1000,0,0,a,u,,\n"
        "t4,2,10,1,1000,0,0,a,u,T4,\n")
    r = analysim("simulate", "--trace", str(trace), "--cluster", "2x8:V100", "--no-plots", "--out",
                 str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["jobs_total"] == 1 and s["jobs_completed"] == 1
    assert s["jobs_filtered"] == {"larger_than_cluster": 1, "no_matching_node": 1}
    assert "larger_than_cluster 1" in r.stdout


def test_bad_input_is_one_line_without_traceback(tmp_path):
    trace = tmp_path / "bad.csv"
    trace.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,abc,1,66.0,vc\n")
    r = analysim("simulate", "--trace", str(trace), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "line 2" in r.stderr and "duration" in r.stderr
    r = analysim("simulate", "--policy", "nope", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 2 and "unknown policy 'nope'" in r.stderr and "Traceback" not in r.stderr
    r = analysim("simulate", "--cluster", "0x8", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_inflate_mode_reports_allocation(tmp_path):
    r = analysim("simulate", "--jobs", "500", "--mode", "inflate", "--placement", "fgd", "--cluster", "tiny",
                 "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["tasks_placed"] > 0 and 0 < s["gpu_allocation_ratio"] <= 1
    assert s["fragmentation_gpus"] >= 0
    assert (tmp_path / "o" / "inflate.png").exists()


def test_compare_runs_combinations_in_parallel(tmp_path):
    r = analysim("compare", "--jobs", "200", "--policies", "fifo,srtf", "--placements", "consolidate",
                 "--preemption", "--both", "--workers", "2", "--out", str(tmp_path / "c"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert set(data["runs"]) == {"fifo/consolidate", "fifo/consolidate+preempt", "srtf/consolidate",
                                 "srtf/consolidate+preempt"}
    assert (tmp_path / "c" / "compare.png").exists()
    lines = r.stdout.splitlines()
    assert lines[0].startswith("run") and len([x for x in lines if x.startswith(("fifo", "srtf"))]) == 4


def _on_a_terminal(argv: list[str], cwd: Path) -> tuple[int, str]:
    """Run with stderr on a pseudo-terminal (as a user's shell has it): exit code, what it drew."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    # 30 rows of 120 columns: a new pseudo-terminal is 0 x 0, where tqdm draws nothing.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    p = started(subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=slave, stdin=subprocess.DEVNULL))
    os.close(slave)
    drawn = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        drawn += chunk
    os.close(master)
    return p.wait(timeout=300), drawn.decode(errors="replace")


def test_compare_shows_progress_on_a_terminal_only(tmp_path):
    argv = [sys.executable, "-m", "analysim", "compare", "--jobs", "200", "--policies", "fifo,srtf",
            "--preemption", "--both", "--workers", "2", "--out", str(tmp_path / "c")]
    code, drawn = _on_a_terminal(argv, tmp_path)
    # One bar over every run's jobs (4 runs x 200), counted in the forked runs.
    assert code == 0 and "comparing" in drawn and "800/800" in drawn, drawn
    code, drawn = _on_a_terminal([*argv, "--no-progress"], tmp_path)
    assert code == 0 and "comparing" not in drawn, drawn
    r = analysim(*argv[3:], cwd=tmp_path)  # not a terminal: quiet
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.splitlines()[-1] == (f"wrote {tmp_path / 'c'}/compare.txt, compare.csv, compare.json, "
                                         "compare.png and one folder per run")


def test_compare_both_without_a_mechanism_is_one_line(tmp_path):
    r = analysim("compare", "--jobs", "50", "--both", "--out", str(tmp_path / "c"), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "analysim compare: error: --both runs each combination with and without --preemption/--migration: "
        "give one of them"]
    assert not (tmp_path / "c").exists()


def test_compare_run_killed_is_a_one_line_error_not_a_hang(tmp_path):
    p = started(subprocess.Popen([sys.executable, "-m", "analysim", "compare", "--jobs", "3000", "--cluster", "tiny",
                                  "--policies", "fifo,srtf", "--preemption", "--workers", "2",
                                  "--out", str(tmp_path / "c")],
                                 cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))

    def forked_run() -> int | None:
        assert p.poll() is None, p.communicate()
        return (descendants(p.pid) or [None])[0]

    victim = wait_until(forked_run, 120, "a forked run")
    os.kill(victim, signal.SIGKILL)
    _, stderr = p.communicate(timeout=300)
    assert p.returncode == 2, stderr
    assert "died (exit code -9)" in stderr and "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr


@needs_shared(TRACES / "openb_pod_list_default.csv", TRACES / "openb_node_list_gpu_node.csv")
def test_openb_inflate_fgd_beats_best_fit_on_fragmentation(tmp_path):
    # GPU pods only: with openb's CPU-only pods kept, this FGD loses to best fit (see docs/simulation.md).
    res = {}
    for placement in ("fgd", "consolidate"):
        out = tmp_path / placement
        r = analysim("simulate", "--trace", str(TRACES / "openb_pod_list_default.csv"), "--cluster",
                     str(TRACES / "openb_node_list_gpu_node.csv"), "--mode", "inflate", "--placement", placement,
                     "--drop-cpu-only", "--no-plots", "--out", str(out), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        res[placement] = json.loads((out / "summary.json").read_text())
    assert res["fgd"]["fragmentation_gpus"] < res["consolidate"]["fragmentation_gpus"]
    assert res["fgd"]["gpu_allocation_ratio"] > 0.9
