"""The run's event stream to WatchEvents clients: each watcher's bounded queue, fed as things
happen, and cut off (rather than buffered without bound) when it falls behind."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from analysim.core.engine import Engine


class EventFeed:
    """The open WatchEvents streams; the feed is the only one to add to their queues."""

    def __init__(self, engine: Engine) -> None:
        # The live engine: an event without a time of its own happens at the engine's now.
        self.engine = engine
        # One queue per open WatchEvents call (its handler adds and removes it); None ends it.
        self.watchers: list[asyncio.Queue] = []

    def close(self) -> None:
        """The scheduler is stopping: every stream ends now, with status OK, rather than being
        held open until the server's grace period runs out and cut off with an error."""
        for q in self.watchers:
            q.put_nowait(None)  # (a full queue has one place kept for it: see publish)
        self.watchers.clear()

    def publish(self, kind: str, job_id: str, nodes: Sequence[str], message: str, t: float | None = None) -> None:
        if not self.watchers:
            return
        from analysim._protos.v1 import scheduler_pb2 as spb
        from scheduler_svc.contract import value

        ev = spb.Event(time_s=self.engine.now if t is None else t, kind=value(spb.EventKind, kind), job_id=job_id,
                       nodes=nodes, message=message)
        for q in list(self.watchers):
            if q.qsize() >= q.maxsize - 1 and q.maxsize > 0:
                self.watchers.remove(q)  # too slow: cut it off rather than buffer without bound
                q.put_nowait(None)
            else:
                q.put_nowait(ev)
