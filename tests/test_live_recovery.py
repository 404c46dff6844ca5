"""Recovery that resumes, namespaces and held jobs, with real processes: the scheduler SIGKILLed
mid-replay and restarted on its journal (the jobs running at the kill end exactly when they
would have, not from zero), client ids that would take a trace job's (refused, also before it
arrives), a held job cancelled, and the `analysim up` options (relative --workdir, --port-file)
and `status --json` (every field, zero-valued ones too)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from analysim._protos.v1 import scheduler_pb2 as spb
from analysim.cli import main as analysim
from analysim.traces.synthetic import generate
from scheduler_svc.launcher import ROOT
from tests.polling import scaled
from tests.test_live_helpers import live, wait_port_free, wait_until


def _rows(path: Path) -> dict[str, dict]:
    with path.open() as f:
        return {r["job_id"]: r for r in csv.DictReader(f)}


RESUMED = {"vcs": ("16x8", ["--jobs", "300", "--seed", "3"]),
           # Under a Kueue partition: each resumed job is charged to its ClusterQueue again.
           "kueue": ("demo", ["--jobs", "300", "--seed", "3", "--rate-scale", "4", "--partition",
                              str(ROOT / "examples" / "kueue" / "demo.yaml")])}


@pytest.mark.parametrize("case", sorted(RESUMED))
def test_scheduler_sigkill_resumes_running_jobs_where_they_were(case: str, tmp_path: Path) -> None:
    journal, out, ref = tmp_path / "journal.db", tmp_path / "live", tmp_path / "offline"
    cluster, args = RESUMED[case]
    assert analysim(["simulate", *args, "--cluster", cluster, "--out", str(ref), "--no-plots", "--no-progress"]) == 0
    offline = _rows(ref / "jobs.csv")
    with live(tmp_path, [*args, "--journal", str(journal), "--out", str(out)], cluster, 16, agents=2) as (run, client):
        def paused_with_running_jobs() -> list:
            # Paused only once 20 jobs have completed: a pause on every poll would leave the
            # replay only the gaps between polls to run in, which on a loaded machine never
            # reached 20 completions within the deadline.
            if client.cluster_state().jobs_completed < 20:
                return []
            client.pause()  # commits the journal: what the scheduler knows is durable
            running = client.list_jobs(status="running", limit=1000).jobs
            if running:
                return running
            client.resume()
            return []

        running = wait_until(paused_with_running_jobs, 60, "paused with jobs running")
        port = run.scheduler.info["grpc"]
        run.kill(run.scheduler, signal.SIGKILL)
        wait_port_free(port)
        # The agents keep their jobs and retry; a new scheduler on the same journal and port.
        run.start_scheduler([*args, "--journal", str(journal), "--out", str(out), "--port", str(port),
                             "--cluster", cluster, "--log-level", "WARNING"])
        summary = client.wait_done(120)
        after = {j.job_id: client.get_job(j.job_id) for j in running}
    # Resumed from the agents' reports: all of them, but for a job whose end its agent reported
    # (and the journal made durable) between the listing and the kill, which needs no resuming.
    assert 0 < summary["live"]["jobs_resumed"] <= len(running)
    for j in running:  # each ends exactly when it would have without the kill, never restarted
        a, o = after[j.job_id], offline[j.job_id]
        assert (a.status, a.restarts) == (spb.JOB_STATUS_COMPLETED, 0)
        assert (a.first_start_s, a.end_s) == (float(o["first_start_s"]), float(o["end_s"])), j.job_id
    assert summary["jobs_completed"] == summary["jobs_total"] == 300
    # Nothing else moved either: the whole replay is still the offline one, byte for byte.
    assert (out / "jobs.csv").read_text() == (ref / "jobs.csv").read_text()


def test_client_ids_cannot_take_trace_ids_even_before_they_arrive(tmp_path: Path) -> None:
    trace_ids = [j.job_id for j in sorted(generate(40, 6).jobs, key=lambda j: j.submit_s)]
    with live(tmp_path, ["--jobs", "40", "--seed", "6", "--speed", "1", "--no-offline-check"], "8x8", 8,
              agents=1) as (_, client):
        wait_until(lambda: client.cluster_state().clock.started, 30, "clock started")
        arrived = {j.job_id for j in client.list_jobs(limit=1000).jobs}
        future = trace_ids[-1]
        assert future not in arrived  # paced at 1x, the last arrival is days away
        for taken in (future, trace_ids[0]):
            with pytest.raises(grpc.RpcError) as e:
                client.submit(num_gpus=1, duration_s=60.0, job_id=taken)
            assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
            assert "a job of the trace" in e.value.details()
        mine = client.submit(num_gpus=1, duration_s=60.0).job_id
        assert mine not in trace_ids
        client.set_speed(None)  # lockstep to the end
        summary = client.wait_done(120)
    assert summary["jobs_total"] == summary["jobs_completed"] == 41
    assert summary["jobs_completed"] + summary["jobs_failed"] + summary["jobs_cancelled"] + \
        summary["jobs_unfinished"] == summary["jobs_total"]
    assert "duplicate_id" not in summary["jobs_filtered"]


def test_held_job_can_be_cancelled(tmp_path: Path) -> None:
    with live(tmp_path, ["--jobs", "0"], "4x8", 4, agents=2) as (run, client):
        wait_until(lambda: client.cluster_state().clock.started, 30, "clock started")
        run.kill(run.agents[1], signal.SIGKILL)
        wait_until(lambda: client.cluster_state().nodes_down == 2, 30, "agent 1's nodes down")
        held = client.submit(num_gpus=32, duration_s=60.0, job_id="needs-every-node")
        assert held.status == spb.JOB_STATUS_PENDING and client.get_job(held.job_id).status == spb.JOB_STATUS_PENDING
        st = client.cluster_state()
        assert (st.jobs_pending, len(st.queue)) == (1, 0)  # held: not in the engine's queue
        assert client.cancel(held.job_id).job_id == held.job_id  # was NOT_FOUND
        wait_until(lambda: client.get_job(held.job_id).status == spb.JOB_STATUS_CANCELLED, 30, "held job cancelled")
        st = client.cluster_state()
        assert (st.jobs_pending, st.jobs_cancelled) == (0, 1)
        _, summary = client.summary()
        assert summary["jobs_cancelled"] == 1


def test_status_json_has_every_field(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with live(tmp_path, ["--jobs", "0"], "2x8", 2, agents=1) as (run, client):
        wait_until(lambda: client.cluster_state().clock.started, 30, "clock started")
        assert analysim(["status", "--scheduler", run.target, "--pause", "--token-file",
                         str(run.token_dir / "client.token")]) == 2  # a client may not pause
        assert capsys.readouterr().err.strip().endswith("PERMISSION_DENIED: a client token may not call Pause "
                                                        "(this token's role may not do that)")
        assert analysim(["status", "--scheduler", run.target, "--json", "--token-file",
                         str(run.token_dir / "client.token")]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["jobs_pending"] == 0 and st["jobs_failed"] == 0 and st["pending_gpu_demand"] == 0
    assert st["clock"]["paused"] is False and st["clock"]["lockstep"] is True
    assert "replay_done" in st and st["queue"] == [] and st["nodes_down"] == 0
    assert st["clock"]["wall_elapsed"].endswith("s")  # a Duration, in protobuf's JSON form


def test_up_with_relative_workdir_and_port_file(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "analysim", "up", "--jobs", "30", "--cluster", "4x8", "--no-progress",
                        "--no-offline-check", "--workdir", "w", "--port-file", "up.json"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=scaled(120))
    assert p.returncode == 0, p.stderr
    info = json.loads((tmp_path / "up.json").read_text())
    assert info["grpc"] > 0 and info["auth"] is True and Path(info["workdir"]) == (tmp_path / "w").resolve()
    assert set(info["agents"]) == {"0", "1"} and (tmp_path / "w" / "tokens" / "agents.tokens").stat().st_mode & 0o077 == 0
    assert "accounted for: 30 completed" in p.stdout
    # Again in the same workdir: a fresh journal, every one of its files (the acknowledgement record too) replaced.
    again = subprocess.run([sys.executable, "-m", "analysim", "up", "--jobs", "10", "--cluster", "4x8", "--no-progress",
                            "--no-offline-check", "--workdir", "w"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=scaled(120))
    assert again.returncode == 0 and "accounted for: 10 completed" in again.stdout, again.stderr
    bad = subprocess.run([sys.executable, "-m", "analysim", "up", "--jobs", "1", "--exit-when-done"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=scaled(60))
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "analysim up: error: analysim up always stops once the replay is done; --exit-when-done is an option of "
        "python -m scheduler_svc serve"]


def test_up_removes_its_temporary_folder_unless_kept(tmp_path: Path) -> None:
    """Its journal and bearer tokens go with it; --keep (or --workdir) keeps them."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    up = [sys.executable, "-m", "analysim", "up", "--jobs", "20", "--cluster", "4x8", "--no-progress",
          "--no-offline-check"]
    p = subprocess.run(up, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=scaled(120))
    assert p.returncode == 0, p.stderr
    assert "(removed at the end: --keep keeps it)" in p.stdout
    assert list(tmp.iterdir()) == []
    p = subprocess.run([*up, "--keep"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=scaled(120))
    assert p.returncode == 0, p.stderr
    (kept,) = tmp.iterdir()
    assert f"logs       {kept}   tokens {kept / 'tokens'}\n" in p.stdout
    assert (kept / "scheduler.log").exists() and (kept / "journal.db").exists()


def test_up_plots_without_matplotlib_fails_before_starting(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from analysim.cli import main\n"
            "sys.exit(main(['up', '--jobs', '5', '--cluster', '2x8', '--plots', '--out', 'o']))")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=scaled(60))
    assert p.returncode == 2 and p.stdout == ""  # no scheduler, no agents started
    assert p.stderr.strip().splitlines() == ["analysim up: error: plots need matplotlib: pip install 'analysim[plots]'"]
    assert list(tmp_path.iterdir()) == []


