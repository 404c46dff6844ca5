"""What the scheduler keeps about agents: their sessions, what it told them about running jobs,
and what GPU telemetry is plausible."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

from analysim._protos.v1 import agent_pb2 as apb

INF = math.inf


@dataclass(eq=False)
class Session:
    """One agent process: its nodes and its stream."""

    agent_id: str
    session_id: str
    nodes: tuple[str, ...]
    principal: str = ""  # the agent token it registered with ("" without authentication)
    running: tuple[apb.RunningJob, ...] = ()  # jobs it still ran when it registered
    outbox: asyncio.Queue = field(default_factory=asyncio.Queue)
    connected: bool = False
    lost: bool = False
    last_seen: float = field(default_factory=time.monotonic)
    bound: float = INF  # lockstep: no completion from this agent before this virtual time
    telemetry: dict[str, apb.NodeTelemetry] = field(default_factory=dict)
    refused: tuple[str, str] | None = None  # (reason, message): a report no honest agent sends ended it


@dataclass(slots=True)
class Placed:
    """What the agents were told about a running job: which launch, on which sessions."""

    launch_id: int
    token: int  # the engine's completion token at launch: a later stop or move changes it
    sessions: tuple[Session, ...]
    start_s: float  # the launch's virtual time: no end before it
    end_s: float  # the end the agents compute from the launch: none after it


# How far past a launch's end an agent's report may be (float rounding, relative to the end).
END_TOLERANCE = 1e-9


def possible_end(p: Placed, t: float) -> bool:
    """An agent's end (or failure) time for a launch is one it could compute: finite, not before
    the launch, not after the end the launch gives."""
    return math.isfinite(t) and p.start_s <= t <= p.end_s + END_TOLERANCE * max(1.0, abs(p.end_s))


def plausible(g: apb.GpuState, gpus: int) -> bool:
    vals = (g.utilization, g.memory_used_bytes, g.memory_total_bytes, g.power_watts, g.temperature_celsius)
    return (g.index < gpus and all(math.isfinite(v) and v >= 0 for v in vals) and g.utilization <= 1.0
            and g.memory_used_bytes <= g.memory_total_bytes and g.temperature_celsius < 150)
