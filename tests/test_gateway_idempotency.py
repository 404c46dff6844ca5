"""Idempotency keys: a retried request (same user, same Idempotency-Key, same content) is
answered from the ledger with the original bytes and is not charged again — over REST and
gRPC, across a restart of the store, and while the first attempt is still in flight."""

from __future__ import annotations

import asyncio
import itertools
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from analysim._protos.v1 import prediction_pb2 as pb
from analysim._protos.v1 import prediction_pb2_grpc as pb_grpc
from analysim.rpc_status import refusal_of
from mlaas_monitor.model import Policy
from mlaas_monitor.service import ApiError, Gateway, Principal
from mlaas_monitor.store import Store
from mlaas_monitor.store_schema import SCHEMA_VERSION
from tests.test_gateway_helpers import ADMIN_KEY, Client, Running, credit_model, credit_rows, running_gateway
from tests.test_gateway_replicas import raw_connection

PREDICT = "/v1/models/credit/predict"
_names = itertools.count()


@pytest.fixture(scope="module")
def gw(module_db: str) -> Iterator[Running]:
    db = module_db
    policy = Policy(reveal_confidence=True, confidence_decimals=3, reveal_leaf=True)
    with running_gateway(db, [credit_model()], policies={"credit": policy}) as r:
        yield r


def post(c: Client, rows: list[list[object]], key: str | None) -> tuple[int, dict, str | None]:
    status, body = c.post(PREDICT, {"rows": rows}, headers={"Idempotency-Key": key} if key else None)
    assert c.last_headers is not None
    return status, body, c.last_headers.get("Idempotent-Replayed")


def replays(gw: Running) -> float:
    return sum(s.value for m in gw.gw.metrics.replays.collect() for s in m.samples if s.name.endswith("_total"))


def test_a_retry_returns_the_original_answer_and_is_not_charged_again(gw: Running) -> None:
    c = gw.new_user("retrier")
    rows = credit_rows()[:7]
    status, first, replayed = post(c, rows, "order-1")
    assert status == 200 and replayed is None
    charged, before = gw.charged(), replays(gw)
    for _ in range(3):
        status, again, replayed = post(c, rows, "order-1")
        assert status == 200 and replayed == "true"
        assert again == first  # same predictions, query id and charge
    assert gw.charged() == charged and replays(gw) == before + 3
    # Raw bytes are identical too (no re-rendering drift, e.g. of rounded confidences).
    raw = [c.request("POST", PREDICT, {"rows": rows}, headers={"Idempotency-Key": "order-1"}) for _ in range(2)]
    assert raw[0] == raw[1]
    # Without a key, or with a new one, the same rows are a new query, charged again.
    for key in (None, "order-2"):
        status, body, replayed = post(c, rows, key)
        assert status == 200 and replayed is None and body["query_id"] > first["query_id"]
    assert gw.charged()[1] == charged[1] + 2 * len(rows)


def test_keys_belong_to_their_user(gw: Running) -> None:
    a, b = gw.new_user("key-a"), gw.new_user("key-b")
    _, first, _ = post(a, credit_rows()[:2], "shared-key")
    status, other, replayed = post(b, credit_rows()[:2], "shared-key")
    assert status == 200 and replayed is None and other["query_id"] != first["query_id"]


@pytest.mark.parametrize(
    ("key", "status", "code"),
    [
        ("", 400, "invalid_request"),  # sent but empty: refused rather than silently ignored
        ("has space", 400, "invalid_request"),
        ("x" * 256, 400, "invalid_request"),
        ("x" * 255, 200, None),
        ("tab\tkey", 400, "invalid_request"),
    ],
)
def test_malformed_keys_are_refused_before_any_charge(gw: Running, key: str, status: int, code: str | None) -> None:
    c = gw.new_user(f"malformed-{next(_names)}")
    before = gw.charged()
    got, body = c.post(PREDICT, {"rows": credit_rows()[:1]}, headers={"Idempotency-Key": key})
    assert got == status, body
    if code is not None:
        assert body["error"]["code"] == code and body["error"]["field"] == "Idempotency-Key"
        assert gw.charged() == before


