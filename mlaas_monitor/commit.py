"""Group commit: every query answered while the previous commit was being made (or, on
SQLite, during one event-loop tick) is logged and charged in a single transaction, and each
request awaits that commit, durable, before it responds.

On SQLite the flush runs on the loop itself (a WAL commit with synchronous=NORMAL is a single
write, tens of microseconds); a writer thread would hand the GIL back and forth and add
latency spikes of up to the interpreter's switch interval (it measured 15 % slower).

On PostgreSQL a commit is a few network round trips, and its durability a WAL fsync
(milliseconds). Both run in threads (psycopg releases the GIL while it waits), in a
pipeline: one thread commits batches one after another, without waiting for the disk
(store.commit_queries(durable=False)); the other waits until the WAL is flushed past
every batch committed so far (store.make_durable), then they are answered. The loop keeps
answering meanwhile, and everything answered by the time a commit ends goes into the next
one; the next commit does not wait for the previous one's fsync.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from mlaas_monitor.store import Store
from mlaas_monitor.store_records import QueryRecord, Refused

Batch = list[tuple[QueryRecord, "asyncio.Future[int | Refused]"]]
Committed = list[tuple[Batch, list["int | Refused"]]]


class GroupCommitter:
    def __init__(self, store: Store, on_batch: Callable[[int], None] | None = None) -> None:
        self._store = store  # where the batches are committed
        self._pending: Batch = []  # records answered since the last commit began, with their callers' futures
        self._scheduled = False  # a commit of _pending is scheduled on the event loop
        self._on_batch = on_batch  # called with each committed batch's size (a metric), or None
        off_loop = store.commits_off_loop
        # Commits off the event loop (PostgreSQL); None: on the loop (SQLite)
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="commit") if off_loop else None
        # Waits for WAL flushes off the event loop (PostgreSQL); None: on the loop
        self._flusher = ThreadPoolExecutor(1, thread_name_prefix="flush") if off_loop else None
        self._committing = False  # a commit is running in its thread
        self._flushing = False  # a flush is running in its thread
        self._not_durable: Committed = []  # committed batches waiting for the next flush
        self._closed = False  # flush_now has run: shutting down

    async def commit(self, record: QueryRecord) -> int | Refused:
        """Durably log and charge ``record``: its sequence number, or why the store refused it."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int | Refused] = loop.create_future()
        self._pending.append((record, fut))
        if not self._scheduled and not self._committing:
            self._scheduled = True
            # call_soon runs after every callback already queued for this tick, so all the
            # requests parsed in this tick join the same transaction.
            loop.call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        self._scheduled = False
        if self._closed:
            return
        batch, self._pending = self._pending, []
        if not batch:
            return
        records = [r for r, _ in batch]
        if self._committer is None:
            try:
                outcomes = self._store.commit_queries(records)
            except Exception as e:  # the transaction rolled back: nobody was charged
                self._fail(batch, e)
                return
            self._resolve(batch, outcomes)
            return
        self._committing = True
        loop = asyncio.get_running_loop()
        done = self._committer.submit(self._store.commit_queries, records, durable=False)
        done.add_done_callback(lambda f: loop.call_soon_threadsafe(self._committed, batch, f))

    def _committed(self, batch: Batch, done: Future[list[int | Refused]]) -> None:
        """On the loop, once a commit ended: hand its batch to the flush, start the next commit."""
        self._committing = False
        e = done.exception()
        if e is not None:
            self._fail(batch, e)
        else:
            self._not_durable.append((batch, done.result()))
            self._start_flush()
        if self._pending and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _start_flush(self) -> None:
        if self._flushing or not self._not_durable or self._flusher is None or self._closed:
            return
        self._flushing = True
        batches, self._not_durable = self._not_durable, []
        loop = asyncio.get_running_loop()
        done = self._flusher.submit(self._store.make_durable)
        done.add_done_callback(lambda f: loop.call_soon_threadsafe(self._flushed, batches, f))

    def _flushed(self, batches: Committed, done: Future[None]) -> None:
        """On the loop, once the WAL is on disk past ``batches``: answer them."""
        self._flushing = False
        e = done.exception()
        for batch, outcomes in batches:
            if e is not None:
                # Committed, but not known to be durable: the clients get 503 and retry (with
                # an Idempotency-Key, a retry finds the charge if it survived).
                self._fail(batch, e)
            else:
                self._resolve(batch, outcomes)
        self._start_flush()

    def _resolve(self, batch: Batch, outcomes: list[int | Refused]) -> None:
        if self._on_batch is not None:
            self._on_batch(len(batch))
        for (_, fut), outcome in zip(batch, outcomes, strict=True):
            if not fut.done():  # a cancelled request was still charged: it was answered
                fut.set_result(outcome)

    @staticmethod
    def _fail(batch: Batch, e: BaseException) -> None:
        for _, fut in batch:
            if not fut.done():
                fut.set_exception(e)

    def flush_now(self) -> None:
        """Commit whatever is pending (graceful shutdown), after what the threads are doing."""
        self._closed = True
        for pool in (self._committer, self._flusher):
            if pool is not None:
                pool.shutdown(wait=True)
        batch, self._pending = self._pending, []
        if batch:
            try:
                outcomes = self._store.commit_queries([r for r, _ in batch])
            except Exception as e:  # the transaction rolled back: nobody was charged
                self._fail(batch, e)
                return
            self._resolve(batch, outcomes)
        if self._not_durable:
            batches, self._not_durable = self._not_durable, []
            try:
                self._store.make_durable()
            except Exception as e:  # committed, durability unknown: as in _flushed
                for b, _ in batches:
                    self._fail(b, e)
                return
            for b, outcomes in batches:
                self._resolve(b, outcomes)
