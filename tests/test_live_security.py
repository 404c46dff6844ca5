"""The scheduler tried as an attacker and a careless operator would: bearer-token roles (a rogue
agent, clients beyond their role), TLS and mutual TLS (plaintext and wrong-CA callers refused;
lockstep identity still holds with auth + mTLS on), one scheduler per journal and per port, and
out-of-range options as one-line errors. Real processes on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from cryptography.x509.oid import ExtendedKeyUsageOID

from analysim._protos.v1 import agent_pb2 as apb
from analysim._protos.v1 import agent_pb2_grpc as apb_grpc
from analysim._protos.v1 import scheduler_pb2 as spb
from analysim._protos.v1 import scheduler_pb2_grpc as spb_grpc
from analysim.cli import main as analysim
from analysim.rpc_status import refusal_of
from analysim.tls import TlsFiles
from analysim.tokens import bearer
from scheduler_svc.auth import new_token
from scheduler_svc.client import SchedulerClient
from scheduler_svc.launcher import ROOT
from tests.polling import scaled
from tests.test_live_helpers import live, sample_sum, scrape, wait_until
from tests.tlscerts import CA


def _register(ch: grpc.Channel, token: str | None, agent_id: str, *nodes: str) -> tuple[grpc.StatusCode, str]:
    """The status code of a Register and its ErrorInfo reason."""
    stub = apb_grpc.AgentServiceStub(ch)
    req = apb.RegisterRequest(agent_id=agent_id, nodes=[apb.NodeInfo(name=n, rack="rack-00", gpu_model="V100", gpus=8)
                                                        for n in nodes])
    try:
        stub.Register(req, timeout=5, metadata=bearer(token))
    except grpc.RpcError as e:
        return e.code(), refusal_of(e)["code"]
    return grpc.StatusCode.OK, ""


def test_rogue_agent_and_clients_beyond_their_role_are_refused(tmp_path: Path) -> None:
    """The issue's attack: a fake agent registering a real agent's id and nodes (it pushed the
    real one off 176 times in 25 s and reported instant completions). Now refused, whatever
    token it holds; the real agents are never lost and the replay is unaffected."""
    with live(tmp_path, ["--jobs", "60", "--seed", "4", "--speed", "50000", "--no-offline-check"], "4x8", 4, agents=2) as (run, client):
        wait_until(lambda: client.cluster_state().clock.started, 30, "clock started")
        codes = {}
        with grpc.insecure_channel(run.target) as ch:
            codes["no token"] = _register(ch, None, "agent-1", "node-0002", "node-0003")
            codes["unknown token"] = _register(ch, new_token(), "agent-1", "node-0002", "node-0003")
            codes["client token"] = _register(ch, run.token("client"), "agent-1", "node-0002", "node-0003")
            codes["operator token"] = _register(ch, run.token("operator"), "agent-1", "node-0002", "node-0003")
            # A stolen agent-0 token: still only agent-0's nodes, and not agent-1's id.
            codes["agent-0 token, agent-1 nodes"] = _register(ch, run.token("agent-0"), "agent-1", "node-0002")
            codes["agent-0 token, agent-1 id"] = _register(ch, run.token("agent-0"), "agent-1", "node-0000")
            # Clients: only their role's methods.
            sched = spb_grpc.SchedulerServiceStub(ch)
            for name, call in (("client pauses", lambda: sched.Pause(spb.PauseRequest(), timeout=5,
                                                                      metadata=bearer(run.token("client")))),
                               ("agent submits", lambda: sched.SubmitJob(spb.SubmitJobRequest(num_gpus=1, duration_s=5),
                                                                         timeout=5, metadata=bearer(run.token("agent-0")))),
                               ("anonymous reads", lambda: sched.GetClusterState(spb.GetClusterStateRequest(), timeout=scaled(5))),
                               ("anonymous watches", lambda: next(sched.WatchEvents(spb.WatchEventsRequest(), timeout=scaled(5)))),
                               ("anonymous agent stream", lambda: next(apb_grpc.AgentServiceStub(ch).Connect(
                                   iter([apb.ConnectRequest(session_id="guess")]), timeout=scaled(5))))):
                with pytest.raises(grpc.RpcError) as e:
                    call()
                codes[name] = e.value.code(), refusal_of(e.value)["code"]
        U, P, BAD = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT
        unauth, role = (U, "unauthenticated"), (P, "wrong_role")
        assert codes == {"no token": unauth, "unknown token": unauth, "client token": role, "operator token": role,
                         "agent-0 token, agent-1 nodes": (P, "foreign_node"),
                         "agent-0 token, agent-1 id": (BAD, "invalid_nodes"),
                         "client pauses": role, "agent submits": role, "anonymous reads": unauth,
                         "anonymous watches": unauth, "anonymous agent stream": unauth}
        with run.client("client") as c:  # a client may submit and read; the operator may pause
            assert c.submit(num_gpus=1, duration_s=60.0).status in (spb.JOB_STATUS_PENDING, spb.JOB_STATUS_RUNNING)
        assert client.pause().paused and not client.resume().paused
        summary = client.wait_done(120)
        m = scrape(run.scheduler.info["host"], run.scheduler.info["metrics"])
        # A real agent process with a token the scheduler does not know stops with one line.
        bad = tmp_path / "bad.token"
        bad.write_text(new_token() + "\n")
        rogue = subprocess.run([sys.executable, "-m", "node_agent", "--scheduler", run.target, "--cluster", "4x8",
                                "--first-node", "2", "--nodes", "2", "--agent-id", "agent-1", "--token-file", str(bad)],
                               cwd=ROOT, capture_output=True, text=True, timeout=scaled(60))
        assert rogue.returncode == 2
        assert rogue.stderr.strip().splitlines()[-1].startswith("analysim agent: error: UNAUTHENTICATED: a bearer token")
    assert summary["live"]["agents_lost"] == 0
    assert summary["jobs_completed"] == summary["jobs_total"] == 61
    refused = {s.labels["reason"]: s.value for s in m["analysim_grpc_calls_refused"] if s.name.endswith("_total")}
    assert refused == {"unauthenticated": 5, "permission_denied": 4, "foreign_node": 1}  # scraped before the process


def test_tls_and_mutual_tls_refuse_plaintext_and_strangers_and_keep_lockstep_identity(tmp_path: Path) -> None:
    ca, stranger = CA(tmp_path, "analysim-ca"), CA(tmp_path, "stranger-ca")
    server, rogue = ca.issue("scheduler"), stranger.issue("rogue")
    args = ["--jobs", "200", "--seed", "3"]
    assert analysim(["simulate", *args, "--cluster", "16x8", "--out", str(tmp_path / "offline"), "--no-plots",
                     "--no-progress"]) == 0
    tls = TlsFiles(ca=ca.files.cert, cert=server.cert, key=server.key)
    mtls = ["--tls-cert", server.cert, "--tls-key", server.key, "--tls-ca", ca.files.cert]
    with live(tmp_path, [*args, *mtls, "--out", str(tmp_path / "live")], "16x8", 16, agents=2, tls=tls) as (run, client):
        assert run.scheduler.info["tls"] and run.scheduler.info["auth"]
        op = run.token("operator")
        attempts = {
            "plaintext": TlsFiles(),
            "server not trusted (wrong CA)": TlsFiles(ca=stranger.files.cert),
            "no client certificate": TlsFiles(ca=ca.files.cert),
            "client certificate of another CA": TlsFiles(ca=ca.files.cert, cert=rogue.cert, key=rogue.key),
        }
        for what, files in attempts.items():
            with SchedulerClient(run.target, timeout_s=5, token=op, tls=files) as c, pytest.raises(grpc.RpcError) as e:
                c.cluster_state()
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE, what
        summary = client.wait_done(120)
    assert summary["fidelity"]["identical_jobs"] == 200
    assert (tmp_path / "live" / "jobs.csv").read_text() == (tmp_path / "offline" / "jobs.csv").read_text()


def _up_mtls(tmp_path: Path, cert, ca: CA) -> subprocess.CompletedProcess:  # noqa: ANN001 — a tlscerts.Issued
    return subprocess.run([sys.executable, "-m", "analysim", "up", "--jobs", "5", "--cluster", "2x8", "--no-progress",
                           "--tls-cert", cert.cert, "--tls-key", cert.key, "--tls-ca", ca.files.cert],
                          cwd=tmp_path, capture_output=True, text=True, timeout=scaled(120))


def test_certificate_purposes_are_checked_at_start(tmp_path: Path) -> None:
    """Mutual TLS under `up` presents the server's certificate as the client's too: a serverAuth-only
    one used to hang 30 s and end in a traceback (the peer's "unsupported certificate purpose")."""
    ca = CA(tmp_path, "ca")
    server_only = ca.issue("server-only", purposes=(ExtendedKeyUsageOID.SERVER_AUTH,))
    started = time.monotonic()
    p = _up_mtls(tmp_path, server_only, ca)
    assert p.returncode == 2 and p.stdout == ""  # nothing started
    assert p.stderr.strip().splitlines() == [
        f"analysim up: error: --tls-cert {server_only.cert}: its extended key usage (serverAuth) does not allow it to "
        "authenticate as a TLS client (mutual TLS): issue it with extendedKeyUsage = serverAuth, clientAuth "
        "(docs/live.md, TLS)"]
    assert time.monotonic() - started < 20
    client_only = ca.issue("client-only", purposes=(ExtendedKeyUsageOID.CLIENT_AUTH,))
    p = _serve(tmp_path, "--tls-cert", client_only.cert, "--tls-key", client_only.key)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"scheduler_svc: error: --tls-cert {client_only.cert}: its extended key usage (clientAuth) does not allow it "
        "to serve TLS: issue it with extendedKeyUsage = clientAuth, serverAuth (docs/live.md, TLS)"]


