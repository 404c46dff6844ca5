"""The REST API against a real aiohttp server on 127.0.0.1: endpoints, the auth matrix,
the bad-input matrix, billing, quotas and rate limits, policy, OpenAPI, metrics."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mlaas_monitor import auth
from mlaas_monitor.model import Policy
from mlaas_monitor.service import Limits
from tests.test_gateway_helpers import Running, credit_model, credit_rows, iris_model, running_gateway

PREDICT = "/v1/models/credit/predict"
_names = itertools.count()  # unique user names within the module's gateway


@pytest.fixture(scope="module")
def gw(module_db: str) -> Iterator[Running]:
    with running_gateway(module_db, [credit_model(), iris_model()], Limits(max_body_bytes=64_000, max_batch_rows=50)) as r:
        yield r


def metric_samples(gw: Running) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = gw.admin.get("/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_list_and_get_models_show_schema_and_card_but_never_the_tree(gw: Running) -> None:
    alice = gw.new_user("lister")
    status, body = alice.get("/v1/models")
    assert status == 200
    assert [m["id"] for m in body["models"]] == ["credit", "iris"]
    status, m = alice.get("/v1/models/credit")
    assert status == 200
    assert [f["name"] for f in m["features"]] == ["amount", "purpose", "age", "housing"]
    assert m["features"][1] == {"name": "purpose", "type": "categorical", "categories": ["car", "education", "repairs", "tv"]}
    assert m["card"]["leaves"] == credit_model().tree.n_leaves
    assert 0.5 < m["card"]["validation_accuracy"] <= 1
    assert "tree" not in m and "validation" not in m and "threshold" not in str(m)
    assert alice.get("/v1/models/nope") == (404, {"error": {"code": "unknown_model", "message": "no such model 'nope'", "field": "model_id"}})


def test_predictions_match_the_trained_tree_and_every_row_is_charged(gw: Running) -> None:
    bob = gw.new_user("bob")
    rows = credit_rows()[:30]
    before = gw.charged()
    status, body = bob.post(PREDICT, {"rows": rows})
    assert status == 200, body
    model = credit_model()
    expected = model.answer(model.schema.encode_rows(rows))
    assert [p["label"] for p in body["predictions"]] == [model.classes[i] for i in expected.labels]
    assert [p["confidence"] for p in body["predictions"]] == np.round(expected.confidences, 2).tolist()
    assert all("leaf" not in p for p in body["predictions"])  # default policy hides leaf ids
    assert body["charged"] == pytest.approx(30 * 0.001)
    after = gw.charged()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 30)
    # Named rows give the same answer as positional ones.
    named = [dict(zip(["amount", "purpose", "age", "housing"], r, strict=True)) for r in rows]
    assert bob.post(PREDICT, {"rows": named})[1]["predictions"] == body["predictions"]
    status, usage = bob.get("/v1/usage")
    assert status == 200
    assert usage["user"] == "bob" and usage["rows"] == 60 and usage["queries"] == 2
    assert usage["models"] == [{"model": "credit", "queries": 2, "rows": 60, "charged": pytest.approx(0.06)}]


AUTH_CASES = [
    # (who, method, path, expected status)
    ("none", "GET", "/v1/models", 401),
    ("wrong", "GET", "/v1/models", 401),
    ("revoked", "GET", "/v1/models", 401),
    ("none", "POST", PREDICT, 401),
    ("wrong", "POST", PREDICT, 401),
    ("revoked", "POST", PREDICT, 401),
    ("none", "GET", "/v1/usage", 401),
    ("none", "GET", "/metrics", 401),
    ("none", "GET", "/v1/openapi.json", 401),
    ("user", "GET", "/metrics", 403),
    ("user", "GET", "/v1/admin/users", 403),
    ("user", "POST", "/v1/admin/users", 403),
    ("user", "POST", "/v1/admin/users/carol/revoke", 403),
    ("user", "POST", "/v1/admin/users/carol/rotate", 403),
    ("user", "GET", "/v1/admin/models/credit/policy", 403),
    ("user", "GET", "/v1/usage?user=carol", 403),  # another user's data
    ("admin", "POST", PREDICT, 403),  # the admin is not a paying user
    ("user", "GET", "/v1/usage", 200),
    ("admin", "GET", "/v1/usage?user=carol", 200),
    ("admin", "GET", "/metrics", 200),
    ("user", "GET", "/v1/openapi.json", 200),
]


@pytest.mark.parametrize(("who", "method", "path", "expected"), AUTH_CASES)
def test_auth_matrix(gw: Running, who: str, method: str, path: str, expected: int) -> None:
    if not any(u["user"] == "carol" for u in gw.admin.get("/v1/admin/users")[1]["users"]):
        gw.new_user("carol")
    status, body = gw.admin.post("/v1/admin/users", {"name": f"m-{who}-{next(_names)}"})
    assert status == 200
    key = body["api_key"]
    if who == "revoked":
        assert gw.admin.post(f"/v1/admin/users/{body['user']}/revoke")[0] == 200
    client = gw.client({"none": None, "wrong": "ak_not-a-key", "revoked": key, "user": key, "admin": "x"}[who])
    if who == "admin":
        client = gw.admin
    before = gw.charged()
    status, resp = client.request(method, path, {"rows": credit_rows()[:1]} if method == "POST" else None)
    assert status == expected, resp
    if status >= 400:
        assert set(resp["error"]) >= {"code", "message"}
    assert gw.charged() == before or (status == 200 and method == "POST")


def test_key_rotation_invalidates_the_old_key(gw: Running) -> None:
    dave = gw.new_user("dave")
    assert dave.get("/v1/usage")[0] == 200
    status, body = gw.admin.post("/v1/admin/users/dave/rotate")
    assert status == 200 and body["api_key"] != dave.key
    assert dave.get("/v1/usage")[0] == 401
    assert gw.client(body["api_key"]).get("/v1/usage")[0] == 200
    assert gw.admin.post("/v1/admin/users/nobody/rotate")[0] == 404
    assert gw.admin.post("/v1/admin/users", {"name": "dave"})[0] == 409


def test_keys_are_stored_hashed(gw: Running) -> None:
    erin = gw.new_user("erin")
    assert erin.key is not None
    if gw.store.backend == "sqlite":
        db = Path(gw.store.path)
        data = db.read_bytes() + db.with_name(db.name + "-wal").read_bytes()
    else:  # every table's rows, as text
        import psycopg

        with psycopg.connect(gw.store.path) as con:
            tables = [r[0] for r in con.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
            data = repr([con.execute(f"SELECT * FROM {t}").fetchall() for t in tables]).encode()
    assert erin.key.encode() not in data
    assert auth.hash_key(erin.key).encode() in data


BAD_INPUT = [
    # (body or raw bytes, status, code, field)
    ({"rows": [[1, "car", 30]]}, 400, "invalid_row", "rows[0]"),
    ({"rows": [[1, "car", 30, "own", 5]]}, 400, "invalid_row", "rows[0]"),
    ({"rows": [["1", "car", 30, "own"]]}, 400, "invalid_row", "rows[0].amount"),
    ({"rows": [[True, "car", 30, "own"]]}, 400, "invalid_row", "rows[0].amount"),
    ({"rows": [[None, "car", 30, "own"]]}, 400, "invalid_row", "rows[0].amount"),
    ({"rows": [[1, "boat", 30, "own"]]}, 400, "invalid_row", "rows[0].purpose"),
    ({"rows": [[1, 3, 30, "own"]]}, 400, "invalid_row", "rows[0].purpose"),
    ({"rows": [[1, "car", 30, "own"], [1, "car", 1e39, "own"]]}, 400, "invalid_row", "rows[1].age"),
    ({"rows": [[1, "car", 10**400, "own"]]}, 400, "invalid_row", "rows[0].age"),
    ({"rows": [{"amount": 1, "purpose": "car", "age": 3}]}, 400, "invalid_row", "rows[0].housing"),
    ({"rows": [{"amount": 1, "purpose": "car", "age": 3, "housing": "own", "x": 1}]}, 400, "invalid_row", "rows[0].x"),
    ({"rows": [7]}, 400, "invalid_row", "rows[0]"),
    ({"rows": []}, 400, "invalid_row", "rows"),
    ({"rows": "all"}, 400, "invalid_row", "rows"),
    ({"row": [[1, "car", 30, "own"]]}, 400, "invalid_request", "row"),
    ({}, 400, "invalid_request", "rows"),
    ([1, 2], 400, "invalid_request", "body"),
    (b'{"rows": [[NaN, "car", 30, "own"]]}', 400, "malformed_json", "body"),
    (b'{"rows": [[Infinity, "car", 30, "own"]]}', 400, "malformed_json", "body"),
    (b'{"rows": [[1, "car", 30, "own"]', 400, "malformed_json", "body"),
    (b"\xff\xfe", 400, "malformed_json", "body"),
    (b"", 400, "malformed_json", "body"),
    (b"[" * 100_000 + b"]" * 100_000, 413, "body_too_large", "body"),
    (b"[" * 30_000 + b"]" * 30_000, 400, "malformed_json", "body"),
    ({"rows": [[1, "car", 30, "own"]] * 51}, 413, "batch_too_large", "rows"),
]


@pytest.mark.parametrize(("body", "status", "code", "field"), BAD_INPUT, ids=range(len(BAD_INPUT)))
def test_bad_input_is_a_clear_4xx_and_never_charged(gw: Running, body: object, status: int, code: str, field: str) -> None:
    frank = gw.client(gw.new_key(f"bad-{next(_names)}"))
    before = gw.charged()
    if isinstance(body, bytes):
        got, resp = frank.request("POST", PREDICT, raw=body)
    else:
        got, resp = frank.post(PREDICT, body)
    assert (got, resp["error"]["code"], resp["error"].get("field")) == (status, code, field), resp
    assert field in resp["error"]["message"]
    assert gw.charged() == before


def test_the_error_message_names_the_problem(gw: Running) -> None:
    g = gw.new_user("gina")
    _, resp = g.post(PREDICT, {"rows": [[1, "boat", 30, "own"]]})
    assert resp["error"]["message"] == "rows[0].purpose: unknown category 'boat'"
    _, resp = g.post(PREDICT, {"rows": [[1, "car", 30]]})
    assert resp["error"]["message"] == "rows[0]: expected 4 values, got 3"
    _, resp = g.request("POST", PREDICT, raw=b'{"rows": [[NaN, "car", 30, "own"]]}')
    assert "NaN" in resp["error"]["message"]
    # The slow path names the first bad value of a batch big enough for the fast path.
    rows = credit_rows()[:20]
    rows[13] = [1, "car", float("inf"), "own"]
    assert g.post(PREDICT, {"rows": rows[:13]})[0] == 200
    _, resp = g.request("POST", PREDICT, raw=json.dumps({"rows": rows}).replace("Infinity", "1e999").encode())
    assert resp["error"] == {"code": "invalid_row", "message": "rows[13].age: infinity is not allowed", "field": "rows[13].age"}


def test_unknown_routes_and_methods_are_json_4xx(gw: Running) -> None:
    assert gw.admin.get("/nope")[1]["error"]["code"] == "not_found"
    assert gw.admin.request("DELETE", "/v1/models")[0] == 405


def test_quota_answers_429_and_is_never_exceeded(gw: Running) -> None:
    h = gw.new_user("hank", quota_rows=25)
    rows = credit_rows()
    assert h.post(PREDICT, {"rows": rows[:20]})[0] == 200
    status, resp = h.post(PREDICT, {"rows": rows[:6]})
    assert (status, resp["error"]["code"]) == (429, "quota_exceeded")
    assert h.post(PREDICT, {"rows": rows[:5]})[0] == 200
    assert h.post(PREDICT, {"rows": rows[:1]})[0] == 429
    assert h.get("/v1/usage")[1]["rows"] == 25
    # Raising the quota lets the user continue.
    status, body = gw.admin.request("PATCH", "/v1/admin/users/hank", {"quota_rows": 26})
    assert status == 200 and body["quota_rows"] == 26
    assert h.post(PREDICT, {"rows": rows[:1]})[0] == 200
    assert gw.admin.request("PATCH", "/v1/admin/users/hank", {"quota_rows": -1})[1]["error"]["field"] == "quota_rows"


def test_rate_limit_answers_429(gw: Running) -> None:
    # 1 request per 1000 s: the burst allows one, the next is refused with no charge.
    r = gw.new_user("rita", rate_limit=0.001)
    assert r.post(PREDICT, {"rows": credit_rows()[:1]})[0] == 200
    before = gw.charged()
    status, resp = r.post(PREDICT, {"rows": credit_rows()[:1]})
    assert (status, resp["error"]["code"]) == (429, "rate_limited")
    assert gw.charged() == before


def test_response_policy_controls_what_is_revealed_and_the_price(gw: Running) -> None:
    u = gw.new_user("ivan")
    rows = iris_model().validation_X[:5].tolist()
    path = "/v1/models/iris/predict"
    status, policy = gw.admin.request("PUT", "/v1/admin/models/iris/policy", {"reveal_leaf": True, "confidence_decimals": 1, "price": 0.5})
    assert status == 200 and policy == {"reveal_confidence": True, "confidence_decimals": 1, "reveal_leaf": True, "price": 0.5,
                                   "top_k": 1, "confidence_noise": 0.0, "noise_seed": 0}
    status, body = u.post(path, {"rows": rows})
    leaves = iris_model().tree.apply(np.array(rows)).tolist()
    assert [p["leaf"] for p in body["predictions"]] == leaves
    assert all(round(p["confidence"], 1) == p["confidence"] for p in body["predictions"])
    assert body["charged"] == pytest.approx(2.5)
    gw.admin.request("PUT", "/v1/admin/models/iris/policy", {"reveal_leaf": False, "reveal_confidence": False})
    _, body = u.post(path, {"rows": rows})
    assert all(set(p) == {"label"} for p in body["predictions"])
    assert gw.admin.get("/v1/admin/models/iris/policy")[1]["reveal_confidence"] is False
    status, resp = gw.admin.request("PUT", "/v1/admin/models/iris/policy", {"confidence_decimals": 99})
    assert (status, resp["error"]["field"]) == (400, "confidence_decimals")
    assert gw.admin.request("PUT", "/v1/admin/models/iris/policy", {"colour": 1})[1]["error"]["field"] == "colour"
    assert gw.admin.request("PUT", "/v1/admin/models/nope/policy", {})[0] == 404
    gw.admin.request("PUT", "/v1/admin/models/iris/policy", Policy().to_dict())


def test_admin_user_validation(gw: Running) -> None:
    for body, field in [({}, "name"), ({"name": ""}, "name"), ({"name": "a b"}, "name"), ({"name": "x", "quota_rows": 1.5}, "quota_rows"),
                        ({"name": "x", "rate_limit": 0}, "rate_limit"), ({"name": "x", "admin": True}, "admin")]:  # fmt: skip
        status, resp = gw.admin.post("/v1/admin/users", body)
        assert (status, resp["error"]["field"]) == (400, field), body
    status, body = gw.admin.get("/v1/admin/users")
    assert status == 200 and all("key" not in str(k) for u in body["users"] for k in u)


def test_metrics_count_requests_rows_and_rejections(gw: Running) -> None:
    j = gw.new_user("judy")
    before = metric_samples(gw)
    assert j.post(PREDICT, {"rows": credit_rows()[:7]})[0] == 200
    assert j.post(PREDICT, {"rows": [[1]]})[0] == 400
    assert gw.client("ak_wrong").get("/v1/models")[0] == 401
    after = metric_samples(gw)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    route = "/v1/models/{id}/predict"
    assert delta("analysim_gateway_requests_total", protocol="http", route=route, status="200") == 1
    assert delta("analysim_gateway_requests_total", protocol="http", route=route, status="400") == 1
    assert delta("analysim_gateway_rows_answered_total", model="credit") == 7
    assert delta("analysim_gateway_charged_credits_total", model="credit") == pytest.approx(0.007)
    assert delta("analysim_gateway_rejections_total", reason="invalid_row") == 1
    assert delta("analysim_gateway_rejections_total", reason="unauthenticated") == 1
    assert delta("analysim_gateway_request_duration_seconds_count", protocol="http", route=route) == 2
    assert after[("analysim_gateway_commit_batch_queries_count", ())] >= 1
