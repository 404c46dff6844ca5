"""The gateway under things that go wrong around it, on real servers on 127.0.0.1: a stored
model that cannot be loaded (isolated: 503 with the reason on its routes, the others
serve, a metric), admin numbers beyond what the store holds (400, never 500), the headers
401, 405 and 429 call for, weak admin keys, and clients that hang up mid-body."""

from __future__ import annotations

import json
import socket
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from analysim._protos.v1 import prediction_pb2 as pb
from analysim._protos.v1 import prediction_pb2_grpc as pb_grpc
from analysim.errors import UserError
from mlaas_monitor.admin_key import load_admin_key
from mlaas_monitor.auth import admin_key_problem
from mlaas_monitor.monitor.client import local_monitor_extension
from mlaas_monitor.server import GatewayThread
from mlaas_monitor.service import MAX_QUOTA_ROWS, Gateway, Limits
from mlaas_monitor.store import Store
from tests.polling import wait_until
from tests.test_gateway_helpers import (
    ADMIN_KEY,
    Client,
    Running,
    credit_model,
    credit_rows,
    iris_model,
    running_gateway,
)

PREDICT = "/v1/models/credit/predict"


@pytest.fixture(scope="module")
def gw(module_db: str) -> Iterator[Running]:
    with running_gateway(module_db, [credit_model()], Limits(max_body_bytes=64_000)) as r:
        yield r


def samples(admin: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = admin.get("/metrics")
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text) for s in f.samples}


def _corrupt(db: Path, model_id: str, spec: str) -> None:
    """Store a model row as another tool (or a newer AnalySIM) might have left it."""
    con = sqlite3.connect(db)
    with con:
        con.execute("INSERT INTO models (id, created, spec, reveal_confidence, confidence_decimals, reveal_leaf, price_micros) VALUES (?, 0, ?, 1, 2, 0, 1000)", (model_id, spec))
    con.close()


@pytest.mark.parametrize("monitored", [True, False], ids=["monitor", "no-monitor"])
def test_a_model_that_fails_to_load_is_isolated(tmp_path: Path, monitored: bool) -> None:
    db = tmp_path / "store.db"
    store = Store(db, background_checkpoint=True)
    store.add_model(credit_model())
    store.add_model(iris_model())
    store.close()
    _corrupt(db, "future", json.dumps({"format": 99}))
    _corrupt(db, "garbled", "{not json")
    store = Store(db, background_checkpoint=True)
    extensions = [local_monitor_extension()] if monitored else []
    try:
        with GatewayThread(Gateway(store, ADMIN_KEY), extensions=extensions) as t:  # starts: one bad model is no crash
            assert t.bound is not None
            admin = Client("127.0.0.1", t.bound.http_port, ADMIN_KEY)
            status, body = admin.post("/v1/admin/users", {"name": "u"})
            user = Client("127.0.0.1", t.bound.http_port, body["api_key"])
            status, body = user.get("/v1/models")
            assert status == 200 and [m["id"] for m in body["models"]] == ["credit", "iris"]
            status, body = user.get("/v1/models/future")
            assert status == 503 and body["error"]["code"] == "model_unavailable"
            assert "unsupported model format 99" in body["error"]["message"]
            status, body = user.post("/v1/models/garbled/predict", {"rows": [[1]]})
            assert status == 503 and "JSONDecodeError" in body["error"]["message"]
            assert user.post(PREDICT, {"rows": credit_rows()[:3]})[0] == 200
            m = samples(admin)
            assert m[("analysim_gateway_model_unavailable", (("model", "future"),))] == 1
            assert m[("analysim_gateway_model_unavailable", (("model", "garbled"),))] == 1
            assert not any(k[0] == "analysim_gateway_requests_total" and ("status", "500") in k[1] for k in m)
            if monitored:
                status, body = admin.get("/v1/admin/monitor")
                assert status == 200 and [x["model"] for x in body["models"]] == ["credit", "iris"]
            # Replacing the broken row makes it servable again, without a restart.
            store.add_model(replace(iris_model(), id="future"), replace=True)
            assert user.get("/v1/models/future")[0] == 200
            assert samples(admin)[("analysim_gateway_model_unavailable", (("model", "future"),))] == 0
    finally:
        store.close()


