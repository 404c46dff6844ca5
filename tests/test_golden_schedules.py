"""Schedules at scale checked against things the engine did not just compute: the schedules of
two outside simulators (PAI v2020; Helios, with virtual clusters and preemption), and committed
digests of realistic runs."""

from __future__ import annotations

import csv
import math
import subprocess
import sys

import pytest

from tests.golden_runs import digest, load, needed_files, runs
from tests.shared import HELIOS, PAI, needs_shared, shared_marks

GOLDEN = load()


def _simulate(out, *args: str) -> dict[str, tuple[float, ...]]:
    """`analysim simulate ARGS` as a user runs it; its jobs.csv as job -> (submit, first start, end)."""
    r = subprocess.run([sys.executable, "-m", "analysim", "simulate", *args, "--out", str(out), "--no-plots",
                        "--no-progress"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    with (out / "jobs.csv").open() as f:
        return {r["job_id"]: (float(r["submit_s"]), float(r["first_start_s"]), float(r["end_s"])) for r in csv.DictReader(f)}


def _assert_same_schedule(ours: dict, ref: dict, peer: str) -> None:
    differ = sorted(k for k in ref if ours.get(k) != ref[k])
    assert not differ, f"{len(differ)} of {len(ref)} jobs differ from the {peer} simulator, e.g. {differ[0]}: " \
                       f"ours {ours.get(differ[0])}, {peer} {ref[differ[0]]}"
    assert ours.keys() == ref.keys()


@needs_shared(PAI / "philly_sample2k_64gpu.csv", PAI / "schedule_sjf_2k_64gpu.csv", PAI / "schedule_fifo_greedy_2k_64gpu.csv")
@pytest.mark.parametrize(("policy", "schedule"), [("sjf", "schedule_sjf_2k_64gpu.csv"),
                                                  ("fair", "schedule_fifo_greedy_2k_64gpu.csv")])
def test_simulate_reproduces_the_pai_simulator_job_by_job(tmp_path, policy, schedule):
    # As a user runs it: `analysim simulate --cluster 1x64` on the sample the PAI simulator ran
    # (README there: one 64-GPU node, CPU never binding; its greedy FIFO is `fair` with one VC).
    ours = _simulate(tmp_path, "--trace", str(PAI / "philly_sample2k_64gpu.csv"), "--cluster", "1x64", "--policy", policy)
    with (PAI / schedule).open() as f:
        ref = {r["job_id"]: (float(r["submit_s"]), float(r["start_s"]), float(r["end_s"])) for r in csv.DictReader(f)}
    assert len(ref) == 2000
    _assert_same_schedule(ours, ref, "PAI")


@needs_shared(HELIOS / "cluster_helios_vcs.yaml", HELIOS / "philly_helios_vcs_5k.csv", HELIOS / "fifo_5k_schedule.csv",
              HELIOS / "philly_helios_vcs_1k.csv", HELIOS / "srtf_preempt0_1k_schedule.csv")
@pytest.mark.parametrize(("trace", "options", "schedule", "jobs"), [
    ("philly_helios_vcs_5k.csv", ("--policy", "fifo"), "fifo_5k_schedule.csv", 4989),
    ("philly_helios_vcs_1k.csv", ("--policy", "srtf", "--preemption", "--restore-overhead", "0"),
     "srtf_preempt0_1k_schedule.csv", 1000),
])
def test_simulate_reproduces_the_helios_simulator_job_by_job(tmp_path, trace, options, schedule, jobs):
    # The Helios simulator (README there): each of Helios' 11 Philly VCs on its own dedicated
    # 8-GPU nodes; per-VC FIFO (strict head of line), and preemptive SRTF at no restore overhead
    # (its victims are the longest-remaining jobs: ours too, by the victim rule, with placement).
    # Helios' schedules give the first start and the end; the submit times are the trace's.
    ours = _simulate(tmp_path, "--trace", str(HELIOS / trace), "--format", "canonical",
                     "--cluster", str(HELIOS / "cluster_helios_vcs.yaml"), *options)
    with (HELIOS / schedule).open() as f:
        ref = {r["job_id"]: (ours.get(r["job_id"], (math.nan,))[0], float(r["start_s"]), float(r["end_s"]))
               for r in csv.DictReader(f)}
    assert len(ref) == jobs
    _assert_same_schedule(ours, ref, "Helios")


@pytest.mark.parametrize("name", [pytest.param(n, marks=shared_marks(*needed_files(a))) for n, a in sorted(runs().items())])
def test_schedule_matches_its_golden_digest(tmp_path, name):
    args = runs()[name]
    assert name in GOLDEN, f"no golden digest for {name}: run `python -m tests.golden_runs {name}`"
    assert digest(args, tmp_path) == GOLDEN[name], (
        f"the schedule of {name} changed (analysim simulate {' '.join(args)}). If that is intended, "
        f"regenerate with `python -m tests.golden_runs {name}` and say in the commit message why the "
        f"schedule changed.")
