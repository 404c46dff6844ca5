"""The two ways the live run moves its clock (the module docstring of ``scheduler_svc.core`` says
what each guarantees): the lockstep step, one synchronised round trip with every agent, and the
paced tick, virtual time following wall time. Both feed the agents' reports and the trace's
arrivals into the engine, run it, and send its decisions out as commands."""

from __future__ import annotations

import logging
import math
import time

from analysim.core.engine import Engine
from scheduler_svc.agents import Agents
from scheduler_svc.commands import CommandTranslator
from scheduler_svc.journal import Journal
from scheduler_svc.latency import LatencyQuantiles
from scheduler_svc.ledger import JobLedger
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.pace import Pace
from scheduler_svc.sessions import Placements
from scheduler_svc.trace_feed import TraceFeed

log = logging.getLogger("scheduler_svc")
INF = math.inf
CLOCK_BROADCAST_S = 1.0  # paced mode: re-anchor the agents' clocks this often (wall)
PACED_MAX_WAIT_S = 0.25


def _or_inf(t: float | None) -> float:
    return INF if t is None else t


class Stepper:
    """One step (lockstep) or tick (paced) at a time, called by the scheduler's loop."""

    def __init__(self, engine: Engine, pace: Pace, agents: Agents, trace: TraceFeed, translator: CommandTranslator,
                 placements: Placements, ledger: JobLedger, journal: Journal, metrics: SchedulerMetrics,
                 paced_lag_s: float) -> None:
        self.engine = engine  # the live engine, run to each step's time
        self.pace = pace  # the time told to the agents, the lockstep step, the broadcasts
        self.agents = agents  # the sessions, and their reports to deliver
        self.trace = trace  # the trace's arrivals
        self.translator = translator  # decisions -> commands
        self.placements = placements  # a report counts only for the launch the agents were told of
        self.ledger = ledger  # arrivals are recorded there
        self.journal = journal  # arrivals are journalled
        self.metrics = metrics  # the decision latency histogram; arrivals counted
        self.paced_lag_s = paced_lag_s  # paced: wall seconds an event waits before it is taken up
        self.latencies = LatencyQuantiles()  # wall seconds per step that ran the engine; fixed size, however long the run
        self.steps = 0  # steps (lockstep) or ticks (paced) that moved the clock or ran the engine
        self.idle = True  # lockstep: the last step found nothing to do (no event, no arrival, no command)

    def _feed(self, until: float) -> None:
        self.trace.feed(until, self.engine, self.ledger, self.metrics, self.journal)

    def deliver(self) -> None:
        """Agents' reports into the engine, completions in launch order within a time (the order
        in which the offline engine, which pushed each completion at launch, takes them)."""
        comps, fails = self.agents.take_reports()
        for t, lid, job_id in comps:
            p = self.placements.get(job_id)
            if p is not None and p.launch_id == lid:
                self.engine.job_finished(job_id, at=t)
        for t, job_id, msg in fails:
            if job_id in self.placements:
                log.info("job %s failed on its agent: %s", job_id, msg or "no reason given")
                self.engine.job_failed(job_id, at=t)

    def lockstep_step(self) -> None:
        pace = self.pace
        T = pace.t_cur
        w = time.perf_counter()
        self.deliver()
        self._feed(T)
        nxt = self.engine.next_event_time()
        ran = nxt is not None and nxt <= T
        if ran:
            self.engine.run(until=T)
        cmds = self.translator.collect()
        t_next = min(_or_inf(self.engine.next_event_time()), self.trace.next_time(),
                     min((s.bound for s in self.agents.sessions.values() if s.connected), default=INF))
        if t_next == INF and not cmds:
            self.idle = True
            if ran:
                self._observe_latency(w)
            return
        self.idle = False
        pace.move_to(max(T, t_next) if t_next < INF else T)
        pace.broadcast(self.agents.sessions.values(), cmds, sync=True)
        self.steps += 1
        if ran:
            self._observe_latency(w)

    def paced_tick(self) -> float:
        """One tick; returns how long (wall seconds) the loop may wait before the next."""
        pace = self.pace
        vnow = pace.clock.now()
        w = time.perf_counter()
        self.deliver()
        self._feed(vnow)
        # Only up to the events that are due, never on to "now": the engine's clock stays at its
        # last event, so a completion reported a little late is still taken at its own time
        # unless a later event has been processed meanwhile. With a lag, events are taken up
        # only once they are `paced_lag_s` wall seconds old: reports later than that are the
        # only ones that can diverge (decisions keep their exact virtual times).
        lag = self.paced_lag_s * pace.clock.speed
        ran = self._run_due(vnow - lag)
        cmds = self.translator.collect()
        t = time.monotonic()
        due = t - pace.last_broadcast >= CLOCK_BROADCAST_S
        if cmds or due:
            pace.broadcast(self.agents.sessions.values(), cmds, sync=False, only=None if due else set(cmds))
        if ran:
            self._observe_latency(w)
            self.steps += 1
        nxt = min(_or_inf(self.engine.next_event_time()), self.trace.next_time())
        if not math.isfinite(nxt):
            return PACED_MAX_WAIT_S
        return min(PACED_MAX_WAIT_S, max(0.0, (nxt + lag - pace.clock.now()) / pace.clock.speed))

    def _run_due(self, horizon: float) -> bool:
        """The engine through every event due by ``horizon``, one event time at a time."""
        ran = False
        while (nxt := self.engine.next_event_time()) is not None and nxt <= horizon:
            self.engine.run(until=nxt)
            ran = True
        return ran

    def _observe_latency(self, w: float) -> None:
        d = time.perf_counter() - w
        self.latencies.add(d)
        self.metrics.latency.observe(d)