def test_a_key_reused_for_different_content_is_422_and_not_charged(gw: Running) -> None:
    c = gw.new_user("reuser")
    post(c, credit_rows()[:2], "k")
    before = gw.charged()
    status, body, _ = post(c, credit_rows()[1:3], "k")
    assert status == 422 and body["error"]["code"] == "idempotency_key_reused"
    assert body["error"]["field"] == "Idempotency-Key" and "different request" in body["error"]["message"]
    assert gw.charged() == before


def grpc_request(rows: list[list[object]]) -> pb.PredictRequest:
    return pb.PredictRequest(
        model_id="credit",
        rows=[pb.Row(values=[pb.Value(text=v) if isinstance(v, str) else pb.Value(number=v) for v in r])
              for r in rows],
    )  # fmt: skip


def test_grpc_retry_returns_the_original_answer(gw: Running) -> None:
    key = gw.new_key("grpc-retrier")
    req = grpc_request(credit_rows()[:3])
    md = (("authorization", f"Bearer {key}"), ("idempotency-key", "grpc-1"))
    with grpc.insecure_channel(gw.thread.grpc_target) as ch:
        stub = pb_grpc.PredictionServiceStub(ch)
        first, call = stub.Predict.with_call(req, metadata=md)
        assert ("idempotent-replayed", "true") not in call.initial_metadata()
        charged = gw.charged()
        again, call = stub.Predict.with_call(req, metadata=md)
        assert ("idempotent-replayed", "true") in call.initial_metadata()
        assert again == first and gw.charged() == charged
        # The same key over REST names the same request (same user, same content).
        rest = Client("127.0.0.1", gw.port, key)
        status, body, replayed = post(rest, credit_rows()[:3], "grpc-1")
        assert status == 200 and replayed == "true" and body["query_id"] == first.query_id
        with pytest.raises(grpc.RpcError) as e:
            stub.Predict(pb.PredictRequest(model_id="credit", rows=req.rows[:1]), metadata=md)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


# A logged answer damaged under the gateway (3 rows answered, confidences and leaves revealed):
# the column, the value written there, and what the refusal names. Each was a 500 with a
# traceback (a blob of the wrong size, a label past the classes) or a wrong answer sent as the
# original (a label of -1 read as the last class; a NaN confidence, which is not JSON).
DAMAGED_ANSWERS = {
    "labels cut": ("query_log", "labels", b"\x01\x00\x00", "labels blob holds 3 bytes; 3 row(s) need 12"),
    "a label past the classes": ("query_log", "labels", np.full(3, 99, "<i4").tobytes(), "label 99 is not one of"),
    "a negative label": ("query_log", "labels", np.full(3, -1, "<i4").tobytes(), "label -1 is not one of"),
    "a NaN confidence": ("query_log", "confidences", np.full(3, np.nan, "<f8").tobytes(), "confidence nan"),
    "confidences cut": ("query_log", "confidences", b"", "confidences blob holds 0 bytes"),
    "leaves cut": ("query_log", "leaves", b"\x00" * 5, "leaves blob holds 5 bytes"),
    "a negative charge": ("ledger", "amount_micros", -5, "amount_micros -5 is not an integer >= 0"),
}


