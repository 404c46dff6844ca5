"""Run a gateway: the aiohttp and gRPC servers on one event loop over one Gateway, with
graceful shutdown (in-flight requests finish, pending commits are flushed, the store is
closed). ``serve`` is what ``analysim gateway`` runs; ``GatewayThread`` runs the same thing
in a background thread for tests and benchmarks."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass

import grpc
from aiohttp import web

from analysim.aio_shutdown import settle
from analysim.ops_http import start_ops_server
from analysim.tls import TlsFiles
from mlaas_monitor.grpc_service import build_grpc_server
from mlaas_monitor.http_app import CONNECTION_CAP, build_app
from mlaas_monitor.service import Gateway

SHUTDOWN_GRACE_S = 10.0
log = logging.getLogger(__name__)


def run_loop(main: Coroutine[object, object, None]) -> None:
    """Run ``main`` on uvloop where it exists (Linux, macOS), else on asyncio's own loop.

    The gateway is bound by per-request event-loop overhead on one core; uvloop takes a
    quarter to a third off it (BENCHMARKS-HISTORY.md, "MLaaS gateway"). Only the gateway and the
    monitor use it: uvloop's clock has millisecond resolution, which the scheduler
    service's paced trace clock should not inherit.
    """
    try:
        import uvloop
    except ImportError:  # e.g. Windows
        asyncio.run(main)
    else:
        uvloop.run(main)


LINGER_S = 1.0


@dataclass(frozen=True)
class Bound:
    host: str  # the address bound (127.0.0.1 unless told otherwise)
    http_port: int  # the HTTP API's port
    grpc_port: int  # the gRPC API's port
    metrics_port: int | None = None  # the unauthenticated /metrics, /healthz, /readyz listener

    def ports(self) -> dict[str, object]:
        """What the gateway's port file holds."""
        ports: dict[str, object] = {"host": self.host, "http": self.http_port, "grpc": self.grpc_port}
        if self.metrics_port is not None:
            ports["metrics"] = self.metrics_port
        return ports


def readiness(gw: Gateway) -> tuple[bool, str]:
    """Ready while the store answers and every extension is (what /readyz says): a gateway
    whose extraction monitor is down or stuck is not ready (it serves, enforcing its last
    decisions)."""
    try:
        n = len(gw.store.model_ids())
    except Exception as e:  # noqa: BLE001 — any failure of the store means not ready
        return False, f"store unreadable: {e}"
    problems = [p for check in gw.readiness_checks if (p := check()) is not None]
    if problems:
        return False, f"store open, {n} models; " + "; ".join(problems)
    return True, f"store open, {n} models"


# An extension (e.g. the extraction monitor) installs its routes, gRPC services and
# query-stream listeners before the servers start: extension(gateway, http_app, grpc_server).
Extension = Callable[[Gateway, web.Application, grpc.aio.Server], None]


async def serve(
    gw: Gateway,
    host: str,
    http_port: int,
    grpc_port: int,
    stop: asyncio.Event,
    on_ready: Callable[[Bound], None] | None = None,
    extensions: Sequence[Extension] = (),
    tls: TlsFiles | None = None,
    metrics_at: tuple[str, int] | None = None,
    reuse_port: bool = False,
) -> None:
    """``metrics_at`` (host, port): also serve /metrics (no key), /healthz and /readyz there, in
    plain HTTP (Prometheus scrapes it; ``tls`` covers the API ports). ``reuse_port``: one of
    several worker processes on the same API ports (SO_REUSEPORT)."""
    tls = tls or TlsFiles()
    ssl_context, creds = tls.server_ssl_context(), tls.server_credentials()  # both None: plaintext
    app = build_app(gw)
    grpc_srv = build_grpc_server(gw, reuse_port)
    for ext in extensions:
        ext(gw, app, grpc_srv.server)
    # lingering_time: after refusing a body that is still arriving (408, 503, 413), wait for the
    # rest of it this long at most before closing (aiohttp's default, 10 s, would let a trickle
    # hold the connection on).
    # keepalive_timeout: aiohttp closes a connection waiting for a request head this long (from
    # its opening or its last response), the header and idle timeout in one.
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_GRACE_S,
                           lingering_time=LINGER_S, keepalive_timeout=gw.limits.idle_timeout_s)
    await runner.setup()
    assert runner.server is not None
    app[CONNECTION_CAP].install(runner.server)
    ops: web.AppRunner | None = None
    refresher: asyncio.Task | None = None
    started = False
    try:
        metrics_port = None
        if metrics_at is not None:
            # (Rendered in a thread: the monitor's metrics are read from its process when scraped.)
            ops, metrics_port = await start_ops_server(gw.metrics.registry, *metrics_at, lambda: readiness(gw),
                                                       render_in_thread=True)
        site = web.TCPSite(runner, host, http_port, ssl_context=ssl_context, reuse_port=reuse_port or None)
        await site.start()
        bound_http = runner.addresses[0][1]
        address = f"{host}:{grpc_port}"
        bound_grpc = (grpc_srv.server.add_secure_port(address, creds) if creds
                      else grpc_srv.server.add_insecure_port(address))
        if bound_grpc == 0:
            raise OSError(f"cannot bind gRPC on {host}:{grpc_port}")
        await grpc_srv.server.start()
        started = True
        await grpc_srv.set_serving(True)
        if on_ready is not None:
            on_ready(Bound(host, bound_http, bound_grpc, metrics_port))
        refresher = asyncio.create_task(_refresh_loop(gw))
        await stop.wait()
    finally:
        if refresher is not None:
            refresher.cancel()
        if started:
            await grpc_srv.set_serving(False)
        grpc_srv.predictions.close_streams()
        await grpc_srv.server.stop(SHUTDOWN_GRACE_S)
        await runner.cleanup()  # stops listening, lets in-flight handlers finish
        if ops is not None:
            await ops.cleanup()
        await settle(SHUTDOWN_GRACE_S)
        gw.shutdown()


