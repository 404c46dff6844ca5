"""Running one cell: ``analysim simulate``'s own code path into a scratch folder, whose files come
back as bytes, so that a cell on any machine of a Ray cluster needs no shared file system."""

from __future__ import annotations

import argparse
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from analysim.cli.simulate import simulate
from analysim.errors import UserError
from analysim.traces import Trace

OK, FAILED, LOST = "ok", "failed", "lost"


@dataclass
class Outcome:
    """What a cell gave: its files (ok), or its error (failed: the cell's own error, which the same
    inputs give again; lost: the worker running it died or vanished, worth another try)."""

    status: str
    files: dict[str, bytes] = field(default_factory=dict)
    error: str = ""
    detail: str = ""  # the traceback of an unexpected error
    wall_s: float = 0.0


def run_cell(args: argparse.Namespace, trace: Trace) -> Outcome:
    """One cell, exactly as ``analysim simulate`` runs it; never raises for the cell's own errors."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="analysim-cell-") as tmp:
        # (a cell's events file is one of its files, by the name the SPEC gives it)
        events = Path(tmp) / Path(args.events).name if getattr(args, "events", None) else None
        ns = argparse.Namespace(**{**vars(args), "out": Path(tmp), "no_progress": True, "events": events})
        try:
            _, written = simulate(ns, trace)
        except UserError as e:
            return Outcome(FAILED, error=str(e), wall_s=time.perf_counter() - started)
        except Exception as e:  # a bug for one cell must not stop the sweep: record it with its traceback
            return Outcome(FAILED, error=f"{type(e).__name__}: {e}", detail=traceback.format_exc(),
                           wall_s=time.perf_counter() - started)
        files = {p.name: p.read_bytes() for p in written}
    return Outcome(OK, files=files, wall_s=time.perf_counter() - started)