@pytest.mark.parametrize("damage", DAMAGED_ANSWERS)
def test_a_damaged_logged_answer_is_refused_cleanly_and_not_charged(gw: Running, module_db: str, damage: str,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    table, column, value, named = DAMAGED_ANSWERS[damage]
    c = gw.new_user(f"damaged-{next(_names)}")
    status, first, _ = post(c, credit_rows()[:3], "kept")
    assert status == 200
    con = raw_connection(module_db)  # the gateway's own store
    key = "query_id" if table == "ledger" else "id"
    param = "%s" if module_db.startswith("postgresql://") else "?"
    con.execute(f"UPDATE {table} SET {column} = {param} WHERE {key} = {param}", (value, first["query_id"]))
    con.close()
    charged = gw.charged()
    caplog.set_level(logging.WARNING)
    status, body, replayed = post(c, credit_rows()[:3], "kept")
    assert (status, body["error"]["code"]) == (503, "answer_unreadable"), body
    assert f"query {first['query_id']}" in body["error"]["message"] and named in body["error"]["message"], body
    assert replayed is None and gw.charged() == charged  # nothing told as the original, nothing charged
    assert not any(r.exc_info for r in caplog.records), "a traceback was logged"
    assert sum(named in r.getMessage() for r in caplog.records) == 1  # said once, in the log too
    md = (("authorization", f"Bearer {c.key}"), ("idempotency-key", "kept"))  # the same request over gRPC
    with grpc.insecure_channel(gw.thread.grpc_target) as ch, pytest.raises(grpc.RpcError) as e:
        pb_grpc.PredictionServiceStub(ch).Predict(grpc_request(credit_rows()[:3]), metadata=md)
    assert (e.value.code(), refusal_of(e.value)["code"]) == (grpc.StatusCode.UNAVAILABLE, "answer_unreadable")
    assert gw.charged() == charged
    status, fresh, _ = post(c, credit_rows()[:3], "kept-2")  # the way out the refusal gives
    assert status == 200 and fresh["query_id"] > first["query_id"]


def test_a_duplicate_while_the_first_is_in_flight_is_409(store_db: str) -> None:
    """Both requests reach the gateway before the first one's commit: the second must not
    be answered (that would charge twice) and must not wait for an answer it can't replay."""
    store = Store(store_db)
    store.add_model(credit_model())
    gw = Gateway(store, ADMIN_KEY)
    gw.create_user({"name": "u"})
    who = Principal("u")

    async def race() -> list[object]:
        return await asyncio.gather(
            gw.predict(who, "credit", credit_rows()[:1], request_key="dup"),
            gw.predict(who, "credit", credit_rows()[:1], request_key="dup"),
            return_exceptions=True,
        )

    first, second = asyncio.run(race())
    assert not isinstance(first, BaseException) and first.query_id == 1
    assert isinstance(second, ApiError) and (second.status, second.code) == (409, "request_in_progress")
    assert store.ledger_totals()[0] == 1
    # Once committed, the retry is a replay.
    again = asyncio.run(gw.predict(who, "credit", credit_rows()[:1], request_key="dup"))
    assert again.replayed and again.query_id == 1 and again.to_json() == first.to_json()
    store.close()


def test_a_version_1_store_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    # The store as version 1 wrote it.
    con = sqlite3.connect(db)
    con.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        " INSERT INTO meta VALUES ('schema_version', '1');"
        " CREATE TABLE models (id TEXT PRIMARY KEY, created REAL NOT NULL, spec TEXT NOT NULL,"
        " reveal_confidence INTEGER NOT NULL, confidence_decimals INTEGER NOT NULL, reveal_leaf INTEGER NOT NULL,"
        " price_micros INTEGER NOT NULL);"
        " CREATE TABLE users (name TEXT PRIMARY KEY, key_hash TEXT NOT NULL UNIQUE, created REAL NOT NULL,"
        " revoked REAL, quota_rows INTEGER, rate_limit REAL);"
        " CREATE TABLE query_log (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, user TEXT NOT NULL,"
        " model TEXT NOT NULL, n_rows INTEGER NOT NULL, n_features INTEGER NOT NULL, features BLOB NOT NULL,"
        " labels BLOB NOT NULL, confidences BLOB, leaves BLOB);"
        " CREATE TABLE ledger (query_id INTEGER PRIMARY KEY REFERENCES query_log(id), ts REAL NOT NULL,"
        " user TEXT NOT NULL, model TEXT NOT NULL, rows INTEGER NOT NULL, amount_micros INTEGER NOT NULL);"
    )
    con.close()
    store = Store(db)
    store.add_model(credit_model())
    gw = Gateway(store, ADMIN_KEY)
    gw.create_user({"name": "u"})
    first = asyncio.run(gw.predict(Principal("u"), "credit", credit_rows()[:1], request_key="k"))
    again = asyncio.run(gw.predict(Principal("u"), "credit", credit_rows()[:1], request_key="k"))
    assert again.replayed and again.query_id == first.query_id
    store.close()
    con = sqlite3.connect(db)
    assert con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    con.close()