def test_quota_beyond_sqlite_integers_is_400_not_500(gw: Running) -> None:
    gw.new_user("big")
    status, body = gw.admin.request("PATCH", "/v1/admin/users/big", {"quota_rows": 9223372036854775808})
    assert status == 400 and body["error"]["field"] == "quota_rows"
    status, body = gw.admin.request("PATCH", "/v1/admin/users/big", {"quota_rows": MAX_QUOTA_ROWS})
    assert status == 200 and body["quota_rows"] == MAX_QUOTA_ROWS
    assert gw.admin.post("/v1/admin/users", {"name": "big2", "quota_rows": 2**64})[0] == 400


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    field=st.sampled_from(["quota_rows", "rate_limit"]),
    value=st.one_of(st.integers(min_value=-(2**80), max_value=2**80), st.floats(allow_nan=False, allow_infinity=False), st.booleans(), st.text(max_size=4)),
)
def test_admin_numbers_are_200_or_400_never_500(gw: Running, field: str, value: object) -> None:
    gw.admin.post("/v1/admin/users", {"name": "big"})  # 409 once it exists (xdist may run this test first)
    status, body = gw.admin.request("PATCH", "/v1/admin/users/big", {field: value})
    assert status in (200, 400), body
    if status == 400:
        assert body["error"]["field"] == field


def test_401_405_429_carry_their_headers(gw: Running) -> None:
    anon = gw.client()
    assert anon.get("/v1/models")[0] == 401
    assert anon.last_headers is not None and anon.last_headers["WWW-Authenticate"].startswith("Bearer")
    assert gw.admin.request("DELETE", "/v1/models")[0] == 405
    assert gw.admin.last_headers is not None and set(gw.admin.last_headers["Allow"].split(",")) >= {"GET"}
    r = gw.new_user("slow", rate_limit=0.001)  # one request per 1000 s
    assert r.post(PREDICT, {"rows": credit_rows()[:1]})[0] == 200
    status, body = r.post(PREDICT, {"rows": credit_rows()[:1]})
    assert (status, body["error"]["code"]) == (429, "rate_limited")
    assert r.last_headers is not None and 1 <= int(r.last_headers["Retry-After"]) <= 1000
    # gRPC: RESOURCE_EXHAUSTED with the same wait as trailing metadata.
    row = pb.Row(values=[pb.Value(text=v) if isinstance(v, str) else pb.Value(number=v) for v in credit_rows()[0]])
    with grpc.insecure_channel(f"127.0.0.1:{gw.thread.bound.grpc_port}") as ch, pytest.raises(grpc.RpcError) as e:  # type: ignore[union-attr]
        pb_grpc.PredictionServiceStub(ch).Predict(pb.PredictRequest(model_id="credit", rows=[row]),
                                                  metadata=(("authorization", f"Bearer {r.key}"),))  # fmt: skip
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert 1 <= int(dict(e.value.trailing_metadata())["retry-after"]) <= 1000


def test_a_client_that_hangs_up_mid_body_is_not_a_500(gw: Running) -> None:
    key = gw.new_key("quitter")
    with socket.create_connection(("127.0.0.1", gw.port)) as s:
        s.sendall(f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                  "Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n{\"rows\": [".encode())  # fmt: skip

    def counted() -> bool:
        return samples(gw.admin).get(
            ("analysim_gateway_requests_total", (("protocol", "http"), ("route", "/v1/models/{id}/predict"), ("status", "499")))
        ) == 1  # fmt: skip

    wait_until(counted)
    assert not any(k[0] == "analysim_gateway_requests_total" and ("status", "500") in k[1] for k in samples(gw.admin))


@pytest.mark.parametrize("key", ["aaaaaaaaaaaaaaaa", "abababababababababab", "password12345678", "short"])
def test_weak_admin_keys_are_refused(key: str, tmp_path: Path) -> None:
    assert admin_key_problem(key) is not None
    with pytest.raises(UserError, match="ANALYSIM_ADMIN_KEY is (too predictable|shorter)"):
        load_admin_key({"ANALYSIM_ADMIN_KEY": key}, None)
    store = Store(tmp_path / "s.db")
    with pytest.raises(ValueError, match="admin key"):
        Gateway(store, key)
    store.close()


def test_random_admin_keys_are_accepted() -> None:
    import secrets

    for _ in range(50):
        assert admin_key_problem(secrets.token_urlsafe(16)) is None
    assert admin_key_problem(ADMIN_KEY) is None
