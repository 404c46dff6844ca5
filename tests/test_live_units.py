"""The live emulator's pure parts: the journal's round trip, node splitting, speed parsing, the
agent's end-time arithmetic (the engine's own) and its deterministic telemetry."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysim._protos.v1 import agent_pb2 as apb
from analysim.clusters import parse_cluster
from analysim.core.engine import Engine, EngineConfig
from analysim.core.job import JobSpec, JobStatus
from analysim.core.policies import build_policy
from analysim.errors import UserError
from analysim.tokens import bearer
from node_agent.agent import Agent
from node_agent.telemetry import gpu_sample
from scheduler_svc.auth import AGENT, CLIENT, Authenticator
from scheduler_svc.bounds import job_problem
from scheduler_svc.cli import parse_speed
from scheduler_svc.journal import Journal, _read_acks
from scheduler_svc.launcher import ROOT, split_nodes


def test_journal_round_trip_and_group_commit(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    j = Journal(path, group_s=3600)
    specs = [JobSpec("a", 1.5, 10.0, 2, gpu_models=("V100",), vc="x", user="u"), JobSpec("b", 2.0, 0.0, 1, gpu_milli=250)]
    j.add_jobs(specs, "trace")
    j.commit()
    j.ended("a", "completed", {"job_id": "a", "end_s": 11.5})
    j.set_meta("clock", 11.5)
    assert j.due() is False  # the group is younger than group_s: not committed yet
    with pytest.raises(UserError, match="in use by another scheduler"):
        Journal(path)  # one scheduler per journal
    j.db.close()  # a crash: the open group is lost, the committed submissions are not
    os.close(j._lock_fd)  # noqa: SLF001 — and the kernel drops the lock with the process
    j2 = Journal(path)
    rows = j2.jobs()
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == [("a", "trace", specs[0], "pending", None),
                                                               ("b", "trace", specs[1], "pending", None)]
    assert j2.meta() == {"transactions": 1}  # the commit of the two jobs; not the open group's
    j2.ended("b", "cancelled", {"job_id": "b"})
    j2.close()
    assert Journal(path).jobs()[1][3:] == ("cancelled", {"job_id": "b"})


def test_a_file_that_is_not_a_journal_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "garbage.db"
    bad.write_bytes(b"not a database" * 100)
    with pytest.raises(UserError, match=r"garbage.db: not a usable SQLite journal"):
        Journal(bad)
    with pytest.raises(UserError, match="cannot open"):
        Journal(tmp_path / "no" / "such" / "dir.db")


def test_split_nodes() -> None:
    assert split_nodes(135, 2) == [(0, 68), (68, 67)]
    assert split_nodes(16, 2) == [(0, 8), (8, 8)]
    assert split_nodes(3, 5) == [(0, 1), (1, 1), (2, 1)]
    assert sum(n for _, n in split_nodes(1000, 7)) == 1000


def test_parse_speed() -> None:
    assert parse_speed("max") is None
    assert parse_speed("2500") == 2500.0
    for bad in ("0", "-1", "fast", "nan", "inf"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_speed(bad)


def test_agent_end_times_are_the_engines() -> None:
    """Odd floats on purpose: the agent's end must equal Engine.expected_end bit for bit."""
    cluster = parse_cluster("2x8")
    eng = Engine(cluster, build_policy("fifo"), EngineConfig(predict_completions=False, relaxed_locality=True))
    eng.submit(JobSpec("j", 0.1, 1234.5678901, 8))
    eng.run(0.1)
    job = eng.jobs["j"]
    assert job.status is JobStatus.RUNNING
    agent = Agent("a", list(cluster.nodes))
    slots = [apb.GpuSlots(node="node-0000", gpus=list(range(8)))]
    la = apb.Launch(job_id="j", launch_id=1, slots=slots, remaining_s=job.remaining_s, overhead_s=job.overhead_s,
                    slowdown=job.placement.slowdown, end_s=eng.expected_end(job))
    started = agent.handle(apb.ConnectResponse(commands=[apb.Command(time_s=job.last_start_s, launch=la)]))
    assert [(e.kind, e.time_s) for e in started.events] == [(apb.JobEvent.KIND_STARTED, 0.1)]
    assert agent.lookahead() == eng.expected_end(job)
    # With an overhead and a slowdown, the same expression as the engine's _launch.
    t, over, slow = 7.77, 0.3, 1.1
    la2 = apb.Launch(job_id="j", launch_id=2, slots=slots, remaining_s=job.remaining_s, overhead_s=over, slowdown=slow,
                     end_s=t + over + job.remaining_s * slow)
    agent.handle(apb.ConnectResponse(commands=[apb.Command(time_s=t, launch=la2)]))
    end = agent.lookahead()
    assert end == t + over + job.remaining_s * slow
    # Lockstep: an update to just before the end reports nothing; to the end, the completion.
    before = agent.handle(apb.ConnectResponse(clock=apb.ClockUpdate(time_s=math.nextafter(end, 0), lockstep=True, step=1)))
    assert [e.kind for e in before.events] == [] and before.ack.lookahead_s == end
    at = agent.handle(apb.ConnectResponse(clock=apb.ClockUpdate(time_s=end, lockstep=True, step=2)))
    assert [(e.kind, e.job_id, e.launch_id, e.time_s) for e in at.events] == [(apb.JobEvent.KIND_FINISHED, "j", 2, end)]
    assert at.ack.lookahead_s == math.inf and agent.used["node-0000"] == [0] * 8


