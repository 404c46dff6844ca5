"""``analysim gateway --workers N``: N gateway processes sharing one HTTP and one gRPC port.

Each worker is a whole gateway (its own event loop, gRPC server and store connection) that
binds the API ports with SO_REUSEPORT: the kernel spreads incoming connections over them.
Workers are started with multiprocessing's *spawn* (a fresh interpreter: gRPC does not
survive fork) and share only the store, a PostgreSQL database. Port 0 is resolved once, by
the supervisor, which keeps a bound (not listening) SO_REUSEPORT socket on each API port so
that the number stays reserved while workers come and go.

The supervisor restarts a worker that dies (SIGKILL, a crash), and on SIGTERM/SIGINT stops
them all gracefully. Metrics are per worker: each has its own metrics port (``--metrics-port
P`` gives worker i port P+i; 0 gives each a free one), all listed in the port file, so that
Prometheus scrapes every worker as its own target and sums across them.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from analysim.errors import UserError

log = logging.getLogger(__name__)
START_TIMEOUT_S = 120.0
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)  # after 1, 2, 3, 4+ deaths in a row without becoming ready


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound (not listening) to ``host:port`` with SO_REUSEPORT: holds the port
    number for the workers, who bind it the same way and listen."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        s.bind((host, port))
    except OSError as e:
        s.close()
        raise UserError(f"cannot bind {host}:{port}: {e}") from e
    return s


def exit_with_parent(poll_s: float = 1.0) -> None:
    """In a worker: stop gracefully (SIGTERM to itself) once the supervisor is gone, even if
    it was SIGKILLed and could not stop the workers: an orphan would hold the ports."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


@dataclass
class Worker:
    index: int  # 0..n-1: which worker (its port file's and process's name)
    process: BaseProcess  # the worker's process
    port_file: Path  # where it writes its ports once it serves
    started: float  # monotonic time it was started
    ports: dict[str, Any] | None = None  # its ports once it serves (None: not yet)


class Supervisor:
    """Starts ``n`` workers running ``target(index, port_file)``; each writes its port file
    once it serves. ``on_change(ports of every worker)`` runs once all serve, and again after
    a restarted worker serves."""

    def __init__(self, n: int, target: Callable[[int, str], None], on_change: Callable[[list[dict[str, Any]]], None]) -> None:
        # Workers to keep running, what each runs (index, port file), and what to call with every worker's ports when they change
        self.n, self.target, self.on_change = n, target, on_change
        # Spawned processes: nothing inherited from the parent's state
        self._ctx = multiprocessing.get_context("spawn")
        self._dir = Path(tempfile.mkdtemp(prefix="analysim-workers-"))  # the port files' directory (removed at stop)
        self._stop = threading.Event()  # set at stop: no more restarts
        self.workers: list[Worker] = []  # the current worker per index
        self._deaths = [0] * n  # per index, deaths since it last served (the restart backoff grows with them)

    def _spawn(self, i: int) -> Worker:
        pf = self._dir / f"worker-{i}.json"
        pf.unlink(missing_ok=True)
        p = self._ctx.Process(target=self.target, args=(i, str(pf)), name=f"gateway-worker-{i}", daemon=False)
        p.start()
        return Worker(i, p, pf, time.monotonic())

    def run(self) -> None:
        """Until SIGTERM/SIGINT; then stops the workers (SIGTERM: graceful) and returns."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        try:
            self.workers = [self._spawn(i) for i in range(self.n)]
            self._wait_ready(initial=True)
            while not self._stop.wait(0.2):
                for w in self.workers:
                    if not w.process.is_alive():
                        self._restart(w)
                if any(w.ports is None for w in self.workers):
                    self._wait_ready(initial=False)
        finally:
            self._stop_all()

    def _read_ports(self, w: Worker) -> bool:
        if w.ports is None and w.port_file.exists():
            w.ports = json.loads(w.port_file.read_text())
            self._deaths[w.index] = 0
            return True
        return False

    def _wait_ready(self, initial: bool) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        changed = False
        while any(w.ports is None for w in self.workers):
            for w in self.workers:
                changed |= self._read_ports(w)
                if w.ports is None and not w.process.is_alive():
                    if initial:
                        raise UserError(f"gateway worker {w.index} exited with status {w.process.exitcode} while starting")
                    return  # the main loop restarts it
            if self._stop.is_set():
                return
            if time.monotonic() > deadline:
                raise UserError(f"gateway workers did not start within {START_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
        if changed or initial:
            self.on_change([w.ports for w in self.workers if w.ports is not None])

    def _restart(self, w: Worker) -> None:
        d = self._deaths[w.index]
        self._deaths[w.index] += 1
        log.error("gateway worker %d (pid %s) exited with status %s; restarting it", w.index, w.process.pid, w.process.exitcode)
        if d and self._stop.wait(RESTART_BACKOFF_S[min(d, len(RESTART_BACKOFF_S)) - 1]):
            return
        self.workers[w.index] = self._spawn(w.index)

    def _stop_all(self) -> None:
        for w in self.workers:
            if w.process.is_alive() and w.process.pid is not None:
                os.kill(w.process.pid, signal.SIGTERM)
        for w in self.workers:
            w.process.join(30)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
        for f in self._dir.iterdir():
            f.unlink()
        self._dir.rmdir()
