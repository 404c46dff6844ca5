"""Trace readers: every supported format becomes a Trace of canonical JobSpecs.

``load_trace(path, fmt)`` with fmt one of FORMATS, or "auto" to tell the format from the header line;
``write_canonical(trace, path)``; ``generate(jobs, seed)`` for the built-in synthetic trace.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from analysim.errors import UserError
from analysim.traces.base import Trace, gc_paused, read_header
from analysim.traces.canonical import read_canonical, write_canonical
from analysim.traces.helios import read_helios
from analysim.traces.openb import read_openb
from analysim.traces.philly import read_philly
from analysim.traces.synthetic import generate

__all__ = ["FORMATS", "Trace", "detect_format", "generate", "load_trace", "write_canonical"]

READERS: dict[str, Callable[[str | Path], Trace]] = {
    "canonical": read_canonical,
    "philly": read_philly,
    "openb": read_openb,
    "helios": read_helios,
}
FORMATS = tuple(READERS)

# Columns that only that format's header has, checked in this order.
_SIGNATURES = (
    ("canonical", {"job_id", "submit_s", "num_gpus"}),
    ("philly", {"timestamp", "duration", "num_gpus", "cluster"}),
    ("openb", {"name", "num_gpu", "gpu_milli"}),
    ("helios", {"job_id", "gpu_num", "submit_time"}),
)


def detect_format(path: str | Path) -> str:
    """The trace format of a file, told from its header line."""
    header = set(read_header(path))
    for fmt, columns in _SIGNATURES:
        if columns <= header:
            return fmt
    if {"sn", "gpu", "model"} <= header:
        raise UserError(f"{path}: this is an openb node list, a cluster description: pass it as the cluster")
    raise UserError(
        f"{path}: cannot tell the trace format from the header ({', '.join(sorted(header))}); "
        f"give it explicitly, one of: {', '.join(FORMATS)}"
    )


def load_trace(path: str | Path, fmt: str = "auto", *, drop_cpu_only: bool = False) -> Trace:
    """Read a trace file; ``fmt`` is one of FORMATS or "auto". ``drop_cpu_only``: leave out jobs
    that ask for no GPU (counted as ``cpu_only``); Philly and Helios rows carry no CPU or memory
    demand for them, so their readers always do."""
    if fmt == "auto":
        fmt = detect_format(path)
    reader = READERS.get(fmt)
    if reader is None:
        raise UserError(f"unknown trace format {fmt!r}; known: auto, {', '.join(FORMATS)}")
    with gc_paused():
        trace = reader(path)
    if drop_cpu_only:
        kept = [j for j in trace.jobs if j.num_gpus > 0]
        if len(kept) < len(trace.jobs):
            trace.filtered["cpu_only"] = trace.filtered.get("cpu_only", 0) + len(trace.jobs) - len(kept)
            trace.jobs = kept
    return trace
