"""Response policies: what a prediction reveals, and the fast JSON rendering that must
produce exactly the bytes of the plain one."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlaas_monitor.model import Policy, PolicyError
from mlaas_monitor.service import PredictResult
from tests.test_gateway_helpers import iris_model

policies = st.builds(
    Policy,
    reveal_confidence=st.booleans(),
    confidence_decimals=st.integers(0, 12),
    reveal_leaf=st.booleans(),
    price_micros=st.integers(0, 10**9),
)


@settings(max_examples=100, deadline=None)
@given(policy=policies, idx=st.lists(st.integers(0, 37), min_size=1, max_size=60), qid=st.integers(1, 2**62))
def test_fragment_json_equals_plain_json(policy: Policy, idx: list[int], qid: int) -> None:
    model = replace(iris_model(), policy=policy)
    ans = model.answer(model.validation_X[idx])
    result = PredictResult(model, ans, qid, len(idx) * policy.price_micros / 1e6)
    assert result.to_json() == json.dumps(result.to_dict(), separators=(",", ":")).encode()
    preds = result.predictions()
    assert all(("confidence" in p) == policy.reveal_confidence and ("leaf" in p) == policy.reveal_leaf for p in preds)
    conf, leaves = model.revealed(ans)
    if policy.reveal_confidence:
        assert conf is not None
        np.testing.assert_array_equal(conf, np.round(ans.confidences, policy.confidence_decimals))


def test_policy_patch_validation() -> None:
    p = Policy().updated({"price": 0.25, "reveal_leaf": True})
    assert p.price_micros == 250_000 and p.reveal_leaf
    for patch, field in [({"price": -1}, "price"), ({"price": float("nan")}, "price"), ({"reveal_leaf": 1}, "reveal_leaf"),
                         ({"confidence_decimals": True}, "confidence_decimals"), ({"x": 1}, "x")]:  # fmt: skip
        with pytest.raises(PolicyError) as exc:
            Policy().updated(patch)
        assert exc.value.field == field
