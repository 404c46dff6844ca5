"""What enforcement does per model and user, as the versioned snapshot the gateways
long-poll (``GET /v1/monitor/decisions``)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from typing import Any


class Decisions:
    """What enforcement does per model and user ('degrade' | 'refuse'; absent: nothing), as
    a versioned snapshot the gateways long-poll. The token is ``EPOCH.VERSION``: a token of
    another epoch (this service restarted) or an older version gets the snapshot at once."""

    def __init__(self) -> None:
        self.epoch = secrets.token_hex(4)  # this service's run: a token of another epoch gets the snapshot at once
        self.version = 0  # bumped at each change of by_model
        self.by_model: dict[str, dict[str, str]] = {}  # model -> user -> action
        self.problem: str | None = None  # why the monitor is not following the log, if it is not
        self._changed = asyncio.Event()  # set at each change: wakes the long polls
        self._polls: dict[asyncio.Event, int] = {}  # per change event, the long polls waiting on it
        self._left = asyncio.Event()  # set when a long poll returns: wakes answered()
        self.closed = False  # set at shutdown: the long polls return

    @property
    def token(self) -> str:
        return f"{self.epoch}.{self.version}"

    def set(self, model_id: str, decided: dict[str, str]) -> None:
        if self.by_model.get(model_id, {}) == decided:
            return
        if decided:
            self.by_model[model_id] = decided
        else:
            self.by_model.pop(model_id, None)
        self._bump()

    def set_problem(self, problem: str | None) -> None:
        """The monitor stopped following the log (why), or follows it again (None): the
        gateways learn it with the next snapshot (their monitor_up and /readyz)."""
        if problem != self.problem:
            self.problem = problem
            self._bump()

    def _bump(self) -> None:
        self.version += 1
        self._changed.set()  # wakes every waiting long poll; later ones wait on a fresh event
        self._changed = asyncio.Event()

    def snapshot(self) -> dict[str, Any]:
        return {"token": self.token, "decisions": {m: dict(d) for m, d in sorted(self.by_model.items())},
                "following": self.problem is None, **({"problem": self.problem} if self.problem else {})}

    def close(self) -> None:
        """Answer every waiting long poll now (the service is stopping) and any later one at once."""
        self.closed = True
        self._changed.set()

    async def wait(self, after: str | None, timeout: float) -> dict[str, Any]:
        """The snapshot once it differs from ``after``, or after ``timeout`` seconds."""
        if after == self.token and timeout > 0 and not self.closed:
            changed = self._changed
            self._polls[changed] = self._polls.get(changed, 0) + 1
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await changed.wait()
            finally:
                self._polls[changed] -= 1
                if not self._polls[changed]:
                    del self._polls[changed]
                self._left.set()
        return self.snapshot()

    async def answered(self, timeout: float) -> bool:
        """Wait until every long poll that was waiting when the decisions last changed has
        returned its snapshot (False: not within ``timeout`` seconds). The monitor's fold
        loop waits on this after a change, so that a page of the log folded next cannot
        hold a decision back from the gateways."""
        try:
            async with asyncio.timeout(timeout):
                while any(ev is not self._changed for ev in self._polls):
                    self._left = asyncio.Event()
                    await self._left.wait()
        except TimeoutError:
            return False
        return True
