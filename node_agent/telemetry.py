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
    product: str  # the name the driver reports (nvidia-smi, dcgm-exporter's modelName label)
    sm_clock_mhz: int  # boost SM clock, held while a job runs
    mem_clock_mhz: int
    hbm: bool  # HBM boards report a memory temperature; GDDR boards report none (0)


# Public datasheet figures (memory, TDP, boost and memory clocks); idle power is typical
# nvidia-smi idle for the board.
MODELS = {
    "V100": GpuModel(32 * GIB, 40.0, 300.0, "Tesla V100-SXM2-32GB", 1530, 877, True),
    "V100M16": GpuModel(16 * GIB, 40.0, 300.0, "Tesla V100-SXM2-16GB", 1530, 877, True),
    "V100M32": GpuModel(32 * GIB, 40.0, 300.0, "Tesla V100-SXM2-32GB", 1530, 877, True),
    "P100": GpuModel(16 * GIB, 30.0, 250.0, "Tesla P100-PCIE-16GB", 1329, 715, True),
    "K80": GpuModel(12 * GIB, 25.0, 150.0, "Tesla K80", 875, 2505, False),
    "T4": GpuModel(16 * GIB, 10.0, 70.0, "Tesla T4", 1590, 5001, False),
    "A10": GpuModel(24 * GIB, 20.0, 150.0, "NVIDIA A10", 1695, 6251, False),
    "A100": GpuModel(80 * GIB, 50.0, 400.0, "NVIDIA A100-SXM4-80GB", 1410, 1593, True),
    "H100": GpuModel(80 * GIB, 70.0, 700.0, "NVIDIA H100 80GB HBM3", 1980, 2619, True),
}
DEFAULT_MODEL = GpuModel(16 * GIB, 30.0, 250.0, "", 1380, 877, True)
IDLE_SM_CLOCK_MHZ = 210  # what an idle board drops to (P8), typical across these models
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
    board = spec(model)
    phase = unit(seed, node, gpu) * 2 * math.pi
    if job_id:
        level = 0.55 + 0.4 * unit(seed, job_id)
        util = min(1.0, max(0.0, share * (level + 0.04 * math.sin(t / 300.0 + phase))))
        mem = board.memory_bytes * min(0.98, share * (0.25 + 0.7 * unit(seed, job_id, "mem")))
    else:
        util = 0.0
        mem = board.memory_bytes * 0.004  # the driver's own allocation on an idle board
    power = board.idle_watts + (board.max_watts - board.idle_watts) * util
    temp = AMBIENT_C + 4.0 * unit(seed, node, gpu, "t") + 45.0 * util + 0.5 * math.sin(t / 600.0 + phase)
    return util, mem, float(board.memory_bytes), power, temp


def spec(model: str) -> GpuModel:
    """The board behind a cluster's GPU model name (a generic one for names not listed)."""
    return MODELS.get(model, DEFAULT_MODEL)


def gpu_uuid(node: str, gpu: int) -> str:
    """A stable GPU-xxxxxxxx-... identity for the board (the same node and index: the same board)."""
    h = hashlib.blake2b(repr((node, gpu)).encode(), digest_size=16).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def pci_bus_id(gpu: int) -> str:
    """Where the board sits on the PCIe bus: one bus per GPU, as on an 8-GPU server."""
    return f"00000000:{0x07 + 0x10 * gpu:02X}:00.0"
