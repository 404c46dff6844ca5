"""Where a sweep's cells run: a process pool on this machine, or Ray tasks on a Ray cluster.

Both engines take the cells to run with their loaded traces and report to a ``Tracker`` as cells
start and finish; each cell runs ``cell.run_cell``. Neither gives up on the sweep when a cell
fails; a cell whose worker died is run again (Ray's task retries; a new process here) and counted
lost when it runs out of tries, so that a re-run of the sweep picks it up.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Hashable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_ready
from typing import Protocol

from analysim.errors import UserError
from analysim.sweep.cell import LOST, Outcome, run_cell
from analysim.sweep.spec import Cell
from analysim.traces import Trace

ENGINES = ("local", "ray")
Work = Sequence[tuple[Cell, Hashable]]  # each cell with the key of its trace


class Tracker(Protocol):
    capacity: int | None  # cells that can run at once, when the engine knows

    def started(self, cell: Cell) -> None: ...
    def finished(self, cell: Cell, outcome: Outcome) -> None: ...
    def retried(self, cell: Cell, why: str) -> None: ...  # started, did not finish, will start again


def machine_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# --- local: forked processes, as many at once as the machine has cores

# Each cell runs in a process of its own, forked from the sweep: it inherits the loaded traces
# (nothing pickled) and sends its outcome back over a pipe that only it writes. A process that
# dies (the OOM killer, a signal) costs its own cell alone, which runs again. A shared pool does
# not survive that: CPython's ProcessPoolExecutor hangs for good when a worker is killed while it
# holds the result queue's lock (seen here: the other worker blocked on the lock, the pool's
# manager thread in a read that never ends).
_FORK = multiprocessing.get_context("fork")


def _run_forked(out: Connection, cell: Cell, trace: Trace) -> None:
    try:
        out.send(run_cell(cell.args, trace))
    finally:
        out.close()


def run_local(work: Work, traces: dict[Hashable, Trace], tracker: Tracker, workers: int, retries: int) -> None:
    queue = list(reversed(work))
    tracker.capacity = workers
    tries: dict[str, int] = {}
    running: dict[Connection, tuple[multiprocessing.process.BaseProcess, Cell, Hashable]] = {}
    while queue or running:
        while queue and len(running) < workers:
            cell, key = queue.pop()
            reader, writer = _FORK.Pipe(duplex=False)
            proc = _FORK.Process(target=_run_forked, args=(writer, cell, traces[key]), daemon=True)
            proc.start()
            writer.close()  # the child holds the only write end: its death is EOF here
            running[reader] = (proc, cell, key)
            tracker.started(cell)
        for reader in wait_ready(list(running)):
            proc, cell, key = running.pop(reader)  # type: ignore[index]
            try:
                outcome: Outcome | None = reader.recv()  # type: ignore[union-attr]
            except EOFError:
                outcome = None
            reader.close()  # type: ignore[union-attr]
            proc.join()
            if outcome is not None:
                tracker.finished(cell, outcome)
                continue
            tries[cell.id] = tries.get(cell.id, 0) + 1
            if tries[cell.id] > retries:
                tracker.finished(cell, Outcome(LOST, error=f"worker process died (exit code {proc.exitcode})"))
            else:
                tracker.retried(cell, "a worker process died")
                queue.append((cell, key))


# --- ray: tasks on a Ray cluster, the traces in its object store

def import_ray():
    try:
        import ray
    except ImportError:
        raise UserError("--engine ray needs Ray: pip install 'analysim[ray]'") from None
    return ray


_RAY_TRACES: dict[str, Trace] = {}


def _run_on_ray(args, boxed_ref: list) -> Outcome:
    """A cell in a Ray worker. The trace's reference comes boxed so that Ray does not resolve it
    for every task: a worker fetches and unpickles each trace once and keeps it for the next cells
    (unpickling the Philly extract costs about as much as a small cell)."""
    import ray

    ref = boxed_ref[0]
    trace = _RAY_TRACES.get(ref.hex())
    if trace is None:
        if len(_RAY_TRACES) >= 2:
            _RAY_TRACES.clear()
        trace = _RAY_TRACES[ref.hex()] = ray.get(ref)
    return run_cell(args, trace)


def run_ray(work: Work, traces: dict[Hashable, Trace], tracker: Tracker, *, address: str | None,
            workers: int, cpus: float, memory_mb: int, retries: int,
            say: Callable[[str], None] = print) -> None:
    ray = import_ray()
    import logging

    if address:
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise UserError(f"cannot connect to the Ray cluster at {address}: {' '.join(str(e).split())}") from None
    else:  # a Ray of our own for this run, stopped at the end
        ray.init(address="local", num_cpus=workers, include_dashboard=False, logging_level=logging.WARNING,
                 log_to_driver=False)
    try:
        say(f"ray: {ray.get_runtime_context().gcs_address}, "
            f"{ray.cluster_resources().get('CPU', 0):g} CPUs in {len(ray.nodes())} node(s)")
        # Each trace once in the object store; every task of that trace gets a reference to it.
        refs = {key: ray.put(trace) for key, trace in traces.items()}
        task = ray.remote(_run_on_ray).options(num_cpus=cpus, memory=memory_mb * 2**20, max_retries=retries,
                                            retry_exceptions=False)
        queue = list(reversed(work))
        running: dict = {}
        while queue or running:
            # Cells in flight: one running per slot of the cluster (which may grow) and one queued
            # behind it, so that no worker waits between cells and an autoscaler sees the demand; the
            # rest stay here, which keeps a driver crash cheap (finished cells are already saved).
            slots = max(1, int(ray.cluster_resources().get("CPU", 1) // cpus))
            tracker.capacity = slots
            while queue and len(running) < 2 * slots:
                cell, key = queue.pop()
                running[task.remote(cell.args, [refs[key]])] = cell
                tracker.started(cell)
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                cell = running.pop(ref)
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayError as e:  # worker or node died after every retry, or task lost
                    outcome = Outcome(LOST, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                tracker.finished(cell, outcome)
    finally:
        ray.shutdown()
