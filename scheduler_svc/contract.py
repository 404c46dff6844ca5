"""The analysim.v1 scheduler contract's enums and documents, to and from the words and dicts
the service, the journal, jobs.csv and the CLI use ("pending", "launch", "trace"...).

Every enum value is ``<ENUM>_<WORD>``: the word is the value's name without the prefix, in
lower case, so the mapping is by name and a new value needs no table here."""

from __future__ import annotations

import math
from typing import Any

from google.protobuf import struct_pb2
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from analysim._protos.v1 import scheduler_pb2 as spb


def _prefix(enum: EnumTypeWrapper) -> str:
    return enum.DESCRIPTOR.values[0].name.removesuffix("UNSPECIFIED")


def word(enum: EnumTypeWrapper, value: int) -> str:
    """``JOB_STATUS_PENDING`` -> ``"pending"``; the zero value -> ``""``."""
    if value == 0:
        return ""
    return enum.Name(value).removeprefix(_prefix(enum)).lower()


def value(enum: EnumTypeWrapper, w: str) -> int:
    """``"pending"`` -> ``JOB_STATUS_PENDING``; ``""`` -> the zero value (ValueError if unknown)."""
    if not w:
        return 0
    try:
        return enum.Value(_prefix(enum) + w.upper())
    except ValueError:
        raise ValueError(f"{w!r} is not one of {', '.join(word(enum, v) for v in enum.values()[1:])}") from None


def job_proto(rec: dict) -> spb.Job:
    """A job record (LiveScheduler.job_record) as a Job: unset times are times not reached yet."""
    from analysim.core.job import GPU_MILLI

    def num(x: object) -> float | None:
        return None if x is None or x == "" or (isinstance(x, float) and math.isnan(x)) else float(x)

    return spb.Job(
        job_id=rec["job_id"], status=value(spb.JobStatus, rec.get("status", "")), vc=rec.get("vc", ""),
        user=rec.get("user", "") or "", num_gpus=int(rec.get("num_gpus", 0)),
        gpu_milli=int(rec.get("gpu_milli", GPU_MILLI)), duration_s=num(rec.get("duration_s")) or 0.0,
        submit_s=num(rec.get("submit_s")) or 0.0, first_start_s=num(rec.get("first_start_s")),
        end_s=num(rec.get("end_s")), nodes=rec.get("nodes", []), preemptions=int(rec.get("preemptions", 0)),
        migrations=int(rec.get("migrations", 0)), restarts=int(rec.get("restarts", 0)),
        source=value(spb.JobSource, rec.get("source", "")),
    )


def summary_struct(summary: dict[str, Any]) -> struct_pb2.Struct:
    """A JSON-safe summary dict as a Struct."""
    s = struct_pb2.Struct()
    s.update(summary)
    return s


def summary_dict(s: struct_pb2.Struct) -> dict[str, Any]:
    """A Struct back to the summary dict, as summary.json has it: a Struct number is a double,
    so whole numbers come back as ints (a count is 137, not 137.0)."""
    from google.protobuf.json_format import MessageToDict

    def ints(x: Any) -> Any:
        if isinstance(x, float) and x.is_integer() and abs(x) < 2**53:
            return int(x)
        if isinstance(x, dict):
            return {k: ints(v) for k, v in x.items()}
        if isinstance(x, list):
            return [ints(v) for v in x]
        return x

    return ints(MessageToDict(s))
