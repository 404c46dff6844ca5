"""Tasks run each in a process of its own, forked from this one, at most N at once.

A forked child inherits what the parent has loaded (a trace, a cluster): nothing is pickled on
the way in. It sends its result back over a pipe that only it writes, so a child that dies (the
OOM killer, a signal) costs its own task alone: its pipe reads EOF and the task is reported dead.
A shared pool does not survive that: CPython's ProcessPoolExecutor hangs for good when a worker
is killed while it holds the result queue's lock (seen here: the other worker blocked on the
lock, the pool's manager thread in a read that never ends).
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_ready
from typing import Any

_FORK = multiprocessing.get_context("fork")


@dataclass(frozen=True)
class Finished:
    key: Hashable
    result: Any  # what the task returned; None when it died
    died: bool
    exitcode: int | None


def _child(out: Connection, fn: Callable[..., Any], args: tuple) -> None:
    try:
        out.send(fn(*args))
    finally:
        out.close()


class ForkedTasks:
    """Submit tasks under keys; iterate ``finished()`` for their outcomes as they end. A task
    submitted while iterating (a retry) runs in the same iteration."""

    def __init__(self, workers: int, on_start: Callable[[Hashable], None] | None = None) -> None:
        self.workers = max(1, workers)
        self.on_start = on_start
        self._waiting: deque[tuple[Hashable, Callable[..., Any], tuple]] = deque()
        self._running: dict[Connection, tuple[multiprocessing.process.BaseProcess, Hashable]] = {}

    def submit(self, key: Hashable, fn: Callable[..., Any], *args: Any) -> None:
        self._waiting.append((key, fn, args))

    def _start_waiting(self) -> None:
        while self._waiting and len(self._running) < self.workers:
            key, fn, args = self._waiting.popleft()
            reader, writer = _FORK.Pipe(duplex=False)
            proc = _FORK.Process(target=_child, args=(writer, fn, args), daemon=True)
            proc.start()
            writer.close()  # the child holds the only write end: its death is EOF here
            self._running[reader] = (proc, key)
            if self.on_start is not None:
                self.on_start(key)

    def finished(self) -> Iterator[Finished]:
        try:
            while True:
                self._start_waiting()
                if not self._running:
                    return
                for reader in wait_ready(list(self._running)):
                    proc, key = self._running.pop(reader)  # type: ignore[index]
                    try:
                        result, died = reader.recv(), False  # type: ignore[union-attr]
                    except (EOFError, OSError):  # OSError: it died in the middle of sending
                        result, died = None, True
                    reader.close()  # type: ignore[union-attr]
                    proc.join()
                    yield Finished(key, result, died, proc.exitcode)
        finally:  # the caller stopped early (an error, ^C): no child outlives it
            for reader, (proc, _) in self._running.items():
                proc.kill()
                proc.join()
                reader.close()
            self._running.clear()
