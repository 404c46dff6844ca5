"""The monitor as its own service (``python -m mlaas_monitor.monitor serve``) shared by two
gateway processes on one store (``--monitor-url``): every route authorised, one state for
both gateways' queries, enforcement pushed to both, and a SIGKILL of the monitor: the
gateways keep serving with its last decisions, and the restarted monitor resumes from its
cursor (nothing folded twice)."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from mlaas_monitor import auth
from mlaas_monitor.model import Policy
from mlaas_monitor.monitor.decisions import Decisions
from mlaas_monitor.store import Store
from tests.polling import scaled
from tests.test_gateway_helpers import ADMIN_KEY, Client, credit_model, credit_rows, start_module, wait_until


def free_port() -> int:
    """A port for a monitor restarted at the same address (as behind a Service)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_monitor(db: Path, tmp: Path, port: int) -> tuple[subprocess.Popen[str], Client]:
    args = ["mlaas_monitor.monitor", "serve", "--db", str(db), "--port", str(port), "--checkpoint-interval", "3600"]
    proc, ports = start_module(args, tmp / "monitor.port", "the monitor's port file")
    return proc, Client("127.0.0.1", ports["http"], ADMIN_KEY)


def start_gateway(db: Path, tmp: Path, name: str, monitor_url: str) -> tuple[subprocess.Popen[str], Client]:
    proc, ports = start_module(
        ["mlaas_monitor.monitor", "gateway", "--db", str(db), "--port", "0", "--grpc-port", "0", "--monitor-url", monitor_url],
        tmp / f"{name}.port", f"gateway {name}'s port file",
    )  # fmt: skip
    return proc, Client("127.0.0.1", ports["http"], ADMIN_KEY)


