"""A live run that cannot write its end says so. ``--out`` is checked at start (an existing
file, a folder that cannot be made); when the end cannot be written after all (the folder
replaced by a file while the replay ran), the failure is logged once, the run is done with the
failure in its summary, a submission gets a clear final error (FAILED_PRECONDITION,
``out_unwritable``, not "retry shortly" for ever), and ``--exit-when-done`` exits non-zero."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from analysim.clusters import parse_cluster
from analysim.rpc_status import refusal_of
from scheduler_svc.launcher import ROOT, LocalRun
from tests.polling import scaled
from tests.test_live_helpers import local_run, wait_until

CLUSTER = "4x8"


@pytest.mark.parametrize("out", ["file", "under-a-file"])
def test_an_out_that_cannot_be_written_is_refused_at_start(tmp_path: Path, out: str) -> None:
    (tmp_path / "taken").write_text("not a folder")
    where = tmp_path / "taken" if out == "file" else tmp_path / "taken" / "run"
    r = subprocess.run([sys.executable, "-m", "scheduler_svc", "serve", "--jobs", "10", "--cluster", CLUSTER,
                        "--out", str(where), "--port-file", str(tmp_path / "port.json")], cwd=ROOT,
                       capture_output=True, text=True, timeout=scaled(60))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"--out {where}: " in r.stderr, r.stderr
    assert not (tmp_path / "port.json").exists()  # never served


def _run_with_out_lost(tmp_path: Path, *extra: str) -> tuple[LocalRun, Path]:
    """A scheduler with --out, whose folder is replaced by a file before the replay starts."""
    out = tmp_path / "out"
    run = local_run(tmp_path / "procs")
    run.provision([n.name for n in parse_cluster(CLUSTER).nodes], 1)
    run.start_scheduler(["--jobs", "20", "--seed", "3", "--no-offline-check", "--cluster", CLUSTER, "--out", str(out),
                         "--log-level", "WARNING", *extra])
    shutil.rmtree(out)  # checked and made at start; gone now, a file in its place
    out.write_text("in the way")
    run.start_agents(CLUSTER, 4, 1)
    return run, out


def test_an_end_that_cannot_be_written_ends_the_run_with_the_failure(tmp_path: Path) -> None:
    run, out = _run_with_out_lost(tmp_path)
    try:
        with run.client() as client:
            summary = client.wait_done(120)
            assert f"--out {out}" in summary["out_error"], summary
            with pytest.raises(grpc.RpcError) as e:
                client.submit(num_gpus=1, duration_s=10.0)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
            assert refusal_of(e.value)["code"] == "out_unwritable" and "restart it with a writable --out" in \
                e.value.details()
            assert client.cluster_state().replay_done
    finally:
        run.stop()
    log = run.scheduler.log.read_text()
    assert log.count("cannot write the run's end") == 1 and "Traceback" not in log and \
        "never retrieved" not in log, log


def test_exit_when_done_exits_non_zero_when_the_end_cannot_be_written(tmp_path: Path) -> None:
    run, out = _run_with_out_lost(tmp_path, "--exit-when-done")
    try:
        wait_until(lambda: not run.scheduler.alive(), 120, "the scheduler exited at the end")
        assert run.scheduler.popen.returncode == 1
    finally:
        run.stop()
    log = run.scheduler.log.read_text()
    assert log.count("cannot write the run's end") == 1 and "Traceback" not in log, log
    assert out.read_text() == "in the way"  # left as it was
