"""The gRPC front end: PredictionService (same semantics and auth as REST, via the shared
Gateway) and QueryStreamService (the query stream for a monitor running as its own
service), plus standard health checking and reflection."""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status as grpc_rpc_status

from analysim import rpc_status
from analysim._protos.v1 import prediction_pb2 as pb
from analysim._protos.v1 import prediction_pb2_grpc as pb_grpc
from analysim.grpc_decode import MalformedRequestGuard
from analysim.grpc_reflection import SERVICE_NAMES as REFLECTION_NAMES
from analysim.grpc_reflection import add_reflection
from mlaas_monitor.model import Answer, Model
from mlaas_monitor.service import ApiError, Gateway, PredictResult, Principal

log = logging.getLogger(__name__)
STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ALREADY_EXISTS,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.FAILED_PRECONDITION,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}
# Where the HTTP status is ambiguous, the error code decides.
CODE_STATUS = {"request_in_progress": grpc.StatusCode.ABORTED}
REPLAY_PAGE = 1000
REPLAYED_METADATA = (("idempotent-replayed", "true"),)


def grpc_status(e: ApiError) -> grpc.StatusCode:
    return CODE_STATUS.get(e.code) or STATUS[e.status]


def error_status(e: ApiError, code: grpc.StatusCode | None = None) -> Any:
    """The google.rpc.Status of a refusal: the REST error body's fields as an ErrorInfo
    (reason = its code) and, for INVALID_ARGUMENT, a BadRequest naming the field."""
    return rpc_status.status_proto(code or grpc_status(e), e.message, reason=e.code,
                                   domain=rpc_status.GATEWAY_DOMAIN, field=e.field)


class _Status(collections.namedtuple("_Status", ("code", "details", "trailing_metadata")), grpc.Status):
    pass


async def _abort(context: grpc.aio.ServicerContext, e: ApiError, code: grpc.StatusCode | None = None) -> None:
    """Abort with the refusal's google.rpc.Status; a ``Retry-After`` the REST answer would
    carry (429, 503) travels as the trailing metadata ``retry-after`` (seconds)."""
    status = grpc_rpc_status.to_status(error_status(e, code))
    retry = e.headers.get("Retry-After")
    if retry is not None:
        status = _Status(status.code, status.details, (*status.trailing_metadata, ("retry-after", retry)))
    await context.abort_with_status(status)


def _metadata(context: grpc.aio.ServicerContext, name: str) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == name:
            return value if isinstance(value, str) else value.decode()
    return None


def _authorization(context: grpc.aio.ServicerContext) -> str | None:
    return _metadata(context, "authorization")


def _value(v: pb.Value) -> Any:
    # ListFields() is [(descriptor, value)] for the set member of the oneof, [] if unset:
    # one call instead of WhichOneof plus getattr.
    f = v.ListFields()
    return f[0][1] if f else None


def rows_from_proto(rows: Any) -> list[Any]:
    """Protobuf rows to the JSON-like values the Gateway validates (one code path for both)."""
    out: list[Any] = []
    value = _value
    for i, row in enumerate(rows):
        if row.fields:
            if row.values:
                raise ApiError(400, "invalid_row", f"rows[{i}]: give either values or fields, not both", f"rows[{i}]")
            out.append({k: value(v) for k, v in row.fields.items()})
        else:
            out.append(list(map(value, row.values)))
    return out


_FRAGMENTS: weakref.WeakKeyDictionary[Model, list[bytes]] = weakref.WeakKeyDictionary()


def _prediction(d: dict[str, Any]) -> pb.Prediction:
    top = [pb.ClassConfidence(label=str(t["label"]), confidence=t["confidence"]) for t in d.get("top", ())]
    return pb.Prediction(label=str(d["label"]), confidence=d.get("confidence"), leaf=d.get("leaf"), top=top)


