"""A cap on the gateway's open HTTP connections. Each holds a file descriptor: idle ones
(connected, sending nothing or half a request head) would otherwise exhaust the process's
descriptors and leave no room for a client with a request. At the cap a new connection
closes the oldest idle one (no request being handled on it), so that requests are still
served; only when every connection is busy is the new one closed at once. aiohttp's
keep-alive timeout (``Limits.idle_timeout_s``) closes idle ones in any case."""

from __future__ import annotations

import resource
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

# Descriptors kept for everything but HTTP connections (the store, gRPC, the monitor, logs).
RESERVED_FDS = 128


def default_max_connections() -> int:
    """What the process's descriptor limit leaves for HTTP connections."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return max(16, (soft if soft != resource.RLIM_INFINITY else 65536) - RESERVED_FDS)


class ConnectionCap:
    def __init__(self, limit: int, on_close: Callable[[str], None] | None = None) -> None:
        self.limit = limit  # open HTTP connections, at most
        self.busy: set[RequestHandler] = set()  # connections with a request being handled
        self.on_close = on_close  # called with "idle" or "busy" for each connection closed by the cap

    def install(self, server: web.Server) -> None:
        """Enforce the cap on SERVER's connections (its connection_made hook, per instance)."""
        made = server.connection_made

        def connection_made(handler: RequestHandler, transport: Any) -> None:
            made(handler, transport)
            connections = server.connections
            if len(connections) <= self.limit:
                return
            # (One closed already but not yet gone, its transport None, is not closed twice.)
            idle = next((h for h in connections if h not in self.busy and h is not handler and h.transport is not None),
                        None)  # fmt: skip
            (idle or handler).force_close()
            if self.on_close is not None:
                self.on_close("idle" if idle is not None else "busy")

        server.connection_made = connection_made  # type: ignore[method-assign]

    @contextmanager
    def handling(self, request: web.BaseRequest) -> Iterator[None]:
        """A context in which REQUEST's connection counts as busy (never closed by the cap)."""
        self.busy.add(request.protocol)
        try:
            yield
        finally:
            self.busy.discard(request.protocol)
