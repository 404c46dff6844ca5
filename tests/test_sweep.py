"""`analysim sweep` with the local engine: SPEC parsing and checking, content-addressed cells,
results identical to `analysim simulate`, failed cells recorded, resume after a killed sweep."""

from __future__ import annotations

import csv
import hashlib
import inspect
import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysim.sweep.results import ci95
from analysim.sweep.spec import SpecError, expand, option_actions, simulate_parser
from tests.polling import wait_until
from tests.procs import descendants, started

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def analysim(*args: str, cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analysim", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300, **kw)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rows(out: Path) -> list[dict]:
    return list(csv.DictReader((out / "results.csv").open()))


def simulate_argv(params: dict) -> list[str]:
    """The `analysim simulate` command line of a results.csv row's parameters."""
    argv = []
    for key, action in option_actions(simulate_parser()).items():
        v, flag = params[key], next(s for s in action.option_strings if s.startswith("--"))
        if action.nargs == 0:
            argv += [flag] if v == "True" else []
        elif v != "":
            argv.append(f"{flag}={v}")
    return argv


# --- SPEC


def test_axes_make_the_cross_product_minus_excludes():
    sweep = expand({"jobs": 100, "policy": ["fifo", "srtf", "tiresias"], "preemption": [False, True],
                    "seed": [1, 2], "exclude": [{"policy": "fifo", "preemption": True}]})
    assert len(sweep.cells) == 3 * 2 * 2 - 2
    assert sweep.axes == ("policy", "preemption", "seed")
    assert {(c.args.policy, c.args.preemption) for c in sweep.cells} == {
        ("fifo", False), ("srtf", False), ("srtf", True), ("tiresias", False), ("tiresias", True)}
    assert all(c.args.jobs == 100 and c.args.no_plots for c in sweep.cells)
    assert sweep.cells[0].label == "policy=fifo preemption=false seed=1"


def test_explicit_cells_cross_the_axes():
    sweep = expand({"cluster": "tiny", "seed": [1, 2, 3],
                    "cells": [{"policy": "fifo"}, {"policy": "srtf", "preemption": True, "migration": True}]})
    assert len(sweep.cells) == 6
    assert sorted({(c.args.policy, c.args.migration) for c in sweep.cells}) == [("fifo", False), ("srtf", True)]
    assert set(sweep.axes) == {"seed", "policy", "preemption", "migration"}


def test_cell_id_is_the_content_not_the_spelling(tmp_path):
    a = tmp_path / "a.csv"
    a.write_bytes((DATA / "canonical_small.csv").read_bytes())
    b = tmp_path / "copy.csv"
    b.write_bytes(a.read_bytes())
    one = expand({"trace": str(a), "policy": "srtf", "limit": 2})
    two = expand({"limit": 2, "policy": "srtf", "trace": str(b)})
    assert one.cells[0].id == two.cells[0].id  # same options, same bytes: same cell
    assert expand({"trace": str(a), "policy": "srtf", "limit": 2, "no_plots": False}).cells[0].id == one.cells[0].id
    assert expand({"trace": str(a), "policy": "srtf", "limit": 3}).cells[0].id != one.cells[0].id
    b.write_text(b.read_text().replace("3600.0", "3601.0"))
    assert expand({"trace": str(b), "policy": "srtf", "limit": 2}).cells[0].id != one.cells[0].id


def test_cells_share_a_loaded_trace_only_when_reading_it_is_the_same():
    from analysim.inputs import trace_inputs

    on_file = expand({"trace": str(DATA / "canonical_small.csv"), "policy": ["fifo", "srtf"], "seed": [1, 2],
                      "preemption": [False, True]})
    assert len({trace_inputs(c.args) for c in on_file.cells}) == 1  # the seed does not change a file
    synthetic = expand({"jobs": 50, "policy": ["fifo", "srtf"], "seed": [1, 2]})
    assert len({trace_inputs(c.args) for c in synthetic.cells}) == 2  # it does change the generated trace
    limits = expand({"trace": str(DATA / "canonical_small.csv"), "limit": [1, 2]})
    assert len({trace_inputs(c.args) for c in limits.cells}) == 2  # not known to act after reading: a key


POLICIES = ["fifo", "sjf", "srtf", "tiresias", "qssf", "fair"]


@settings(max_examples=40, deadline=None)
@given(policies=st.lists(st.sampled_from(POLICIES), min_size=1, max_size=6, unique=True),
       seeds=st.lists(st.integers(0, 10**6), min_size=1, max_size=4, unique=True),
       mech=st.lists(st.booleans(), min_size=1, max_size=2, unique=True))
def test_every_combination_is_one_distinct_cell(policies, seeds, mech):
    sweep = expand({"policy": policies, "seed": seeds, "preemption": mech})
    assert len(sweep.cells) == len(policies) * len(seeds) * len(mech)
    assert len({c.id for c in sweep.cells}) == len(sweep.cells)
    assert {(c.args.policy, c.args.seed, c.args.preemption) for c in sweep.cells} == {
        (p, s, m) for p in policies for s in seeds for m in mech}


def test_every_simulate_option_is_a_spec_key():
    """Keys come from simulate's parser: whatever option simulate has (now or added later), a SPEC
    may set it, and the cell gets the value simulate would parse."""
    parser = simulate_parser()
    actions = option_actions(parser)
    assert {"policy", "placement", "preemption", "migration", "trace", "cluster", "seed", "limit"} <= set(actions)
    assert "out" not in actions and "no_progress" not in actions
    for key, action in actions.items():
        value = True if action.nargs == 0 else (action.default if action.default is not None else None)
        if value is None:
            continue
        value = str(value) if not isinstance(value, bool | int | float) else value
        [cell] = expand({key: value}).cells
        assert getattr(cell.args, action.dest) == (True if action.nargs == 0 else action.default), key


@settings(max_examples=40, deadline=None)
@given(policies=st.lists(st.sampled_from(POLICIES), min_size=1, max_size=6, unique=True),
       seeds=st.lists(st.integers(0, 100), min_size=1, max_size=3, unique=True),
       drop=st.lists(st.tuples(st.sampled_from(POLICIES), st.integers(0, 100)), max_size=4))
def test_exclude_removes_exactly_the_matching_cells(policies, seeds, drop):
    spec = {"policy": policies, "seed": seeds, "exclude": [{"policy": p, "seed": s} for p, s in drop]}
    kept = {(p, s) for p in policies for s in seeds} - set(drop)
    if not kept:
        with pytest.raises(SpecError, match="leaves no cell"):
            expand(spec)
        return
    assert {(c.args.policy, c.args.seed) for c in expand(spec).cells} == kept


@pytest.mark.parametrize("spec, key, problem", [
    ({"polcy": ["fifo"]}, "polcy", "did you mean 'policy'"),
    ({"out": "x"}, "out", "the sweep sets --out itself"),
    ({"limit": "abc"}, "limit", "expected a positive integer"),
    ({"limit": -5}, "limit", "expected a positive integer"),
    ({"preemption": ["maybe"]}, "preemption", "expected true or false"),
    ({"mode": ["replay", "nope"]}, "mode", "invalid choice"),
    ({"policy": []}, "policy", "empty list"),
    ({"seed": [1, 1]}, "seed", "appears twice"),
    ({"policy": [{"a": 1}]}, "policy", "expected a single value"),
    ({"exclude": [{"polcy": "fifo"}]}, "polcy", "unknown key"),
    ({"policy": "fifo", "exclude": [{"policy": "fifo"}]}, "exclude", "leaves no cell"),
    ({"policy": "fifo", "cells": [{"policy": "srtf"}]}, "policy", "set at the top level"),
])
def test_bad_spec_names_the_key(spec, key, problem):
    with pytest.raises(SpecError) as e:
        expand(spec, "s.yaml")
    assert str(e.value).startswith("s.yaml: ") and key in str(e.value) and problem in str(e.value)


@pytest.mark.parametrize("text, key", [
    ("policy: [fifo, nope]\n", "policy: unknown policy 'nope'"),
    ("placement: [consolidate, sideways]\n", "placement: unknown placement 'sideways'"),
    ("cluster: [tiny, 0x8]\n", "cluster: "),
    ("trace: [missing.csv]\n", "trace: "),
    ("limit: []\n", "limit: empty list"),
    ("jobs: 10\nunknown_thing: 3\n", "unknown key 'unknown_thing'"),
    ("policy: [fifo\n", "not valid YAML"),
    ("jobs: 100000000000000000000\n", "jobs: 100000000000000000000: argument --jobs: expected at most 10,000,000"),
    ("jobs: 1e20\n", "jobs: 1e20: argument --jobs"),
    (f"jobs: [{', '.join(map(str, range(1, 1001)))}]\nseed: [{', '.join(map(str, range(1000)))}]\n",
     "1,000,000 cells (1000 jobs x 1000 seed); a sweep may have at most 10,000"),
    ("cluster: demo\npartition: %s\npartition_set: {ClusterQueue/nope/v100/nvidia.com/gpu/nominalQuota: [1, 2]}\n"
     % (Path(__file__).parents[1] / "examples" / "kueue" / "demo.yaml"), "has no ClusterQueue 'nope'"),
])
@pytest.mark.parametrize("dry", [False, True], ids=["run", "dry-run"])
def test_bad_spec_is_one_line_before_any_cell_runs(tmp_path, text, key, dry):
    # --dry-run runs the run's own checks: what the run refuses, the dry run refuses too.
    spec = tmp_path / "s.yaml"
    spec.write_text("jobs: 20\ncluster: tiny\n" + text if "jobs" not in text and "cluster" not in text else
                    ("jobs: 20\n" + text if "jobs" not in text else text))
    r = analysim("sweep", str(spec), "--out", str(tmp_path / "o"), *(["--dry-run"] if dry else []), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"analysim sweep: error: {spec}: ") and key in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def test_toml_spec(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text('jobs = 20\ncluster = "tiny"\npolicy = ["fifo", "srtf"]\n')
    r = analysim("sweep", str(spec), "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "2 cells"


# --- running


SPEC = """\
jobs: 150
cluster: tiny
seed: [1, 2]
cells:
  - {policy: fifo}
  - {policy: srtf, preemption: true}
  # a trace without durations replayed: every job is filtered out when the cell runs, so it fails by itself
  - {policy: tiresias, trace: %s}
""" % (Path(__file__).parent / "data" / "openb_inflate_small.csv")


def test_local_sweep_equals_simulate_records_failures_and_resumes(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "sweep"
    r = analysim("sweep", str(spec), "--out", str(out), "--workers", "2", cwd=tmp_path)
    assert r.returncode == 1, r.stderr  # some cells failed; the others ran
    assert "6 cells ran" in r.stdout and "2 failed" in r.stdout
    table = rows(out)
    assert [t["status"] for t in table] == ["ok", "ok", "failed"] * 2
    summary_keys = json.loads(next((out / "cells").glob("*/summary.json")).read_text())
    for t in table:
        assert t["status"] == "failed" or all(k in t or f"summary.{k}" in t for k in summary_keys)
        assert (out / "cells" / t["cell"] / "cell.json").exists()
    failed = [t for t in table if t["status"] == "failed"]
    assert all("all 4 jobs were filtered out" in t["error"] for t in failed)
    # A user error is its one line, with no traceback to keep (a crash keeps one in error.txt).
    assert not (out / "cells" / failed[0]["cell"] / "error.txt").exists()
    # Each ok cell is the `analysim simulate` run of its parameters, byte for byte.
    ok = [t for t in table if t["status"] == "ok"]
    procs = [started(subprocess.Popen([sys.executable, "-m", "analysim", "simulate", *simulate_argv(t), "--out",
                                       str(tmp_path / "sim" / t["cell"])], cwd=tmp_path, stdout=subprocess.DEVNULL))
             for t in ok]
    assert [p.wait(timeout=120) for p in procs] == [0] * len(ok)
    for t in ok:
        for name in ("jobs.csv", "timeseries.csv"):
            assert digest(out / "cells" / t["cell"] / name) == digest(tmp_path / "sim" / t["cell"] / name)
    assert {t["seed"] for t in ok} == {"1", "2"} and {t["summary.policy"] for t in ok} == {
        "fifo/consolidate", "srtf/consolidate"}
    agg = list(csv.DictReader((out / "aggregate.csv").open()))
    assert {a["group"] for a in agg} == {"policy=fifo preemption=false trace=default",
                                         "policy=srtf preemption=true trace=default"}
    assert all(a["seeds"] == "2" and float(a["avg_jct_s_ci95"]) >= 0 for a in agg)

    # A re-run does no work; --retry-failed runs only the failed cells again; a lost cell folder is run again.
    before = {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/jobs.csv")}
    r = analysim("sweep", str(spec), "--out", str(out), cwd=tmp_path)
    assert "0 cells ran" in r.stdout and "6 skipped" in r.stdout, r.stdout
    assert r.returncode == 1 and "2 of 6 cells have no results" in r.stdout  # the failures still stand
    assert before == {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/jobs.csv")}
    r = analysim("sweep", str(spec), "--out", str(out), "--retry-failed", cwd=tmp_path)
    assert "2 cells ran" in r.stdout and "4 skipped" in r.stdout, r.stdout
    import shutil

    shutil.rmtree(out / "cells" / ok[0]["cell"])
    r = analysim("sweep", str(spec), "--out", str(out), cwd=tmp_path)
    assert "1 cells ran" in r.stdout, r.stdout
    assert digest(out / "cells" / ok[0]["cell"] / "jobs.csv") == digest(tmp_path / "sim" / ok[0]["cell"] / "jobs.csv")


def test_a_killed_sweep_resumes_where_it_stopped(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("jobs: 400\ncluster: tiny\npolicy: [fifo, srtf, tiresias]\npreemption: [false, true]\n"
                    "seed: [1, 2]\n")
    out = tmp_path / "sweep"
    p = started(subprocess.Popen([sys.executable, "-m", "analysim", "sweep", str(spec), "--out", str(out), "--workers", "1"],
                                 cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
    try:
        wait_until(lambda: len(list((out / "cells").glob("*/cell.json"))) >= 2, 120, "two finished cells")
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the sweep and its pool, mid-sweep
        p.wait()
    finished = {d.name for d in (out / "cells").glob("*") if (d / "cell.json").exists()}
    assert 2 <= len(finished) < 12
    r = analysim("sweep", str(spec), "--out", str(out), "--workers", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"{12 - len(finished)} cells ran" in r.stdout and f"{len(finished)} skipped" in r.stdout, r.stdout
    assert [t["status"] for t in rows(out)] == ["ok"] * 12
    assert not (out / "cells" / ".partial").exists()


def test_confidence_interval_is_students_t():
    mean, half = ci95([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.302652729911275 / 3**0.5)
    assert ci95([5.0]) == (5.0, None)


def test_a_killed_pool_worker_is_retried_in_a_new_pool(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("jobs: 3000\ncluster: tiny\npolicy: [fifo, srtf]\npreemption: [false, true]\nseed: [1, 2]\n")
    out = tmp_path / "sweep"
    p = started(subprocess.Popen([sys.executable, "-m", "analysim", "sweep", str(spec), "--out", str(out), "--workers", "2"],
                                 cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))

    def proc(pid: int, name: str) -> str:
        return Path(f"/proc/{pid}/{name}").read_text()

    def stat(pid: int) -> list[str]:  # the fields of /proc/PID/stat after the command's name
        return proc(pid, "stat").rsplit(")", 1)[1].split()

    def started_at(pid: int) -> int:  # clock ticks after boot (field 22)
        return int(stat(pid)[19])

    def mid_cell() -> int | None:
        """A worker stopped (SIGSTOP) before it has written anything of its cell's outputs: a cell
        writes its files (hundreds of kB) before it sends its result, so this one has not sent it
        and its death cannot go unseen. The one forked last is the likeliest; if it has got that
        far, it goes on (SIGCONT) and we look again."""
        try:
            kids = descendants(p.pid)
            if not kids:
                return None
            pid = max(kids, key=started_at)
            os.kill(pid, signal.SIGSTOP)
            state = wait_until(lambda: stat(pid)[0] if stat(pid)[0] in "TZX" else "", 10, "the worker stopped")
            if state != "T":
                return None  # it has exited: look again
            written = int(dict(line.split(": ") for line in proc(pid, "io").splitlines())["wchar"])
        except (OSError, ValueError):
            return None  # it exited while we looked: look again
        if written < 1024:
            return pid
        os.kill(pid, signal.SIGCONT)
        return None

    victim = wait_until(mid_cell, 120, "a worker in the middle of its cell")
    os.kill(victim, signal.SIGKILL)
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 0, stderr
    assert "a worker process died; running it again" in stderr
    assert "8 cells ran" in stdout and "0 lost" in stdout, stdout
    assert [t["status"] for t in rows(out)] == ["ok"] * 8



def _die_halfway_through_sending() -> None:
    """In the forked child: put the length of a 1 MiB result and 10 bytes of it on the pipe, then
    die by SIGKILL, as a child killed in the middle of sending its result does."""
    out = inspect.currentframe().f_back.f_locals["out"]  # the child's end of its result pipe
    os.write(out.fileno(), struct.pack("!i", 1 << 20) + b"x" * 10)
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_task_killed_in_the_middle_of_sending_is_a_death_not_a_crash():
    from analysim.forked import ForkedTasks

    tasks = ForkedTasks(2)
    tasks.submit("halfway", _die_halfway_through_sending)
    tasks.submit("fine", sum, (1, 2, 3))
    done = {f.key: f for f in tasks.finished()}
    assert done["halfway"].died and done["halfway"].exitcode == -signal.SIGKILL
    assert not done["fine"].died and done["fine"].result == 6
