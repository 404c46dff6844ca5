"""The documented bounds of every client-supplied string and number (docs/live.md, "Bounds").

One table, read by the server (INVALID_ARGUMENT beyond a bound) and by the CLI (a one-line
error before anything is sent), so that both say the same thing."""

from __future__ import annotations

import math
import re

# Every id a client or an agent names (job ids, agent ids): what a file name, a CSV cell and a
# Prometheus label can all hold verbatim; no "/", so no id is a path ("a/../../b").
ID_MAX = 128
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]*")
TEXT_MAX = 64  # user, vc, GPU model names
GPU_MODELS_MAX = 16
NUM_GPUS_MAX = 65_536
DURATION_MIN_S = 1e-3
DURATION_MAX_S = 1e8  # about three years of virtual time
CPU_MILLI_MAX = 10**9  # a million cores
MEMORY_MIB_MAX = 2**32  # 4 PiB
LIST_LIMIT_MAX = 10_000
WATCH_KINDS_MAX = 32
AGENT_NODES_MAX = 100_000
MESSAGE_MAX_BYTES = 16 * 1024 * 1024  # gRPC receive limit: a heartbeat of 100,000 GPUs fits


def id_problem(field: str, value: str) -> str | None:
    """The one bound of every id field, applied on every RPC that takes one (None: in bounds)."""
    if 1 <= len(value) <= ID_MAX and ID_RE.fullmatch(value):
        return None
    return (f"{field} must be 1 to {ID_MAX} characters: letters, digits and ._:@+- (not first), "
            f"got {value[:40]!r}{'...' if len(value) > 40 else ''}")


def _printable(s: str) -> bool:
    return s.isprintable() and "\x00" not in s


def text_problem(field: str, value: str) -> str | None:
    """The bound of a name such as a vc or a user (None: in bounds)."""
    if len(value) > TEXT_MAX or not _printable(value):
        return f"{field} must be at most {TEXT_MAX} printable characters, got {len(value)}"
    return None


def job_problem(job_id: str, num_gpus: int, gpu_milli: int, duration_s: float, vc: str, user: str,
                gpu_models: list[str] | tuple[str, ...], cpu_milli: int, memory_mib: int) -> str | None:
    """What is out of bounds in a job request (None: nothing). ``job_id`` may be empty (chosen
    by the scheduler); ``gpu_milli`` 0 means 1000."""
    if job_id and (problem := id_problem("job_id", job_id)) is not None:
        return problem
    if not 1 <= num_gpus <= NUM_GPUS_MAX:
        return f"num_gpus must be at least 1 and at most {NUM_GPUS_MAX}, got {num_gpus}"
    if not 0 <= gpu_milli <= 1000:
        return f"gpu_milli must be in 1..1000 (0: 1000), got {gpu_milli}"
    if not (math.isfinite(duration_s) and DURATION_MIN_S <= duration_s <= DURATION_MAX_S):
        return f"duration_s must be between {DURATION_MIN_S:g} and {DURATION_MAX_S:g} s, got {duration_s:g}"
    for name, value in (("vc", vc), ("user", user)):
        if (problem := text_problem(name, value)) is not None:
            return problem
    if len(gpu_models) > GPU_MODELS_MAX or any(len(m) > TEXT_MAX or not _printable(m) for m in gpu_models):
        return f"gpu_models: at most {GPU_MODELS_MAX} names of at most {TEXT_MAX} printable characters"
    if not 0 <= cpu_milli <= CPU_MILLI_MAX:
        return f"cpu_milli must be in 0..{CPU_MILLI_MAX}, got {cpu_milli}"
    if not 0 <= memory_mib <= MEMORY_MIB_MAX:
        return f"memory_mib must be in 0..{MEMORY_MIB_MAX}, got {memory_mib}"
    return None
