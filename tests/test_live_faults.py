"""Faults with real signals: an agent SIGKILLed mid-replay and restarted, an agent frozen past
its heartbeat deadline (SIGSTOP/SIGCONT), the scheduler SIGKILLed and restarted from its SQLite
journal. Every job stays accounted for."""

from __future__ import annotations

import json
import signal
import sqlite3
from contextlib import closing
from pathlib import Path

from analysim._protos.v1 import scheduler_pb2 as spb
from scheduler_svc.launcher import split_nodes
from tests.test_live_helpers import live, sample_sum, scrape, wait_port_free, wait_until


def _agent_has_jobs(client, first: int, count: int) -> bool:  # noqa: ANN001
    st = client.cluster_state(nodes=True)
    return any(g.allocated > 0 for n in st.nodes[first:first + count] for g in n.gpu)


def test_agent_killed_mid_replay_and_restarted(tmp_path: Path) -> None:
    cluster, nodes = "16x4", 16
    args = ["--jobs", "300", "--seed", "3", "--policy", "tiresias", "--preemption", "--checkpoint-interval", "600"]
    with live(tmp_path, args, cluster, nodes, agents=2) as (run, client):
        first, count = split_nodes(nodes, 2)[1]

        def paused_with_jobs_on_agent1() -> bool:
            # Pause, look; if agent 1 happens to be idle, let the replay go on a little.
            client.pause()
            if _agent_has_jobs(client, first, count):
                return True
            client.resume()
            return False

        wait_until(lambda: client.cluster_state().jobs_completed >= 20, 60, "some progress")
        wait_until(paused_with_jobs_on_agent1, 60, "agent 1 running jobs while paused")
        before = client.cluster_state()
        assert not before.replay_done
        run.kill(run.agents[1], signal.SIGKILL)
        st = wait_until(lambda: (s := client.cluster_state()).nodes_down == count and s, 30, "agent 1's nodes down")
        assert st.agents == 1
        client.resume()  # its jobs are requeued at once (from their last checkpoint); the rest go on
        run.start_agent(1, cluster, first, count)
        wait_until(lambda: client.cluster_state().nodes_down == 0, 30, "agent 1's nodes back")
        summary = client.wait_done(120)
    assert summary["jobs_total"] == 300
    assert summary["jobs_completed"] == 300
    assert summary["jobs_failed"] == summary["jobs_cancelled"] == summary["jobs_unfinished"] == 0
    assert summary["restarts"] >= 1  # the killed agent's jobs were requeued and ran again
    assert summary["live"]["agents_lost"] == 1


def test_frozen_agent_misses_heartbeats_then_returns(tmp_path: Path) -> None:
    # Paced: the job keeps running. The default heartbeat deadline (5 s): a tighter one would
    # also declare a live agent lost on a busy machine.
    args = ["--jobs", "0", "--speed", "1"]
    with live(tmp_path, args, "4x8", 4, agents=2) as (run, client):
        wait_until(lambda: client.cluster_state().clock.started, 30, "clock started")
        job = client.submit(num_gpus=8, duration_s=1e8)  # runs "forever" (the bound: 3 years) on one node
        wait_until(lambda: client.get_job(job.job_id).status == spb.JOB_STATUS_RUNNING, 30, "job running")
        node = client.get_job(job.job_id).nodes[0]
        holder = 0 if int(node.split("-")[1]) < 2 else 1

        # Telemetry follows what runs: the job's 8 GPUs busy, the other node's idle — in the
        # scheduler's view (from heartbeats) and on the agent's own /metrics.
        def busy() -> list:
            st = client.cluster_state(nodes=True)
            return [g.telemetry.utilization for n in st.nodes if n.name == node for g in n.gpu]

        utils = wait_until(lambda: (u := busy()) and min(u) > 0 and u, 15, "busy GPUs in the telemetry")
        assert len(utils) == 8 and min(utils) >= 0.5
        agent = scrape(run.agents[holder].info["host"], run.agents[holder].info["metrics"])
        util = {s.labels["node"]: s.value for s in agent["analysim_gpu_utilization_ratio"]}
        power = [s.value for s in agent["analysim_gpu_power_watts"] if s.labels["node"] == node]
        idle_power = [s.value for s in agent["analysim_gpu_power_watts"] if s.labels["node"] != node]
        assert util[node] >= 0.5 and min(power) > max(idle_power)
        run.agents[holder].popen.send_signal(signal.SIGSTOP)
        try:
            st = wait_until(lambda: (s := client.cluster_state()).nodes_down == 2 and s, 60, "frozen agent's nodes down")
            assert st.agents == 1
            # Requeued, and placed again on the other agent's free nodes.
            info = wait_until(lambda: (j := client.get_job(job.job_id)).restarts == 1 and j.status == spb.JOB_STATUS_RUNNING and j,
                              60, "job restarted elsewhere")
            assert info.nodes[0] != node
        finally:
            run.agents[holder].popen.send_signal(signal.SIGCONT)
        wait_until(lambda: client.cluster_state().nodes_down == 0, 30, "nodes back after SIGCONT")


