"""The rate limiter's invariants over arbitrary request timings (quotas are tested end to end
in test_gateway_http)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mlaas_monitor.limits import TokenBucket


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(0.01, 1000),
    gaps=st.lists(st.floats(0, 5), min_size=1, max_size=200),
)
def test_token_bucket_never_admits_more_than_burst_plus_rate_times_time(rate: float, gaps: list[float]) -> None:
    now = 0.0
    bucket = TokenBucket.full(rate, now)
    admitted = 0
    for gap in gaps:
        now += gap
        admitted += bucket.take(now)
        assert 0 <= bucket.tokens <= bucket.burst
    assert admitted <= bucket.burst + rate * now + 1e-9
    # And it is not stingy: a request after a full refill always passes.
    assert bucket.take(now + bucket.burst / rate + 1)
