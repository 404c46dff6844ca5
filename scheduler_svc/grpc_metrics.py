"""gRPC server metrics (an aio server interceptor): RPCs started and handled by service,
method and status code, and their handling time. Names after go-grpc-prometheus, with the
project's prefix."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram

from analysim.grpc_decode import WrappingInterceptor, same_shape

# Wall seconds: unary calls take well under a millisecond; streams (an agent's session,
# WatchEvents) last as long as the client stays.
HANDLING_BUCKETS = (1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 300, 3600)
LABELS = ["grpc_service", "grpc_method", "grpc_type"]


class GrpcServerMetrics(WrappingInterceptor):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__()
        # RPCs started, by service, method and type
        self.started = Counter("analysim_grpc_server_started_total", "RPCs started on the server.", LABELS,
                               registry=registry)
        # RPCs ended, by status code too
        self.handled = Counter("analysim_grpc_server_handled_total",
                               "RPCs completed on the server, by status code.", [*LABELS, "grpc_code"], registry=registry)
        # wall seconds from an RPC's start to its end
        self.seconds = Histogram("analysim_grpc_server_handling_seconds", "Time from an RPC's start to its end.",
                                 LABELS, buckets=HANDLING_BUCKETS, registry=registry)

    def wrap(self, full_method: str, handler: Any) -> Any:
        """One wrapped handler per method, made on its first call (label children included)."""
        service, _, method = full_method.lstrip("/").rpartition("/")
        kind = ("bidi_stream" if handler.request_streaming and handler.response_streaming else
                "client_stream" if handler.request_streaming else
                "server_stream" if handler.response_streaming else "unary")  # fmt: skip
        labels = (service, method, kind)
        started, seconds = self.started.labels(*labels), self.seconds.labels(*labels)
        handled: dict[str, Any] = {}

        def done(context: grpc.aio.ServicerContext, start: float, error: BaseException | None) -> None:
            code = context.code()
            if code is None:  # not set by the handler: OK, CANCELLED (the client left) or UNKNOWN
                code = (grpc.StatusCode.OK if error is None else grpc.StatusCode.CANCELLED
                        if isinstance(error, asyncio.CancelledError) else grpc.StatusCode.UNKNOWN)  # fmt: skip
            name = code.name if isinstance(code, grpc.StatusCode) else str(code)
            child = handled.get(name)
            if child is None:
                child = handled[name] = self.handled.labels(*labels, name)
            child.inc()
            seconds.observe(time.perf_counter() - start)

        behavior = (handler.unary_unary or handler.unary_stream or handler.stream_unary
                    or handler.stream_stream)  # fmt: skip

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            # Unary handlers, and streaming ones that answer with context.write() (health Watch).
            started.inc()
            start, error = time.perf_counter(), None
            try:
                return await behavior(request, context)
            except BaseException as e:
                error = e
                raise
            finally:
                done(context, start, error)

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            started.inc()
            start, error = time.perf_counter(), None
            try:
                async for item in behavior(request, context):
                    yield item
            except BaseException as e:
                error = e
                raise
            finally:
                done(context, start, error)

        return same_shape(handler, stream if inspect.isasyncgenfunction(behavior) else call)