def test_scheduler_killed_and_restarted_loses_no_submitted_job(tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    # Paced at 20,000x: the trace's arrivals take a few wall seconds, long enough to kill it mid-way.
    args = ["--jobs", "300", "--seed", "5", "--speed", "20000", "--journal", str(journal)]
    with live(tmp_path, args, "16x8", 16, agents=2) as (run, client):
        wait_until(lambda: client.cluster_state().clock.started, 30, "clock started")
        injected = [client.submit(num_gpus=2, duration_s=3600.0 * (i + 1), vc="default").job_id for i in range(5)]

        def journalled_completions() -> int:
            with closing(sqlite3.connect(journal)) as db:
                return db.execute("SELECT COUNT(*) FROM jobs WHERE status = 'completed'").fetchone()[0]

        wait_until(lambda: journalled_completions() >= 10, 60, "completions in the journal")
        port = run.scheduler.info["grpc"]
        run.kill(run.scheduler, signal.SIGKILL)
        wait_port_free(port)
        assert run.scheduler.popen.returncode == -signal.SIGKILL
        # What the journal promised survives the crash.
        with closing(sqlite3.connect(journal)) as db:
            ids = {r[0] for r in db.execute("SELECT job_id FROM jobs")}
            ended_before = {job_id: json.loads(rec) for job_id, rec in
                            db.execute("SELECT job_id, record FROM jobs WHERE status = 'completed'")}
        assert set(injected) <= ids
        assert ended_before  # journalled outcomes (at most the last 50 ms of them can be lost)
        # Same port, same journal: the agents reconnect by themselves; finish in lockstep.
        run.start_scheduler([*args[:-2], "--journal", str(journal), "--port", str(port), "--cluster", "16x8",
                             "--speed", "max", "--log-level", "WARNING"])
        wait_until(lambda: client.cluster_state().clock.started, 60, "agents back with the new scheduler")
        summary = client.wait_done(120)
        for job_id in injected:
            assert client.get_job(job_id).status == spb.JOB_STATUS_COMPLETED
        for job_id, rec in ended_before.items():  # kept as they were, not run again
            j = client.get_job(job_id)
            assert (j.status, j.first_start_s, j.end_s) == (spb.JOB_STATUS_COMPLETED, rec["first_start_s"], rec["end_s"])
    assert summary["jobs_total"] == 305
    assert summary["jobs_completed"] == 305
    assert summary["jobs_client"] == 5


def test_injected_job_failures_are_accounted_for(tmp_path: Path) -> None:
    """Agents failing 20 % of launches (deterministic by seed): every job ends completed or failed,
    and failures are reported as such in the summary, the job records and the metrics."""
    with live(tmp_path, ["--jobs", "120", "--seed", "2", "--no-offline-check"], "16x8", 16, agents=2,
              agent_args=["--fail-rate", "0.2", "--seed", "9"]) as (run, client):
        summary = client.wait_done(120)
        failed = client.list_jobs(status="failed", limit=1000)
        sched = scrape(run.scheduler.info["host"], run.scheduler.info["metrics"])
    assert summary["jobs_failed"] > 0 and summary["jobs_completed"] > 0
    assert summary["jobs_completed"] + summary["jobs_failed"] == summary["jobs_total"] == 120
    assert failed.total == summary["jobs_failed"]
    assert all(j.end_s - j.first_start_s < j.duration_s for j in failed.jobs)  # failed part-way
    assert sample_sum(sched["analysim_jobs_failed"], "analysim_jobs_failed_total") == summary["jobs_failed"]


def test_lockstep_agent_stalled_past_its_deadline_comes_back(tmp_path: Path) -> None:
    """SIGSTOP in lockstep with a clock update in flight, past the heartbeat deadline: the
    scheduler closes the stream; on SIGCONT the agent reads the update it had buffered, finds
    its stream over when it answers, and must register again rather than exit."""
    cluster, nodes = "16x4", 16
    args = ["--jobs", "200", "--seed", "4", "--heartbeat-deadline", "1.5", "--no-offline-check"]
    with live(tmp_path, args, cluster, nodes, agents=2) as (run, client):
        first, count = split_nodes(nodes, 2)[1]
        wait_until(lambda: client.cluster_state().jobs_completed >= 10, 60, "some progress")
        client.pause()
        stalled = run.agents[1]
        stalled.popen.send_signal(signal.SIGSTOP)
        try:
            client.resume()  # a clock update (waiting for its Ack) goes to the stopped agent
            wait_until(lambda: client.cluster_state().nodes_down == count, 30, "the stalled agent's nodes down")
        finally:
            stalled.popen.send_signal(signal.SIGCONT)
        wait_until(lambda: client.cluster_state().nodes_down == 0 or not stalled.alive(), 30,
                   "the agent's nodes back")
        assert stalled.alive(), stalled.tail()
        summary = client.wait_done(120)
        assert stalled.alive() and run.agents[1] is stalled
        m = scrape(run.scheduler.info["host"], run.scheduler.info["metrics"])
    assert summary["jobs_completed"] == summary["jobs_total"] == 200
    assert summary["live"]["agents_lost"] == 1
    # Not the offline run any more, and the summary and metrics say so: when, and why.
    diverged = summary["live"]["diverged_from_offline"]
    assert diverged["at_s"] > 0 and "agent agent-1 lost" in diverged["why"] and "requeued" in diverged["why"], diverged
    assert sample_sum(m["analysim_lockstep_diverged"], "analysim_lockstep_diverged") == 1
    assert "Traceback" not in stalled.log.read_text()
