"""What every service answers on its metrics port: ``/metrics`` (Prometheus text, no key),
``/healthz`` (liveness: the process serves HTTP) and ``/readyz`` (readiness: 200 once the
service can do its job, 503 with the reason until then). Also the metrics every service
exports besides its own: ``process_*``, ``analysim_build_info`` and the log lines the rate limit left
out (``analysim_log_lines_suppressed_total``)."""

from __future__ import annotations

import asyncio
import platform
from collections.abc import Callable, Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from analysim import __version__
from analysim.logs import RATE_LIMIT

# Ready: (ready?, why) — "why" is shown either way, e.g. "3/3 agents" or "store open".
Readiness = Callable[[], tuple[bool, str]]


def add_standard_metrics(registry: CollectorRegistry, service: str) -> None:
    """``process_*`` (CPU, memory, open files, start time), ``analysim_build_info`` and
    ``analysim_log_lines_suppressed_total``."""
    ProcessCollector(registry=registry)
    registry.register(_SuppressedLines())
    Gauge("analysim_build_info", "Always 1; the labels say what runs.", ["service", "version", "python"],
          registry=registry).labels(service, __version__, platform.python_version()).set(1)


class _SuppressedLines(Collector):
    """Log lines left out by the rate limit (analysim.logs), by source."""

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[CounterMetricFamily]:
        c = CounterMetricFamily("analysim_log_lines_suppressed", "Log lines left out by the per-source rate limit.",
                                labels=["source"])
        for source, n in sorted(RATE_LIMIT.suppressed.items()):
            c.add_metric([source], n)
        yield c


def ops_app(registry: CollectorRegistry, ready: Readiness | None = None, render_in_thread: bool = False) -> web.Application:
    """``render_in_thread``: render /metrics off the event loop, for a registry with a collector
    that waits (on another process) and whose collectors are all safe to run from a thread."""

    async def metrics(request: web.Request) -> web.Response:
        body = await asyncio.to_thread(generate_latest, registry) if render_in_thread else generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        ok, why = ready() if ready is not None else (True, "serving")
        return web.Response(text=f"{'ready' if ok else 'not ready'}: {why}\n", status=200 if ok else 503)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def start_ops_server(registry: CollectorRegistry, host: str, port: int, ready: Readiness | None = None,
                           render_in_thread: bool = False) -> tuple[web.AppRunner, int]:
    """Serve ``ops_app`` on host:port (0: any free port); the runner (to clean up) and the port."""
    runner = web.AppRunner(ops_app(registry, ready, render_in_thread), access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner, runner.addresses[0][1]
