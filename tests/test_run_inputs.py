"""What `simulate` does with input it cannot honestly run: out-of-range numbers, traces whose every
job is filtered, trace VCs the cluster does not have, and a reader that closes the pipe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import started

DEDICATED = "vcs:\n  - {name: a, nodes: 1}\n  - {name: b, nodes: 1}\nnodes:\n  - {count: 2, gpus: 8, gpu_model: V100}\n"


def analysim(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analysim", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.mark.parametrize(("flag", "value"), [
    ("--restore-overhead", "nan"), ("--restore-overhead", "1e308"), ("--restore-overhead", "-1000"),
    ("--migration-overhead", "inf"), ("--checkpoint-interval", "-1"), ("--rebalance-interval", "0"),
    ("--limit", "-5"), ("--limit", "0"), ("--jobs", "-1"), ("--rate-scale", "nan"), ("--seed", "-1"),
])
def test_out_of_range_flags_are_one_line_errors(tmp_path, flag, value):
    line = one_line_error(analysim("simulate", "--jobs", "20", "--no-plots", "--out", str(tmp_path / "o"),
                                   f"{flag}={value}", cwd=tmp_path))
    assert flag in line and value in line
    assert not (tmp_path / "o").exists()


def test_no_jobs_at_all_is_an_error(tmp_path):
    # (--jobs 0 is valid for the live scheduler, which then only takes clients' jobs.)
    line = one_line_error(analysim("simulate", "--jobs", "0", "--no-plots", "--out", str(tmp_path / "o"),
                                   cwd=tmp_path))
    assert "the trace has no jobs" in line


def test_an_out_of_range_trace_value_names_file_line_and_column(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_s,duration_s,num_gpus\nj1,0,100,1\nj2,5,1e308,1\n")
    line = one_line_error(analysim("simulate", "--trace", str(trace), "--cluster", "2x8", "--no-plots",
                                   "--out", str(tmp_path / "o"), cwd=tmp_path))
    assert "t.csv, line 3, column 'duration_s'" in line and "at most" in line


def _dedicated_cluster(tmp_path: Path) -> Path:
    spec = tmp_path / "two.yaml"
    spec.write_text(DEDICATED)
    return spec


def test_every_job_filtered_is_an_error_with_counts_and_reasons(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_s,duration_s,num_gpus,vc\nj1,0,100,1,x\nj2,5,100,1,y\nj3,6,100,1,y\n")
    line = one_line_error(analysim("simulate", "--trace", str(trace), "--cluster", str(_dedicated_cluster(tmp_path)),
                                   "--no-plots", "--out", str(tmp_path / "o"), cwd=tmp_path))
    assert "all 3 jobs were filtered out (unknown_vc 3)" in line and "--vc-map" in line
    # The same on a quota spec (Philly's VCs), where such jobs used to run silently.
    line = one_line_error(analysim("simulate", "--trace", str(trace), "--cluster", "philly", "--no-plots",
                                   "--out", str(tmp_path / "o"), cwd=tmp_path))
    assert "unknown_vc 3" in line


def test_trace_vcs_mapped_by_file_or_default(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_s,duration_s,num_gpus,vc\nj1,0,100,1,x\nj2,5,100,1,y\nj3,6,100,1,z\n")
    cluster = _dedicated_cluster(tmp_path)
    vmap = tmp_path / "map.csv"
    vmap.write_text("trace_vc,cluster_vc\nx,a\ny,b\n")
    out = tmp_path / "o"
    r = analysim("simulate", "--trace", str(trace), "--cluster", str(cluster), "--vc-map", str(vmap),
                 "--no-plots", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["jobs_filtered"] == {"unknown_vc": 1} and s["jobs_total"] == 2  # z: not mapped, refused, counted
    assert {vc: v["jobs_total"] for vc, v in s["per_vc"].items()} == {"a": 1, "b": 1}
    r = analysim("simulate", "--trace", str(trace), "--cluster", str(cluster), "--vc-map", str(vmap),
                 "--default-vc", "b", "--no-plots", "--out", str(out), cwd=tmp_path)
    s = json.loads((out / "summary.json").read_text())
    assert s["jobs_filtered"] == {} and s["per_vc"]["b"]["jobs_total"] == 2
    r = analysim("simulate", "--trace", str(trace), "--cluster", str(cluster), "--vc-map", "share",
                 "--no-plots", "--out", str(out), cwd=tmp_path)
    s = json.loads((out / "summary.json").read_text())
    assert s["jobs_total"] == 3 and set(s["per_vc"]) == {"a", "b"}
    vmap.write_text("trace_vc,cluster_vc\nx,a\ny,nope\n")
    line = one_line_error(analysim("simulate", "--trace", str(trace), "--cluster", str(cluster), "--vc-map",
                                   str(vmap), "--no-plots", "--out", str(out), cwd=tmp_path))
    assert "map.csv, line 3, column 'cluster_vc'" in line and "'nope'" in line


def test_a_closed_pipe_ends_the_command_quietly(tmp_path):
    # `analysim trace info F | head -1`: head exits; the next write must not be a traceback.
    data = Path(__file__).resolve().parent / "data" / "philly_small.csv"
    p = started(subprocess.Popen([sys.executable, "-m", "analysim", "trace", "info", str(data)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, cwd=tmp_path))
    p.stdout.close()  # before the command writes anything
    err = p.stderr.read()
    assert p.wait(timeout=120) == 141 and err == b""
