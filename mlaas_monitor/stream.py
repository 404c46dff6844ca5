"""The internal query stream: every answered query, for in-process consumers and gRPC subscribers.

In-process by default: ``add_listener`` callbacks run on the gateway's event loop right
after the query is committed (cheap, ordered, no copies), and ``subscribe`` gives an
asyncio queue per consumer. The gRPC QueryStreamService exposes the same stream to other
processes. (The extraction monitor reads neither: it follows the store's query log, which
holds every replica's queries.) Sequence numbers are the durable query-log ids, so a
consumer that restarts (or falls behind) resumes from the store with ``events_after``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class QueryEvent:
    seq: int  # query-log id: dense, increasing, durable
    timestamp: float  # wall-clock time it was answered
    user: str  # the user charged
    model_id: str  # the model asked
    features: np.ndarray  # (n_rows, n_features) float64, encoded as the tree sees them
    labels: np.ndarray  # class indices the user was told
    confidences: np.ndarray | None  # as revealed (rounded); None if the policy hid them
    leaves: np.ndarray | None  # None if the policy hid them
    problem: str | None = None  # set when the stored row could not be decoded (the arrays are then empty)

    @property
    def n_rows(self) -> int:
        return int(self.features.shape[0])


Listener = Callable[[QueryEvent], None]


class Subscription:
    """A bounded queue of live events. On overflow it is marked lost and stops receiving, so
    a slow consumer never stalls the gateway; it must resume from the store by ``seq``."""

    def __init__(self, stream: QueryStream, maxsize: int, model_id: str | None) -> None:
        # The stream it came from, and the model it follows (None: every model)
        self._stream, self.model_id = stream, model_id
        self.queue: asyncio.Queue[QueryEvent | None] = asyncio.Queue(maxsize)  # events not yet read (None: closed)
        self.lost = False  # it overflowed: events were dropped, resume from the store

    def offer(self, event: QueryEvent) -> None:
        if self.lost or (self.model_id and event.model_id != self.model_id):
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.lost = True
            self.close()

    def close(self) -> None:
        self._stream._subscriptions.discard(self)
        # Wake a reader blocked on get(); ignore if the queue is full (it is lost anyway).
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(None)

    async def get(self) -> QueryEvent | None:
        """The next event, or None once closed."""
        return await self.queue.get()


class QueryStream:
    def __init__(self) -> None:
        self._listeners: list[Listener] = []  # called with every answered query
        self._subscriptions: set[Subscription] = set()  # the live subscriptions

    def add_listener(self, fn: Listener) -> Callable[[], None]:
        """Call ``fn(event)`` for every answered query; returns a function that removes it."""
        self._listeners.append(fn)
        return lambda: self._listeners.remove(fn)

    def subscribe(self, maxsize: int = 10_000, model_id: str | None = None) -> Subscription:
        sub = Subscription(self, maxsize, model_id)
        self._subscriptions.add(sub)
        return sub

    @property
    def active(self) -> bool:
        return bool(self._listeners or self._subscriptions)

    def publish(self, event: QueryEvent) -> None:
        for fn in self._listeners:
            try:
                fn(event)
            except Exception:  # the query is committed and answered: a consumer's bug must not turn it into an error
                log.exception("query-stream listener %r failed on event %d", fn, event.seq)
        for sub in list(self._subscriptions):
            sub.offer(event)

    def close(self) -> None:
        for sub in list(self._subscriptions):
            sub.close()
