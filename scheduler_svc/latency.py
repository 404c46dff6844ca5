"""Decision latencies in a fixed-size structure: log-spaced bins 1 % wide from 1 µs to 1,000 s
(1,400 counters, whatever the run's length), for the summary's quantiles (each within 1 % of
the exact one) and an exact maximum. A list of every step's latency grew without bound."""

from __future__ import annotations

import math

import numpy as np

LOW_S, HIGH_S, GAMMA = 1e-6, 1e3, 1.01
_LOG_GAMMA = math.log(GAMMA)
BINS = math.ceil(math.log(HIGH_S / LOW_S) / _LOG_GAMMA) + 1


class LatencyQuantiles:
    def __init__(self) -> None:
        self.counts = np.zeros(BINS, dtype=np.int64)  # values per bin (bin 0: at most LOW_S)
        self.n = 0  # values added
        self.max = 0.0  # the largest value added, exact (seconds)

    def add(self, seconds: float) -> None:
        i = 0 if seconds <= LOW_S else min(BINS - 1, int(math.log(seconds / LOW_S) / _LOG_GAMMA) + 1)
        self.counts[i] += 1
        self.n += 1
        if seconds > self.max:
            self.max = seconds

    def quantile(self, q: float) -> float:
        """The q-quantile (0 <= q <= 1) as its bin's geometric middle; 0.0 before any value."""
        if self.n == 0:
            return 0.0
        rank = min(self.n, max(1, math.ceil(q * self.n)))
        i = int(np.searchsorted(np.cumsum(self.counts), rank))
        if i == 0:
            return LOW_S
        return min(self.max, LOW_S * GAMMA ** (i - 0.5))
