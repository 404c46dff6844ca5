"""Alibaba GPU cluster trace v2023 ("openb") pod lists.

Full form: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,
deletion_time,scheduled_time`` (times in seconds). Short form (multigpu50): the first five columns
only, no times, for "fill the cluster until full" (inflate) runs: submit 0, duration unknown.

A pod with ``num_gpu == 1`` uses ``gpu_milli``/1000 of one GPU; a pod with more GPUs uses them whole,
whatever the file says. Pods without GPUs are kept: the traces hold them on purpose (the cpu050
variant tests CPU pressure on GPU nodes), and they take CPU and memory GPU pods need (drop them with
``load_trace(..., drop_cpu_only=True)``). Left out, and counted: pods never scheduled
(``never_scheduled``, empty scheduled_time) and pods deleted before being scheduled
(``deleted_before_scheduled``). Pods still running at the end of the observation carry its end as
deletion_time, so their durations are lower bounds (pod_phase says which; it is not read).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from analysim.core.job import GPU_MILLI, JobSpec
from analysim.traces.base import CsvInput, Row, TraceFormat

FORMAT = "openb"
COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
TIME_COLUMNS = ("creation_time", "deletion_time", "scheduled_time")
OPTIONAL = ("gpu_spec", "qos", "pod_phase", *TIME_COLUMNS)


def _open(path: str | Path) -> CsvInput:
    return CsvInput(path, FORMAT, COLUMNS, OPTIONAL)


def _rows(src: CsvInput) -> Iterator[Row]:
    timed = any(src.has(c) for c in TIME_COLUMNS)
    if timed and not all(src.has(c) for c in TIME_COLUMNS):
        missing = ", ".join(c for c in TIME_COLUMNS if not src.has(c))
        raise src.error(src.header_line, missing, "the time columns come together: this one is missing")
    i_name = src.index["name"]
    i_spec = src.index.get("gpu_spec")
    i_qos = src.index.get("qos")
    shared = src.shared
    for line, row in src.rows():
        cpu = src.int_field(row, "cpu_milli", line)
        mem = src.int_field(row, "memory_mib", line)
        gpus = src.int_field(row, "num_gpu", line)
        milli = src.int_field(row, "gpu_milli", line)
        if milli > GPU_MILLI:
            raise src.error(line, "gpu_milli", f"must be at most {GPU_MILLI}, got {milli}")
        if gpus == 1 and milli == 0:
            raise src.error(line, "gpu_milli", "a one-GPU pod needs a share of 1 to 1000")
        models = _models(src, row, i_spec, line)
        submit, end, scheduled = _times(src, row, line) if timed else (0.0, 0.0, 0.0)
        duration = None
        if timed:
            if scheduled is None:
                yield line, None, "never_scheduled"
                continue
            if end < scheduled:
                yield line, None, "deleted_before_scheduled"
                continue
            duration = end - scheduled
        yield line, None, JobSpec(
            job_id=row[i_name],
            submit_s=submit,
            duration_s=duration,
            num_gpus=gpus,
            gpu_milli=shared(milli) if gpus == 1 else GPU_MILLI if gpus else 0,
            cpu_milli=shared(cpu),
            memory_mib=shared(mem),
            vc="default",
            gpu_models=models,
            qos=shared(row[i_qos]) if i_qos is not None else "",
        )


READER = TraceFormat(FORMAT, _open, _rows, reasons=("never_scheduled", "deleted_before_scheduled"))


def _times(src: CsvInput, row: list[str], line: int) -> tuple[float, float, float | None]:
    """(creation, deletion, scheduled); scheduled is None for a pod never scheduled."""
    scheduled = None
    if row[src.index["scheduled_time"]] != "":
        scheduled = src.float_field(row, "scheduled_time", line)
    return src.float_field(row, "creation_time", line), src.float_field(row, "deletion_time", line), scheduled


def _models(src: CsvInput, row: list[str], i_spec: int | None, line: int) -> tuple[str, ...]:
    if i_spec is None or not row[i_spec]:
        return ()
    models = tuple(m.strip() for m in row[i_spec].split("|"))
    if not all(models):
        raise src.error(line, "gpu_spec", f"empty GPU model in {row[i_spec]!r}")
    return models
