"""A scheduler stopped by SIGTERM while clients are attached: open WatchEvents streams end with
status OK (not cut off when the grace period runs out), the process exits 0, its log holds no
traceback and its own temporary journal is gone; and the shutdown's last step, ``settle``, against a real gRPC server with a call still
running when ``stop`` returns."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import grpc

from analysim._protos.v1 import scheduler_pb2 as spb
from tests.polling import scaled
from tests.test_live_helpers import live, wait_until
from tests.threads import CheckedThread


def test_sigterm_ends_open_watches_with_ok_and_exits_cleanly(tmp_path: Path, monkeypatch) -> None:
    # (the scheduler's temporary folder, where a scheduler without --journal makes its journal)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    with live(tmp_path, ["--jobs", "0"], "4x8", 4, agents=1) as (run, client):
        assert list(tmp.glob("analysim-journal-*/journal.db")), "the scheduler made no journal of its own"
        events: list = []
        ended: list = []
        stream = client.watch()

        def read() -> None:
            try:
                for r in stream:
                    events.append(r.event)
                ended.append("ok")
            except grpc.RpcError as e:
                ended.append(f"{e.code().name}: {e.details()}")

        reader = CheckedThread(read, name="watch reader")
        reader.start()
        wait_until(lambda: events and events[0].kind == spb.EVENT_KIND_WATCHING, 30, "the watch handshake")
        run.scheduler.popen.send_signal(signal.SIGTERM)
        assert run.scheduler.popen.wait(scaled(60)) == 0, run.scheduler.tail(40)
        reader.join(scaled(30))
        # A stream the scheduler held open through its grace period would end UNAVAILABLE
        # ("Cancelling all calls").
        assert ended == ["ok"], ended
    log = run.scheduler.log.read_text()
    assert "Traceback" not in log and "ERROR" not in log, run.scheduler.tail(40)
    # a journal no later start could name is not left behind
    assert not list(tmp.glob("analysim-journal-*")), list(tmp.iterdir())


SERVER_STOPPED_MID_CALL = """
import asyncio, logging, sys, threading
import grpc
from grpc import aio
from analysim.aio_shutdown import settle

logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
started, answers = threading.Event(), []

class Handler(grpc.GenericRpcHandler):
    def service(self, details):
        async def slow(request, context):
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                print("handler: cancelled", flush=True)
                return b""  # a handler that ends quietly when cut off
            return b""
        return grpc.unary_unary_rpc_method_handler(slow)

def client(target):
    with grpc.insecure_channel(target) as channel:
        try:
            channel.unary_unary("/t/Slow")(b"", timeout=600)
        except grpc.RpcError as e:
            answers.append(e.code().name)

async def main():
    server = aio.server()
    server.add_generic_rpc_handlers([Handler()])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    caller = threading.Thread(target=client, args=(f"127.0.0.1:{port}",))
    caller.start()
    await asyncio.to_thread(started.wait)
    await server.stop(0.05)  # the grace period runs out with the call in flight
    print("tasks left by stop:", len(asyncio.all_tasks()) - 1, flush=True)
    if sys.argv[1] == "settle":
        print("cancelled by settle:", await settle(30.0), flush=True)
        print("tasks after settle:", len(asyncio.all_tasks()) - 1, flush=True)
    return caller

caller = asyncio.run(main())
caller.join()
print("client:", answers, flush=True)
"""


def test_settle_lets_the_calls_grpc_stop_left_running_finish(tmp_path: Path) -> None:
    script = tmp_path / "server_stopped_mid_call.py"
    script.write_text(textwrap.dedent(SERVER_STOPPED_MID_CALL))
    r = subprocess.run([sys.executable, str(script), "settle"], capture_output=True, text=True,
                       timeout=scaled(120), cwd=Path(__file__).resolve().parents[1])
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    left = re.search(r"tasks left by stop: (\d+)", out)
    assert left and int(left[1]) > 0, f"stop() left nothing running: this test no longer tests anything\n{out}"
    assert "cancelled by settle: 0" in out and "tasks after settle: 0" in out, out
    assert "handler: cancelled" in out and "client: ['UNAVAILABLE']" in out, out
    assert "Traceback" not in out and "Exception not handled" not in out, out
