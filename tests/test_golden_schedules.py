"""Schedules at scale checked against things the engine did not just compute: the PAI v2020
simulator's schedules (an outside oracle), and committed digests of realistic runs."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from tests.golden_runs import digest, load, needed_files, runs
from tests.shared import PAI, needs_shared, shared_marks

GOLDEN = load()


@needs_shared(PAI / "philly_sample2k_64gpu.csv", PAI / "schedule_sjf_2k_64gpu.csv", PAI / "schedule_fifo_greedy_2k_64gpu.csv")
@pytest.mark.parametrize(("policy", "schedule"), [("sjf", "schedule_sjf_2k_64gpu.csv"),
                                                  ("fair", "schedule_fifo_greedy_2k_64gpu.csv")])
def test_simulate_reproduces_the_pai_simulator_job_by_job(tmp_path, policy, schedule):
    # As a user runs it: `analysim simulate --cluster 1x64` on the sample the PAI simulator ran
    # (README there: one 64-GPU node, CPU never binding; its greedy FIFO is `fair` with one VC).
    r = subprocess.run([sys.executable, "-m", "analysim", "simulate", "--trace", str(PAI / "philly_sample2k_64gpu.csv"),
                        "--cluster", "1x64", "--policy", policy, "--out", str(tmp_path), "--no-plots", "--no-progress"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    with (PAI / schedule).open() as f:
        ref = {r["job_id"]: (float(r["submit_s"]), float(r["start_s"]), float(r["end_s"])) for r in csv.DictReader(f)}
    with (tmp_path / "jobs.csv").open() as f:
        ours = {r["job_id"]: (float(r["submit_s"]), float(r["first_start_s"]), float(r["end_s"]))
                for r in csv.DictReader(f)}
    assert len(ref) == 2000
    differ = sorted(k for k in ref if ours.get(k) != ref[k])
    assert not differ, f"{len(differ)} jobs differ from the PAI simulator, e.g. {differ[0]}: " \
                       f"ours {ours.get(differ[0])}, PAI {ref[differ[0]]} (submit, start, end)"
    assert ours.keys() == ref.keys()


@pytest.mark.parametrize("name", [pytest.param(n, marks=shared_marks(*needed_files(a))) for n, a in sorted(runs().items())])
def test_schedule_matches_its_golden_digest(tmp_path, name):
    args = runs()[name]
    assert name in GOLDEN, f"no golden digest for {name}: run `python -m tests.golden_runs {name}`"
    assert digest(args, tmp_path) == GOLDEN[name], (
        f"the schedule of {name} changed (analysim simulate {' '.join(args)}). If that is intended, "
        f"regenerate with `python -m tests.golden_runs {name}` and say in the commit message why the "
        f"schedule changed.")
