"""Per-user request rate limit (token bucket) and row quota. Pure: the clock is passed in."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenBucket:
    rate: float  # requests per second
    burst: float  # tokens the bucket holds when full
    tokens: float  # tokens now (a request takes one)
    stamp: float  # when tokens was last brought up to date, in seconds

    @classmethod
    def full(cls, rate: float, now: float, burst: float | None = None) -> TokenBucket:
        b = burst if burst is not None else max(1.0, rate)
        return cls(rate, b, b, now)

    def take(self, now: float, n: float = 1.0) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False

    def wait_seconds(self, n: float = 1.0) -> float:
        """After a refused ``take``: how long until ``n`` tokens are there (Retry-After)."""
        return max(0.0, (n - self.tokens) / self.rate)


def quota_allows(used_rows: int, reserved_rows: int, quota_rows: int | None, n: int) -> bool:
    """Would answering ``n`` more rows stay within the quota (None = unlimited)?"""
    return quota_rows is None or used_rows + reserved_rows + n <= quota_rows