def test_preempted_then_relaunched_job_reports_only_its_last_launch() -> None:
    cluster = parse_cluster("2x8")
    agent = Agent("a", list(cluster.nodes))

    def launch(lid: int, node: str, t: float) -> apb.Command:
        return apb.Command(time_s=t, launch=apb.Launch(job_id="j", launch_id=lid, remaining_s=100.0, slowdown=1.0,
                                                       slots=[apb.GpuSlots(node=node, gpus=[0, 1])]))

    agent.handle(apb.ConnectResponse(commands=[launch(1, "node-0000", 0.0)]))
    agent.handle(apb.ConnectResponse(commands=[apb.Command(time_s=50.0, preempt=apb.Preempt(job_id="j", checkpoint=True)),
                                                launch(2, "node-0001", 50.0)]))
    assert agent.used["node-0000"][:2] == [0, 0] and agent.used["node-0001"][:2] == [1000, 1000]
    out = agent.handle(apb.ConnectResponse(clock=apb.ClockUpdate(time_s=1000.0, lockstep=True, step=1)))
    fin = [(e.launch_id, e.time_s) for e in out.events if e.kind == apb.JobEvent.KIND_FINISHED]
    assert fin == [(2, 150.0)]


def test_telemetry_is_deterministic_and_plausible() -> None:
    a = gpu_sample(1, "node-0000", 3, "V100", "job-1", 1.0, 1000.0)
    assert a == gpu_sample(1, "node-0000", 3, "V100", "job-1", 1.0, 1000.0)
    assert a != gpu_sample(2, "node-0000", 3, "V100", "job-1", 1.0, 1000.0)
    util, mem, total, power, temp = a
    assert 0.5 <= util <= 1.0 and 0 < mem <= total == 32 * 2**30 and 40 < power <= 300 and 30 < temp < 90
    idle = gpu_sample(1, "node-0000", 3, "V100", "", 0.0, 1000.0)
    assert idle[0] == 0.0 and idle[3] == 40.0 and idle[1] < mem
    half = gpu_sample(1, "node-0000", 3, "T4", "job-1", 0.5, 1000.0)
    assert half[0] < util and half[3] <= 70.0


def test_up_picks_the_cluster_simulate_picks() -> None:
    """Without --cluster, `analysim up` must replay on the cluster `analysim simulate` would use."""
    from analysim.cli import build_parser
    from analysim.cli.up import cluster_spec
    from analysim.inputs import load_inputs

    parser = build_parser()
    data = ROOT / "tests" / "data"
    for extra in ([], ["--trace", str(data / "philly_small.csv")], ["--trace", str(data / "helios_small.csv")]):
        up = parser.parse_args(["up", *extra])
        sim = parser.parse_args(["simulate", *extra])
        assert parse_cluster(cluster_spec(up)).name == load_inputs(sim)[1].name, extra


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_accepted_client_ids_survive_csv_and_logs(job_id: str) -> None:
    """Whatever id the bounds accept reads back from jobs.csv unchanged and has no control character."""
    import csv
    import io

    problem = job_problem(job_id, 1, 0, 60.0, "vc", "", (), 0, 0)
    if problem is None and job_id:
        buf = io.StringIO()
        csv.writer(buf).writerow([job_id, "x"])
        assert next(csv.reader(io.StringIO(buf.getvalue()))) == [job_id, "x"]
        assert job_id.isprintable() and len(job_id) <= 128 and " " not in job_id


@settings(max_examples=100, deadline=None)
@given(token=st.text(alphabet=st.characters(codec="ascii", exclude_categories=("Cc", "Zs")), min_size=16, max_size=64),
       presented=st.text(max_size=80))
def test_a_token_is_known_exactly(token: str, presented: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("tokens") / "client.token"
    path.write_text(token.replace("#", "x") + "\n")
    auth = Authenticator()
    auth.add_file(CLIENT, path)
    real = token.replace("#", "x")
    assert auth.identify(bearer(real)).role == CLIENT
    assert (auth.identify(bearer(presented)) is not None) == (presented == real)
    assert auth.identify(()) is None


def test_agent_token_node_ranges(tmp_path: Path) -> None:
    order = [f"node-{i:04d}" for i in range(10)]
    path = tmp_path / "agents.tokens"
    path.write_text("# agents\n" + "a" * 20 + " node-0002..node-0004,node-0009\n" + "b" * 20 + "\n")
    auth = Authenticator()
    auth.add_file(AGENT, path, order)
    assert auth.identify(bearer("a" * 20)).nodes == {"node-0002", "node-0003", "node-0004", "node-0009"}
    assert auth.identify(bearer("b" * 20)).nodes is None  # a bare token: any node
    path.write_text("c" * 20 + " node-0002..node-0042\n")
    with pytest.raises(UserError, match=r"line 1: node 'node-0042' is not in the cluster"):
        Authenticator().add_file(AGENT, path, order)
    path.write_text("short\n")
    with pytest.raises(UserError, match="at least 16 characters"):
        Authenticator().add_file(CLIENT, path)


def test_the_acknowledgement_record_claims_only_committed_jobs(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    j = Journal(path)
    for i in range(3):
        j.add_client_job(JobSpec(f"c-{i}", 0.0, 60.0, 1))
    acks = Path(f"{path}-acks")
    with acks.open("ab") as f:  # a group's lines written, its commit never made; a line cut short
        f.write(f'{j._tx + 1} "ghost"\n{j._tx} "cut'.encode())  # noqa: SLF001
    record, problem = _read_acks(acks)
    assert problem is None and record == {"transactions": j._tx, "client_jobs": 3,  # noqa: SLF001
                                          "since_checkpoint": ["c-0", "c-1", "c-2"]}
    j._checkpoint()  # noqa: SLF001 — the WAL folded into the file: the list starts again
    assert _read_acks(acks)[0]["since_checkpoint"] == []
    j.close()
