"""``analysim sweep``: many ``analysim simulate`` runs (cells) from one SPEC, on this machine or on a
Ray cluster, into one folder that a re-run resumes.

- ``spec``: SPEC -> cells (simulate's own parser checks every value), content-addressed ids;
- ``cell``: one cell through simulate's code path; ``engines``: where cells run;
- ``store``: the ``cells/<id>/`` folders; ``results``: results.csv and aggregate.csv.

This sits above the CLI's ``simulate`` (it drives it), beside the other commands.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path

from analysim.core.policies import build_policy
from analysim.errors import UserError
from analysim.inputs import load_inputs, read_trace, run_options, trace_inputs
from analysim.report import cluster_queue_rows, write_csv, write_json
from analysim.sweep.cell import FAILED, LOST, OK, Outcome
from analysim.sweep.engines import run_local, run_ray
from analysim.sweep.results import aggregate, result_row, write_results
from analysim.sweep.spec import Cell, SpecError, Sweep
from analysim.sweep.store import Store
from analysim.traces import Trace


@dataclass
class EngineOptions:
    engine: str = "local"
    workers: int = 1
    address: str | None = None
    cell_cpus: float = 1.0
    cell_memory_mb: int = 1024
    retries: int = 3


@dataclass
class SweepRun:
    """What a sweep did: cells it ran now, skipped (finished before), and how they ended."""

    total: int
    skipped: int
    ran: int = 0
    failed: int = 0
    lost: int = 0
    wall_s: float = 0.0
    rows: list[dict] = field(default_factory=list)
    aggregate: list[dict] = field(default_factory=list)
    # (cell label, summary) of the cells that ran under a partition: cluster_queues.csv
    cluster_queues: list[tuple[str, dict]] = field(default_factory=list)


def preflight(sweep: Sweep, cells: list[Cell]) -> dict[Hashable, Trace]:
    """Everything that can be wrong with a cell's inputs, found before any cell runs: policies,
    placements, traces, clusters. Returns the traces the cells need, loaded once each."""
    src = sweep.source
    checked: set = set()
    for c in sweep.cells:
        a = c.args
        key = (a.policy, a.placement, a.backfill)
        if key in checked:
            continue
        checked.add(key)
        for name, call in (("policy", lambda a=a: build_policy(a.policy)),
                           ("placement", lambda a=a: build_policy(a.policy, a.placement)),
                           ("backfill", lambda a=a: build_policy(a.policy, a.placement, backfill=a.backfill))):
            try:
                call()
            except ValueError as e:
                raise SpecError(f"{src}: {name}: {e}") from None
    traces: dict[Hashable, Trace] = {}
    for c in cells:
        key = trace_inputs(c.args)
        if key not in traces:
            try:
                traces[key] = read_trace(c.args)
            except UserError as e:
                raise SpecError(f"{src}: trace: {e}") from None
        inputs = (key, c.args.cluster, c.args.partition, tuple(c.args.partition_set or ()))
        if inputs not in checked:
            checked.add(inputs)
            try:
                load_inputs(c.args, traces[key])
                run_options(c.args, c.args.policy, c.args.placement)
            except UserError as e:
                raise SpecError(f"{src}: {'partition' if c.args.partition else 'cluster'}: {e}") from None
    return traces


class _Progress:
    """The sweep's tracker: keeps each finished cell, shows done / running / failed and the ETA."""

    def __init__(self, store: Store, total: int, show: bool) -> None:
        self.store = store
        self.running = self.done = self.failed = self.lost = 0  # running: handed to the engine
        self.capacity: int | None = None
        self.lost_cells: dict[str, Outcome] = {}
        self.bar = None
        if show and total:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="cell", desc="sweep", mininterval=0.5, dynamic_ncols=True)
            self._show()

    def _show(self) -> None:
        if self.bar is not None:
            running = self.running if self.capacity is None else min(self.running, self.capacity)
            self.bar.set_postfix(running=running, failed=self.failed + self.lost, refresh=False)

    def started(self, cell: Cell) -> None:
        self.running += 1
        self._show()
        if self.bar is not None:
            self.bar.refresh()

    def finished(self, cell: Cell, outcome: Outcome) -> None:
        self.running -= 1
        self.done += 1
        if outcome.status == LOST:
            self.lost += 1
            self.lost_cells[cell.id] = outcome
        else:
            self.store.save(cell, outcome)
            self.failed += outcome.status == FAILED
        if outcome.status != OK:
            self.warn(f"cell {cell.id} ({cell.label}) {outcome.status}: {outcome.error}")
        self._show()
        if self.bar is not None:
            self.bar.update(1)

    def retried(self, cell: Cell, why: str) -> None:
        self.running -= 1
        self.warn(f"cell {cell.id} ({cell.label}): {why}; running it again")
        self._show()

    def warn(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_sweep(sweep: Sweep, out: Path, engine: EngineOptions, *, retry_failed: bool = False,
              progress: bool = True, spec_file: Path | None = None,
              say: Callable[[str], None] = print) -> SweepRun:
    store = Store(out)
    todo = []
    for c in sweep.cells:
        rec = store.record(c.id)
        if rec is None or (retry_failed and rec.get("status") == FAILED):
            todo.append(c)
    traces = preflight(sweep, todo)
    out.mkdir(parents=True, exist_ok=True)
    store.clean_partial()
    if spec_file is not None:  # the SPEC as given, beside its results
        (out / f"spec{spec_file.suffix or '.yaml'}").write_bytes(spec_file.read_bytes())
    params = list(sweep.cells[0].params())
    write_json({"spec": sweep.source, "axes": list(sweep.axes), "params": params,
                "cells": [{"id": c.id, "label": c.label, "spec": c.given} for c in sweep.cells]},
               out / "sweep.json")
    run = SweepRun(total=len(sweep.cells), skipped=len(sweep.cells) - len(todo))
    say(f"sweep: {run.total} cells ({', '.join(sweep.axes) or 'no axes'}); {run.skipped} finished before, "
        f"{len(todo)} to run on {engine.engine}")
    started = time.perf_counter()
    tracker = _Progress(store, len(todo), progress)
    work = [(c, trace_inputs(c.args)) for c in todo]
    try:
        if work and engine.engine == "ray":
            run_ray(work, traces, tracker, address=engine.address, workers=engine.workers, cpus=engine.cell_cpus,
                    memory_mb=engine.cell_memory_mb, retries=engine.retries, say=say)
        elif work:
            run_local(work, traces, tracker, engine.workers, engine.retries)
    finally:
        tracker.close()
        store.clean_partial()
    run.wall_s = time.perf_counter() - started
    run.ran, run.failed, run.lost = tracker.done - tracker.lost, tracker.failed, tracker.lost
    run.rows = collect_rows(sweep, store, tracker.lost_cells)
    write_results(run.rows, out / "results.csv")
    run.aggregate = aggregate(run.rows, sweep.axes, params)
    write_csv(run.aggregate, out / "aggregate.csv")
    for c in sweep.cells:
        summary = store.summary(c.id)
        if summary is not None and summary.get("per_cluster_queue"):
            run.cluster_queues.append((c.label, summary))
    if run.cluster_queues:
        write_csv(cluster_queue_rows(run.cluster_queues), out / "cluster_queues.csv")
    return run


def collect_rows(sweep: Sweep, store: Store, lost: dict[str, Outcome]) -> list[dict]:
    rows = []
    for c in sweep.cells:
        rec = store.record(c.id)
        if rec is None:
            o = lost.get(c.id)
            status, error = (LOST, o.error) if o else ("pending", "")
            rows.append(result_row(c.id, c.label, status, error, c.params(), None))
            continue
        summary = store.summary(c.id) if rec["status"] == OK else None
        rows.append(result_row(c.id, c.label, rec["status"], rec.get("error", ""), c.params(), summary))
    return rows
