"""The monitor deployed as its own service: it follows the gateway's gRPC
``QueryStreamService/Subscribe`` (admin key), keeps its state in its own SQLite file, and
serves ``/metrics`` and ``/v1/admin/monitor[/{model}]`` (admin key) over HTTP.

The owner's models (tree, validation set S) are read from the gateway's store file (or a
copy): the tree never leaves the owner's side. Each (re)connection subscribes from seq 0,
so the durable log is replayed: rows up to this monitor's checkpoint only give back the raw
queries T_u needs, rows after it are folded in as new — the same rule as in process, hence
the same statuses.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc
import numpy as np
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from analysim.errors import UserError
from mlaas_monitor import auth
from mlaas_monitor.http_app import error_response, json_response
from mlaas_monitor.monitor.core import ModelMonitor
from mlaas_monitor.monitor.persist import MonitorDB
from mlaas_monitor.monitor.service import CHECKPOINT_INTERVAL_S, MonitorBase
from mlaas_monitor.service import ApiError
from mlaas_monitor.store import ModelUnavailable, Store
from mlaas_monitor.stream import QueryEvent
from protos.analysim.v1 import prediction_pb2 as pb
from protos.analysim.v1 import prediction_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
RETRY_S = 1.0


def event_from_proto(e: pb.QueryEvent) -> QueryEvent:
    n_features = int(e.n_features)
    features = np.asarray(e.features, dtype=np.float64).reshape(-1, n_features)
    return QueryEvent(
        seq=int(e.seq), timestamp=e.timestamp, user=e.user, model_id=e.model_id, features=features,
        labels=np.asarray(e.labels, dtype=np.int64),
        confidences=np.asarray(e.confidences, dtype=np.float64) if len(e.confidences) else None,
        leaves=np.asarray(e.leaves, dtype=np.int64) if len(e.leaves) else None,
    )  # fmt: skip


class RemoteMonitor(MonitorBase):
    def __init__(
        self, target: str, admin_key: str, models_db: str, state_db: str,
        checkpoint_interval: float = CHECKPOINT_INTERVAL_S,
    ) -> None:  # fmt: skip
        self.registry = CollectorRegistry(auto_describe=True)
        super().__init__(MonitorDB(state_db), self.registry, checkpoint_interval)
        self.target, self.admin_key = target, admin_key
        self._admin_hash = auth.hash_key(admin_key)
        self.models = Store(models_db)
        self._restore_upto: dict[str, int] = {}
        self._restored: dict[str, int] = {}
        self.connected = asyncio.Event()

    def monitor(self, model_id: str) -> ModelMonitor | None:
        mon = self.monitors.get(model_id)
        if mon is None:
            try:
                model = self.models.load_model(model_id)
            except ModelUnavailable as e:  # isolated, as the gateway does: the other models are watched
                log.error("not monitoring %s: %s", model_id, e.reason)
                return None
            if model is None:
                return None
            mon = ModelMonitor(model, self.configs.get(model_id))
            try:
                cp = self.db.load(mon)
            except ValueError:  # a replaced model: rebuild from the stream
                mon, cp = ModelMonitor(model, self.configs.get(model_id)), None
            self._restore_upto[model_id] = cp.seq if cp else 0
            self.monitors[model_id] = mon
            self._publish_all(mon)
        return mon

    def handle(self, e: QueryEvent) -> None:
        mon = self.monitor(e.model_id)
        if mon is None:
            return
        if e.seq <= self._restore_upto.get(e.model_id, 0):
            if e.seq > self._restored.get(e.model_id, 0):  # a reconnect replays again: once only
                mon.restore_queries(e.user, e.features, e.labels)
                self._restored[e.model_id] = e.seq
        elif e.seq > mon.last_seq:
            self._fold(mon, e)

    async def run(self) -> None:
        """Follow the stream until cancelled; reconnect (after RETRY_S) when it breaks."""
        md = (("authorization", f"Bearer {self.admin_key}"),)
        try:
            while True:
                try:
                    async with grpc.aio.insecure_channel(self.target) as ch:
                        call = pb_grpc.QueryStreamServiceStub(ch).Subscribe(pb.SubscribeRequest(after_seq=0), metadata=md)
                        await call.wait_for_connection()
                        self.connected.set()
                        async for pe in call:
                            start = time.perf_counter()
                            self.handle(event_from_proto(pe))
                            self.m_update.observe(time.perf_counter() - start)
                            self._schedule_save()
                except grpc.aio.AioRpcError as e:
                    if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                        raise UserError(f"the gateway refused the admin key: {e.details()}") from e
                    log.warning("query stream from %s broke (%s); reconnecting", self.target, e.code())
                self.connected.clear()
                await asyncio.sleep(RETRY_S)  # a retry back-off, not synchronisation
        finally:
            self.flush()

    def close(self) -> None:
        self.flush()
        self.db.close()
        self.models.close()

    # ---- the read-only HTTP view ----

    def model_view(self, model_id: str) -> dict[str, Any]:
        mon = self.monitor(model_id)
        if mon is None:
            raise ApiError(404, "unknown_model", f"no such model {model_id!r}", "model_id")
        return {
            "model": model_id, "last_seq": mon.last_seq, "total_queries": mon.total_queries,
            "config": mon.config.to_dict(),
            "users": [s.public() for _, s in sorted(mon.users.items())],
            "groups": [s.public() for _, s in sorted(mon.groups.items())],
        }  # fmt: skip

    def build_app(self) -> web.Application:
        registry = self.registry

        def check(request: web.Request) -> None:
            token = auth.bearer_token(request.headers.get("Authorization"))
            if token is None or not auth.same_hash(auth.hash_key(token), self._admin_hash):
                raise ApiError(401, "unauthenticated", "missing or invalid admin key", "Authorization")

        async def guarded(request: web.Request, fn: Any) -> web.StreamResponse:
            try:
                check(request)
                return fn(request)
            except ApiError as e:
                return error_response(e)

        async def metrics(request: web.Request) -> web.StreamResponse:
            return await guarded(request, lambda r: web.Response(body=generate_latest(registry), content_type="text/plain"))

        async def models(request: web.Request) -> web.StreamResponse:
            return await guarded(request, lambda r: json_response({"models": [self.model_view(m) for m in self.models.model_ids()]}))

        async def one(request: web.Request) -> web.StreamResponse:
            return await guarded(request, lambda r: json_response(self.model_view(r.match_info["model"])))

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/v1/admin/monitor", models)
        app.router.add_get("/v1/admin/monitor/{model}", one)
        return app
