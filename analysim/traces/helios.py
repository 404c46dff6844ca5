"""SenseTime Helios Slurm job logs (Hu et al., SC'21), e.g. the Venus cluster's ``cluster_log.csv``.

Header ``job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue``,
times ``YYYY-MM-DD HH:MM:SS``. Submit times count from the earliest kept job; ``duration`` (seconds) is
the run time; ``cpu_num`` CPUs become ``cpu_milli``. Jobs of every final state are kept: failed and
cancelled jobs held GPUs too. Not read: ``node_num`` (placement is the scheduler's choice), ``state``,
``end_time`` and ``queue`` (the queueing delay Slurm gave it). Left out, and counted: GPU-less jobs
(``cpu_only``) and jobs that never started (``never_started``: empty start_time or duration).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from analysim.core.job import JobSpec
from analysim.traces.base import CsvInput, Row, TraceFormat

FORMAT = "helios"
COLUMNS = ("job_id", "vc", "gpu_num", "submit_time", "duration")
OPTIONAL = ("user", "cpu_num", "node_num", "state", "start_time", "end_time", "queue")


def _open(path: str | Path) -> CsvInput:
    return CsvInput(path, FORMAT, COLUMNS, OPTIONAL)


def _rows(src: CsvInput) -> Iterator[Row]:
    i_id, i_vc, i_dur = src.index["job_id"], src.index["vc"], src.index["duration"]
    i_user = src.index.get("user")
    i_start = src.index.get("start_time")
    has_cpu = src.has("cpu_num")
    shared = src.shared
    for line, row in src.rows():
        gpus = src.int_field(row, "gpu_num", line)
        submit = src.time_field(row, "submit_time", line)
        cpu = round(src.float_field(row, "cpu_num", line) * 1000) if has_cpu else 0
        started = row[i_dur] != "" and (i_start is None or row[i_start] != "")
        if started and i_start is not None:
            src.time_field(row, "start_time", line)  # validated only: duration is what is used
        duration = src.float_field(row, "duration", line) if started else 0.0
        if gpus == 0:
            yield line, None, "cpu_only"
        elif not started:
            yield line, None, "never_started"
        else:
            user = shared(row[i_user]) if i_user is not None else ""
            yield line, submit, JobSpec(job_id=row[i_id], submit_s=submit, duration_s=duration, num_gpus=gpus,
                                        cpu_milli=cpu, vc=shared(row[i_vc]), user=user)


READER = TraceFormat(FORMAT, _open, _rows, rebase=True, reasons=("cpu_only", "never_started"))
