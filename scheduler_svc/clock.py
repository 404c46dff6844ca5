"""The scheduler's virtual clock."""

from __future__ import annotations

import time

from analysim._protos.v1 import agent_pb2 as apb


class VirtualClock:
    """Virtual seconds. Lockstep or paused: moves only when set. Paced: t0 + speed x (wall - w0)."""

    def __init__(self, speed: float | None) -> None:
        self.lockstep = speed is None  # moves only when set, step by step with the agents
        self.speed = float(speed) if speed else 1.0  # paced: virtual seconds per wall second (> 0)
        self.paused = False  # stopped at t0 until resumed
        self.t0 = 0.0  # virtual seconds at the last set
        self.w0 = time.monotonic()  # wall (monotonic) seconds at the last set
        self.durable_s = 0.0  # the journal holds every outcome before this virtual time

    def now(self) -> float:
        if self.lockstep or self.paused:
            return self.t0
        return self.t0 + self.speed * (time.monotonic() - self.w0)

    def set(self, t: float) -> None:
        self.t0 = t
        self.w0 = time.monotonic()

    def update(self, step: int = 0) -> apb.ClockUpdate:
        return apb.ClockUpdate(time_s=self.now(), speed=self.speed, lockstep=self.lockstep,
                               paused=self.paused, step=step, durable_s=self.durable_s)