def _leaf_fragments(model: Model) -> list[bytes]:
    """Per node, the serialised ``predictions`` entry a row in that leaf gets under the
    model's policy (a Model is immutable; a policy change makes a new one)."""
    frags = _FRAGMENTS.get(model)
    if frags is None:
        labels, conf = model.node_answers
        n = model.tree.n_nodes
        preds = model.render(Answer(labels, conf, np.arange(n)))
        frags = [pb.PredictResponse(predictions=[_prediction(d)]).SerializeToString() for d in preds]
        _FRAGMENTS[model] = frags
    return frags


def predict_response(result: PredictResult) -> pb.PredictResponse:
    """Concatenated wire fragments parse as one message (repeated fields append): this
    replaces building a Python message object per row."""
    if result.answer is None or result.model.per_row:  # a replay (rare), or noise: the plain way
        return pb.PredictResponse(predictions=[_prediction(d) for d in result.predictions()],
                                  query_id=result.query_id, charged=result.charged)  # fmt: skip
    frags = _leaf_fragments(result.model)
    tail = pb.PredictResponse(query_id=result.query_id, charged=result.charged).SerializeToString()
    return pb.PredictResponse.FromString(b"".join([frags[i] for i in result.answer.leaves.tolist()]) + tail)


FEATURE_KIND = {"numeric": pb.FEATURE_KIND_NUMERIC, "categorical": pb.FEATURE_KIND_CATEGORICAL}


def model_info(public: dict[str, Any]) -> pb.ModelInfo:
    feats = [
        pb.FeatureInfo(
            name=f["name"],
            kind=FEATURE_KIND[f["type"]],
            min=f.get("min", 0.0),
            max=f.get("max", float(len(f.get("categories", [])) - 1)),
            categories=f.get("categories", []),
        )
        for f in public["features"]
    ]
    info = pb.ModelInfo(id=public["id"], features=feats, classes=[str(c) for c in public["classes"]])
    info.card.update(public)
    return info


