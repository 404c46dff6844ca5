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

    agent_id: str  # the id the agent registered with (one session at a time per id)
    session_id: str  # this registration's id, which its Connect stream names
    nodes: tuple[str, ...]  # the nodes it registered, each of the cluster's, none twice
    principal: str = ""  # the agent token it registered with ("" without authentication)
    running: tuple[apb.RunningJob, ...] = ()  # jobs it still ran when it registered
    # ConnectResponses waiting for its stream; None ends the stream.
    outbox: asyncio.Queue = field(default_factory=asyncio.Queue)
    connected: bool = False  # its Connect stream is open (its nodes are up)
    lost: bool = False  # over for good (stream ended, silent, refused or replaced); never comes back
    last_seen: float = field(default_factory=time.monotonic)  # wall (monotonic) time of its last message
    bound: float = INF  # lockstep: no completion from this agent before this virtual time
    # node -> the last plausible GPU telemetry it sent for it.
    telemetry: dict[str, apb.NodeTelemetry] = field(default_factory=dict)
    refused: tuple[str, str] | None = None  # (reason, message): a report no honest agent sends ended it

    def lower_bound(self, end: float) -> None:
        """A launch just sent to it ends at ``end``: no completion from it before then at the latest."""
        if end < self.bound:
            self.bound = end


@dataclass(slots=True)
class Placed:
    """What the agents were told about a running job: which launch, on which sessions."""

    launch_id: int  # the Launch's id (unique across scheduler lives: each numbers from its epoch)
    token: int  # the engine's completion token at launch: a later stop or move changes it
    sessions: tuple[Session, ...]  # the agents holding its GPUs when it was launched
    start_s: float  # the launch's virtual time: no end before it
    end_s: float  # the end the agents compute from the launch: none after it


class Placements:
    """What the agents were told about each running job. Written only through these methods, by
    the translation of decisions into commands and by the recovery; read by the agents' reports."""

    def __init__(self) -> None:
        # job id -> its current launch as the agents know it; a job not running has none.
        self.told: dict[str, Placed] = {}

    def get(self, job_id: str) -> Placed | None:
        return self.told.get(job_id)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self.told

    def put(self, job_id: str, placed: Placed) -> None:
        self.told[job_id] = placed

    def drop(self, job_id: str) -> None:
        self.told.pop(job_id, None)


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
