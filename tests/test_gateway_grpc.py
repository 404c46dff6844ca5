"""The gRPC services against a real grpc.aio server on 127.0.0.1: the same semantics and
auth as REST (shared serving code), health, reflection, and the query stream."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf.json_format import MessageToDict
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from analysim._protos.v1 import prediction_pb2 as pb
from analysim._protos.v1 import prediction_pb2_grpc as pb_grpc
from analysim.rpc_status import refusal_fields, refusal_of
from mlaas_monitor.model import Policy
from mlaas_monitor.service import Limits
from tests.polling import scaled
from tests.reflection import reflected_file_package, reflected_services
from tests.test_gateway_helpers import (
    ADMIN_KEY,
    Running,
    credit_model,
    credit_rows,
    running_gateway,
    wait_until,
)


@pytest.fixture(scope="module")
def gw(module_db: str) -> Iterator[Running]:
    db = module_db
    policy = Policy(reveal_confidence=True, confidence_decimals=3, reveal_leaf=True)
    with running_gateway(db, [credit_model()], Limits(max_batch_rows=40), {"credit": policy}) as r:
        yield r


@pytest.fixture(scope="module")
def channel(gw: Running) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(gw.thread.grpc_target) as ch:
        yield ch


_names = itertools.count()


def md(key: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),) if key else ()


def to_proto(rows: list[list[object]]) -> list[pb.Row]:
    return [pb.Row(values=[pb.Value(text=v) if isinstance(v, str) else pb.Value(number=v) for v in r]) for r in rows]


def error_of(exc: grpc.RpcError) -> dict[str, str]:
    """The REST error body's fields, from the call's google.rpc.Status details."""
    return refusal_of(exc)


CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}


def stream_error(r: pb.PredictStreamResponse) -> tuple[str, str, str | None]:
    """A streamed refusal: its status name, reason and field."""
    err = refusal_fields(r.error)
    return CODE_NAMES[r.error.code], err["code"], err.get("field")


def test_grpc_predict_equals_http_predict(gw: Running, channel: grpc.Channel) -> None:
    key = gw.new_key("g-alice")
    stub = pb_grpc.PredictionServiceStub(channel)
    rows = credit_rows()[:25]
    before = gw.charged()
    resp = stub.Predict(pb.PredictRequest(model_id="credit", rows=to_proto(rows)), metadata=md(key))
    _, http = gw.client(key).post("/v1/models/credit/predict", {"rows": rows})
    assert [p.label for p in resp.predictions] == [str(p["label"]) for p in http["predictions"]]
    assert [p.confidence for p in resp.predictions] == [p["confidence"] for p in http["predictions"]]
    assert [p.leaf for p in resp.predictions] == [p["leaf"] for p in http["predictions"]]
    assert resp.charged == pytest.approx(0.025) and resp.query_id + 1 == http["query_id"]
    assert gw.charged()[1] - before[1] == 50
    named = [pb.Row(fields={k: v for k, v in zip(["amount", "purpose", "age", "housing"], r.values, strict=True)})
             for r in to_proto(rows)]  # fmt: skip
    assert stub.Predict(pb.PredictRequest(model_id="credit", rows=named), metadata=md(key)).predictions == resp.predictions
    usage = stub.GetUsage(pb.GetUsageRequest(), metadata=md(key))
    assert (usage.user, usage.rows, usage.queries) == ("g-alice", 75, 3)
    info = stub.GetModel(pb.GetModelRequest(model_id="credit"), metadata=md(key)).model
    assert [f.name for f in info.features] == ["amount", "purpose", "age", "housing"]
    assert [f.kind for f in info.features[:2]] == [pb.FEATURE_KIND_NUMERIC, pb.FEATURE_KIND_CATEGORICAL]
    assert list(info.features[1].categories) == ["car", "education", "repairs", "tv"]
    # The card is the REST model document, as a Struct.
    card = MessageToDict(info.card)
    assert card["id"] == "credit" and card == json.loads(json.dumps(gw.client(key).get("/v1/models/credit")[1]))
    assert [m.id for m in stub.ListModels(pb.ListModelsRequest(), metadata=md(key)).models] == ["credit"]


@pytest.mark.parametrize(
    ("who", "request_", "code", "field"),
    [
        ("none", pb.PredictRequest(model_id="credit"), grpc.StatusCode.UNAUTHENTICATED, "Authorization"),
        ("wrong", pb.PredictRequest(model_id="credit"), grpc.StatusCode.UNAUTHENTICATED, "Authorization"),
        ("admin", pb.PredictRequest(model_id="credit"), grpc.StatusCode.PERMISSION_DENIED, None),
        ("user", pb.PredictRequest(model_id="nope", rows=[pb.Row()]), grpc.StatusCode.NOT_FOUND, "model_id"),
        ("user", pb.PredictRequest(model_id="credit"), grpc.StatusCode.INVALID_ARGUMENT, "rows"),
        ("user", pb.PredictRequest(model_id="credit", rows=[pb.Row(values=[pb.Value(number=1)])]),
         grpc.StatusCode.INVALID_ARGUMENT, "rows[0]"),
        ("user", pb.PredictRequest(model_id="credit", rows=[pb.Row(values=[pb.Value(number=1), pb.Value(text="boat"),
         pb.Value(number=3), pb.Value(text="own")])]), grpc.StatusCode.INVALID_ARGUMENT, "rows[0].purpose"),
        ("user", pb.PredictRequest(model_id="credit", rows=[pb.Row(values=[pb.Value(number=float("nan")),
         pb.Value(text="car"), pb.Value(number=3), pb.Value(text="own")])]), grpc.StatusCode.INVALID_ARGUMENT, "rows[0].amount"),
        ("user", pb.PredictRequest(model_id="credit", rows=[pb.Row(values=[pb.Value(), pb.Value(text="car"),
         pb.Value(number=3), pb.Value(text="own")])]), grpc.StatusCode.INVALID_ARGUMENT, "rows[0].amount"),
        ("user", pb.PredictRequest(model_id="credit", rows=[pb.Row(values=[pb.Value(number=1)], fields={"a": pb.Value()})]),
         grpc.StatusCode.INVALID_ARGUMENT, "rows[0]"),
        ("user", pb.PredictRequest(model_id="credit", rows=to_proto([[1.0, "car", 3.0, "own"]] * 41)),
         grpc.StatusCode.INVALID_ARGUMENT, "rows"),
    ],
    ids=range(11),
)  # fmt: skip
def test_grpc_refusals_map_to_status_codes_and_are_never_charged(
    gw: Running, channel: grpc.Channel, who: str, request_: pb.PredictRequest, code: grpc.StatusCode, field: str | None
) -> None:
    key = gw.new_key(f"g-{who}-{next(_names)}")
    metadata = md({"none": None, "wrong": "ak_nope", "admin": ADMIN_KEY, "user": key}[who])
    before = gw.charged()
    with pytest.raises(grpc.RpcError) as exc:
        pb_grpc.PredictionServiceStub(channel).Predict(request_, metadata=metadata)
    assert exc.value.code() == code
    assert error_of(exc.value).get("field") == field
    status = rpc_status.from_call(exc.value)
    violations = []
    for d in status.details:
        if d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            d.Unpack(br)
            violations += [v.field for v in br.field_violations]
    # A BadRequest names the field exactly when the argument is at fault.
    assert violations == ([field] if field and code == grpc.StatusCode.INVALID_ARGUMENT else [])
    assert gw.charged() == before


def test_grpc_usage_of_another_user_needs_the_admin(gw: Running, channel: grpc.Channel) -> None:
    key = gw.new_key("g-bob")
    stub = pb_grpc.PredictionServiceStub(channel)
    with pytest.raises(grpc.RpcError) as exc:
        stub.GetUsage(pb.GetUsageRequest(user="g-alice"), metadata=md(key))
    assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert stub.GetUsage(pb.GetUsageRequest(user="g-bob"), metadata=md(ADMIN_KEY)).user == "g-bob"


def test_health_is_serving_and_reflection_needs_a_key(gw: Running, channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "analysim.v1.PredictionService"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service)).status == health_pb2.HealthCheckResponse.SERVING
    key = gw.new_key("g-refl")
    for version in ("v1", "v1alpha"):  # v1: what grpcurl asks first
        with pytest.raises(grpc.RpcError) as exc:
            reflected_services(channel, version)
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        names = reflected_services(channel, version, md(key))
        assert {"analysim.v1.PredictionService", "analysim.v1.QueryStreamService", "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection"} <= names
        assert reflected_file_package(channel, version, "analysim.v1.PredictionService", md(key)) == "analysim.v1"


def test_query_stream_replays_the_log_then_follows_live(gw: Running, channel: grpc.Channel) -> None:
    key = gw.new_key("g-stream")
    user = gw.client(key)
    rows = credit_rows()
    seen: list[int] = [user.post("/v1/models/credit/predict", {"rows": rows[:3]})[1]["query_id"]]
    stream = pb_grpc.QueryStreamServiceStub(channel)
    with pytest.raises(grpc.RpcError) as exc:
        next(iter(stream.Subscribe(pb.SubscribeRequest(after_seq=0), metadata=md(key))))
    assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED

    call = stream.Subscribe(pb.SubscribeRequest(after_seq=seen[0] - 1, model_id="credit"), metadata=md(ADMIN_KEY))
    got: list[pb.QueryEvent] = []
    reader = threading.Thread(target=lambda: got.extend(r.event for r in itertools.islice(call, 4)), daemon=True)
    reader.start()
    wait_until(lambda: len(got) >= 1, what="the replayed event")
    for n in (1, 2, 5):
        seen.append(user.post("/v1/models/credit/predict", {"rows": rows[10 : 10 + n]})[1]["query_id"])
    reader.join(scaled(30))
    call.cancel()
    assert [e.seq for e in got] == seen
    first = got[0]
    assert first.user == "g-stream" and first.model_id == "credit" and first.n_features == 4
    X = np.array(first.features).reshape(-1, 4)
    m = credit_model()
    np.testing.assert_array_equal(X, m.schema.encode_rows(rows[:3]))
    assert list(first.leaves) == m.tree.apply(X).tolist()
    assert [len(e.labels) for e in got] == [3, 1, 2, 5]
    # The durable log holds the same events (what a restarted monitor replays).
    replay = gw.store.events_after(seen[0] - 1, "credit")
    assert [e.seq for e in replay][:4] == seen
    np.testing.assert_array_equal(replay[0].features, X)
    # The wall time as a Timestamp, exact to the float the log holds.
    assert first.timestamp.seconds + first.timestamp.nanos / 1e9 == replay[0].timestamp


def test_query_stream_without_after_seq_follows_live_only(gw: Running, channel: grpc.Channel) -> None:
    user = gw.client(gw.new_key("g-live"))
    rows = credit_rows()
    assert user.post("/v1/models/credit/predict", {"rows": rows[:1]})[0] == 200  # in the log: not replayed
    call = pb_grpc.QueryStreamServiceStub(channel).Subscribe(pb.SubscribeRequest(model_id="credit"),
                                                             metadata=md(ADMIN_KEY))
    got: list[pb.QueryEvent] = []
    reader = threading.Thread(target=lambda: got.extend(r.event for r in itertools.islice(call, 1)), daemon=True)
    reader.start()
    # Answered until the subscription is surely in place: the first event must be one of these.
    live_ids: list[int] = []
    wait_until(lambda: got or live_ids.append(user.post("/v1/models/credit/predict", {"rows": rows[:2]})[1]["query_id"]),
               what="a live event", poll_s=0.05)
    reader.join(scaled(30))
    call.cancel()
    assert got[0].seq in live_ids and len(got[0].labels) == 2


def test_in_process_listener_sees_every_answered_query_and_no_rejected_one(gw: Running) -> None:
    events: list[object] = []
    remove: list[object] = []
    gw.thread.call(lambda: remove.append(gw.gw.stream.add_listener(events.append)))
    u = gw.new_user("g-listen")
    assert u.post("/v1/models/credit/predict", {"rows": credit_rows()[:2]})[0] == 200
    assert u.post("/v1/models/credit/predict", {"rows": [[1]]})[0] == 400
    gw.thread.call(remove[0])  # type: ignore[arg-type]
    assert [(e.user, e.n_rows) for e in events] == [("g-listen", 2)]  # type: ignore[attr-defined]


def packed_request(rows: list[list[object]]) -> pb.PredictRequest:
    nums = [float(v) for r in rows for v in r if not isinstance(v, str)]  # type: ignore[arg-type]
    cats = [v for r in rows for v in r if isinstance(v, str)]
    return pb.PredictRequest(model_id="credit", packed=pb.PackedRows(n_rows=len(rows), numbers=nums, categories=cats))


def test_packed_rows_answer_like_rows(gw: Running, channel: grpc.Channel) -> None:
    key = gw.new_key("g-packed")
    stub = pb_grpc.PredictionServiceStub(channel)
    rows = credit_rows()[:33]
    a = stub.Predict(pb.PredictRequest(model_id="credit", rows=to_proto(rows)), metadata=md(key))
    b = stub.Predict(packed_request(rows), metadata=md(key))
    assert a.predictions == b.predictions and b.charged == pytest.approx(0.033)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda r: r.packed.numbers.append(1.0), "packed.numbers"),
        (lambda r: r.packed.categories.pop(), "packed.categories"),
        (lambda r: r.packed.__setattr__("n_rows", 0), "packed.n_rows"),
        (lambda r: r.packed.__setattr__("n_rows", 41), "packed.n_rows"),
        (lambda r: r.packed.numbers.__setitem__(5, float("nan")), "rows[2].age"),
        (lambda r: r.packed.numbers.__setitem__(0, float("-inf")), "rows[0].amount"),
        (lambda r: r.packed.categories.__setitem__(3, "boat"), "rows[1].housing"),
        (lambda r: r.rows.append(pb.Row()), "rows"),
    ],
    ids=range(8),
)
def test_packed_rows_refusals_name_the_field(gw: Running, channel: grpc.Channel, mutate: object, field: str) -> None:
    key = gw.new_key(f"g-pk-{next(_names)}")
    req = packed_request(credit_rows()[:4])
    mutate(req)  # type: ignore[operator]
    before = gw.charged()
    with pytest.raises(grpc.RpcError) as exc:
        pb_grpc.PredictionServiceStub(channel).Predict(req, metadata=md(key))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_of(exc.value)["field"] == field
    assert gw.charged() == before


def stream_request(rows: list[list[object]], key: str = "", model: str = "credit") -> pb.PredictStreamRequest:
    return pb.PredictStreamRequest(request=pb.PredictRequest(model_id=model, rows=to_proto(rows)), idempotency_key=key)


def test_predict_stream_answers_each_request_in_order_like_predict(gw: Running, channel: grpc.Channel) -> None:
    key = gw.new_key(f"s-{next(_names)}")
    stub = pb_grpc.PredictionServiceStub(channel)
    rows = credit_rows()
    before = gw.charged()
    batches = [rows[i : i + 1 + i % 3] for i in range(12)]
    bad = pb.PredictStreamRequest(request=pb.PredictRequest(model_id="credit", rows=to_proto([[1.0, "boat", 3.0, "own"]])))
    requests = [stream_request(b) for b in batches[:6]] + [bad, stream_request(batches[0], model="nope")]
    requests += [stream_request(b) for b in batches[6:]]
    responses = list(stub.PredictStream(iter(requests), metadata=md(key)))
    assert len(responses) == len(requests)  # one each, in order; a refusal does not end the stream
    answers = [r.answer for r in responses if r.HasField("answer")]
    assert [r.WhichOneof("result") for r in responses[6:8]] == ["error", "error"]
    assert stream_error(responses[6]) == ("INVALID_ARGUMENT", "invalid_row", "rows[0].purpose")
    assert stream_error(responses[7]) == ("NOT_FOUND", "unknown_model", "model_id")
    for batch, answer in zip(batches, answers, strict=True):
        unary = stub.Predict(pb.PredictRequest(model_id="credit", rows=to_proto(batch)), metadata=md(key))
        assert answer.predictions == unary.predictions and answer.charged == unary.charged
    ids = [a.query_id for a in answers]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # Every answered row charged once (the stream's and the unary check calls), refusals never.
    assert gw.charged()[1] - before[1] == 2 * sum(map(len, batches))


def test_predict_stream_replays_by_idempotency_key(gw: Running, channel: grpc.Channel) -> None:
    key = gw.new_key(f"s-{next(_names)}")
    stub = pb_grpc.PredictionServiceStub(channel)
    rows = credit_rows()[:3]
    first, again, other = stub.PredictStream(
        iter([stream_request(rows, "k1"), stream_request(rows, "k1"), stream_request(rows[:1], "k1")]), metadata=md(key)
    )
    assert not first.replayed and again.replayed and again.answer == first.answer
    assert stream_error(other)[:2] == ("FAILED_PRECONDITION", "idempotency_key_reused")
    assert stub.GetUsage(pb.GetUsageRequest(), metadata=md(key)).rows == 3


def test_predict_stream_checks_the_key_at_the_start_and_for_every_request(gw: Running, channel: grpc.Channel) -> None:
    stub = pb_grpc.PredictionServiceStub(channel)
    for who, code in ((None, grpc.StatusCode.UNAUTHENTICATED), (ADMIN_KEY, grpc.StatusCode.PERMISSION_DENIED)):
        with pytest.raises(grpc.RpcError) as exc:
            list(stub.PredictStream(iter([stream_request(credit_rows()[:1])]), metadata=md(who)))
        assert exc.value.code() == code
    name = f"s-{next(_names)}"
    key = gw.new_key(name)
    answered = threading.Event()

    def requests() -> Iterator[pb.PredictStreamRequest]:
        yield stream_request(credit_rows()[:1])
        answered.wait(scaled(30))  # the key is revoked between the two requests
        yield stream_request(credit_rows()[:1])

    stream = stub.PredictStream(requests(), metadata=md(key))
    assert next(stream).HasField("answer")
    assert gw.admin.post(f"/v1/admin/users/{name}/revoke")[0] == 200
    answered.set()
    second = next(stream)
    assert stream_error(second)[:2] == ("UNAUTHENTICATED", "unauthenticated")
    assert list(stream) == []
    assert stub.GetUsage(pb.GetUsageRequest(user=name), metadata=md(ADMIN_KEY)).rows == 1


def test_shutdown_ends_an_idle_predict_stream_at_once(tmp_path: Path) -> None:
    """A stream waiting for its client's next message is not a request in flight: shutdown
    ends it cleanly instead of waiting out the grace period for it."""
    more = threading.Event()
    with running_gateway(tmp_path / "s.db") as r, grpc.insecure_channel(r.thread.grpc_target) as ch:
        key = r.new_key("idle")

        def requests() -> Iterator[pb.PredictStreamRequest]:
            yield stream_request(credit_rows()[:1])
            more.wait(scaled(60))  # the client goes quiet

        stream = pb_grpc.PredictionServiceStub(ch).PredictStream(requests(), metadata=md(key))
        assert next(stream).HasField("answer")
        r.thread.stop()
        # Ended with status OK: a stream held until the grace period ran out would be cut off
        # with an error instead. (Nothing lost or half-sent.)
        assert list(stream) == []
        more.set()
        assert r.store.ledger_totals()[1] == 1
