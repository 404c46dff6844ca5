"""A served model: schema + tree + classes + card + held-out validation set + response policy.

Serialised as JSON only (never pickle), so loading a model cannot execute code. Prediction
and the response policy are pure functions over arrays.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from mlaas_monitor.schema import Schema
from mlaas_monitor.tree import Tree

MICROS = 1_000_000  # prices and charges are integer micro-credits: no float drift in the ledger


@dataclass(frozen=True)
class Policy:
    """What a prediction reveals, and what a row costs."""

    reveal_confidence: bool = True
    confidence_decimals: int = 2  # BigML-style rounding
    reveal_leaf: bool = False
    price_micros: int = 1000  # per answered row (0.001 credits)

    def to_dict(self) -> dict[str, Any]:
        return {
            "reveal_confidence": self.reveal_confidence,
            "confidence_decimals": self.confidence_decimals,
            "reveal_leaf": self.reveal_leaf,
            "price": self.price_micros / MICROS,
        }

    def updated(self, changes: dict[str, Any]) -> Policy:
        """Apply a JSON patch of policy fields; raises ValueError(field, problem)."""
        kw: dict[str, Any] = {}
        for key, v in changes.items():
            if key in ("reveal_confidence", "reveal_leaf"):
                if type(v) is not bool:
                    raise PolicyError(key, "expected true or false")
                kw[key] = v
            elif key == "confidence_decimals":
                if type(v) is not int or not 0 <= v <= 12:
                    raise PolicyError(key, "expected an integer from 0 to 12")
                kw[key] = v
            elif key == "price":
                if type(v) not in (int, float) or not 0 <= v <= 1e6 or v != v:
                    raise PolicyError(key, "expected a number from 0 to 1000000")
                kw["price_micros"] = round(v * MICROS)
            else:
                raise PolicyError(key, "unknown policy field")
        return replace(self, **kw)


class PolicyError(ValueError):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


def render_predictions(
    classes: tuple[Any, ...], labels: np.ndarray, confidences: np.ndarray | None, leaves: np.ndarray | None
) -> list[dict[str, Any]]:
    """What a user is told, as JSON-ready dicts: the label, and the confidence and leaf id
    where they were revealed (``None`` when hidden)."""
    out: list[dict[str, Any]] = [{"label": classes[i]} for i in labels.tolist()]
    if confidences is not None:
        for d, c in zip(out, confidences.tolist(), strict=True):
            d["confidence"] = c
    if leaves is not None:
        for d, lf in zip(out, leaves.tolist(), strict=True):
            d["leaf"] = lf
    return out


@dataclass(frozen=True)
class Answer:
    """What the tree says about a batch, before the policy hides anything."""

    labels: np.ndarray  # class indices (int64)
    confidences: np.ndarray  # probability of the predicted class at the leaf
    leaves: np.ndarray  # node ids


@dataclass(frozen=True, eq=False)
class Model:
    id: str
    schema: Schema
    tree: Tree
    classes: tuple[Any, ...]  # JSON scalars (int or str)
    card: dict[str, Any]
    validation_X: np.ndarray  # encoded held-out rows (the monitor's S)
    validation_y: np.ndarray  # their true class indices
    policy: Policy = Policy()

    @cached_property
    def node_answers(self) -> tuple[np.ndarray, np.ndarray]:
        """Per node: predicted class index and its probability (all a row's answer
        depends on is the leaf it lands in)."""
        labels = self.tree.value.argmax(axis=1)
        return labels, self.tree.value[np.arange(self.tree.n_nodes), labels]

    def answer(self, X: np.ndarray) -> Answer:
        leaves = self.tree.apply(X)
        labels, conf = self.node_answers
        return Answer(labels[leaves], conf[leaves], leaves)

    @cached_property
    def _rounded_confidences(self) -> np.ndarray:
        # Per node, rounded once per policy: a gather per query instead of a ufunc call.
        return np.round(self.node_answers[1], self.policy.confidence_decimals)

    def revealed(self, ans: Answer) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The confidences and leaf ids as the policy lets the user see them."""
        p = self.policy
        conf = self._rounded_confidences[ans.leaves] if p.reveal_confidence else None
        return conf, ans.leaves if p.reveal_leaf else None

    def render(self, ans: Answer) -> list[dict[str, Any]]:
        """Predictions per the policy, as JSON-ready dicts."""
        return render_predictions(self.classes, ans.labels, *self.revealed(ans))

    @cached_property
    def _json_fragments(self) -> list[str]:
        # The serialised prediction for a row in each leaf, under this policy: a batch's
        # JSON is then a join instead of building and encoding a dict per row.
        labels, conf = self.node_answers
        n = self.tree.n_nodes
        preds = self.render(Answer(labels, conf, np.arange(n)))
        return [json.dumps(d, separators=(",", ":")) for d in preds]

    def predictions_json(self, ans: Answer) -> str:
        """``json.dumps(self.render(ans))``, without the per-row work."""
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
