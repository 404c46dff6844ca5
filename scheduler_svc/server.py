"""Run the scheduler service: gRPC (SchedulerService, AgentService, health, reflection) and
Prometheus /metrics, /healthz and /readyz over HTTP, on one asyncio loop with the LiveScheduler; clean shutdown on
SIGTERM/SIGINT. Ports may be 0: the bound ones are written to ``port_file`` (JSON)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import grpc

from analysim.aio_shutdown import settle
from analysim.errors import UserError
from analysim.ops_http import start_ops_server
from analysim.portfile import write_port_file
from analysim.tls import TlsFiles
from scheduler_svc.auth import Authenticator
from scheduler_svc.core import LiveScheduler
from scheduler_svc.grpc_api import build_server, set_serving

log = logging.getLogger("scheduler_svc")
GRACE_S = 5.0


def readiness(live: LiveScheduler) -> tuple[bool, str]:
    """Ready while every node has an agent and the clock has started (what /readyz answers):
    a lost agent makes the scheduler not ready until its nodes are back."""
    owned, total = len(live.agents.node_owner), len(live.cluster.nodes)
    started = live.pace.started
    what = f"{owned}/{total} nodes have an agent, clock {'started' if started else 'waiting for them'}"
    if live.journal.failure is not None:  # reads are served; submissions are refused
        return False, f"{what}; {live.journal.failure}"
    return started and owned == total, what


async def serve(live: LiveScheduler, host: str, grpc_port: int, metrics_port: int, port_file: str | None,
                exit_when_done: bool = False, auth: Authenticator | None = None, tls: TlsFiles | None = None) -> bool:
    """Serve until SIGTERM/SIGINT (or the replay's end with ``exit_when_done``); False if the
    run's end could not be written to --out."""
    loop = asyncio.get_running_loop()
    auth = auth or Authenticator()
    stop = _on_signals(loop, auth)
    if not auth.enabled:
        log.warning("no token files: every caller may submit, control the clock and register as an agent")
    server, hs = build_server(live, auth)
    creds = (tls or TlsFiles()).server_credentials()
    bound = _bind(server, f"{host}:{grpc_port}", creds)
    try:
        runner, mport = await start_ops_server(live.metrics.registry, host, metrics_port, lambda: readiness(live))
    except OSError as e:
        raise UserError(f"cannot listen on {host}:{metrics_port} for /metrics ({e.strerror})") from None
    await server.start()
    await set_serving(hs, True)
    tasks = [loop.create_task(live.run()), loop.create_task(live.agents.watchdog())]
    info = {"host": host, "grpc": bound, "metrics": mport, "pid": os.getpid(), "tls": creds is not None,
            "auth": auth.enabled}
    if port_file:
        write_port_file(port_file, info)
    log.info("scheduler on %s:%d (gRPC), metrics http://%s:%d/metrics", host, bound, host, mport)
    waiter = loop.create_task(stop.wait())
    try:
        await _until_stopped(live, stop, waiter, tasks, exit_when_done)
    finally:
        await set_serving(hs, False)
        live.stop()
        for t in tasks:
            t.cancel()
        await server.stop(GRACE_S)
        await runner.cleanup()
        waiter.cancel()
        await settle(GRACE_S)
        live.commit()
        live.journal.close()
    return live.end.out_error is None


def _on_signals(loop: asyncio.AbstractEventLoop, auth: Authenticator) -> asyncio.Event:
    """SIGTERM and SIGINT set the event returned; SIGHUP re-reads the token files now (they are
    also followed as they change)."""
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: auth.reload("on SIGHUP"))
    return stop


def _bind(server: grpc.aio.Server, address: str, creds: grpc.ServerCredentials | None) -> int:
    """The gRPC port bound at ``address`` (UserError when it cannot be)."""
    try:
        bound = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise UserError(f"cannot listen on {address} for gRPC (in use, or not an address of this machine)")
    return bound


async def _until_stopped(live: LiveScheduler, stop: asyncio.Event, waiter: asyncio.Task, tasks: list[asyncio.Task],
                         exit_when_done: bool) -> None:
    """Until a signal, a task's failure (raised here) or, with ``exit_when_done``, the replay's end."""
    while not stop.is_set():
        done, _ = await asyncio.wait([waiter, *tasks], timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            if t in done and (e := t.exception()) is not None:
                raise e
        if exit_when_done and live.end.done:
            return
