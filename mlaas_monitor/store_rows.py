"""A logged row read back: its blobs as arrays, as a ``QueryEvent`` (with its problem said when
its columns are not what the gateway writes), or as an answer an idempotency key finds."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from mlaas_monitor.stream import QueryEvent


def told(labels: bytes, conf: bytes | None, leaves: bytes | None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """A logged answer's blobs as arrays: class indices, and the confidences and leaf ids
    when they were revealed."""
    return (
        np.frombuffer(labels, dtype="<i4").astype(np.int64),
        None if conf is None else np.frombuffer(conf, dtype="<f8").astype(np.float64),
        None if leaves is None else np.frombuffer(leaves, dtype="<i4").astype(np.int64),
    )


def logged_event(r: Iterable[Any]) -> QueryEvent:
    """A logged row as an event; one whose columns are not what the gateway writes (a
    timestamp as text, a user as a blob, blobs that do not fit the shape) comes back with its
    ``problem`` said and its fields made safe to log (the monitor quarantines it and moves on)."""
    qid, ts, user, model, n, f, feats, labels, conf, leaves = r
    problem = _column_problem(ts, user, model) or _blob_problem(n, f, feats, labels, conf, leaves)
    if problem is not None:
        return QueryEvent(qid, ts if _is_finite_number(ts) else 0.0, _as_text(user), _as_text(model),
                          np.empty((0, 0)), np.empty(0, np.int64), None, None, problem)  # fmt: skip
    features = np.frombuffer(feats, dtype="<f8").reshape(n, f).astype(np.float64)
    return QueryEvent(qid, float(ts), user, model, features, *told(labels, conf, leaves))


def _is_finite_number(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def _as_text(v: Any) -> str:
    """A text column's value, or its repr (shortened) when it is not text."""
    return v if isinstance(v, str) else repr(v)[:60]


def _column_problem(ts: Any, user: Any, model: Any) -> str | None:
    if not _is_finite_number(ts):
        return f"ts {_as_text(ts)} is not a finite number"
    for name, v in (("user", user), ("model", model)):
        if not isinstance(v, str):
            return f"{name} {_as_text(v)} is not text"
    return None


def _blob_problem(n: Any, f: Any, feats: Any, labels: Any, conf: Any, leaves: Any) -> str | None:
    if not isinstance(n, int) or not isinstance(f, int) or n < 0 or f < 0:
        return f"n_rows {n!r} and n_features {f!r} must be integers >= 0"
    return _sized_problem("features", feats, n, 8 * f) or _told_problem(n, labels, conf, leaves)


def _told_problem(n: int, labels: Any, conf: Any, leaves: Any) -> str | None:
    """What is wrong with the blobs of an answer to N rows (confidences and leaves may be
    absent: hidden by the policy), or None."""
    return (_sized_problem("labels", labels, n, 4)
            or (None if conf is None else _sized_problem("confidences", conf, n, 8))
            or (None if leaves is None else _sized_problem("leaves", leaves, n, 4)))  # fmt: skip


def _sized_problem(name: str, blob: Any, n: int, row_bytes: int) -> str | None:
    if not isinstance(blob, bytes | bytearray | memoryview):
        return f"{name} is not a blob"
    if len(blob) != n * row_bytes:
        return f"{name} blob holds {len(blob)} bytes; {n} row(s) need {n * row_bytes}"
    return None


def answered_problem(digest: Any, n: Any, labels: Any, conf: Any, leaves: Any, amount: Any) -> str | None:
    """What is wrong with a logged answer's row as an idempotency key finds it, or None."""
    if not isinstance(digest, bytes | bytearray | memoryview):
        return "request_digest is not a blob"
    if not isinstance(n, int) or n < 0:
        return f"n_rows {_as_text(n)} is not an integer >= 0"
    if not isinstance(amount, int) or amount < 0:
        return f"amount_micros {_as_text(amount)} is not an integer >= 0"
    return _told_problem(n, labels, conf, leaves)
