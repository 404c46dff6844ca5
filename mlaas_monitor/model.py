"""A served model: schema + tree + classes + card + held-out validation set + response policy.

Serialised as JSON only (never pickle), so loading a model cannot execute code. Prediction
and the response policy are pure functions over arrays.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from mlaas_monitor.schema import Schema
from mlaas_monitor.tree import Tree

MICROS = 1_000_000  # prices and charges are integer micro-credits: no float drift in the ledger
MAX_TOP_K = 1000  # more than any served model's classes: "all of them"


@dataclass(frozen=True)
class Policy:
    """What a prediction reveals, and what a row costs."""

    reveal_confidence: bool = True  # the leaf's confidence is told
    confidence_decimals: int = 2  # BigML-style rounding
    reveal_leaf: bool = False  # the leaf's id is told
    price_micros: int = 1000  # per answered row (0.001 credits)
    # Output post-processing as a defence (the kinds IBM ART ships): how many of the leaf's
    # class probabilities are revealed, most probable first (1: the label's alone, as on
    # BigML; k >= 2 adds a ranked "top" list), and the standard deviation of Gaussian noise
    # added to them before rounding (0: none). The noise is a function of the row and
    # ``noise_seed`` only: the same row always gets the same answer (asking again averages
    # nothing out), on every replica, and a run is reproducible.
    top_k: int = 1
    confidence_noise: float = 0.0  # in [0, 1]
    noise_seed: int = 0  # the noise's seed, with the row

    def to_dict(self) -> dict[str, Any]:
        return {
            "reveal_confidence": self.reveal_confidence,
            "confidence_decimals": self.confidence_decimals,
            "reveal_leaf": self.reveal_leaf,
            "price": self.price_micros / MICROS,
            "top_k": self.top_k,
            "confidence_noise": self.confidence_noise,
            "noise_seed": self.noise_seed,
        }

    def updated(self, changes: dict[str, Any]) -> Policy:
        """Apply a JSON patch of policy fields; raises ValueError(field, problem)."""
        kw: dict[str, Any] = {}
        for key, v in changes.items():
            check = _POLICY_CHECKS.get(key)
            if check is None:
                raise PolicyError(key, "unknown policy field")
            kw["price_micros" if key == "price" else key] = check(key, v)
        return replace(self, **kw)

    def checked(self) -> Policy:
        """This policy, if every field is in the range a client may set it to (a stored row
        may hold anything: a negative price would credit the user); raises PolicyError."""
        Policy().updated(self.to_dict())
        return self


class PolicyError(ValueError):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem  # the policy field's name, and what is wrong with its value


def _switch(key: str, v: Any) -> bool:
    if type(v) is not bool:
        raise PolicyError(key, "expected true or false")
    return v


def _decimals(key: str, v: Any) -> int:
    if type(v) is not int or not 0 <= v <= 12:
        raise PolicyError(key, "expected an integer from 0 to 12")
    return v


def _top_k(key: str, v: Any) -> int:
    if type(v) is not int or not 1 <= v <= MAX_TOP_K:
        raise PolicyError(key, f"expected an integer from 1 to {MAX_TOP_K}")
    return v


def _noise(key: str, v: Any) -> float:
    if type(v) not in (int, float) or not 0 <= v <= 1:
        raise PolicyError(key, "expected a number from 0 to 1")
    return float(v)


def _seed(key: str, v: Any) -> int:
    if type(v) is not int or not 0 <= v < 2**63:
        raise PolicyError(key, "expected an integer from 0 to 2^63 - 1")
    return v


def _price_micros(key: str, v: Any) -> int:
    """A price per row in credits, as millionths."""
    if type(v) not in (int, float) or not 0 <= v <= 1e6 or v != v:
        raise PolicyError(key, "expected a number from 0 to 1000000")
    return round(v * MICROS)


# The policy fields a JSON patch may set (``price``: credits per row, stored as price_micros)
# -> each one's check: (field, value) -> the value to set, or PolicyError naming the field.
_POLICY_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "reveal_confidence": _switch, "reveal_leaf": _switch, "confidence_decimals": _decimals, "top_k": _top_k,
    "confidence_noise": _noise, "noise_seed": _seed, "price": _price_micros,
}  # fmt: skip


def render_predictions(
    classes: tuple[Any, ...], labels: np.ndarray, confidences: np.ndarray | None, leaves: np.ndarray | None,
    top: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[dict[str, Any]]:
    """What a user is told, as JSON-ready dicts: the label, and the confidence and leaf id
    where they were revealed (``None`` when hidden); ``top`` (class indices and their
    probabilities, (n, k) each, the label first) as a ranked list under a top-k policy."""
    out: list[dict[str, Any]] = [{"label": classes[i]} for i in labels.tolist()]
    if confidences is not None:
        for d, c in zip(out, confidences.tolist(), strict=True):
            d["confidence"] = c
    if top is not None:
        for d, cs, ps in zip(out, top[0].tolist(), top[1].tolist(), strict=True):
            d["top"] = [{"label": classes[c], "confidence": p} for c, p in zip(cs, ps, strict=True)]
    if leaves is not None:
        for d, lf in zip(out, leaves.tolist(), strict=True):
            d["leaf"] = lf
    return out


# ---- output post-processing: noise on confidences, top-k (pure) ----

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, elementwise on uint64 arrays (their arithmetic wraps)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def row_keys(X: np.ndarray, seed: int = 0) -> np.ndarray:
    """A 64-bit key per row of X: a function of the row's values and ``seed`` only, not of
    its place in a batch, the process or the replica that answers it."""
    bits = np.ascontiguousarray(np.asarray(X, np.float64) + 0.0).view(np.uint64)  # + 0.0: -0.0 keys as 0.0
    h = np.full(bits.shape[0], seed & _MASK64, np.uint64)
    for j in range(bits.shape[1]):
        h = _mix64((h + np.uint64(_GOLDEN)) ^ bits[:, j])
    return h


def _standard_normals(keys: np.ndarray, n: int) -> np.ndarray:
    """(len(keys), n) standard normal draws, each a function of its key and column (Box-Muller
    on two SplitMix64 streams)."""
    out = np.empty((keys.shape[0], n), np.float64)
    for c in range(n):
        a = _mix64(keys + np.uint64(((2 * c + 1) * _GOLDEN) & _MASK64))
        b = _mix64(keys + np.uint64(((2 * c + 2) * _GOLDEN) & _MASK64))
        u1 = ((a >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53  # in (0, 1): log is finite
        u2 = (b >> np.uint64(11)).astype(np.float64) / 2.0**53
        out[:, c] = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return out


def noisy_distribution(P: np.ndarray, labels: np.ndarray, keys: np.ndarray, scale: float) -> np.ndarray:
    """Gaussian noise on class probabilities, as ART's GaussianNoise post-processor: add
    N(0, scale^2) to each, clip at 0 and renormalise, so that each row stays a distribution.
    One departure: the label keeps the largest probability (its value is swapped with the
    largest where noise made another class win), since the gateway's label is the tree's
    and the confidences must not contradict it. ``keys``: one per row (``row_keys``)."""
    Q = np.clip(np.asarray(P, np.float64) + scale * _standard_normals(keys, P.shape[1]), 0.0, None)
    total = Q.sum(axis=1, keepdims=True)
    # All mass clipped away (only with scale >> 1): the row keeps its noise-free distribution.
    Q = np.where(total > 0, Q / np.where(total > 0, total, 1.0), P)
    rows = np.arange(Q.shape[0])
    win = Q.argmax(axis=1)
    largest, own = Q[rows, win], Q[rows, labels]
    Q[rows, win] = own
    Q[rows, labels] = largest
    return Q


def ranked(P: np.ndarray, labels: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k most probable classes and their probabilities, the label first, then by
    probability (ties by class index): (class indices, probabilities), (n, min(k, K)) each."""
    rows = np.arange(P.shape[0])
    score = np.array(P, np.float64)
    score[rows, labels] = np.inf
    order = np.argsort(-score, axis=1, kind="stable")[:, : min(k, P.shape[1])]
    return order, np.take_along_axis(np.asarray(P, np.float64), order, axis=1)


