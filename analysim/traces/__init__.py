"""Trace readers: every supported format becomes a Trace of canonical JobSpecs.

``load_trace(path, fmt)`` with fmt one of FORMATS, or "auto" to tell the format from the header line
(``limit``: only the first jobs, read from the top of a file sorted by submit time); ``scan_trace``
for one pass over a file's jobs that holds none of them; ``write_canonical(trace, path)``;
``generate(jobs, seed)`` for the built-in synthetic trace.
"""

from __future__ import annotations

from pathlib import Path

from analysim.errors import UserError
from analysim.traces import canonical, helios, kueue_workloads, openb, philly
from analysim.traces.base import Trace, TraceFormat, TraceScan, gc_paused, read_header, read_trace
from analysim.traces.canonical import write_canonical
from analysim.traces.synthetic import generate

__all__ = ["FORMATS", "Trace", "TraceScan", "detect_format", "generate", "load_trace", "scan_trace",
           "write_canonical"]

READERS: dict[str, TraceFormat] = {m.FORMAT: m.READER for m in (canonical, philly, openb, helios, kueue_workloads)}
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
    first = read_header(path)
    if first and first[0].lstrip().startswith(("apiVersion", "kind", "{", "---", "items", "#")):
        return kueue_workloads.FORMAT  # YAML or JSON: the Kubernetes objects read as a trace are Workloads
    header = set(first)
    for fmt, columns in _SIGNATURES:
        if columns <= header:
            return fmt
    if {"sn", "gpu", "model"} <= header:
        raise UserError(f"{path}: this is an openb node list, a cluster description: pass it as the cluster")
    raise UserError(
        f"{path}: cannot tell the trace format from the header ({', '.join(sorted(header))}); "
        f"give it explicitly, one of: {', '.join(FORMATS)}"
    )


def trace_format(path: str | Path, fmt: str = "auto") -> TraceFormat:
    """The reader of ``fmt`` (one of FORMATS, or "auto": told from the file's header)."""
    if fmt == "auto":
        fmt = detect_format(path)
    reader = READERS.get(fmt)
    if reader is None:
        raise UserError(f"unknown trace format {fmt!r}; known: auto, {', '.join(FORMATS)}")
    return reader


def load_trace(path: str | Path, fmt: str = "auto", *, drop_cpu_only: bool = False,
               limit: int | None = None) -> Trace:
    """Read a trace file; ``fmt`` is one of FORMATS or "auto". ``drop_cpu_only``: leave out jobs
    that ask for no GPU (counted as ``cpu_only``); Philly and Helios rows carry no CPU or memory
    demand for them, so their readers always do. ``limit``: the first ``limit`` jobs by submit
    time; on a file sorted by submit time reading stops there (rows past it are neither read nor
    checked, and ``filtered`` counts the rows read); on one that is not, the whole file is read."""
    reader = trace_format(path, fmt)
    with gc_paused():
        return read_trace(reader, path, limit=limit, drop_cpu_only=drop_cpu_only)


def scan_trace(path: str | Path, fmt: str = "auto") -> TraceScan:
    """One pass over a trace file's jobs, in file order and on the file's own clock, holding none
    of them (``analysim trace info`` summarises a file of millions of jobs this way)."""
    return TraceScan(trace_format(path, fmt), path)
