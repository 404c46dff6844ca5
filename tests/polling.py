"""Waiting for a condition with a deadline: tests synchronise on what they can observe,
never on a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(cond: Callable[[], T], deadline_s: float = 30.0, what: str = "condition", poll_s: float = 0.01) -> T:
    """Poll ``cond`` until it returns something truthy; fail the test at the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline_s:g} s waiting for {what}")
        time.sleep(poll_s)
