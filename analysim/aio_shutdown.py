"""The last step of a service's asyncio shutdown: let the tasks still running finish on their own
before ``asyncio.run`` closes the loop.

``grpc.aio.Server.stop(grace)`` returns once gRPC's core has ended every call, while the Python
tasks that ran those calls may still be unwinding (grpc/grpc#37239): a call cut off when the grace
period ran out is typically among them. Left to ``asyncio.run``, such a task is cancelled where
it stands, and gRPC reports that as an exception its handler never saw, with a traceback, on a
clean stop. Awaiting them first costs a few loop iterations."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("analysim.shutdown")


async def settle(timeout_s: float) -> int:
    """Wait up to ``timeout_s`` for every other task on this loop to finish by itself; cancel and
    await those that do not (named in a warning). Call it once the servers have stopped: a task
    that lives as long as a server (an HTTP keep-alive, a background loop) must be ended first.
    Returns how many were cancelled."""
    me = asyncio.current_task()
    others = [t for t in asyncio.all_tasks() if t is not me]
    if not others:
        return 0
    _, pending = await asyncio.wait(others, timeout=timeout_s)
    if not pending:
        return 0
    log.warning("%d task(s) still running %.1f s after the servers stopped, cancelled: %s", len(pending),
                timeout_s, ", ".join(sorted(t.get_name() for t in pending)))
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return len(pending)
