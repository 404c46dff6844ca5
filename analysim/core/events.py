"""A tiny event core: one virtual clock in seconds and a heap of timestamped events.

Events at the same time are taken in a fixed class order (node changes, then completions, then
arrivals, then timers) and, within a class, in the order they were pushed: runs are deterministic.
"""

from __future__ import annotations

import heapq
import math
from typing import Any, Final

# Same-time ordering: free resources before new demand arrives, so a pass sees both.
NODE: Final = 0
COMPLETION: Final = 1
ARRIVAL: Final = 2
TIMER: Final = 3


# An event: (time, klass, seq, kind, payload). The heap compares (time, klass, seq) in C, and seq
# is unique, so the comparison never reaches kind or payload. (A plain tuple: a NamedTuple's
# constructor is interpreted Python, which cost more than the rest of a push.)
Event = tuple[float, int, int, str, Any]
KIND: Final = 3  # the fields a handler reads
PAYLOAD: Final = 4


class EventQueue:
    """The engine's pending events, earliest first; of one time, by class, then in push order.

    Invariant: ``_heap`` is a heap of events whose seqs are all below ``_seq`` and distinct."""

    def __init__(self) -> None:
        self._heap: list[Event] = []  # the events not yet popped (heapq's order)
        self._seq = 0  # the next event's seq (events pushed so far)

    def push(self, time: float, klass: int, kind: str, payload: Any = None) -> Event:
        ev = (time, klass, self._seq, kind, payload)
        self._seq += 1
        heapq.heappush(self._heap, ev)
        return ev

    def pop(self) -> Event:
        return heapq.heappop(self._heap)

    def peek_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def next_time(self) -> float:
        """The first event's time; infinity when there is none."""
        return self._heap[0][0] if self._heap else math.inf

    def __len__(self) -> int:
        return len(self._heap)
