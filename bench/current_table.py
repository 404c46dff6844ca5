"""BENCHMARKS.md's current tables: one Markdown table per area, written between that area's two
markers, everything outside them kept byte for byte, the file replaced atomically.

    <!-- current:simulation:begin -->
    | measured | figure | wall s | CPU s | ... |
    <!-- current:simulation:end -->
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

HEADER = ("| measured | figure | wall s | CPU s | load, 1 min: start → end | command | machine | when (UTC), commit |\n"
          "|---|---|---:|---:|---|---|---|---|\n")


class MarkerError(ValueError):
    """The file lacks an area's markers, or has them twice or in the wrong order."""


@dataclass(frozen=True)
class Row:
    """One measured (or skipped) row of an area's table."""

    measured: str  # what the row measures, sizes included, in a reader's words
    figure: str  # the figures a reader came for, or why the row was skipped
    command: str  # the exact command, as run from the repository's root
    wall_s: float | None  # None when skipped
    cpu_s: float | None  # user + sys of the command and what it started; None when skipped
    load: tuple[float, float] | None  # the 1-minute load average at the row's start and end
    machine: str  # CPU model, cores, Python, and whether the core was compiled
    when: str  # the row's start, UTC, and the commit measured

    def line(self) -> str:
        def seconds(x: float | None) -> str:
            return "–" if x is None else f"{x:,.1f}"

        load = "–" if self.load is None else f"{self.load[0]:.1f} → {self.load[1]:.1f}"
        cells = [self.measured, self.figure, seconds(self.wall_s), seconds(self.cpu_s), load, f"`{self.command}`",
                 self.machine, self.when]
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |\n"


def markers(area: str) -> tuple[str, str]:
    return f"<!-- current:{area}:begin -->", f"<!-- current:{area}:end -->"


def render(rows: list[Row]) -> str:
    return HEADER + "".join(r.line() for r in rows)


def replace_table(text: str, area: str, table: str) -> str:
    """``text`` with what lies between ``area``'s markers replaced by ``table``, all else unchanged."""
    begin, end = markers(area)
    if text.count(begin) != 1 or text.count(end) != 1:
        raise MarkerError(f"needs exactly one {begin} and one {end} line")
    start = text.index(begin) + len(begin)
    stop = text.index(end)
    if stop < start:
        raise MarkerError(f"{end} comes before {begin}")
    return text[:start] + "\n" + table + text[stop:]


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename, so that a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, os.stat(path).st_mode & 0o777 if path.exists() else 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
