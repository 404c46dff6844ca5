"""Clients against a real scheduler: job injection through the Python client and the CLI,
events, cancel, clock control, invalid jobs (INVALID_ARGUMENT), a misbehaving agent (logged and
ignored), and a short paced replay whose summary reports its divergence from the offline run."""

from __future__ import annotations

import math
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from analysim._protos.v1 import agent_pb2 as apb
from analysim._protos.v1 import agent_pb2_grpc as apb_grpc
from analysim._protos.v1 import scheduler_pb2 as spb
from analysim.cli import main as analysim
from analysim.rpc_status import refusal_of
from analysim.tokens import bearer
from scheduler_svc.contract import word
from tests.test_live_helpers import live, sample_sum, scrape, wait_until
from tests.threads import CheckedThread


def test_injection_events_cancel_and_clock_control(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with live(tmp_path, ["--jobs", "0"], "4x8", 4, agents=1) as (run, client):
        wait_until(lambda: client.cluster_state().clock.started, 30, "clock started")
        events: list = []
        stream = client.watch()
        def read() -> None:
            try:
                for r in stream:
                    events.append(r.event)
            except grpc.RpcError as e:  # cancelled at the end of the test
                assert e.code() == grpc.StatusCode.CANCELLED

        reader = CheckedThread(read, name="watch reader")
        reader.start()
        wait_until(lambda: events and events[0].kind == spb.EVENT_KIND_WATCHING, 30, "the watch handshake")
        # Lockstep with nothing else to do: each job runs its whole duration at once in virtual time.
        ids = [client.submit(num_gpus=g, duration_s=d, user="alice").job_id for g, d in ((1, 60.0), (8, 3600.0), (4, 1.0))]
        wait_until(lambda: all(client.get_job(i).status == spb.JOB_STATUS_COMPLETED for i in ids), 30, "injected jobs done")
        for i, d in zip(ids, (60.0, 3600.0, 1.0), strict=True):
            j = client.get_job(i)
            assert j.end_s - j.first_start_s == d and j.source == spb.JOB_SOURCE_CLIENT
        assert client.list_jobs(status="completed").total == 3

        assert analysim(["submit", "--scheduler", run.target, "--token-file", str(run.token_dir / "client.token"), "--gpus", "2", "--duration", "120", "--id", "cli-job"]) == 0
        assert "cli-job" in capsys.readouterr().out
        wait_until(lambda: client.get_job("cli-job").status == spb.JOB_STATUS_COMPLETED, 30, "CLI job done")

        # Paced at 1x, a long job stays running: cancel it.
        client.set_speed(1.0)
        long = client.submit(num_gpus=1, duration_s=10.0**6).job_id
        wait_until(lambda: client.get_job(long).status == spb.JOB_STATUS_RUNNING, 30, "long job running")

        def on_a_gpu(job_id: str) -> bool:  # the agent's dcgm-exporter series name the job as the GPU's pod
            agent = scrape(run.agents[0].info["host"], run.agents[0].info["metrics"])
            return any(s.labels.get("pod") == job_id for s in agent["DCGM_FI_DEV_GPU_UTIL"])

        wait_until(lambda: on_a_gpu(long), 30, "the agent to run the long job")
        paused = client.pause()
        assert paused.paused and not paused.lockstep
        assert client.cancel(long).job_id == long
        client.resume()
        wait_until(lambda: client.get_job(long).status == spb.JOB_STATUS_CANCELLED, 30, "long job cancelled")
        wait_until(lambda: not on_a_gpu(long), 30, "the agent to stop the cancelled job (a Kill)")
        assert client.set_speed(None).lockstep
        with pytest.raises(grpc.RpcError) as e:
            client.cancel("no-such-job")
        assert e.value.code() == grpc.StatusCode.NOT_FOUND

        assert analysim(["status", "--scheduler", run.target, "--nodes", "--token-file",
                         str(run.token_dir / "client.token")]) == 0
        out = capsys.readouterr().out
        assert "lockstep" in out and "node-0003" in out and "5 submitted" in out
        wait_until(lambda: any(e.kind == spb.EVENT_KIND_CANCEL and e.job_id == long for e in events), 30, "cancel event")
        stream.cancel()
        reader.join()  # what the reader thread asserted fails the test here
        kinds = {(word(spb.EventKind, e.kind), e.job_id) for e in events}
        for i in ids:
            assert {("submit", i), ("launch", i), ("complete", i)} <= kinds
        sched = scrape(run.scheduler.info["host"], run.scheduler.info["metrics"])
        assert sample_sum(sched["analysim_jobs_submitted"], "analysim_jobs_submitted_total", source="client") == 5
        assert sample_sum(sched["analysim_jobs_cancelled"], "analysim_jobs_cancelled_total") == 1


INVALID = [
    (dict(num_gpus=2, duration_s=-5.0, vc="ee9e8c"), "duration_s must be"),
    (dict(num_gpus=2, duration_s=math.inf, vc="ee9e8c"), "duration_s must be"),
    (dict(num_gpus=0, duration_s=5.0, vc="ee9e8c"), "num_gpus must be at least 1"),
    (dict(num_gpus=2, duration_s=5.0, vc="nope"), "unknown virtual cluster 'nope'"),
    # No vc on a cluster that names its VCs: required, with the list (not "unknown 'default'").
    (dict(num_gpus=2, duration_s=5.0), "vc is required on this cluster; its virtual clusters: ee9e8c, 7f04ca, b436b2,"),
    (dict(num_gpus=2, duration_s=5.0, vc="ee9e8c", gpu_models=["Z80"]), "unknown GPU model 'Z80'"),
    (dict(num_gpus=600, duration_s=5.0, vc="ee9e8c"), "more than the cluster can ever hold"),
    (dict(num_gpus=2, duration_s=5.0, vc="ee9e8c", gpu_milli=500), "gpu_milli"),
    # Bounds (docs/live.md): nothing a CSV cell, a log line or the replay's end could choke on.
    (dict(num_gpus=1, duration_s=5.0, vc="ee9e8c", job_id="a\x00b"), "job_id must be 1 to 128 characters"),
    (dict(num_gpus=1, duration_s=5.0, vc="ee9e8c", job_id="x" * 129), "job_id must be 1 to 128 characters"),
    (dict(num_gpus=1, duration_s=5.0, vc="ee9e8c", user="u" * (1 << 20)), "user must be at most 64"),
    (dict(num_gpus=1, duration_s=5.0, vc="ee9e8c", user="a\nb"), "user must be at most 64 printable"),
    (dict(num_gpus=1, duration_s=0.0, vc="ee9e8c"), "duration_s must be between 0.001 and 1e+08"),
    (dict(num_gpus=1, duration_s=5e-324, vc="ee9e8c"), "duration_s must be between"),
    (dict(num_gpus=1, duration_s=1e308, vc="ee9e8c"), "duration_s must be between"),
    (dict(num_gpus=70_000, duration_s=5.0, vc="ee9e8c"), "num_gpus must be at least 1 and at most 65536"),
    (dict(num_gpus=1, duration_s=5.0, vc="ee9e8c", cpu_milli=10**12), "cpu_milli must be in 0..1000000000"),
]


def _violations(e: grpc.RpcError) -> list[str]:
    out = []
    for d in rpc_status.from_call(e).details:
        if d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            d.Unpack(br)
            out += [v.field for v in br.field_violations]
    return out


def test_invalid_jobs_are_refused_with_invalid_argument(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # The philly preset: 64 nodes, 15 VCs with quotas (no "default" VC).
    with live(tmp_path, ["--jobs", "0"], "philly", 64, agents=1) as (run, client):
        for kw, message in INVALID:
            with pytest.raises(grpc.RpcError) as e:
                client.submit(**kw)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, kw
            assert message in e.value.details(), (kw, e.value.details())
            # The rich status names the field the refusal is about (ErrorInfo and BadRequest).
            field = next((f for start, f in (("unknown virtual", "vc"), ("unknown GPU", "gpu_models"),
                                              ("more than the", "num_gpus")) if message.startswith(start)),
                         message.split()[0])
            assert refusal_of(e.value)["field"] == field, (kw, refusal_of(e.value))
            assert _violations(e.value) == [field]
        ok = client.submit(num_gpus=8, duration_s=5.0, vc="ee9e8c", job_id="fine")
        with pytest.raises(grpc.RpcError) as e:
            client.submit(num_gpus=8, duration_s=5.0, vc="ee9e8c", job_id="fine")
        assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert refusal_of(e.value) == {"code": "duplicate_id", "message": "job 'fine' already exists (a job)",
                                       "field": "job_id"}
        assert analysim(["submit", "--scheduler", run.target, "--gpus", "4", "--duration", "-1", "--vc", "ee9e8c"]) == 2
        assert "--duration must be between 0.001 and 1e+08 s, got -1" in capsys.readouterr().err
        token = ["--token-file", str(run.token_dir / "client.token")]
        assert analysim(["submit", "--scheduler", run.target, *token, "--gpus", "4", "--duration", "5"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "vc is required on this cluster" in err[0] and err[0].endswith("(give --vc)"), err
        with pytest.raises(grpc.RpcError) as e:
            client.set_speed(-3.0)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert client.list_jobs().total == 1 and ok.job_id == "fine"
        sched = scrape(run.scheduler.info["host"], run.scheduler.info["metrics"])
        # The CLI's own bounds check refused the -1 before sending it.
        assert sample_sum(sched["analysim_jobs_rejected"], "analysim_jobs_rejected_total") == len(INVALID) + 2


def _nodes(*specs: tuple[str, int, str]) -> list[apb.NodeInfo]:
    return [apb.NodeInfo(name=n, rack="rack-00", gpu_model=m, gpus=g, cpu_milli=80000, memory_mib=1 << 19)
            for n, g, m in specs]


def test_misbehaving_agent_is_logged_and_ignored(tmp_path: Path) -> None:
    """A hand-driven agent (a real gRPC client) that registers wrong nodes, reports a job it was
    never given and GPU states that cannot be: refused or ignored, and the scheduler carries on."""
    with live(tmp_path, ["--jobs", "0", "--speed", "1"], "2x8", 2, agents=0) as (run, client):
        with grpc.insecure_channel(run.target) as ch:
            stub = apb_grpc.AgentServiceStub(ch)
            md = bearer(run.token("agent-0"))
            for bad, message in ((_nodes(("node-0009", 8, "V100")), "not part of cluster"),
                                 (_nodes(("node-0000", 4, "V100")), "registered with 4xV100"),
                                 (_nodes(("node-0000", 8, "V100"), ("node-0000", 8, "V100")), "registered twice")):
                with pytest.raises(grpc.RpcError) as e:
                    stub.Register(apb.RegisterRequest(agent_id="rogue", nodes=bad), timeout=5, metadata=md)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in e.value.details()
            reg = stub.Register(apb.RegisterRequest(agent_id="rogue", nodes=_nodes(("node-0000", 8, "V100"),
                                                                                    ("node-0001", 8, "V100"))), timeout=5,
                                metadata=md)
            impossible = apb.Heartbeat(nodes=[
                apb.NodeTelemetry(node="node-0000", gpus=[apb.GpuState(index=0, utilization=5.0, memory_used_bytes=1,
                                                                       memory_total_bytes=2)]),
                apb.NodeTelemetry(node="node-0001", gpus=[apb.GpuState(index=1, utilization=0.5, memory_used_bytes=9,
                                                                       memory_total_bytes=2)]),
                apb.NodeTelemetry(node="node-0001", gpus=[apb.GpuState(index=12, utilization=0.5)]),
                apb.NodeTelemetry(node="node-0005", gpus=[apb.GpuState(index=0)]),
            ])
            msgs = [
                apb.ConnectRequest(session_id=reg.session_id),
                apb.ConnectRequest(events=[apb.JobEvent(kind=apb.JobEvent.KIND_FINISHED, job_id="ghost", launch_id=7,
                                                      time_s=1.0)]),
                apb.ConnectRequest(heartbeat=impossible),
                apb.ConnectRequest(ack=apb.Ack(step=999, time_s=-1.0, lookahead_s=math.nan)),
            ]
            call = stub.Connect(iter(msgs), metadata=md)
            first = next(call)  # the clock: the session is live
            assert first.clock.speed == 1.0
            wait_until(lambda: _ignored(run) >= {"unknown_job": 1, "impossible_gpu_state": 3, "unknown_node": 1}.items(),
                       30, "reports ignored")
            call.cancel()
        # Still serving, clients unaffected.
        job = client.submit(num_gpus=1, duration_s=5.0)
        assert client.get_job(job.job_id).status in (spb.JOB_STATUS_PENDING, spb.JOB_STATUS_RUNNING)


def _ignored(run) -> set:  # noqa: ANN001
    m = scrape(run.scheduler.info["host"], run.scheduler.info["metrics"]).get("analysim_agent_reports_ignored", [])
    got = {s.labels["reason"]: int(s.value) for s in m if s.name.endswith("_total")}
    return {(k, v) for k, v in got.items()} | {(k, n) for k, v in got.items() for n in range(1, v)}


def test_paced_replay_reports_its_divergence(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["--jobs", "80", "--seed", "4", "--speed", "300000", "--paced-lag", "0.05", "--out", str(out)]
    with live(tmp_path, args, "8x8", 8, agents=2) as (_, client):
        summary = client.wait_done(120)
    assert summary["live"]["mode"] == "paced" and summary["live"]["speed"] == 300000
    assert summary["jobs_completed"] == summary["jobs_total"] == 80
    fid = summary["fidelity"]
    assert fid["compared_jobs"] == 80
    assert 0 <= fid["mean_abs_delta_jct_s"] <= fid["max_abs_delta_jct_s"] < math.inf
    assert fid["divergence_ratio"] == pytest.approx(fid["mean_abs_delta_jct_s"] / fid["offline_avg_jct_s"])
    assert (out / "summary.json").exists() and (out / "jobs.csv").read_text().count("\n") == 81
