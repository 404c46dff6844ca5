"""Waiting for a condition with a deadline: tests synchronise on what they can observe,
never on a fixed sleep. Every deadline is scaled by how slow this machine is right now
(``SLOWDOWN``), so a test that holds on a quiet machine holds under load too."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# The largest slowdown a deadline is stretched by: beyond it a test that waits is hung, not slow.
MAX_SLOWDOWN = 10.0
# CPU work timed to measure how much of a core this process gets (about 20 ms on a quiet core).
_PROBE_LOOPS = 200_000


@functools.cache
def slowdown() -> float:
    """How many times longer than on a quiet machine things take here, measured once per test
    process: the larger of a busy loop's wall time over its CPU time (the share of a core the
    scheduler gives us) and the load average per CPU, between 1 and MAX_SLOWDOWN."""
    best = float("inf")
    for _ in range(3):
        wall, cpu = time.perf_counter(), time.process_time()
        n = 0
        for i in range(_PROBE_LOOPS):
            n += i
        spent_cpu = time.process_time() - cpu
        if spent_cpu > 0:
            best = min(best, (time.perf_counter() - wall) / spent_cpu)
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    factor = max(best if best != float("inf") else 1.0, load)
    return min(MAX_SLOWDOWN, max(1.0, factor))


def scaled(seconds: float) -> float:
    """A deadline of SECONDS on a quiet machine, stretched by this machine's slowdown."""
    return seconds * slowdown()


def wait_until(cond: Callable[[], T], deadline_s: float = 30.0, what: str = "condition", poll_s: float = 0.01) -> T:
    """Poll ``cond`` until it returns something truthy; fail the test at the deadline (scaled)."""
    limit = scaled(deadline_s)
    end = time.monotonic() + limit
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {limit:g} s waiting for {what}")
        time.sleep(poll_s)