def metric(client: Client, name: str) -> float:
    status, text = client.get("/metrics")
    assert status == 200, text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_shared_monitor_pushes_decisions_to_every_gateway_and_survives_sigkill(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    store = Store(db)
    store.add_model(credit_model())
    store.set_policy("credit", Policy(reveal_leaf=True))
    # Accounts made before the gateways start: each gateway reads them once (accounts
    # created through one gateway and seen by the others are the replicas' business).
    keys = {n: auth.new_key() for n in ("ben", "cat")}
    for n, k in keys.items():
        store.add_user(n, auth.hash_key(k), None, None)
    store.close()
    rows = credit_rows()
    procs: list[subprocess.Popen[str]] = []
    try:
        mproc, monitor = start_monitor(db, tmp_path, free_port())
        procs.append(mproc)
        url = f"http://127.0.0.1:{monitor.port}"
        (a, ga), (b, gb) = start_gateway(db, tmp_path, "a", url), start_gateway(db, tmp_path, "b", url)
        procs += [a, b]
        run(db, tmp_path, rows, keys, procs, monitor, ga, gb)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(scaled(30))


def run(db: Path, tmp: Path, rows: list[list[Any]], keys: dict[str, str], procs: list[subprocess.Popen[str]],
        monitor: Client, ga: Client, gb: Client) -> None:  # fmt: skip
    # Every route of the monitor needs the admin key, the decisions feed too.
    for path in ("/v1/monitor/decisions", "/metrics", "/v1/admin/monitor", "/v1/admin/groups"):
        assert Client("127.0.0.1", monitor.port).get(path)[0] == 401
        assert Client("127.0.0.1", monitor.port, keys["ben"]).get(path)[0] == 401
    assert monitor.get("/v1/monitor/decisions?wait=nope")[0] == 400

    # One state for both gateways' queries: ben half through each.
    ben_a, ben_b = Client("127.0.0.1", ga.port, keys["ben"]), Client("127.0.0.1", gb.port, keys["ben"])
    for i in range(0, 120, 4):
        assert (ben_a if i % 8 else ben_b).post("/v1/models/credit/predict", {"rows": rows[i : i + 4]})[0] == 200

    def seen(client: Client, name: str, n: int) -> dict[str, Any] | None:
        status, body = client.get(f"/v1/admin/monitor/credit/users/{name}")
        return body if status == 200 and body["n_queries"] >= n else None

    view = wait_until(lambda: seen(monitor, "ben", 120), what="the monitor to see both gateways' rows")
    assert view["n_queries"] == 120 and sum(view["leaves"]["counts"]) == 120
    assert seen(gb, "ben", 120) == view  # a gateway forwards the monitor's admin routes
    assert metric(ga, "analysim_gateway_monitor_up") == 1
    assert metric(monitor, "analysim_monitor_cursor") >= 30
    assert metric(gb, "analysim_monitor_cursor") == 0  # a shared monitor is scraped on its own, not once per replica

    # Enforcement decided once, applied by both gateways (ben's next query may land on either).
    cfg = {"enforcement": {"action": "degrade", "method": "coverage_mass", "threshold": 0.3, "intent": False}}
    assert gb.request("PUT", "/v1/admin/monitor/credit/config", cfg)[0] == 200

    sent = 120  # ben's rows so far; each probe below sends one more, however many it takes

    def degraded(client: Client) -> bool:
        nonlocal sent
        status, body = client.post("/v1/models/credit/predict", {"rows": rows[:1]})
        assert status == 200, body
        sent += 1
        return set(body["predictions"][0]) == {"label"}

    wait_until(lambda: degraded(ben_a), what="gateway a to degrade ben")
    wait_until(lambda: degraded(ben_b), what="gateway b to degrade ben")
    wait_until(lambda: seen(monitor, "ben", sent), what="the degraded rows")
    history = monitor.get("/v1/admin/monitor/credit/users/ben")[1]["history"]

    # The monitor SIGKILLed: both gateways keep serving, with the last decisions.
    mproc = procs[0]
    mproc.send_signal(signal.SIGKILL)
    mproc.wait(scaled(30))
    for g in (ga, gb):
        wait_until(lambda: metric(g, "analysim_gateway_monitor_up") == 0, what="the gateways to notice")  # noqa: B023
    assert degraded(ben_a) and degraded(ben_b)
    cat = Client("127.0.0.1", gb.port, keys["cat"])
    for i in range(0, 60, 3):
        assert cat.post("/v1/models/credit/predict", {"rows": rows[i : i + 3]})[0] == 200
    assert gb.get("/v1/admin/monitor/credit")[0] == 503  # its admin routes say it is away

    # Restarted: it resumes from its cursor and catches up with what it missed.
    mproc, monitor = start_monitor(db, tmp, monitor.port)
    procs.append(mproc)
    wait_until(lambda: seen(monitor, "cat", 60) and seen(monitor, "ben", sent), what="the restarted monitor to catch up")
    resumed = monitor.get("/v1/admin/monitor/credit/users/ben")[1]
    assert resumed["n_queries"] == sent and sum(resumed["leaves"]["counts"]) == sent
    # Nothing folded twice: the history goes on where it was, every point once.
    assert resumed["history"][: len(history)] == history
    counts = [h["n_queries"] for h in resumed["history"]]
    assert counts == sorted(set(counts))
    # The gateways resubscribe; the decisions are the monitor's again (a new decision reaches both).
    for g in (ga, gb):
        wait_until(lambda: metric(g, "analysim_gateway_monitor_up") == 1, what="the gateways to resubscribe")  # noqa: B023
    cfg["enforcement"]["action"] = "refuse"
    assert ga.request("PUT", "/v1/admin/monitor/credit/config", cfg)[0] == 200
    for c in (ben_a, ben_b):
        wait_until(lambda: c.post("/v1/models/credit/predict", {"rows": rows[:1]})[0] == 403, what="ben refused")  # noqa: B023
    mproc.send_signal(signal.SIGTERM)
    assert mproc.wait(scaled(30)) == 0


def test_decisions_long_poll_answers_on_change_on_a_foreign_token_and_on_close() -> None:
    async def scenario() -> None:
        d = Decisions()
        first = await d.wait(None, 10)  # no token: at once
        assert first == {"token": d.token, "decisions": {}, "following": True}
        assert (await d.wait("0000.0", 10))["token"] == d.token  # another run's token: at once
        assert (await d.wait(d.token, 0.01))["decisions"] == {}  # nothing changed: after the wait
        waiting = asyncio.create_task(d.wait(first["token"], 30))
        await asyncio.sleep(0)  # let it start waiting
        d.set("m", {"ann": "refuse"})
        changed = await asyncio.wait_for(waiting, 5)
        assert changed["decisions"] == {"m": {"ann": "refuse"}} and changed["token"] != first["token"]
        d.set("m", {"ann": "refuse"})  # the same decisions: no new version
        assert d.token == changed["token"]
        d.set("m", {})  # nothing left for the model: it leaves the snapshot
        assert d.snapshot()["decisions"] == {}
        waiting = asyncio.create_task(d.wait(d.token, 30))
        await asyncio.sleep(0)
        d.close()
        assert (await asyncio.wait_for(waiting, 5))["token"] == d.token  # a stopping service answers every poll
        assert (await asyncio.wait_for(d.wait(d.token, 30), 5))["token"] == d.token

    asyncio.run(scenario())


def test_the_follower_can_wait_until_the_polls_waiting_on_a_change_are_answered() -> None:
    """``Decisions.answered``: what the monitor's fold loop waits on after its decisions
    change, so that the next slice of the log cannot hold the change back from a gateway."""

    async def scenario() -> None:
        d = Decisions()
        assert await d.answered(5)  # nobody waiting: at once
        before = d.token
        old = [asyncio.create_task(d.wait(before, 30)) for _ in range(2)]
        await asyncio.sleep(0)  # let them start waiting
        assert await d.answered(5)  # waiting on the current version: not the follower's business
        d.set("m", {"ann": "degrade"})
        assert not any(t.done() for t in old)  # they have not run since the change
        later = asyncio.create_task(d.wait(d.token, 30))  # a poll on the new version, started after
        assert await d.answered(5)
        assert all(t.done() and t.result()["decisions"] == {"m": {"ann": "degrade"}} for t in old)
        assert not later.done()  # answered() does not wait for a poll of the new version
        d.close()
        assert (await asyncio.wait_for(later, 5))["token"] == d.token

    asyncio.run(scenario())
