"""The seam the extraction monitor plugs into: an extension adds admin routes and a
query-stream listener before the servers start, and sees every answered query."""

from __future__ import annotations

from pathlib import Path

import grpc
from aiohttp import web

from mlaas_monitor.server import GatewayThread
from mlaas_monitor.service import Gateway
from mlaas_monitor.store import Store
from mlaas_monitor.stream import QueryEvent
from tests.test_gateway_helpers import ADMIN_KEY, Client, credit_model, credit_rows


def test_extension_routes_and_listener(tmp_path: Path) -> None:
    seen: list[QueryEvent] = []

    def monitor(gw: Gateway, app: web.Application, server: grpc.aio.Server) -> None:
        gw.stream.add_listener(seen.append)

        async def status(request: web.Request) -> web.Response:
            gw.require_admin(gw.authenticate(request.headers.get("Authorization")))
            return web.json_response({"queries_seen": len(seen), "rows_seen": sum(e.n_rows for e in seen)})

        app.router.add_get("/v1/admin/monitor", status)

    store = Store(tmp_path / "s.db")
    store.add_model(credit_model())
    with GatewayThread(Gateway(store, ADMIN_KEY), extensions=[monitor]) as t:
        assert t.bound is not None
        admin = Client("127.0.0.1", t.bound.http_port, ADMIN_KEY)
        user = Client("127.0.0.1", t.bound.http_port, admin.post("/v1/admin/users", {"name": "u"})[1]["api_key"])
        for n in (1, 4):
            assert user.post("/v1/models/credit/predict", {"rows": credit_rows()[:n]})[0] == 200
        assert user.post("/v1/models/credit/predict", {"rows": [[0]]})[0] == 400
        assert admin.get("/v1/admin/monitor") == (200, {"queries_seen": 2, "rows_seen": 5})
        assert user.get("/v1/admin/monitor")[0] == 403
    store.close()
    assert [e.seq for e in seen] == [1, 2]


def test_a_failing_listener_does_not_fail_the_answered_query(tmp_path: Path) -> None:
    def broken(gw: Gateway, app: web.Application, server: grpc.aio.Server) -> None:
        def listener(event: QueryEvent) -> None:
            raise RuntimeError("monitor bug")

        gw.stream.add_listener(listener)

    store = Store(tmp_path / "s.db")
    store.add_model(credit_model())
    with GatewayThread(Gateway(store, ADMIN_KEY), extensions=[broken]) as t:
        assert t.bound is not None
        admin = Client("127.0.0.1", t.bound.http_port, ADMIN_KEY)
        user = Client("127.0.0.1", t.bound.http_port, admin.post("/v1/admin/users", {"name": "u"})[1]["api_key"])
        assert user.post("/v1/models/credit/predict", {"rows": credit_rows()[:2]})[0] == 200
        assert user.get("/v1/usage")[1]["rows"] == 2
    store.close()
