"""gRPC server metrics (an aio server interceptor): RPCs started and handled by service,
method and status code, and their handling time. Names after go-grpc-prometheus, with the
project's prefix."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram

# Wall seconds: unary calls take well under a millisecond; streams (an agent's session,
# WatchEvents) last as long as the client stays.
HANDLING_BUCKETS = (1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 300, 3600)
LABELS = ["grpc_service", "grpc_method", "grpc_type"]


class GrpcServerMetrics(grpc.aio.ServerInterceptor):
    def __init__(self, registry: CollectorRegistry) -> None:
        self.started = Counter("analysim_grpc_server_started_total", "RPCs started on the server.", LABELS,
                               registry=registry)
        self.handled = Counter("analysim_grpc_server_handled_total",
                               "RPCs completed on the server, by status code.", [*LABELS, "grpc_code"], registry=registry)
        self.seconds = Histogram("analysim_grpc_server_handling_seconds", "Time from an RPC's start to its end.",
                                 LABELS, buckets=HANDLING_BUCKETS, registry=registry)
        self._wrapped: dict[str, tuple[Any, Any]] = {}  # method -> (its handler, the handler wrapped)

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        # One wrapped handler per method, made on its first call (label children included).
        cached = self._wrapped.get(details.method)
        if cached is None or cached[0] is not handler:
            cached = self._wrapped[details.method] = (handler, self._wrap(details.method, handler))
        return cached[1]

    def _wrap(self, full_method: str, handler: Any) -> Any:
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

        make = {
            (False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler,
        }[(handler.request_streaming, handler.response_streaming)]  # fmt: skip
        return make(stream if inspect.isasyncgenfunction(behavior) else call,
                    request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
