"""Where a sweep's cells run: a process pool on this machine, or Ray tasks on a Ray cluster.

Both engines take the cells to run with their loaded traces and report to a ``Tracker`` as cells
start and finish; each cell runs ``cell.run_cell``. Neither gives up on the sweep when a cell
fails; a cell whose worker died is run again (Ray's task retries; a new process here) and counted
lost when it runs out of tries, so that a re-run of the sweep picks it up.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

from analysim.errors import UserError
from analysim.forked import ForkedTasks
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


# --- local: forked processes, as many at once as the machine has cores (see analysim.forked for
# why each cell has a process of its own rather than a place in a shared pool)

def run_local(work: Work, traces: dict[Hashable, Trace], tracker: Tracker, workers: int, retries: int) -> None:
    tracker.capacity = workers
    cells = {cell.id: (cell, key) for cell, key in work}
    tries: dict[str, int] = {}
    tasks = ForkedTasks(workers, on_start=lambda cell_id: tracker.started(cells[cell_id][0]))
    for cell, key in work:
        tasks.submit(cell.id, run_cell, cell.args, traces[key])
    for done in tasks.finished():
        cell, key = cells[done.key]
        if not done.died:
            tracker.finished(cell, done.result)
            continue
        tries[cell.id] = tries.get(cell.id, 0) + 1
        if tries[cell.id] > retries:
            tracker.finished(cell, Outcome(LOST, error=f"worker process died (exit code {done.exitcode})"))
        else:
            tracker.retried(cell, "a worker process died")
            tasks.submit(cell.id, run_cell, cell.args, traces[key])


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
