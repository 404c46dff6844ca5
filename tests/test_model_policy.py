"""Response policies: what a prediction reveals, the fast JSON rendering that must
produce exactly the bytes of the plain one, and the output post-processing defences (top-k
confidences, noise on confidences)."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlaas_monitor.model import Policy, PolicyError, noisy_distribution, ranked, row_keys
from mlaas_monitor.service import PredictResult
from tests.test_gateway_helpers import iris_model

policies = st.builds(
    Policy,
    reveal_confidence=st.booleans(),
    confidence_decimals=st.integers(0, 12),
    reveal_leaf=st.booleans(),
    price_micros=st.integers(0, 10**9),
    top_k=st.integers(1, 4),
    confidence_noise=st.sampled_from([0.0, 0.0, 0.05, 0.3]),
    noise_seed=st.integers(0, 2**63 - 1),
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
    if policy.reveal_confidence and policy.confidence_noise == 0:
        assert conf is not None
        np.testing.assert_array_equal(conf, np.round(ans.confidences, policy.confidence_decimals))
    # A ranked list exactly under a top-k policy that reveals confidences, the label first.
    k = min(policy.top_k, len(model.classes))
    for p in preds:
        assert ("top" in p) == (policy.reveal_confidence and policy.top_k >= 2)
        if "top" in p:
            assert len(p["top"]) == k and p["top"][0] == {"label": p["label"], "confidence": p["confidence"]}
            assert all(a["confidence"] >= b["confidence"] for a, b in itertools.pairwise(p["top"]))


distributions = st.integers(2, 6).flatmap(lambda k: st.lists(
    st.lists(st.floats(0, 1, allow_nan=False), min_size=k, max_size=k).filter(lambda r: sum(r) > 0), min_size=1, max_size=30))


@settings(max_examples=200, deadline=None)
@given(rows=distributions, scale=st.floats(0, 2), seed=st.integers(0, 2**63 - 1), k=st.integers(1, 8))
def test_noise_keeps_a_distribution_and_the_label_and_top_k_keeps_the_argmax(
    rows: list[list[float]], scale: float, seed: int, k: int
) -> None:
    P = np.array(rows)
    P = P / P.sum(axis=1, keepdims=True)
    labels = P.argmax(axis=1)
    keys = row_keys(np.arange(P.shape[0], dtype=np.float64)[:, None] * 0.5, seed)
    Q = noisy_distribution(P, labels, keys, scale)
    assert Q.shape == P.shape and np.all(Q >= 0)
    np.testing.assert_allclose(Q.sum(axis=1), 1.0, atol=1e-9)
    assert np.all(Q[np.arange(P.shape[0]), labels] >= Q.max(axis=1))  # the label stays the most probable
    np.testing.assert_array_equal(Q, noisy_distribution(P, labels, keys, scale))  # a function of the keys
    order, probs = ranked(Q, labels, k)
    assert order.shape == (P.shape[0], min(k, P.shape[1]))
    np.testing.assert_array_equal(order[:, 0], labels)  # top-k keeps the argmax, first
    np.testing.assert_array_equal(probs, np.take_along_axis(Q, order, axis=1))
    assert np.all(np.diff(probs, axis=1) <= 0)  # most probable first
    assert all(len(set(r)) == len(r) for r in order.tolist())  # each class once


def test_noise_is_a_function_of_the_row_and_the_seed() -> None:
    model = replace(iris_model(), policy=Policy(confidence_noise=0.1, noise_seed=7, confidence_decimals=6, top_k=3))
    X = model.validation_X[:20]
    conf, _ = model.revealed(model.answer(X))
    # The same rows in another batch, in another order: the same answers (no averaging out by asking again).
    again, _ = model.revealed(model.answer(np.concatenate([X[::-1], X[:3]])))
    assert conf is not None and again is not None
    np.testing.assert_array_equal(again[:20][::-1], conf)
    np.testing.assert_array_equal(again[20:], conf[:3])
    # Rows in one leaf are told different confidences (the noise hides the leaf's own), and
    # another seed gives other noise; the labels are the tree's.
    ans = model.answer(X)
    same_leaf = [i for i in range(20) if ans.leaves[i] == ans.leaves[0]]
    assert len(same_leaf) >= 2 and len(set(conf[same_leaf].tolist())) > 1
    other, _ = replace(model, policy=replace(model.policy, noise_seed=8)).revealed(ans)
    assert other is not None and not np.array_equal(other, conf)
    np.testing.assert_array_equal(model.answer(X).labels, replace(model, policy=Policy()).answer(X).labels)
    assert np.all((conf >= 0) & (conf <= 1))
    top = model.revealed_top(ans)
    assert top is not None
    np.testing.assert_allclose(top[1].sum(axis=1), 1.0, atol=1e-5)  # all 3 classes: a distribution (6 decimals)


def test_policy_patch_validation() -> None:
    p = Policy().updated({"price": 0.25, "reveal_leaf": True})
    assert p.price_micros == 250_000 and p.reveal_leaf
    p = Policy().updated({"top_k": 2, "confidence_noise": 0.05, "noise_seed": 3})
    assert (p.top_k, p.confidence_noise, p.noise_seed) == (2, 0.05, 3)
    assert p.to_dict()["top_k"] == 2 and p.to_dict()["confidence_noise"] == 0.05
    for patch, field in [({"price": -1}, "price"), ({"price": float("nan")}, "price"), ({"reveal_leaf": 1}, "reveal_leaf"),
                         ({"confidence_decimals": True}, "confidence_decimals"), ({"x": 1}, "x"),
                         ({"top_k": 0}, "top_k"), ({"top_k": 1.5}, "top_k"), ({"top_k": True}, "top_k"),
                         ({"confidence_noise": -0.1}, "confidence_noise"), ({"confidence_noise": 2}, "confidence_noise"),
                         ({"confidence_noise": "0.1"}, "confidence_noise"), ({"noise_seed": -1}, "noise_seed"),
                         ({"noise_seed": 2**63}, "noise_seed")]:  # fmt: skip
        with pytest.raises(PolicyError) as exc:
            Policy().updated(patch)
        assert exc.value.field == field
