"""Group commit: every query answered during one event-loop tick is logged and charged in a
single transaction, and each request awaits that commit before it responds.

The flush runs on the loop itself (a SQLite WAL commit with synchronous=NORMAL is a single
write, tens of microseconds; a PostgreSQL one a few round trips on a local socket); a writer
thread would hand the GIL back and forth and add latency spikes of up to the interpreter's
switch interval.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mlaas_monitor.store import QueryRecord, Refused, Store


class GroupCommitter:
    def __init__(self, store: Store, on_batch: Callable[[int], None] | None = None) -> None:
        self._store = store
        self._pending: list[tuple[QueryRecord, asyncio.Future[int | Refused]]] = []
        self._scheduled = False
        self._on_batch = on_batch

    async def commit(self, record: QueryRecord) -> int | Refused:
        """Durably log and charge ``record``: its sequence number, or why the store refused it."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int | Refused] = loop.create_future()
        self._pending.append((record, fut))
        if not self._scheduled:
            self._scheduled = True
            # call_soon runs after every callback already queued for this tick, so all the
            # requests parsed in this tick join the same transaction.
            loop.call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            ids = self._store.commit_queries([r for r, _ in batch])
        except Exception as e:  # the transaction rolled back: nobody was charged
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        if self._on_batch is not None:
            self._on_batch(len(batch))
        for (_, fut), qid in zip(batch, ids, strict=True):
            if not fut.done():  # a cancelled request was still charged: it was answered
                fut.set_result(qid)

    def flush_now(self) -> None:
        """Commit whatever is pending (graceful shutdown)."""
        self._flush()
