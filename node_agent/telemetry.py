"""Synthetic GPU telemetry that follows what runs on each GPU: plausible values, deterministic
by (seed, node, GPU, job, virtual time), no randomness state to carry."""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class GpuModel:
    memory_bytes: int
    idle_watts: float
    max_watts: float  # board power limit (TDP)


# Public datasheet figures (memory, TDP); idle power is typical nvidia-smi idle for the board.
MODELS = {
    "V100": GpuModel(32 * GIB, 40.0, 300.0),
    "V100M16": GpuModel(16 * GIB, 40.0, 300.0),
    "V100M32": GpuModel(32 * GIB, 40.0, 300.0),
    "P100": GpuModel(16 * GIB, 30.0, 250.0),
    "K80": GpuModel(12 * GIB, 25.0, 150.0),
    "T4": GpuModel(16 * GIB, 10.0, 70.0),
    "A10": GpuModel(24 * GIB, 20.0, 150.0),
    "A100": GpuModel(80 * GIB, 50.0, 400.0),
    "H100": GpuModel(80 * GIB, 70.0, 700.0),
}
DEFAULT_MODEL = GpuModel(16 * GIB, 30.0, 250.0)
AMBIENT_C = 30.0


def unit(*key: object) -> float:
    """A deterministic number in [0, 1) from the key."""
    h = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return struct.unpack("<Q", h)[0] / 2**64


def gpu_sample(seed: int, node: str, gpu: int, model: str, job_id: str, share: float, t: float) -> tuple[float, ...]:
    """(utilization 0..1, memory used bytes, memory total bytes, power W, temperature C).

    A busy GPU's utilization is a per-job level (0.55..0.95, times its share of a shared GPU)
    with a slow wobble whose phase is per GPU; memory is a per-job fraction of the board.
    """
    spec = MODELS.get(model, DEFAULT_MODEL)
    phase = unit(seed, node, gpu) * 2 * math.pi
    if job_id:
        level = 0.55 + 0.4 * unit(seed, job_id)
        util = min(1.0, max(0.0, share * (level + 0.04 * math.sin(t / 300.0 + phase))))
        mem = spec.memory_bytes * min(0.98, share * (0.25 + 0.7 * unit(seed, job_id, "mem")))
    else:
        util = 0.0
        mem = spec.memory_bytes * 0.004  # the driver's own allocation on an idle board
    power = spec.idle_watts + (spec.max_watts - spec.idle_watts) * util
    temp = AMBIENT_C + 4.0 * unit(seed, node, gpu, "t") + 45.0 * util + 0.5 * math.sin(t / 600.0 + phase)
    return util, mem, float(spec.memory_bytes), power, temp
