"""The statistics a run's summary gives: one implementation each, for the whole run and per queue."""

from __future__ import annotations

import numpy as np


def jain_index(values: list[float]) -> float:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 when all equal, 1/n when one takes everything.
    Applied to the VCs' mean job slowdown: 1 means every tenant waits in the same proportion."""
    if not values:
        return 1.0
    sq = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * sq) if sq > 0 else 1.0


def distribution(x: np.ndarray) -> tuple[float | None, float | None, float | None, float | None]:
    """Mean, median, 95th and 99th percentile (numpy's linear interpolation); all None when empty.
    In the order the values come (the mean's rounding depends on it)."""
    if not x.size:
        return None, None, None, None
    p95, p99 = np.percentile(x, (95, 99))  # (one partition for both: the same values as two calls)
    return float(x.mean()), float(np.median(x)), float(p95), float(p99)


def jct_stats(jct: np.ndarray, queue: np.ndarray) -> dict:
    """Over completed jobs, in the order they ended."""
    mean, median, p95, p99 = distribution(jct)
    return {"avg_jct_s": mean, "median_jct_s": median, "p95_jct_s": p95, "p99_jct_s": p99,
            "avg_queue_s": float(np.mean(queue)) if queue.size else None}
