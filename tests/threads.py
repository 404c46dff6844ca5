"""Background threads whose failures reach the test: an assertion (or any exception) raised in
the thread is re-raised by ``join`` in the test's own thread instead of dying with the thread."""

from __future__ import annotations

import threading
from collections.abc import Callable


class CheckedThread(threading.Thread):
    def __init__(self, target: Callable[..., object], args: tuple = (), name: str | None = None) -> None:
        super().__init__(target=target, args=args, name=name, daemon=True)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            super().run()
        except BaseException as e:  # noqa: BLE001 - handed to the test thread by join()
            self.error = e

    def join(self, timeout: float | None = 30.0) -> None:
        """Wait for the thread (it must end within ``timeout``); re-raise what it raised."""
        super().join(timeout)
        if self.is_alive():
            raise AssertionError(f"thread {self.name} still running after {timeout} s")
        if self.error is not None:
            raise self.error
