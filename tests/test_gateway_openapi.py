"""GET /v1/openapi.json from real gateways (127.0.0.1, ephemeral ports), with and without the
monitor extension: the document describes exactly the (method, path) pairs the running app
serves, and is structurally sound OpenAPI 3.0 (checked here by hand: the project does not
depend on openapi-spec-validator)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from aiohttp import web

from mlaas_monitor.monitor.client import local_monitor_extension
from mlaas_monitor.openapi import merge, openapi_spec
from mlaas_monitor.server import Extension, GatewayThread
from mlaas_monitor.service import Gateway
from mlaas_monitor.store import Store
from tests.test_gateway_helpers import ADMIN_KEY, Client, credit_model

OPERATIONS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
UNDESCRIBED = {"HEAD", "OPTIONS", "*"}  # aiohttp adds a HEAD route beside every GET
ERROR_REF = "#/components/schemas/Error"

Served = tuple[bool, dict[str, Any], set[tuple[str, str]]]  # monitored, spec, routes


@pytest.fixture(scope="module", params=[False, True], ids=["core", "monitor"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The spec a user's key fetches, and the routes on the running app's router."""
    apps: list[web.Application] = []

    def capture(gw: Gateway, app: web.Application, server: grpc.aio.Server) -> None:
        apps.append(app)  # runs after the other extensions: every route is in

    extensions: list[Extension] = [local_monitor_extension()] if request.param else []
    store = Store(tmp_path_factory.mktemp("openapi") / "store.db")
    store.add_model(credit_model())
    with GatewayThread(Gateway(store, ADMIN_KEY), extensions=[*extensions, capture]) as t:
        assert t.bound is not None
        admin = Client("127.0.0.1", t.bound.http_port, ADMIN_KEY)
        status, body = admin.post("/v1/admin/users", {"name": "reader"})
        assert status == 200, body
        status, spec = Client("127.0.0.1", t.bound.http_port, body["api_key"]).get("/v1/openapi.json")
        assert status == 200, spec
        routes = {
            (r.method, r.resource.canonical)
            for r in apps[0].router.routes()
            if r.method not in UNDESCRIBED and r.resource is not None
        }
        yield request.param, spec, routes
    store.close()


def described(spec: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in spec["paths"].items() for method in item}


def test_the_spec_describes_exactly_the_served_routes(served: Served) -> None:
    monitored, spec, routes = served
    assert described(spec) == routes
    assert (("GET", "/v1/admin/monitor") in routes) == monitored  # each case serves what it should


def resolve(spec: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), f"only local references: {ref}"
    node: Any = spec
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict) and part in node, f"unresolved $ref {ref}"
        node = node[part]
    return node


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if "$ref" in node:
            yield node["$ref"]
        for v in node.values():
            yield from refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from refs(v)


def test_the_spec_is_structurally_sound(served: Served) -> None:
    spec = served[1]
    assert re.fullmatch(r"3\.0\.\d+", spec["openapi"])
    assert spec["info"]["title"] and spec["info"]["version"]
    schemes = spec["components"]["securitySchemes"]
    assert all(name in schemes for req in spec["security"] for name in req)
    for ref in refs(spec):
        assert isinstance(resolve(spec, ref), dict), ref
    for path, item in spec["paths"].items():
        assert path.startswith("/")
        templated = set(re.findall(r"\{([^}]+)\}", path))
        for method, op in item.items():
            where = f"{method.upper()} {path}"
            assert method in OPERATIONS, where
            params = op.get("parameters", [])
            assert len({(p["name"], p["in"]) for p in params}) == len(params), f"{where}: duplicate parameter"
            in_path = [p for p in params if p["in"] == "path"]
            assert {p["name"] for p in in_path} == templated, f"{where}: path parameters"
            assert all(p["required"] is True for p in in_path), where
            assert op["responses"], f"{where}: no responses"
            for status, response in op["responses"].items():
                assert re.fullmatch(r"[1-5]\d\d", status) and response["description"], f"{where} {status}"
                if int(status) >= 400:  # the gateway's error body, everywhere
                    assert response["content"]["application/json"]["schema"] == {"$ref": ERROR_REF}, (
                        f"{where} {status}"
                    )
            if "requestBody" in op:
                assert op["requestBody"]["content"]["application/json"]["schema"], where


def test_predict_documents_the_idempotency_key(served: Served) -> None:
    op = served[1]["paths"]["/v1/models/{id}/predict"]["post"]
    (key,) = [p for p in op["parameters"] if p["in"] == "header"]
    assert key["name"] == "Idempotency-Key" and not key["required"]
    assert (key["schema"]["minLength"], key["schema"]["maxLength"]) == (1, 255)
    pattern = re.compile(key["schema"]["pattern"])
    assert pattern.match("retry-42_!~") and not pattern.match("has space") and not pattern.match("é")
    assert "Idempotent-Replayed" in op["responses"]["200"]["headers"]
    assert {"409", "422"} <= op["responses"].keys()


def test_an_operation_described_twice_is_refused() -> None:
    spec = openapi_spec()
    with pytest.raises(ValueError, match="described twice"):
        merge(spec, {"paths": {"/v1/models": {"get": {"responses": {}}}}})