REFRESH_INTERVAL_S = 1.0


async def _refresh_loop(gw: Gateway) -> None:
    """Other processes (replicas, `analysim model train`) change the store: catch up."""
    while True:
        await asyncio.sleep(REFRESH_INTERVAL_S)
        try:
            gw.refresh()
        except Exception as e:  # noqa: BLE001 — e.g. the database restarting: try again next time
            log.warning("could not refresh users and policies from the store: %s", e)


def run_forever(
    gw: Gateway,
    host: str,
    http_port: int,
    grpc_port: int,
    on_ready: Callable[[Bound], None],
    extensions: Sequence[Extension] = (),
    tls: TlsFiles | None = None,
    metrics_at: tuple[str, int] | None = None,
    reuse_port: bool = False,
) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(gw, host, http_port, grpc_port, stop, on_ready, extensions, tls=tls, metrics_at=metrics_at,
                    reuse_port=reuse_port)

    run_loop(main())


class GatewayThread:
    """A real gateway on 127.0.0.1 ephemeral ports in a background thread."""

    def __init__(self, gw: Gateway, host: str = "127.0.0.1", extensions: Sequence[Extension] = (),
                 tls: TlsFiles | None = None) -> None:
        # The gateway served, the address to bind, extensions (the monitor's client), and TLS files (none: plain)
        self.gw, self.host, self.extensions, self.tls = gw, host, extensions, tls or TlsFiles()
        self.bound: Bound | None = None  # the ports once serving (None: not yet)
        self._ready = threading.Event()  # set once serving, or once it failed to start
        self._error: BaseException | None = None  # why it failed to start (None: it did not fail)
        self._loop: asyncio.AbstractEventLoop | None = None  # the thread's event loop (None: not running)
        self._stop: asyncio.Event | None = None  # set to stop the gateway (None: not running)
        # Runs the gateway's event loop
        self._thread = threading.Thread(target=self._run, name="gateway", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def ready(b: Bound) -> None:
                self.bound = b
                self._ready.set()

            await serve(self.gw, self.host, 0, 0, self._stop, ready, self.extensions, self.tls)

        try:
            run_loop(main())
        except BaseException as e:  # surfaced by start()
            self._error = e
            self._ready.set()

    def start(self, timeout: float = 30.0) -> GatewayThread:
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            raise RuntimeError(f"gateway did not start: {self._error!r}")
        return self

    def call(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the gateway's loop (e.g. to add a stream listener)."""
        assert self._loop is not None
        done = threading.Event()

        def run() -> None:
            try:
                fn()
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    def stop(self, timeout: float = 30.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    @property
    def url(self) -> str:
        assert self.bound is not None
        return f"{'https' if self.tls.cert else 'http'}://{self.host}:{self.bound.http_port}"

    @property
    def grpc_target(self) -> str:
        assert self.bound is not None
        return f"{self.host}:{self.bound.grpc_port}"

    def __enter__(self) -> GatewayThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