def test_a_job_after_the_end_reopens_the_run_and_is_written_out(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with live(tmp_path, ["--jobs", "5", "--seed", "1", "--out", str(out), "--no-offline-check"], "4x8", 4,
              agents=1) as (_, client):
        first = client.wait_done(60)
        assert first["jobs_total"] == 5 and (out / "jobs.csv").read_text().count("\n") == 6
        late = client.submit(num_gpus=2, duration_s=30.0, job_id="late").job_id
        wait_until(lambda: client.get_job(late).status == spb.JOB_STATUS_COMPLETED, 30, "the late job done")
        second = client.wait_done(60)
    assert second["jobs_total"] == second["jobs_completed"] == 6 and second["jobs_client"] == 1
    wait_until(lambda: "late," in (out / "jobs.csv").read_text(), 30, "out/ written again with the late job")
    assert json.loads((out / "summary.json").read_text())["jobs_total"] == 6


def test_scheduler_sigkill_without_warning_still_replays_exactly(tmp_path: Path) -> None:
    """No pause first: whatever the last journal commit missed (ends reported to the dead
    scheduler, arrivals after its last commit) comes back from the agents."""
    journal, out, ref = tmp_path / "journal.db", tmp_path / "live", tmp_path / "offline"
    args = ["--jobs", "400", "--seed", "8"]
    assert analysim(["simulate", *args, "--cluster", "16x8", "--out", str(ref), "--no-plots", "--no-progress"]) == 0
    with live(tmp_path, [*args, "--journal", str(journal), "--out", str(out)], "16x8", 16, agents=2) as (run, client):
        st = wait_until(lambda: (s := client.cluster_state()).jobs_completed >= 100 and s, 60, "the replay under way")
        port = run.scheduler.info["grpc"]
        run.kill(run.scheduler, signal.SIGKILL)
        wait_port_free(port)
        assert not st.replay_done and st.jobs_running > 0
        run.start_scheduler([*args, "--journal", str(journal), "--out", str(out), "--port", str(port),
                             "--cluster", "16x8", "--log-level", "WARNING"])
        summary = client.wait_done(120)
    assert summary["live"]["jobs_resumed"] > 0
    assert summary["jobs_completed"] == summary["jobs_total"] == 400
    assert (out / "jobs.csv").read_text() == (ref / "jobs.csv").read_text()
