"""Property-based fuzz of predict request bodies against a real server: whatever the body,
the answer is never a 5xx, a refusal is a JSON error naming a field, and only answered
rows are charged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mlaas_monitor.service import Limits
from tests.test_gateway_helpers import Client, Running, credit_model, credit_rows, running_gateway

FEATURES = ["amount", "purpose", "age", "housing"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["car", "tv", "own", "rent", "free", "boat", "", "?"]),
    st.text(max_size=8),
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20
)
# Rows that are often valid and often nearly so: every feature gets a value of the right
# kind, or a wrong one, in either the positional or the named form.
good_value = {
    "amount": st.floats(min_value=-1e6, max_value=1e6) | st.integers(-1000, 1000),
    "purpose": st.sampled_from(["car", "tv", "repairs", "education"]),
    "age": st.integers(0, 100),
    "housing": st.sampled_from(["own", "rent", "free"]),
}


@st.composite
def near_valid_row(draw: st.DrawFn) -> Any:
    values = [draw(good_value[f] | scalars) if draw(st.integers(0, 39)) == 0 else draw(good_value[f]) for f in FEATURES]
    shape = draw(st.integers(0, 19))
    if shape == 0:
        return values[: draw(st.integers(0, 3))]
    if shape == 1:
        return [*values, draw(scalars)]
    if shape <= 3:
        row = dict(zip(FEATURES, values, strict=True))
        if draw(st.booleans()):
            row.pop(draw(st.sampled_from(FEATURES)))
        return row
    return values


bodies = st.one_of(
    st.builds(lambda rows: {"rows": rows}, st.lists(near_valid_row(), min_size=0, max_size=30)),
    st.builds(lambda rows: {"rows": rows}, st.lists(near_valid_row(), min_size=1, max_size=3)),
    st.builds(lambda rows: {"rows": rows}, json_values),
    json_values,
    st.dictionaries(st.text(max_size=6), json_values, max_size=3),
)
raw_bodies = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([b'{"rows": [[NaN, "car", 1, "own"]]}', b'{"rows": [[-Infinity, "tv", 1, "own"]]}', b"{", b"[]", b"null"]),
    st.builds(lambda s: s.encode(), st.text(max_size=50)),
)


@pytest.fixture(scope="module")
def gw(module_db: str) -> Iterator[tuple[Running, Client]]:
    with running_gateway(module_db, [credit_model()], Limits(max_body_bytes=20_000, max_batch_rows=25)) as r:
        yield r, r.new_user("fuzzer")


def check(gw: Running, client: Client, send: Any, in_hypothesis: bool = True) -> None:
    before = gw.charged()
    status, resp = send()
    after = gw.charged()
    assert status < 500, resp
    if in_hypothesis:
        event(f"status {status}")  # --hypothesis-show-statistics: the mix answered / refused
    if status == 200:
        n = len(resp["predictions"])
        assert n >= 1 and (after[0] - before[0], after[1] - before[1]) == (1, n)
    else:
        assert 400 <= status < 500
        assert after == before, "a refused request was charged"
        err = resp["error"]
        assert err["code"] and err["message"] and (err.get("field") is None or isinstance(err["field"], str))


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(body=bodies)
def test_fuzzed_json_bodies_never_5xx_and_never_charge_refusals(gw: tuple[Running, Client], body: Any) -> None:
    running, client = gw
    check(running, client, lambda: client.request("POST", "/v1/models/credit/predict", raw=json.dumps(body).encode()))


@SETTINGS
@given(raw=raw_bodies)
def test_fuzzed_raw_bytes_never_5xx(gw: tuple[Running, Client], raw: bytes) -> None:
    running, client = gw
    check(running, client, lambda: client.request("POST", "/v1/models/credit/predict", raw=raw))


def test_a_known_good_body_is_answered(gw: tuple[Running, Client]) -> None:
    # Guards the fuzz: the server does answer valid bodies through the same path.
    running, client = gw
    check(running, client, lambda: client.post("/v1/models/credit/predict", {"rows": credit_rows()[:3]}), False)
    assert client.post("/v1/models/credit/predict", {"rows": credit_rows()[:3]})[0] == 200
