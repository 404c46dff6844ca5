"""AnalySIM's own trace format: one CSV row per JobSpec, written and read back exactly.

Header ``job_id,submit_s,duration_s,num_gpus,gpu_milli,cpu_milli,memory_mib,vc,user,gpu_models,qos``.
Floats are written with ``repr``, so reading gives back the very same values. ``duration_s`` empty:
unknown. ``gpu_models``: allowed GPU models, ``|``-separated, empty = any. Only job_id, submit_s,
duration_s and num_gpus are required when reading; a missing column takes JobSpec's default. Strings
are taken literally (no trimming); nothing is filtered. An optional last column ``recorded_admit_s``
(empty: not recorded) keeps the admission time the traced cluster recorded (Trace.recorded_admit_s);
it is written only for a trace that has one, so other files read and write as they always have.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

from analysim.core.job import GPU_MILLI, MAX_COUNT, MAX_TIME_S, JobSpec
from analysim.errors import UserError
from analysim.report import RECORDED_ADMISSION
from analysim.traces.base import CsvInput, Row, Trace, TraceFormat

FORMAT = "canonical"
COLUMNS = (
    "job_id", "submit_s", "duration_s", "num_gpus", "gpu_milli", "cpu_milli", "memory_mib",
    "vc", "user", "gpu_models", "qos",
)  # fmt: skip
REQUIRED = COLUMNS[:4]
RECORDED = RECORDED_ADMISSION
_DEFAULTS = JobSpec("", 0.0, None, 0)


def _open(path: str | Path) -> CsvInput:
    return CsvInput(path, FORMAT, REQUIRED, (*COLUMNS[4:], RECORDED), strict=True)


def _rows(src: CsvInput) -> Iterator[Row]:
    idx = src.index
    text = {c: idx.get(c) for c in ("vc", "user", "qos", "gpu_models")}
    shared = src.shared
    recorded = idx.get(RECORDED)
    for line, row in src.rows():
        job_id = row[idx["job_id"]]
        if not job_id:
            raise src.error(line, "job_id", "empty job id")
        if recorded is not None and row[recorded] != "":
            src.recorded_admit_s[job_id] = src.float_field(row, RECORDED, line)
        num_gpus = src.int_field(row, "num_gpus", line)
        milli = src.int_field(row, "gpu_milli", line) if "gpu_milli" in idx else GPU_MILLI
        if milli > GPU_MILLI or (num_gpus > 0 and milli == 0):
            raise src.error(line, "gpu_milli", f"must be 1 to {GPU_MILLI}, got {milli}")
        duration = None
        if row[idx["duration_s"]] != "":
            duration = src.float_field(row, "duration_s", line)
        models: tuple[str, ...] = ()
        if text["gpu_models"] is not None and row[text["gpu_models"]]:
            models = tuple(row[text["gpu_models"]].split("|"))
            if not all(models):
                raise src.error(line, "gpu_models", f"empty GPU model in {row[text['gpu_models']]!r}")
        yield line, None, JobSpec(
            job_id=job_id,
            submit_s=src.float_field(row, "submit_s", line),
            duration_s=duration,
            num_gpus=num_gpus,
            gpu_milli=shared(milli),
            cpu_milli=shared(src.int_field(row, "cpu_milli", line)) if "cpu_milli" in idx else 0,
            memory_mib=shared(src.int_field(row, "memory_mib", line)) if "memory_mib" in idx else 0,
            vc=shared(row[text["vc"]]) if text["vc"] is not None else _DEFAULTS.vc,
            user=shared(row[text["user"]]) if text["user"] is not None else "",
            gpu_models=models,
            qos=shared(row[text["qos"]]) if text["qos"] is not None else "",
        )


READER = TraceFormat(FORMAT, _open, _rows, unique_ids=True)


def write_canonical(trace: Trace, path: str | Path) -> None:
    """Write ``trace.jobs`` in the canonical format (filter counts are not part of it)."""
    recorded = trace.recorded_admit_s
    columns = (*COLUMNS, RECORDED) if recorded else COLUMNS
    rows = [_row(j) for j in trace.jobs]
    if recorded:
        rows = [[*row, repr(float(recorded[j.job_id])) if j.job_id in recorded else ""]
                for row, j in zip(rows, trace.jobs, strict=True)]
    try:
        with Path(path).open("w", newline="", encoding="utf-8") as f:
            plain = csv.writer(f, lineterminator="\n")
            # csv quotes a field holding "\n" but not one holding a lone "\r" (not part of the line
            # terminator), which the reader would then take for a line end: quote those rows fully.
            quoted = csv.writer(f, lineterminator="\n", quoting=csv.QUOTE_ALL)
            plain.writerow(columns)
            for row in rows:
                (quoted if any("\r" in x for x in row) else plain).writerow(row)
    except OSError as e:
        raise UserError(f"{path}: cannot write: {e.strerror}") from None
    except UnicodeEncodeError as e:
        raise UserError(
            f"{path}: cannot write {e.object[e.start : e.end]!r}: not encodable as UTF-8"
        ) from None


def _row(j: JobSpec) -> list[str]:
    if not j.job_id:
        raise UserError("cannot write a job with an empty job id")
    numbers_ok = (
        0 <= j.submit_s <= MAX_TIME_S
        and (j.duration_s is None or 0 <= j.duration_s <= MAX_TIME_S)
        and min(j.num_gpus, j.gpu_milli, j.cpu_milli, j.memory_mib) >= 0
        and max(j.num_gpus, j.gpu_milli, j.cpu_milli, j.memory_mib) <= MAX_COUNT
    )
    if not numbers_ok:  # the reader would reject the file, so refuse to write it
        raise UserError(f"job {j.job_id}: value out of range (times 0..{MAX_TIME_S:g} s), cannot write it: {j}")
    if any(not m or "|" in m for m in j.gpu_models):
        raise UserError(
            f"job {j.job_id}: GPU model names must be non-empty and free of '|': {j.gpu_models!r}"
        )
    return [
        j.job_id,
        repr(float(j.submit_s)),
        "" if j.duration_s is None else repr(float(j.duration_s)),
        str(j.num_gpus),
        str(j.gpu_milli),
        str(j.cpu_milli),
        str(j.memory_mib),
        j.vc,
        j.user,
        "|".join(j.gpu_models),
        j.qos,
    ]
