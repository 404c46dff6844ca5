"""What a logged query must be before the monitor folds it in: the row's blobs decoded (the
store says when they do not fit), at least one row, finite features of the model's width,
one answer per row, labels among the model's classes, confidences in [0, 1] and leaves that
are leaves of its tree. A row that fails is quarantined (``persist.MonitorDB.quarantine``),
never folded and never allowed to stop the cursor."""

from __future__ import annotations

import numpy as np

from mlaas_monitor.monitor.core import ModelMonitor
from mlaas_monitor.stream import QueryEvent

REASONS = ("undecodable", "empty", "shape", "not_finite", "label", "confidence", "leaf", "unknown_model")


def row_problem(mon: ModelMonitor, e: QueryEvent) -> tuple[str, str] | None:
    """(reason, what is wrong) for a row the monitor must not fold; None for a good one."""
    if e.problem is not None:
        return "undecodable", e.problem
    return _features_problem(mon, e.features) or _answers_problem(mon, e)


def _features_problem(mon: ModelMonitor, X: np.ndarray) -> tuple[str, str] | None:
    """At least one row, of the model's width, every feature finite."""
    if X.shape[0] == 0:
        return "empty", "no rows"
    if X.ndim != 2 or X.shape[1] != mon.n_features:
        return "shape", f"{X.shape[1] if X.ndim == 2 else '?'} features per row; model {mon.model_id!r} has {mon.n_features}"
    if not np.isfinite(X).all():
        return "not_finite", "a feature is NaN or infinite"
    return None


def _answers_problem(mon: ModelMonitor, e: QueryEvent) -> tuple[str, str] | None:
    """One answer per row: a label among the model's classes, a confidence in [0, 1] and a
    leaf of its tree (where the policy revealed them)."""
    n = e.features.shape[0]
    if e.labels.shape[0] != n:
        return "shape", f"{e.labels.shape[0]} labels for {n} rows"
    k = mon.tree.n_classes
    if e.labels.min() < 0 or e.labels.max() >= k:
        return "label", f"label index {int(e.labels.max() if e.labels.max() >= k else e.labels.min())} outside 0..{k - 1}"
    c = e.confidences
    if c is not None and (c.shape[0] != n or not ((c >= 0) & (c <= 1)).all()):
        return "confidence", "confidences must be one per row, in [0, 1]"
    leaves = e.leaves
    if leaves is None:
        return None
    if leaves.shape[0] != n:
        return "shape", f"{leaves.shape[0]} leaves for {n} rows"
    nodes = mon.tree.n_nodes
    bad = (leaves < 0) | (leaves >= nodes)
    if not bad.any():
        bad = mon.tree.left[leaves] != -1
    if bad.any():
        return "leaf", f"leaf id {int(leaves[bad][0])} is not a leaf of the tree ({nodes} nodes)"
    return None
