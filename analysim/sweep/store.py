"""A sweep's folder: ``cells/<id>/`` holds each finished cell's outputs and its ``cell.json``.

A cell folder appears whole or not at all (written aside, then renamed), so a crash or a kill
leaves either a finished cell, which a re-run skips, or nothing, which a re-run runs.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from analysim.report import write_json
from analysim.sweep.cell import FAILED, OK, Outcome
from analysim.sweep.spec import Cell

CELL_FILE = "cell.json"


class Store:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.cells = out / "cells"
        self._partial = self.cells / ".partial"

    def record(self, cell_id: str) -> dict | None:
        """The cell's record (status ok or failed), or None when it has not finished."""
        try:
            return json.loads((self.cells / cell_id / CELL_FILE).read_text())
        except (OSError, ValueError):
            return None

    def summary(self, cell_id: str) -> dict | None:
        try:
            return json.loads((self.cells / cell_id / "summary.json").read_text())
        except (OSError, ValueError):
            return None

    def save(self, cell: Cell, outcome: Outcome) -> None:
        """Keep a finished cell (ok, or failed by its own error); a lost one is not kept."""
        assert outcome.status in (OK, FAILED)
        self._partial.mkdir(parents=True, exist_ok=True)
        tmp = self._partial / f"{cell.id}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        for name, data in outcome.files.items():
            (tmp / name).write_bytes(data)
        if outcome.detail:
            (tmp / "error.txt").write_text(outcome.detail)
        write_json({"id": cell.id, "label": cell.label, "status": outcome.status, "error": outcome.error,
                    "cell_wall_s": outcome.wall_s, "spec": cell.given, "params": cell.params()}, tmp / CELL_FILE)
        final = self.cells / cell.id
        if final.exists():  # a failed cell run again
            shutil.rmtree(final)
        os.replace(tmp, final)

    def clean_partial(self) -> None:
        """Leftovers of cells that were being written when a sweep died."""
        shutil.rmtree(self._partial, ignore_errors=True)
