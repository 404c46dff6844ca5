"""The scheduler's decision latencies are kept in a fixed-size structure (it grew a float per
engine step, for ever, and GetSummary copied it all): quantiles within 1 % of numpy's exact
ones, an exact maximum, and the same memory after 200,000 steps as after one."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_svc.latency import GAMMA, LatencyQuantiles

latency = st.floats(min_value=2e-6, max_value=500.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(latency, min_size=1, max_size=300), st.sampled_from([0.0, 0.01, 0.5, 0.9, 0.99, 1.0]))
def test_quantiles_within_one_percent_of_the_exact_ones(values: list[float], q: float) -> None:
    lq = LatencyQuantiles()
    for v in values:
        lq.add(v)
    exact = float(np.quantile(np.array(values), q, method="inverted_cdf"))
    assert abs(lq.quantile(q) - exact) <= (GAMMA - 1) * exact * 1.0001
    assert lq.max == max(values)


def test_memory_does_not_grow_with_the_steps() -> None:
    lq = LatencyQuantiles()
    size = lq.counts.nbytes
    rng = np.random.default_rng(0)
    for v in rng.lognormal(-8, 2, 200_000):
        lq.add(float(v))
    assert lq.counts.nbytes == size and lq.n == 200_000
    assert LatencyQuantiles().quantile(0.5) == 0.0
