"""Contract details under hostile input, on real servers: malformed protobuf bytes answer
INVALID_ARGUMENT without internals (scheduler and gateway); every id field has one bound,
applied on every RPC that takes one, never echoed back whole; token files rotated under a
running scheduler take effect at once (and on SIGHUP, which no longer ends it)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from analysim._protos.v1 import scheduler_pb2 as spb
from analysim._protos.v1 import scheduler_pb2_grpc as spb_grpc
from analysim.rpc_status import refusal_of
from analysim.tokens import bearer, read_token
from scheduler_svc.client import SchedulerClient
from scheduler_svc.launcher import ROOT
from tests.test_gateway_helpers import running_gateway
from tests.test_live_helpers import live, wait_until

GARBAGE = b"\xff\xff\xff\xff\x0f\x0a\x99"  # not a protobuf message: a varint that never ends


def _raw(channel: grpc.Channel, method: str, data: bytes, token: str | None = None) -> grpc.RpcError:
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as e:
        call(data, timeout=10, metadata=(("authorization", f"Bearer {token}"),) if token else ())
    return e.value


def _is_plain_refusal(e: grpc.RpcError) -> bool:
    d = e.details() or ""
    return "Error" not in d and "Exception" not in d and "<class" not in d and len(d) < 300


def test_scheduler_contract_under_hostile_input(tmp_path: Path) -> None:
    with live(tmp_path, ["--jobs", "0"], "4x8", 4, agents=1) as (run, client):
        token = run.token("client")
        with grpc.insecure_channel(run.target) as ch:
            for method in ("SubmitJob", "GetJob", "CancelJob", "ListJobs"):
                e = _raw(ch, f"/analysim.v1.SchedulerService/{method}", GARBAGE, token)
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and _is_plain_refusal(e), (method, e)
                assert refusal_of(e)["code"] == "malformed_request"
            # Authentication still answers first.
            assert _raw(ch, "/analysim.v1.SchedulerService/SubmitJob", GARBAGE).code() == grpc.StatusCode.UNAUTHENTICATED
            # A streaming method: the agents' Connect.
            conn = ch.stream_stream("/analysim.v1.AgentService/Connect", request_serializer=None,
                                    response_deserializer=None)  # fmt: skip
            with pytest.raises(grpc.RpcError) as e:
                list(conn(iter([GARBAGE]), timeout=10, metadata=(("authorization", f"Bearer {run.token('agent-0')}"),)))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and _is_plain_refusal(e.value)
        # One id bound on every RPC that takes one: no path, no 10 MB id echoed back.
        for bad in ("a/../../b", "x" * 10_000_000, "-lead", ""):
            for call in (client.get_job, client.cancel):
                with pytest.raises(grpc.RpcError) as e:
                    call(bad)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (bad[:20], e.value.code())
                assert len(e.value.details()) < 300 and "job_id must be" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            client.submit(num_gpus=1, duration_s=10.0, job_id="a/../../b")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        ok = client.submit(num_gpus=1, duration_s=10.0, job_id="ok-1.a:b@c+d").job_id
        assert client.get_job(ok).job_id == ok
        # ListJobs: a status the enum does not have, a 10 MB vc: INVALID_ARGUMENT, no internals.
        with grpc.insecure_channel(run.target) as ch:
            stub = spb_grpc.SchedulerServiceStub(ch)
            for field, req in (("status", spb.ListJobsRequest(status=99)),
                               ("vc", spb.ListJobsRequest(vc="x" * 10_000_000))):
                with pytest.raises(grpc.RpcError) as e:
                    stub.ListJobs(req, timeout=10, metadata=bearer(token))
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and _is_plain_refusal(e.value), field
                assert refusal_of(e.value)["code"] == "out_of_bounds" and refusal_of(e.value).get("field") == field


def test_tokens_rotated_under_a_running_scheduler_take_effect_at_once(tmp_path: Path) -> None:
    cluster = "4x8"
    with live(tmp_path, ["--jobs", "0"], cluster, 4, agents=1) as (run, client):
        old = run.token("client")
        assert run.token_dir is not None
        tokens = subprocess.run([sys.executable, "-m", "scheduler_svc", "tokens", "--cluster", cluster, "--agents", "1",
                                 "--out", str(run.token_dir), "--new"], cwd=ROOT, capture_output=True, text=True)  # fmt: skip
        assert tokens.returncode == 0, tokens.stderr
        new = read_token(run.token_dir / "client.token")
        assert new != old
        with SchedulerClient(run.target, token=new) as fresh:
            assert fresh.submit(num_gpus=1, duration_s=10.0).job_id  # its first call: no window

        def old_refused() -> bool:
            with SchedulerClient(run.target, token=old) as stale:
                try:
                    stale.cluster_state()
                except grpc.RpcError as e:
                    return e.code() == grpc.StatusCode.UNAUTHENTICATED
            return False

        wait_until(old_refused, 10, "the old client token refused")
        # SIGHUP re-reads the files (and is logged); the scheduler goes on serving.
        run.scheduler.popen.send_signal(signal.SIGHUP)
        wait_until(lambda: "token files on SIGHUP" in run.scheduler.log.read_text(), 10, "the SIGHUP logged")
        assert run.scheduler.alive()
        with SchedulerClient(run.target, token=new) as fresh:
            assert fresh.cluster_state().clock.started


def test_a_token_file_that_is_not_utf8_keeps_the_previous_tokens(tmp_path: Path) -> None:
    with live(tmp_path, ["--jobs", "0"], "4x8", 4, agents=1) as (run, client):
        assert run.token_dir is not None
        (run.token_dir / "client.token").write_bytes(b"\xff\xfe not UTF-8\n")
        run.scheduler.popen.send_signal(signal.SIGHUP)
        wait_until(lambda: "not re-read" in run.scheduler.log.read_text(), 10, "the unreadable file logged")
        assert client.submit(num_gpus=1, duration_s=10.0).job_id  # the previous client token still works
        # (and the agent's: it registers and the lockstep clock starts, however slow the machine)
        wait_until(lambda: client.cluster_state().clock.started, 60, "the agent registered, the clock started")
    log = run.scheduler.log.read_text()
    assert "not UTF-8 text" in log and "the previous tokens stay valid" in log and "Traceback" not in log, log


def test_token_files_are_replaced_by_rename(tmp_path: Path) -> None:
    # A reader holding the old file (a scheduler re-reading it) sees all of it, never a truncated one.
    args = [sys.executable, "-m", "scheduler_svc", "tokens", "--cluster", "4x8", "--agents", "2",
            "--out", str(tmp_path / "t")]
    assert subprocess.run(args, cwd=ROOT, capture_output=True).returncode == 0
    old = (tmp_path / "t" / "client.token").read_text()
    with (tmp_path / "t" / "client.token").open() as held:
        assert subprocess.run([*args, "--new"], cwd=ROOT, capture_output=True).returncode == 0
        assert held.read() == old
    new = tmp_path / "t" / "client.token"
    assert new.read_text() != old and new.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == sorted(
        ["agents.tokens", "agent-0.token", "agent-1.token", "client.token", "operator.token"])  # nothing staged left


def test_gateway_answers_malformed_bytes_with_invalid_argument(tmp_path: Path) -> None:
    with running_gateway(tmp_path / "s.db") as g, grpc.insecure_channel(g.thread.grpc_target) as ch:
        key = g.new_key("alice")
        for method in ("/analysim.v1.PredictionService/Predict", "/analysim.v1.PredictionService/GetUsage"):
            e = _raw(ch, method, GARBAGE, key)
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and _is_plain_refusal(e), (method, e.details())
            assert refusal_of(e)["code"] == "malformed_request"
