"""The REST front end (aiohttp): decode HTTP, call the Gateway, encode JSON. Nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import ClientPayloadError, web
from aiohttp.web_protocol import RequestPayloadError

from mlaas_monitor.connections import ConnectionCap, default_max_connections
from mlaas_monitor.openapi import openapi_spec
from mlaas_monitor.service import ApiError, Gateway, bad_field

log = logging.getLogger(__name__)
GATEWAY: web.AppKey[Gateway] = web.AppKey("gateway", Gateway)
# OpenAPI fragments describing the routes extensions add (see openapi.py).
OPENAPI_FRAGMENTS: web.AppKey[list[dict[str, Any]]] = web.AppKey("openapi_fragments", list)
UPLOADS: web.AppKey[list[int]] = web.AppKey("uploads", list)  # [slow bodies being received now]
CONNECTION_CAP: web.AppKey[ConnectionCap] = web.AppKey("connection_cap", ConnectionCap)
SLOW_BODY_S = 0.25  # a body still arriving after this is a slow upload
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


REPLAYED = {"Idempotent-Replayed": "true"}


def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity, which are not JSON; refuse them by name.
    raise ValueError(f"{name} is not valid JSON")


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(data, separators=(",", ":")).encode(), status=status, content_type="application/json")


# Tells a client without (valid) credentials how to authenticate (RFC 9110, 11.6.1).
WWW_AUTHENTICATE = {"WWW-Authenticate": 'Bearer realm="analysim"'}
# nginx's status for a request the client abandoned; counted, never answered (no one listens).
CLIENT_CLOSED = 499


class ClientGone(Exception):
    """The client closed the connection before its request body had arrived."""


def error_response(e: ApiError) -> web.Response:
    r = json_response(e.body(), e.status)
    r.headers.update(e.headers)
    if e.status == 401:
        r.headers.update(WWW_AUTHENTICATE)
    return r


async def read_body(request: web.Request) -> bytes:
    """The body (``_receive_body``): 413 beyond the size limit, 400 when it cannot be decoded
    (a Content-Encoding it is not in, a broken chunked encoding); ClientGone when the client left."""
    try:
        return await _receive_body(request)
    except web.HTTPRequestEntityTooLarge as e:
        limit = request.app[GATEWAY].limits.max_body_bytes
        raise ApiError(413, "body_too_large", f"body: larger than the limit of {limit} bytes", "body") from e
    except RequestPayloadError as e:  # (aiohttp's message: "400, message:\n  Can not decode ...")
        why = str(e).rsplit("message:", 1)[-1].strip()
        # The rest of the body is unreadable: marked read (aiohttp would otherwise read it to
        # reuse the connection, and log the same error as unhandled), the connection closed.
        request.content.feed_eof()
        raise ApiError(400, "malformed_body", f"body: {why}", "body", headers={"Connection": "close"}) from e
    except (ConnectionError, ClientPayloadError) as e:
        raise ClientGone(str(e)) from e


async def _receive_body(request: web.Request) -> bytes:
    """The body, received whole within ``limits.body_timeout_s``. One that has arrived with its
    headers (the usual case) is read at once; one still arriving after ``SLOW_BODY_S`` is a slow
    upload, of which at most ``limits.max_uploads`` are waited for at a time (beyond: 503 at
    once). A client that announces a Content-Length and sends a trickle thus holds a
    connection and a buffer for the timeout at most, and never keeps the others out."""
    if request.content.is_eof():
        return await request.read()
    limits, uploads = request.app[GATEWAY].limits, request.app[UPLOADS]
    read = asyncio.ensure_future(request.read())
    done, _ = await asyncio.wait({read}, timeout=min(SLOW_BODY_S, limits.body_timeout_s))
    if not done:
        if uploads[0] >= limits.max_uploads:
            await _cancel(read)
            raise ApiError(503, "too_many_uploads", f"{limits.max_uploads} slow request bodies are being received: "
                           "retry shortly", headers={"Retry-After": "1", "Connection": "close"})  # fmt: skip
        uploads[0] += 1
        try:
            done, _ = await asyncio.wait({read}, timeout=max(0.0, limits.body_timeout_s - SLOW_BODY_S))
        finally:
            uploads[0] -= 1
        if not done:
            await _cancel(read)
            raise ApiError(408, "body_timeout", f"body: not received whole within {limits.body_timeout_s:g} s", "body",
                           headers={"Connection": "close"})  # fmt: skip
    return read.result()


async def _cancel(task: asyncio.Future[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


async def read_json(request: web.Request) -> Any:
    raw = await read_body(request)
    if not raw:
        raise bad_field("body", "empty body: expected JSON", "malformed_json")
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except UnicodeDecodeError as e:
        raise bad_field("body", "not UTF-8 text", "malformed_json") from e
    except RecursionError as e:
        raise bad_field("body", "JSON nested too deeply", "malformed_json") from e
    except ValueError as e:  # JSONDecodeError included
        raise bad_field("body", f"malformed JSON: {e}", "malformed_json") from e


def add_openapi(app: web.Application, fragment: dict[str, Any]) -> None:
    """Describe routes an extension adds to ``app`` (before it starts) in GET /v1/openapi.json."""
    app[OPENAPI_FRAGMENTS].append(fragment)


def _route_name(request: web.Request) -> str:
    info = request.match_info
    if isinstance(info, web.UrlMappingMatchInfo) and not info.http_exception:
        return info.route.resource.canonical if info.route.resource else "unmatched"
    return "unmatched"


def build_app(gw: Gateway) -> web.Application:
    @web.middleware
    async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.perf_counter()
        try:
            with cap.handling(request):
                response = await handler(request)
        except ApiError as e:
            response = error_response(e)
            gw.metrics.rejections.labels(e.code).inc()
        except web.HTTPException as e:  # router 404/405
            code = {404: "not_found", 405: "method_not_allowed"}.get(e.status, "http_error")
            allow = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
            response = error_response(ApiError(e.status, code, e.reason, headers=allow))
            gw.metrics.rejections.labels(code).inc()
        except ClientGone as e:  # not our error: counted as 499, not 500 (no one reads the answer)
            log.info("client closed %s %s before its body arrived: %s", request.method, request.path, e)
            response = error_response(ApiError(CLIENT_CLOSED, "client_closed", "the client closed the connection"))
        except Exception:  # a bug: answer JSON, log it, keep serving
            log.exception("internal error on %s %s", request.method, request.path)
            response = error_response(ApiError(500, "internal", "internal error"))
        gw.metrics.observe_request("http", _route_name(request), response.status, time.perf_counter() - start)
        return response

    cap = ConnectionCap(gw.limits.max_connections or default_max_connections(),
                        lambda kind: gw.metrics.connections_capped.labels(kind).inc())
    app = web.Application(middlewares=[observe], client_max_size=gw.limits.max_body_bytes)
    app[GATEWAY] = gw
    app[CONNECTION_CAP] = cap
    app[OPENAPI_FRAGMENTS] = []
    app[UPLOADS] = [0]

    def principal(request: web.Request) -> Any:
        return gw.authenticate(request.headers.get("Authorization"))

    async def list_models(request: web.Request) -> web.Response:
        principal(request)
        return json_response({"models": gw.list_models()})

    async def get_model(request: web.Request) -> web.Response:
        principal(request)
        return json_response(gw.model(request.match_info["id"]).public())

    async def predict(request: web.Request) -> web.Response:
        p = principal(request)
        body = await read_json(request)
        if type(body) is not dict:
            raise bad_field("body", "expected a JSON object with 'rows'")
        for key in body:
            if key != "rows":
                raise bad_field(str(key)[:40], "unknown field (expected only 'rows')")
        if "rows" not in body:
            raise bad_field("rows", "missing: expected a list of rows")
        result = await gw.predict(p, request.match_info["id"], body["rows"], None, request.headers.get("Idempotency-Key"))
        headers = REPLAYED if result.replayed else None
        return web.Response(body=result.to_json(), content_type="application/json", headers=headers)

    async def usage(request: web.Request) -> web.Response:
        p = principal(request)
        return json_response(gw.usage(p, request.query.get("user")))

    async def openapi(request: web.Request) -> web.Response:
        principal(request)
        return json_response(openapi_spec(*request.app[OPENAPI_FRAGMENTS]))

    async def metrics(request: web.Request) -> web.Response:
        gw.require_admin(principal(request))
        # In a thread: a collector may wait on another process (the monitor's metrics).
        return web.Response(body=await asyncio.to_thread(gw.metrics.render), content_type="text/plain", charset="utf-8")

    def admin(fn: Callable[[web.Request], Awaitable[Any]]) -> Handler:
        async def handler(request: web.Request) -> web.Response:
            gw.require_admin(principal(request))
            return json_response(await fn(request))

        return handler

    async def list_users(request: web.Request) -> Any:
        return {"users": gw.list_users()}

    async def create_user(request: web.Request) -> Any:
        return gw.create_user(await read_json(request))

    async def patch_user(request: web.Request) -> Any:
        return gw.update_limits(request.match_info["name"], await read_json(request))

    async def rotate(request: web.Request) -> Any:
        return gw.rotate_key(request.match_info["name"])

    async def revoke(request: web.Request) -> Any:
        return gw.revoke_key(request.match_info["name"])

    async def get_policy(request: web.Request) -> Any:
        return gw.model(request.match_info["id"]).policy.to_dict()

    async def put_policy(request: web.Request) -> Any:
        return gw.set_policy(request.match_info["id"], await read_json(request))

    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{id}", get_model)
    app.router.add_post("/v1/models/{id}/predict", predict)
    app.router.add_get("/v1/usage", usage)
    app.router.add_get("/v1/openapi.json", openapi)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/admin/users", admin(list_users))
    app.router.add_post("/v1/admin/users", admin(create_user))
    app.router.add_patch("/v1/admin/users/{name}", admin(patch_user))
    app.router.add_post("/v1/admin/users/{name}/rotate", admin(rotate))
    app.router.add_post("/v1/admin/users/{name}/revoke", admin(revoke))
    app.router.add_get("/v1/admin/models/{id}/policy", admin(get_policy))
    app.router.add_put("/v1/admin/models/{id}/policy", admin(put_policy))
    return app
