"""Requests that are not valid protobuf bytes answer INVALID_ARGUMENT ("the request is not a
valid analysim.v1.SubmitJobRequest message"), with reason ``malformed_request``, instead of
grpc's UNKNOWN carrying the Python exception's text. A server interceptor, innermost: the
request deserializer it installs never raises, and the behaviour refuses what it could not
decode before the servicer sees it (interceptors outside it, e.g. authentication, still
answer first)."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from analysim import rpc_status


class _Malformed:
    """What the guarded deserializer returns for bytes that do not parse."""


_MALFORMED = _Malformed()


class WrappingInterceptor(grpc.aio.ServerInterceptor):
    """An interceptor that wraps each method's handler (``wrap``), once, on its first call."""

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[Any, Any]] = {}  # method -> (its handler, the handler wrapped)

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:  # fmt: skip
        handler = await continuation(details)
        if handler is None or not self.wraps(handler):
            return handler
        cached = self._wrapped.get(details.method)
        if cached is None or cached[0] is not handler:
            cached = self._wrapped[details.method] = (handler, self.wrap(details.method, handler))
        return cached[1]

    def wraps(self, handler: Any) -> bool:
        return True

    def wrap(self, method: str, handler: Any) -> Any:
        raise NotImplementedError


class MalformedRequestGuard(WrappingInterceptor):
    def __init__(self, domain: str) -> None:
        super().__init__()
        self.domain = domain

    def wraps(self, handler: Any) -> bool:
        return handler.request_deserializer is not None

    def wrap(self, method: str, handler: Any) -> Any:
        decode = handler.request_deserializer
        what = method.rsplit("/", 1)[-1]
        domain = self.domain

        def deserialize(data: bytes) -> Any:
            try:
                return decode(data)
            except Exception:  # noqa: BLE001 — any failure to parse is the caller's malformed bytes
                return _MALFORMED

        async def refuse(context: grpc.aio.ServicerContext) -> None:
            await rpc_status.abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                                   f"the {what} request is not a valid protobuf message", reason="malformed_request",
                                   domain=domain)  # fmt: skip

        behavior = handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream

        async def requests(it: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for r in it:
                if r is _MALFORMED:
                    await refuse(context)
                yield r

        async def checked(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if handler.request_streaming:
                return requests(request, context)
            if request is _MALFORMED:
                await refuse(context)
            return request

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            # Unary handlers, and streaming ones that answer with context.write() (health Watch).
            return await behavior(await checked(request, context), context)

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for item in behavior(await checked(request, context), context):
                yield item

        return same_shape(handler, stream if inspect.isasyncgenfunction(behavior) else call, deserialize)


def same_shape(handler: Any, behavior: Callable[..., Any], request_deserializer: Callable[[bytes], Any] | None = None) -> Any:
    """A method handler of ``handler``'s shape (unary or streaming each way) that runs
    ``behavior``, with ``handler``'s serializers unless another request deserializer is given:
    what an interceptor that wraps a method returns."""
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]  # fmt: skip
    return make(behavior, request_deserializer=request_deserializer or handler.request_deserializer,
                response_serializer=handler.response_serializer)