@dataclass(frozen=True)
class Answer:
    """What the tree says about a batch, before the policy hides anything."""

    labels: np.ndarray  # class indices (int64)
    confidences: np.ndarray  # probability of the predicted class at the leaf
    leaves: np.ndarray  # node ids
    keys: np.ndarray | None = None  # per row (row_keys, unseeded), where the policy adds noise


@dataclass(frozen=True, eq=False)
class Model:
    id: str  # the model's name (unique in the store)
    schema: Schema  # the features and how rows are encoded
    tree: Tree  # the trained tree
    classes: tuple[Any, ...]  # JSON scalars (int or str)
    card: dict[str, Any]  # the model card: training data, sizes, validation accuracy
    validation_X: np.ndarray  # encoded held-out rows (the monitor's S)
    validation_y: np.ndarray  # their true class indices
    policy: Policy = Policy()  # what an answer reveals, and what a row costs

    @cached_property
    def node_answers(self) -> tuple[np.ndarray, np.ndarray]:
        """Per node: predicted class index and its probability (all a row's answer
        depends on is the leaf it lands in)."""
        labels = self.tree.value.argmax(axis=1)
        return labels, self.tree.value[np.arange(self.tree.n_nodes), labels]

    def answer(self, X: np.ndarray) -> Answer:
        leaves = self.tree.apply(X)
        labels, conf = self.node_answers
        p = self.policy
        keys = row_keys(X) if p.confidence_noise > 0 else None
        return Answer(labels[leaves], conf[leaves], leaves, keys)

    @property
    def per_row(self) -> bool:
        """Whether answers depend on the row, not only on its leaf (noise on confidences):
        then no per-leaf answer can be precomputed."""
        return self.policy.reveal_confidence and self.policy.confidence_noise > 0

    def _distribution(self, ans: Answer) -> np.ndarray:
        """Each row's class probabilities as the policy reveals them, before rounding."""
        P = self.tree.value[ans.leaves]
        if not self.per_row:
            return P
        keys = ans.keys if ans.keys is not None else np.zeros(ans.leaves.shape[0], np.uint64)
        # The row's key (any policy's) mixed with this policy's seed: another seed, other noise.
        seeded = _mix64(keys ^ np.uint64(self.policy.noise_seed & _MASK64))
        return noisy_distribution(P, ans.labels, seeded, self.policy.confidence_noise)

    @cached_property
    def _rounded_confidences(self) -> np.ndarray:
        # Per node, rounded once per policy: a gather per query instead of a ufunc call.
        return np.round(self.node_answers[1], self.policy.confidence_decimals)

    def revealed(self, ans: Answer) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The confidences and leaf ids as the policy lets the user see them."""
        p = self.policy
        if not p.reveal_confidence:
            conf = None
        elif self.per_row:
            conf = np.round(self._distribution(ans)[np.arange(ans.labels.shape[0]), ans.labels], p.confidence_decimals)
        else:
            conf = self._rounded_confidences[ans.leaves]
        return conf, ans.leaves if p.reveal_leaf else None

    def revealed_top(self, ans: Answer) -> tuple[np.ndarray, np.ndarray] | None:
        """Under a top-k policy (k >= 2), each row's k most probable classes and their
        probabilities as revealed (the label first; rounded, noisy where the policy adds
        noise); None otherwise. The query log keeps the label's confidence: the rest is a
        function of the leaf (or, with noise, of the row) and the policy."""
        p = self.policy
        if not p.reveal_confidence or p.top_k < 2:
            return None
        order, probs = ranked(self._distribution(ans), ans.labels, p.top_k)
        return order, np.round(probs, p.confidence_decimals)

    def render(self, ans: Answer) -> list[dict[str, Any]]:
        """Predictions per the policy, as JSON-ready dicts."""
        return render_predictions(self.classes, ans.labels, *self.revealed(ans), self.revealed_top(ans))

    @cached_property
    def _json_fragments(self) -> list[str]:
        # The serialised prediction for a row in each leaf, under this policy: a batch's
        # JSON is then a join instead of building and encoding a dict per row.
        labels, conf = self.node_answers
        n = self.tree.n_nodes
        preds = self.render(Answer(labels, conf, np.arange(n)))
        return [json.dumps(d, separators=(",", ":")) for d in preds]

    def predictions_json(self, ans: Answer) -> str:
        """``json.dumps(self.render(ans))``, without the per-row work (where answers are a
        function of the leaf alone)."""
        if self.per_row:
            return json.dumps(self.render(ans), separators=(",", ":"))
        frag = self._json_fragments
        return "[" + ",".join([frag[i] for i in ans.leaves.tolist()]) + "]"

    def public(self) -> dict[str, Any]:
        """GET /v1/models/{id}: input schema, card and policy, never the tree."""
        return {
            "id": self.id,
            "features": self.schema.to_list(),
            "classes": list(self.classes),
            "card": self.card,
            "policy": self.policy.to_dict(),
        }

    def spec(self) -> dict[str, Any]:
        """Everything but the policy, for the store."""
        return {
            "format": 1,
            "features": self.schema.to_list(),
            "classes": list(self.classes),
            "tree": self.tree.to_dict(),
            "card": self.card,
            "validation": {"X": self.validation_X.tolist(), "y": self.validation_y.tolist()},
        }

    @classmethod
    def from_spec(cls, model_id: str, spec: dict[str, Any], policy: Policy) -> Model:
        if spec.get("format") != 1:
            raise ValueError(f"unsupported model format {spec.get('format')!r}")
        schema = Schema.from_list(spec["features"])
        classes = tuple(spec["classes"])
        if not all(type(c) in (int, str) for c in classes):
            raise ValueError("class labels must be integers or strings")
        tree = Tree.from_dict(spec["tree"], len(schema))
        if tree.n_classes != len(classes):
            raise ValueError("tree and class list disagree")
        vx = np.asarray(spec["validation"]["X"], dtype=np.float64).reshape(-1, len(schema))
        vy = np.asarray(spec["validation"]["y"], dtype=np.int64)
        return cls(model_id, schema, tree, classes, dict(spec["card"]), vx, vy, policy)
