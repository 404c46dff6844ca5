"""The container way of running the services: ANALYSIM_* environment variables (flags win,
``*_FILE`` secrets), logs on stdout, /healthz and /readyz on each metrics port, and the
metrics every service exports (process_*, analysim_build_info, the scheduler's gRPC server
metrics, the gateway's unauthenticated /metrics whose extraction series go with a revoked
user or a deleted group). Real processes configured by their environment alone."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysim.envconfig import apply_env, env_name
from mlaas_monitor.monitor.attacks import ApiClient
from scheduler_svc.client import SchedulerClient
from tests.polling import scaled, wait_until
from tests.procs import started
from tests.test_gateway_helpers import ADMIN_KEY
from tests.test_live_helpers import sample_sum, scrape

ROOT = Path(__file__).resolve().parent.parent


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--metrics-port", type=int, default=0)
    s.add_argument("--db", required=True)
    s.add_argument("--dry-run", action="store_true")
    s.add_argument("--mode", choices=["a", "b"], default="a")
    s.add_argument("--key", action="append", default=[])
    s.add_argument("--token")
    s.add_argument("--admin-key-file")
    return p


def parse(env: dict[str, str], *argv: str) -> argparse.Namespace:
    p = parser()
    apply_env(p, env)
    return p.parse_args(["serve", *argv])


def test_env_names_and_precedence(tmp_path: Path) -> None:
    assert env_name("--metrics-port") == "ANALYSIM_METRICS_PORT"
    env = {"ANALYSIM_METRICS_PORT": "9100", "ANALYSIM_DB": "/data/s.db", "ANALYSIM_DRY_RUN": "true",
           "ANALYSIM_KEY": "k1, k2", "ANALYSIM_MODE": "b"}
    a = parse(env)  # --db is required, and satisfied by the environment
    assert (a.metrics_port, a.db, a.dry_run, a.key, a.mode) == (9100, "/data/s.db", True, ["k1", "k2"], "b")
    b = parse(env, "--metrics-port", "1", "--db", "x")
    assert (b.metrics_port, b.db) == (1, "x")  # flags win
    assert parse({"ANALYSIM_DRY_RUN": "0", "ANALYSIM_DB": "d"}).dry_run is False


def test_file_variables(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("s3cret\n")
    a = parse({"ANALYSIM_DB": "d", "ANALYSIM_TOKEN_FILE": str(secret)})
    assert a.token == "s3cret"
    # An option of its own named --admin-key-file takes ANALYSIM_ADMIN_KEY_FILE as its path.
    a = parse({"ANALYSIM_DB": "d", "ANALYSIM_ADMIN_KEY_FILE": str(secret)})
    assert a.admin_key_file == str(secret)


@pytest.mark.parametrize(("env", "message"), [
    ({"ANALYSIM_METRICS_PORT": "x"}, "ANALYSIM_METRICS_PORT: invalid int value: 'x'"),
    ({"ANALYSIM_DRY_RUN": "maybe"}, "ANALYSIM_DRY_RUN: expected true or false"),
    ({"ANALYSIM_MODE": "c"}, "ANALYSIM_MODE: 'c' is not one of a, b"),
    ({"ANALYSIM_TOKEN_FILE": "/nonexistent/t"}, "ANALYSIM_TOKEN_FILE: cannot read /nonexistent/t"),
])  # fmt: skip
def test_bad_values_name_the_variable(env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse({"ANALYSIM_DB": "d", **env})
    assert e.value.code == 2
    assert message in capsys.readouterr().err


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=-(10**12), max_value=10**12), st.none() | st.integers(min_value=0, max_value=65535),
       st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1))
def test_values_round_trip_and_flags_win(v: int, flag: int | None, db: str) -> None:
    argv = [] if flag is None else [f"--metrics-port={flag}"]
    a = parse({"ANALYSIM_DB": db, "ANALYSIM_METRICS_PORT": str(v)}, *argv)
    assert a.metrics_port == (v if flag is None else flag) and a.db == db


# ---- real services, configured by their environment alone ----


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(module: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        return started(subprocess.Popen([sys.executable, "-m", *module], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                        env={**os.environ, "PYTHONPATH": str(ROOT), **env}))


def port_file(path: Path, proc: subprocess.Popen, log: Path) -> dict:
    def ready() -> bool:
        assert proc.poll() is None, log.read_text()
        return path.exists()

    wait_until(ready, what=f"{path.name}")
    return json.loads(path.read_text())


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=scaled(10)) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        p.wait(scaled(30))


def test_scheduler_and_agent_from_the_environment(tmp_path: Path) -> None:
    from analysim.clusters import parse_cluster
    from analysim.tokens import read_token
    from scheduler_svc.auth import write_tokens

    tokens = write_tokens(tmp_path / "tokens", [n.name for n in parse_cluster("tiny").nodes], 1)
    sched_env = {"ANALYSIM_AGENT_TOKEN_FILE": str(tokens / "agents.tokens"),
                 "ANALYSIM_CLIENT_TOKEN_FILE": str(tokens / "client.token"), "ANALYSIM_CLUSTER": "tiny", "ANALYSIM_JOBS": "30", "ANALYSIM_SPEED": "1000",
                 "ANALYSIM_NO_OFFLINE_CHECK": "1", "ANALYSIM_LOG_FORMAT": "json", "ANALYSIM_HEARTBEAT_DEADLINE": "1",
                 "ANALYSIM_JOURNAL": str(tmp_path / "journal.db"), "ANALYSIM_PORT_FILE": str(tmp_path / "s.json")}
    sched = spawn(["scheduler_svc", "serve"], sched_env, tmp_path / "s.log")
    agent = None
    try:
        s = port_file(tmp_path / "s.json", sched, tmp_path / "s.log")
        assert get(s["metrics"], "/healthz")[0] == 200
        status, body = get(s["metrics"], "/readyz")
        assert status == 503 and "0/4 nodes have an agent" in body
        # The agent's slice comes from a StatefulSet-like name and the fleet size.
        agent = spawn(["node_agent"], {"ANALYSIM_SCHEDULER": f"127.0.0.1:{s['grpc']}", "ANALYSIM_CLUSTER": "tiny",
                                       "ANALYSIM_AGENT_INDEX": "analysim-agent-0", "ANALYSIM_AGENTS": "1",
                                       "ANALYSIM_TOKEN_FILE": str(tokens / "agent-0.token"),
                                       "ANALYSIM_PORT_FILE": str(tmp_path / "a.json")}, tmp_path / "a.log")
        a = port_file(tmp_path / "a.json", agent, tmp_path / "a.log")
        wait_until(lambda: get(s["metrics"], "/readyz")[0] == 200, what="the scheduler ready")
        wait_until(lambda: get(a["metrics"], "/readyz")[0] == 200, what="the agent ready")
        with SchedulerClient(f"127.0.0.1:{s['grpc']}") as c:
            with pytest.raises(grpc.RpcError) as e:
                c.cluster_state()  # no token: refused by the auth interceptor, inside the metrics one
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with SchedulerClient(f"127.0.0.1:{s['grpc']}", token=read_token(tokens / "client.token")) as c:
            c.cluster_state()
            with pytest.raises(grpc.RpcError) as e:
                c.submit(num_gpus=1, duration_s=-10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        svc = "analysim.v1.SchedulerService"

        def handled(method: str, code: str) -> float:
            m = scrape("127.0.0.1", s["metrics"])
            return sample_sum(m["analysim_grpc_server_handled"], "analysim_grpc_server_handled_total",
                              grpc_service=svc, grpc_method=method, grpc_code=code)  # fmt: skip

        # An aborted call's status reaches the client before the server's handler has unwound.
        wait_until(lambda: handled("SubmitJob", "INVALID_ARGUMENT") == 1, what="SubmitJob counted as INVALID_ARGUMENT")
        assert handled("GetClusterState", "OK") == 1
        assert handled("GetClusterState", "UNAUTHENTICATED") == 1
        m = scrape("127.0.0.1", s["metrics"])
        assert sample_sum(m["analysim_grpc_server_handling_seconds"], "analysim_grpc_server_handling_seconds_count",
                          grpc_method="SubmitJob") == 1
        # The image's HEALTHCHECK command, against a live port and a closed one.
        for port, code in ((a["metrics"], 0), (free_port(), 1)):
            r = subprocess.run([sys.executable, "-m", "analysim.healthcheck", "/healthz"], cwd=ROOT, capture_output=True,
                               env={**os.environ, "ANALYSIM_METRICS_PORT": str(port)}, timeout=scaled(30))  # fmt: skip
            assert r.returncode == code, r.stdout
        for port, service in ((s["metrics"], "scheduler"), (a["metrics"], "agent")):
            m = scrape("127.0.0.1", port)
            assert sample_sum(m["analysim_build_info"], "analysim_build_info", service=service) == 1
            assert m["process_resident_memory_bytes"][0].value > 0
        # A lost agent makes the scheduler not ready (its nodes are down) until it is back.
        agent.kill()
        agent.wait(scaled(30))
        wait_until(lambda: get(s["metrics"], "/readyz")[0] == 503, what="the scheduler not ready without its agent")
        first = (tmp_path / "s.log").read_text().splitlines()[0]
        rec = json.loads(first)  # --log-format json from ANALYSIM_LOG_FORMAT, on stdout
        assert rec["service"] == "scheduler" and rec["level"] == "INFO" and rec["ts"].endswith("Z")
    finally:
        stop(*(p for p in (agent, sched) if p is not None))


def test_gateway_metrics_without_the_admin_key(tmp_path: Path) -> None:
    from mlaas_monitor.store import Store
    from tests.test_gateway_helpers import iris_model

    db = tmp_path / "store.db"
    store = Store(str(db))
    store.add_model(iris_model())
    store.close()
    key_file = tmp_path / "admin.key"
    key_file.write_text(ADMIN_KEY + "\n")
    env = {"ANALYSIM_DB": str(db), "ANALYSIM_PORT": "0", "ANALYSIM_GRPC_PORT": "0", "ANALYSIM_ADMIN_KEY_FILE": str(key_file),
           "ANALYSIM_PORT_FILE": str(tmp_path / "g.json"), "ANALYSIM_MONITOR_CHECKPOINT_INTERVAL": "0.1"}
    gw = spawn(["mlaas_monitor.monitor", "gateway"], env, tmp_path / "g.log")
    try:
        g = port_file(tmp_path / "g.json", gw, tmp_path / "g.log")
        assert get(g["metrics"], "/readyz") == (200, "ready: store open, 1 models\n")
        assert get(g["http"], "/metrics")[0] == 401  # the API port's /metrics still wants the admin key
        admin = ApiClient(f"http://127.0.0.1:{g['http']}", ADMIN_KEY)
        keys = {u: admin.call("POST", "/v1/admin/users", {"name": u})["api_key"] for u in ("ann", "bob")}
        admin.call("POST", "/v1/admin/groups", {"name": "pair", "members": ["ann", "bob"]})
        rows = [[5.0 + i / 10, 3.0, 1.5 + i / 20, 0.2] for i in range(30)]
        for u in ("ann", "bob"):
            ApiClient(f"http://127.0.0.1:{g['http']}", keys[u]).call("POST", "/v1/models/iris/predict", {"rows": rows})

        def subjects() -> set[str]:
            """The users' and declared groups' subjects (the monitor's own pooled ones, auto:*,
            are there whoever sends what)."""
            m = scrape("127.0.0.1", g["metrics"])
            return {s.labels["subject"] for s in m.get("analysim_extraction_status", [])
                    if not s.labels["subject"].startswith("auto:")}

        wait_until(lambda: {"ann", "bob", "group:pair"} <= subjects(), what="status series of both users and the group")
        m = scrape("127.0.0.1", g["metrics"])
        assert sample_sum(m["analysim_extraction_threshold"], "analysim_extraction_threshold",
                          model="iris", method="best_copy") == 0.5  # the default warning method
        assert sample_sum(m["analysim_gateway_user_rows"], "analysim_gateway_user_rows_total", user="ann") == 30
        assert sample_sum(m["analysim_build_info"], "analysim_build_info", service="gateway") == 1
        admin.call("POST", "/v1/admin/users/ann/revoke")
        assert subjects() == {"bob", "group:pair"}
        admin.call("DELETE", "/v1/admin/groups/pair")
        assert subjects() == {"bob"}
    finally:
        stop(gw)
    # After a restart the recovered state does not bring them back.
    (tmp_path / "g.json").unlink()
    gw = spawn(["mlaas_monitor.monitor", "gateway"], env, tmp_path / "g2.log")
    try:
        g = port_file(tmp_path / "g.json", gw, tmp_path / "g2.log")
        m = scrape("127.0.0.1", g["metrics"])
        assert {s.labels["subject"] for s in m.get("analysim_extraction_status", [])
                if not s.labels["subject"].startswith("auto:")} == {"bob"}
    finally:
        stop(gw)


@pytest.mark.parametrize(("args", "message"), [
    ([], "nothing to load: give --scheduler, --gateway or both"),
    (["--gateway", "http://127.0.0.1:9", "--colluders", "1"], "--colluders: a colluding group needs at least 2"),
    (["--gateway", "http://127.0.0.1:9", "--attackers", "sideways"], "unknown attack 'sideways'"),
    (["--gateway", "http://127.0.0.1:9", "--ready-timeout", "0.2"], "gateway http://127.0.0.1:9 not ready after 0.2 s"),
    (["--gateway", "http://127.0.0.1:9", "--enforce-threshold", "1.5"], "expected a number from 0 to 1, got 1.5"),
    (["--gateway", "http://127.0.0.1:9", "--duration", "-1"], "--duration: expected seconds from 0"),
    (["--scheduler", "127.0.0.1:9", "--token-file", "/nonexistent/client.token"],
     "token file /nonexistent/client.token: cannot read"),
])  # fmt: skip
def test_load_refuses_bad_input_in_one_line(args: list[str], message: str) -> None:
    r = subprocess.run([sys.executable, "-m", "analysim", "load", *args], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "ANALYSIM_ADMIN_KEY": ADMIN_KEY}, timeout=scaled(60))  # fmt: skip
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