def test_up_names_a_handshake_that_cannot_succeed_at_once(tmp_path: Path) -> None:
    """A certificate for another host: the client's handshake fails for good; `up` says so in one
    line with the last gRPC error and the scheduler log's last line, not after 30 s of waiting."""
    ca = CA(tmp_path, "ca")
    elsewhere = ca.issue("elsewhere", hosts=("example.org",))
    started = time.monotonic()
    p = _up_mtls(tmp_path, elsewhere, ca)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(err) == 1, p.stderr
    assert err[0].startswith("analysim up: error: scheduler at 127.0.0.1:")
    assert "not serving (waiting would not help): UNAVAILABLE: " in err[0]
    assert "Hostname Verification Check failed" in err[0]
    assert "; the scheduler's log (" in err[0] and "scheduler.log) ends: " in err[0] and " scheduler INFO " in err[0]
    assert time.monotonic() - started < 25


def _serve(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scheduler_svc", "serve", "--jobs", "0", "--cluster", "2x8", *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=scaled(60))


def test_one_scheduler_per_journal_and_per_port(tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    with live(tmp_path, ["--jobs", "0", "--journal", str(journal)], "2x8", 2, agents=1) as (run, client):
        second = _serve(tmp_path, "--journal", str(journal))
        assert second.returncode == 2
        assert second.stderr.strip().splitlines() == [
            f"scheduler_svc: error: --journal {journal} is in use by another scheduler (one scheduler per journal)"]
        port = run.scheduler.info["grpc"]
        third = _serve(tmp_path, "--journal", str(tmp_path / "other.db"), "--port", str(port))
        assert third.returncode == 2
        assert f"cannot listen on 127.0.0.1:{port} for gRPC" in third.stderr.strip().splitlines()[-1]
        # With --jobs 0 the replay ends at once and its end is written out (submissions refused
        # UNAVAILABLE meanwhile, "retry shortly"): on a loaded machine that can outlast the two
        # refused starts above, so wait for it to be done.
        wait_until(lambda: client.summary()[0], what="the empty replay's end written out")
        # All submissions reach the one scheduler (with SO_REUSEPORT, the kernel split them 6/14).
        for i in range(20):
            client.submit(num_gpus=1, duration_s=10.0, job_id=f"c{i}")
        assert client.list_jobs().total == 20


@pytest.mark.parametrize(("argv", "message"), [
    (["--port", "70000"], "argument --port: expected a port from 0 to 65535, got 70000"),
    (["--port", "-1"], "argument --port: expected a port from 0 to 65535, got -1"),
    (["--metrics-port", "70000"], "argument --metrics-port: expected a port from 0 to 65535, got 70000"),
    (["--heartbeat-deadline", "0"], "argument --heartbeat-deadline: must be between 0.05 and 3600 wall seconds"),
    (["--host", "0.0.0.0"], "--host 0.0.0.0: serving beyond loopback needs --agent-token-file"),
    (["--tls-cert", "/nonexistent.crt", "--tls-key", "/nonexistent.key"], "--tls-cert /nonexistent.crt: cannot read"),
    (["--client-token-file", "/nonexistent"], "token file /nonexistent: cannot read"),
])
def test_out_of_range_service_options_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    from scheduler_svc.cli import main as serve_main

    try:
        code = serve_main(["serve", "--jobs", "0", "--cluster", "2x8", *argv])
    except SystemExit as e:  # argparse's usage error
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and message in err[-1] and "Traceback" not in "\n".join(err)


def test_garbage_journal_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from scheduler_svc.cli import main as serve_main

    bad = tmp_path / "j.db"
    bad.write_bytes(b"\x00garbage" * 512)
    assert serve_main(["serve", "--jobs", "0", "--cluster", "2x8", "--journal", str(bad)]) == 2
    assert capsys.readouterr().err.strip() == f"scheduler_svc: error: --journal {bad}: not a usable SQLite journal " \
                                              "(file is not a database)"


@pytest.mark.parametrize(("argv", "message"), [
    (["--gpus", "5000000000", "--duration", "5"], "--gpus must be at least 1 and at most 65536, got 5000000000"),
    (["--gpus", "1", "--duration", "5", "--cpu-milli", "100000000000000000000"], "--cpu-milli must be in 0..1000000000"),
    (["--gpus", "1", "--duration", "1e308"], "--duration must be between 0.001 and 1e+08 s, got 1e+308"),
    (["--gpus", "1", "--duration", "5", "--id", "a b"], "--id must be 1 to 128 characters"),
])
def test_out_of_range_submissions_are_one_line_before_sending(argv: list[str], message: str,
                                                              capsys: pytest.CaptureFixture) -> None:
    assert analysim(["submit", "--scheduler", "127.0.0.1:9", *argv]) == 2  # nothing listens there: not sent
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"analysim submit: error: {message}")


def test_refused_and_allowed_counts_in_metrics(tmp_path: Path) -> None:
    """Operators see refusals on /metrics: a scrape after one refused call of each kind."""
    with live(tmp_path, ["--jobs", "0"], "2x8", 2, agents=1) as (run, _):
        with SchedulerClient(run.target, timeout_s=5) as anonymous, pytest.raises(grpc.RpcError):
            anonymous.pause()
        m = scrape(run.scheduler.info["host"], run.scheduler.info["metrics"])
    assert sample_sum(m["analysim_grpc_calls_refused"], "analysim_grpc_calls_refused_total",
                      reason="unauthenticated") == 1