class _Observed:
    """Shared wrapper: auth, ApiError -> status, metrics."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw  # the gateway whose requests are observed

    async def call(
        self, route: str, context: grpc.aio.ServicerContext, fn: Callable[[Principal], Awaitable[Any]]
    ) -> Any:
        start = time.perf_counter()
        try:
            result = await fn(self.gw.authenticate(_authorization(context)))
        except ApiError as e:
            await _abort(context, e, self.rejected(route, e, start))
        self.gw.metrics.observe_request("grpc", route, "OK", time.perf_counter() - start)
        return result

    def rejected(self, route: str, e: ApiError, start: float) -> grpc.StatusCode:
        """Count a refusal (by reason, and as a request with its status); its gRPC status."""
        status = grpc_status(e)
        self.gw.metrics.rejections.labels(e.code).inc()
        self.gw.metrics.observe_request("grpc", route, status.name, time.perf_counter() - start)
        return status


class PredictionServicer(pb_grpc.PredictionServiceServicer, _Observed):
    def __init__(self, gw: Gateway) -> None:
        super().__init__(gw)
        self._stopping = False  # set while the server drains: open streams end after their current answer
        self._idle_streams: set[asyncio.Task[Any]] = set()  # PredictStreams waiting for a message

    def close_streams(self) -> None:
        """Graceful shutdown: a stream ends after the message it is answering; a stream
        waiting for its client's next message ends now (else it would hold the shutdown for
        the whole grace period)."""
        self._stopping = True
        for task in list(self._idle_streams):
            task.cancel()

    async def ListModels(self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext) -> pb.ListModelsResponse:
        async def run(p: Principal) -> pb.ListModelsResponse:
            return pb.ListModelsResponse(models=[model_info(m) for m in self.gw.list_models()])

        return await self.call("ListModels", context, run)

    async def GetModel(self, request: pb.GetModelRequest, context: grpc.aio.ServicerContext) -> pb.GetModelResponse:
        async def run(p: Principal) -> pb.GetModelResponse:
            return pb.GetModelResponse(model=model_info(self.gw.model(request.model_id).public()))

        return await self.call("GetModel", context, run)

    async def _answer(self, p: Principal, request: pb.PredictRequest, key: str | None) -> PredictResult:
        self.gw.require_user(p)
        if request.HasField("packed"):
            if request.rows:
                raise ApiError(400, "invalid_request", "rows: give rows or packed, not both", "rows")
            pk = request.packed
            # list() copies the repeated fields in C; numpy and slicing on the protobuf
            # containers themselves would go element by element in Python.
            packed = (pk.n_rows, list(pk.numbers), list(pk.categories))
            return await self.gw.predict(p, request.model_id, None, packed, key)
        self.gw.check_batch(len(request.rows))
        return await self.gw.predict(p, request.model_id, rows_from_proto(request.rows), None, key)

    async def Predict(self, request: pb.PredictRequest, context: grpc.aio.ServicerContext) -> pb.PredictResponse:
        async def run(p: Principal) -> pb.PredictResponse:
            result = await self._answer(p, request, _metadata(context, "idempotency-key"))
            if result.replayed:
                await context.send_initial_metadata(REPLAYED_METADATA)
            return predict_response(result)

        return await self.call("Predict", context, run)

    async def PredictStream(
        self, request_iterator: AsyncIterator[pb.PredictStreamRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.PredictStreamResponse]:
        start = time.perf_counter()
        authorization = _authorization(context)
        try:
            self.gw.require_user(self.gw.authenticate(authorization))
        except ApiError as e:
            await _abort(context, e, self.rejected("PredictStream", e, start))
        task = asyncio.current_task()
        assert task is not None
        self._idle_streams.add(task)
        try:
            async for item in request_iterator:
                self._idle_streams.discard(task)
                yield await self._stream_answer(item, authorization)
                if self._stopping:
                    return
                self._idle_streams.add(task)
        except asyncio.CancelledError:
            if not self._stopping:
                raise
            # Cancelled by close_streams while idle: end the stream cleanly (status OK).
        finally:
            self._idle_streams.discard(task)

    async def _stream_answer(self, item: pb.PredictStreamRequest, authorization: str | None) -> pb.PredictStreamResponse:
        """One message of a PredictStream: its answer, or its refusal in band."""
        start = time.perf_counter()
        try:
            # Per request, not per stream: a key rotated or revoked meanwhile stops here.
            p = self.gw.authenticate(authorization)
            result = await self._answer(p, item.request, item.idempotency_key or None)
        except ApiError as e:
            status = error_status(e, self.rejected("PredictStream", e, start))
            # ErrorStatus has google.rpc.Status's wire format: its bytes are one.
            return pb.PredictStreamResponse(error=pb.ErrorStatus.FromString(status.SerializeToString()))
        self.gw.metrics.observe_request("grpc", "PredictStream", "OK", time.perf_counter() - start)
        return pb.PredictStreamResponse(answer=predict_response(result), replayed=result.replayed)

    async def GetUsage(self, request: pb.GetUsageRequest, context: grpc.aio.ServicerContext) -> pb.GetUsageResponse:
        async def run(p: Principal) -> pb.GetUsageResponse:
            u = self.gw.usage(p, request.user or None)
            return pb.GetUsageResponse(
                user=u["user"],
                queries=u["queries"],
                rows=u["rows"],
                charged=u["charged"],
                models=[pb.ModelUsage(model_id=m["model"], queries=m["queries"], rows=m["rows"], charged=m["charged"])
                        for m in u["models"]],
            )  # fmt: skip

        return await self.call("GetUsage", context, run)


def event_proto(e: Any) -> pb.SubscribeResponse:
    ev = pb.QueryEvent(
        seq=e.seq,
        user=e.user,
        model_id=e.model_id,
        n_features=e.features.shape[1],
        features=e.features.ravel().tolist(),
        labels=e.labels.tolist(),
        confidences=[] if e.confidences is None else e.confidences.tolist(),
        leaves=[] if e.leaves is None else e.leaves.tolist(),
    )
    # Whole seconds and the fraction separately: exact to the nanosecond, so a monitor
    # reading the stream sees the float time it would have seen in process.
    seconds = math.floor(e.timestamp)
    ev.timestamp.seconds, ev.timestamp.nanos = seconds, min(round((e.timestamp - seconds) * 1e9), 999_999_999)
    return pb.SubscribeResponse(event=ev)


class QueryStreamServicer(pb_grpc.QueryStreamServiceServicer):
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw  # the gateway whose answered queries are streamed

    async def Subscribe(
        self, request: pb.SubscribeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.SubscribeResponse]:
        try:
            self.gw.require_admin(self.gw.authenticate(_authorization(context)))
        except ApiError as e:
            await _abort(context, e)
        model = request.model_id or None
        # Subscribe before replaying so nothing committed in between is missed; skip the
        # live events the replay already delivered.
        sub = self.gw.stream.subscribe(model_id=model)
        try:
            # Unset after_seq: live only (nothing is replayed; every live event is newer than -1).
            last = request.after_seq if request.HasField("after_seq") else -1
            if last >= 0:
                while True:
                    page = self.gw.store.events_after(last, model, REPLAY_PAGE)
                    for e in page:
                        last = e.seq
                        if e.problem is not None:  # not an answer anyone was given: nothing to stream
                            log.warning("query stream: log row %d not sent: %s", e.seq, e.problem)
                            continue
                        yield event_proto(e)
                    if len(page) < REPLAY_PAGE:
                        break
            while True:
                e = await sub.get()
                if e is None:  # gateway shutting down, or this consumer fell too far behind
                    if sub.lost:
                        await rpc_status.abort(context, grpc.StatusCode.DATA_LOSS,
                                               "consumer too slow; resubscribe with after_seq",
                                               reason="consumer_too_slow", domain=rpc_status.GATEWAY_DOMAIN)
                    return
                if e.seq > last:
                    last = e.seq
                    yield event_proto(e)
        finally:
            sub.close()


class _AuthorisedReflection(reflection.aio.ReflectionServicer):
    """Reflection describes the API, so it needs a valid key like every endpoint; health
    stays open so that load balancers and orchestrators can probe without a secret.

    (A subclass rather than a server interceptor: an interceptor runs on every call and
    cost a fifth of single-row Predict throughput.)"""

    def __init__(self, gw: Gateway, service_names: list[str]) -> None:
        super().__init__(service_names)
        self.gw = gw  # the gateway that authenticates reflection calls

    async def ServerReflectionInfo(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            self.gw.authenticate(_authorization(context))
        except ApiError as e:
            await _abort(context, e, grpc.StatusCode.UNAUTHENTICATED)
        async for response in super().ServerReflectionInfo(request_iterator, context):
            yield response


@dataclass
class GrpcServer:
    server: grpc.aio.Server  # the running gRPC server
    health: Any  # the health servicer (serving or not, per service)
    services: list[str]  # the services' full names, as health reports them
    predictions: PredictionServicer  # the prediction service (told when the server drains)

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self.services]:
            await self.health.set(name, status)


def build_grpc_server(gw: Gateway, reuse_port: bool = False) -> GrpcServer:
    """``reuse_port``: share the port with the other workers of ``analysim gateway --workers``
    (SO_REUSEPORT; off otherwise, so that a port taken by someone else is an error)."""
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", gw.limits.max_body_bytes), ("grpc.so_reuseport", int(reuse_port))],
        interceptors=[MalformedRequestGuard(rpc_status.GATEWAY_DOMAIN)],
    )
    predictions = PredictionServicer(gw)
    pb_grpc.add_PredictionServiceServicer_to_server(predictions, server)
    pb_grpc.add_QueryStreamServiceServicer_to_server(QueryStreamServicer(gw), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    services = [d.full_name for d in pb.DESCRIPTOR.services_by_name.values()]
    add_reflection(server, _AuthorisedReflection(gw, [*services, health.SERVICE_NAME, *REFLECTION_NAMES]))
    return GrpcServer(server, health_servicer, services, predictions)
