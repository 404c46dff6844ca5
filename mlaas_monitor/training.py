"""Train a scikit-learn decision tree on a dataset and turn it into a servable Model.

Pure apart from scikit-learn itself: the caller loads the data and stores the result.
"""

from __future__ import annotations

import time

import numpy as np

from analysim.errors import UserError
from mlaas_monitor.datasets import RawDataset
from mlaas_monitor.model import Model, Policy
from mlaas_monitor.schema import Feature, Schema, infer_feature, numeric_feature
from mlaas_monitor.tree import from_sklearn

HOLDOUT_FRACTION = 0.25


def encode_dataset(ds: RawDataset) -> tuple[Schema, np.ndarray, tuple[object, ...], np.ndarray]:
    """Type and encode every column; returns (schema, X, classes, y as class indices)."""
    if isinstance(ds.data, np.ndarray):
        X = np.asarray(ds.data, dtype=np.float64)
        features: list[Feature] = [numeric_feature(n, X[:, i]) for i, n in enumerate(ds.columns)]
    else:
        cols = list(zip(*ds.data, strict=True))
        encoded = [infer_feature(n, c) for n, c in zip(ds.columns, cols, strict=True)]
        features = [f for f, _ in encoded]
        X = np.column_stack([e for _, e in encoded]) if encoded else np.empty((len(ds.data), 0))
    _check_float32(X, [f.name for f in features], ds.name)
    raw = [t.item() if isinstance(t, np.generic) else t for t in ds.target]
    try:
        labels: list[object] = [int(v) for v in raw]  # "1"/"2" in german.data are classes 1 and 2
    except (TypeError, ValueError):
        labels = [str(v) for v in raw]
    classes = tuple(sorted(set(labels)))  # type: ignore[type-var]
    index = {c: i for i, c in enumerate(classes)}
    y = np.array([index[v] for v in labels], dtype=np.int64)
    return Schema(tuple(features)), X, classes, y


FLOAT32_MAX = float(np.finfo(np.float32).max)


def _check_float32(X: np.ndarray, names: list[str], dataset: str) -> None:
    """The tree compares float32 (as scikit-learn's does): a value beyond it cannot be split
    on. Refuse it by column and row instead of letting scikit-learn fail with a traceback."""
    if X.size == 0:
        return
    bad = np.abs(X) > FLOAT32_MAX
    if bad.any():
        r, j = (int(v) for v in np.argwhere(bad)[0])
        raise UserError(f"{dataset}: column {names[j]!r}, data row {r + 1}: {X[r, j]:g} is beyond float32 "
                        f"(±{FLOAT32_MAX:.3g}), the precision trees compare in; rescale or drop the column")  # fmt: skip


def holdout_split(X: np.ndarray, y: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X_train, X_held_out, y_train, y_held_out): the split ``train_model`` makes (the held-out
    rows are the model's validation set, the monitor's S)."""
    from sklearn.model_selection import train_test_split

    stratify = y if np.bincount(y).min() >= 2 else None
    return train_test_split(X, y, test_size=HOLDOUT_FRACTION, random_state=seed, stratify=stratify)  # type: ignore[no-any-return]


def train_model(
    ds: RawDataset,
    model_id: str,
    max_depth: int | None = None,
    max_leaf_nodes: int | None = None,
    seed: int = 0,
    policy: Policy | None = None,
) -> Model:
    from sklearn.tree import DecisionTreeClassifier

    schema, X, classes, y = encode_dataset(ds)
    if len(classes) < 2:
        raise UserError(f"target {ds.target_name!r} has a single class; nothing to learn")
    X_tr, X_val, y_tr, y_val = holdout_split(X, y, seed)
    est = DecisionTreeClassifier(max_depth=max_depth, max_leaf_nodes=max_leaf_nodes, random_state=seed)
    est.fit(X_tr, y_tr)
    tree = from_sklearn(est)
    card = {
        "dataset": ds.name,
        "target": ds.target_name,
        "training_rows": int(len(y_tr)),
        "validation_rows": int(len(y_val)),
        "depth": tree.depth(),
        "leaves": tree.n_leaves,
        "nodes": tree.n_nodes,
        "validation_accuracy": 0.0,
        "hyperparameters": {"max_depth": max_depth, "max_leaf_nodes": max_leaf_nodes, "seed": seed},
        "encoding": "categorical values are encoded as their index in the feature's category list",
        "created": time.time(),
    }
    model = Model(model_id, schema, tree, classes, card, X_val, y_val, policy or Policy())
    accuracy = float(np.mean(model.answer(X_val).labels == y_val))
    card["validation_accuracy"] = round(accuracy, 6)
    return model
