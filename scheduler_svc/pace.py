"""Where the live run's clock stands and what it waits for: the virtual time the agents were last
told, the lockstep step and the agents whose Ack it awaits, the loop's wake-up, and the clock
updates sent to the agents. The pace is the only writer of these; the steppers, the agents'
messages and the clock controls move them through its methods."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from prometheus_client import Counter

from analysim._protos.v1 import agent_pb2 as apb
from analysim.core.engine import Engine
from scheduler_svc.clock import VirtualClock
from scheduler_svc.sessions import Session


class Pace:
    """The run's clock state between the engine and the agents."""

    def __init__(self, clock: VirtualClock, engine: Engine, sent: Counter) -> None:
        self.clock = clock  # the virtual clock the agents follow (lockstep, paced, paused)
        self.engine = engine  # the live engine, read for its now
        self.sent = sent  # analysim_stream_messages_total{direction="sent"}
        # Virtual seconds: the time the agents were last told (lockstep), never behind the engine's
        # last step; paced, where the clock was when it last changed mode.
        self.t_cur = 0.0
        # The lockstep step number, +1 per synchronised broadcast; an Ack names the one it answers.
        self.step = 0
        # Lockstep: the sessions whose Ack of ``step`` has not come yet (the next step waits for them).
        self.pending: set[Session] = set()
        self.started = False  # every node had an agent once: the clock runs (it never stops after)
        self.stopping = False  # the service is stopping: the loop and the watchdog end
        self.kick = asyncio.Event()  # set when the loop has something to do (a report, a job, an Ack)
        self.last_broadcast = 0.0  # wall (monotonic) time of the last clock update to every agent
        self.wall_start: float | None = None  # wall (monotonic) time the clock started; None before
        self.wall_done: float | None = None  # wall (monotonic) time the replay ended; None before
        self.virtual_start = 0.0  # virtual seconds: where the clock started

    def wake(self) -> None:
        self.kick.set()

    def event_time(self) -> float:
        """When an outside event happens: the time the agents were last told (lockstep), or now."""
        return self.t_cur if self.clock.lockstep else max(self.clock.now(), self.engine.now)

    def move_to(self, t: float) -> None:
        """The agents are told ``t`` next (and the clock shows it)."""
        self.t_cur = t
        self.clock.set(t)

    def start(self, t: float) -> None:
        """Every node has an agent: the clock starts at ``t`` (virtual), now (wall)."""
        self.started = True
        self.move_to(t)
        self.virtual_start = t
        self.wall_start = time.monotonic()

    def pause(self, sessions: Iterable[Session]) -> bool:
        """Stop the clock where it is (False if it was stopped already)."""
        clock = self.clock
        if clock.paused:
            return False
        clock.set(clock.now())
        clock.paused = True
        self.broadcast(sessions, {}, sync=False)
        return True

    def resume(self, sessions: Iterable[Session]) -> None:
        clock = self.clock
        if clock.paused:
            clock.paused = False
            clock.set(clock.t0)
            self.broadcast(sessions, {}, sync=clock.lockstep)
            self.kick.set()

    def set_speed(self, speed: float | None, sessions: Iterable[Session]) -> None:
        """A number: paced at that speed from now on. None: lockstep."""
        clock = self.clock
        now = clock.now() if not clock.lockstep else self.t_cur
        clock.lockstep = speed is None
        if speed is not None:
            clock.speed = float(speed)
        clock.set(now)
        self.t_cur = max(self.t_cur, now)
        self.pending.clear()
        if self.started and not clock.paused:
            self.broadcast(sessions, {}, sync=clock.lockstep)
        self.kick.set()

    def durable(self, t: float) -> None:
        """The journal holds every outcome before ``t``: the agents are told with the next update."""
        self.clock.durable_s = t

    def stop(self) -> None:
        self.stopping = True
        self.kick.set()

    def t_cur_is(self, t: float) -> None:
        """The agents are told ``t`` next (the clock is set when they are)."""
        self.t_cur = t

    def awaits(self, s: Session, step: int) -> bool:
        """An Ack of ``step`` from ``s`` is one the current step waits for."""
        return s in self.pending and step == self.step

    def acked(self, s: Session) -> None:
        self.pending.discard(s)
        if not self.pending:
            self.kick.set()

    def forget(self, s: Session) -> None:
        """A lost session is waited for no more."""
        self.pending.discard(s)

    def broadcast(self, sessions: Iterable[Session], cmds: dict[Session, list], sync: bool,
                  only: set[Session] | None = None) -> None:
        """Send each connected agent its commands and the clock; in lockstep, expect every Ack."""
        if sync:
            self.step += 1
        upd = self.clock.update(self.step if sync else 0)
        n = 0
        for s in sessions:
            if not s.connected or (only is not None and s not in only):
                continue
            s.outbox.put_nowait(apb.ConnectResponse(commands=cmds.get(s, ()), clock=upd))
            n += 1
            if sync:
                self.pending.add(s)
        self.count_sent(n)
        self.last_broadcast = time.monotonic()

    def count_sent(self, n: int) -> None:
        self.sent.inc(n)

    def ended(self) -> None:
        """The replay ended now (wall): the achieved speed is measured up to here."""
        self.wall_done = time.monotonic()

    def achieved_speed(self) -> float:
        if self.wall_start is None:
            return 0.0
        end = self.wall_done or time.monotonic()
        return (self.clock.now() - self.virtual_start) / max(end - self.wall_start, 1e-9)
