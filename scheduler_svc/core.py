"""The live scheduler: drives the simulation core (``analysim.core.engine.Engine``) from the
network. No scheduling logic lives here — arrivals (trace replayer and clients), completions
and node state (agents) go into the engine as events; its decisions go out to the agents as
commands.

The engine runs with ``predict_completions=False``: it never decides when a job ends, the
agents do. A Launch carries the engine's numbers for the job (remaining work, overhead,
slowdown) and the agent computes ``end = t + overhead + remaining * slowdown`` with the same
float arithmetic as the engine, so a lockstep replay reproduces ``analysim simulate`` exactly.

Two clock modes:

- lockstep (``speed=None``, ``--speed max``): conservative synchronisation. Each step sends
  every connected agent its commands and the next virtual time T; each agent applies the
  commands, moves its clock to T, reports the completions at T and its lookahead (earliest
  pending completion) in an Ack. Only when every agent has acknowledged does the scheduler
  feed those completions to the engine, run the engine to T, and pick the next T: the minimum
  of the engine's next event, the trace's next arrival, and each agent's lookahead bound
  (its last reported lookahead, lowered by the ends of the launches just sent to it). One
  round trip per step, and no agent can report an event earlier than a time the engine has
  already passed.
- paced (``speed=S``): virtual time = start + S x wall time; the engine is run up to "now"
  whenever an event is due or an agent reports; agents report completions when their own
  clock (re-anchored by every clock update) passes them.

Everything runs on one asyncio loop (the gRPC servicers too), so the engine needs no lock.

``LiveScheduler`` composes the parts, each the only writer of its state: ``pace`` (the time told
to the agents, the lockstep step and its Acks), ``agents`` (sessions, node owners, reports),
``intake`` (client jobs), ``trace_feed`` (the trace's arrivals), ``ledger`` (jobs outside the
engine), ``commands`` and ``accounts`` (decisions into commands, metrics, journal), ``steppers``
(the lockstep step and the paced tick), ``recovery`` (a restart), ``ending`` (the replay's end)
and ``view`` (the read model the metrics, the summary and the queries read).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Sequence
from dataclasses import replace

from analysim.core.cluster import ClusterSpec
from analysim.core.engine import Engine
from analysim.core.job import JobSpec
from analysim.events import EventsCsv
from analysim.simulation import RunOptions, run_policy
from scheduler_svc.accounts import DecisionAccounts, LiveRecorder
from scheduler_svc.agents import Agents
from scheduler_svc.clock import VirtualClock
from scheduler_svc.commands import CommandTranslator
from scheduler_svc.ending import RunEnd
from scheduler_svc.intake import Intake
from scheduler_svc.journal import Journal, JournalUnavailable
from scheduler_svc.ledger import JobLedger
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.pace import Pace
from scheduler_svc.recovery import Recovery
from scheduler_svc.sessions import Placements
from scheduler_svc.settings import LiveSettings
from scheduler_svc.steppers import Stepper
from scheduler_svc.trace_feed import TraceFeed, offline_jobs
from scheduler_svc.view import RunView
from scheduler_svc.watch import EventFeed

log = logging.getLogger("scheduler_svc")


def live_engine(cluster: ClusterSpec, opts: RunOptions, jobs: list[JobSpec]) -> tuple[Engine, LiveRecorder]:
    """The engine as analysim simulate builds it for these jobs, with predict_completions off (the
    agents say when a job ends) and a recorder that keeps each ended job's row."""
    span = (jobs[-1].submit_s - jobs[0].submit_s) if jobs else 0.0
    interval = max(1.0, math.ceil(span / max(opts.sample_points, 1))) if span > 0 else 60.0
    recorder = LiveRecorder(sample_interval_s=interval, fgd=opts.fgd_metric)
    recorder.rows = {}
    # Kueue's policy on a cluster with a partition (--partition), as analysim simulate takes it.
    engine = Engine(cluster, run_policy(cluster, opts), replace(opts.engine_config(), predict_completions=False),
                    recorder=recorder, workload=jobs)
    if recorder.fgd:
        # Built now rather than at the first sample: a first build costs tens of milliseconds,
        # a stall a paced replay would feel (its incremental refresh keeps it exact after).
        engine.fragmentation_index()
    return engine, recorder


class LiveScheduler:
    """One live run: the parts, composed, and the loop that drives them."""

    def __init__(self, cluster: ClusterSpec, opts: RunOptions, trace_jobs: Sequence[JobSpec], *,
                 journal: Journal, metrics: SchedulerMetrics, settings: LiveSettings | None = None) -> None:
        self.cluster = cluster  # the cluster the run schedules
        self.journal = journal  # the durable record of the run (jobs, outcomes, clock)
        self.metrics = metrics  # the scheduler's Prometheus metrics
        settings = settings or LiveSettings()
        jobs = offline_jobs(trace_jobs, opts)
        self.engine, recorder = live_engine(cluster, opts, jobs)  # the simulation core, driven from the network
        engine = self.engine
        # The events file (--events), written as the engine decides, as analysim simulate writes it.
        events: EventsCsv | None = None
        if settings.events is not None:
            events = EventsCsv(settings.events)
            events.open()
            events.attach(engine)
        # Its own policy: plugins keep state (a partition's quota usage) that is the live engine's.
        validator = Engine(cluster, run_policy(cluster, opts), engine.config)
        trace = TraceFeed(jobs, cluster, opts, engine, settings.trace_filtered, settings.trace_source)
        self.trace = trace  # the trace's jobs still to come
        self.ledger = JobLedger()  # jobs outside the engine; where each came from
        self.pace = Pace(VirtualClock(settings.speed), engine, metrics.sent)  # the clock between engine and agents
        self.feed = EventFeed(engine)  # the WatchEvents streams
        placements = Placements()
        self.agents = Agents(cluster, engine, metrics, self.pace, placements, self.feed,  # the agents' sessions
                             settings.heartbeat_deadline_s, on_all_nodes=self._start)
        self.end = RunEnd(settings, events, self.pace, self.agents, self.feed)  # the replay's end
        self.intake = Intake(cluster, engine, validator, journal, self.ledger, trace.ids, metrics,  # client jobs
                             self.pace, self.feed, self.end)
        self.recovery = Recovery(engine, journal, self.ledger, trace, self.agents, placements,  # restarts
                                 self.pace, metrics)
        first_launch = self.recovery.restore(cluster, opts.seed, recorder)
        accounts = DecisionAccounts(engine, recorder, metrics, journal, self.ledger, self.feed)
        translator = CommandTranslator(engine, self.agents.node_owner, placements, accounts, first_launch)
        self.stepper = Stepper(engine, self.pace, self.agents, trace, translator, placements,  # steps and ticks
                               self.ledger, journal, metrics, settings.paced_lag_s)
        self.view = RunView(engine=engine, cluster=cluster, opts=opts, journal=journal,  # what readers read
                            recorder=recorder, registry=metrics.registry, ledger=self.ledger, trace=trace,
                            agents=self.agents, pace=self.pace, stepper=self.stepper, recovery=self.recovery,
                            end=self.end)
        metrics.attach(self.view)

    # --------------------------------------------------------------- the clock

    def _start(self) -> None:
        """Every node has an agent: the restart's reports are taken up and the clock starts."""
        pace = self.pace
        kills = self.recovery.resume_reported()
        t = pace.t_cur
        if t == 0.0 and not self.journal.meta().get("clock"):
            # Paced mode starts at the first arrival, as the offline run does; lockstep would
            # jump there anyway.
            first = self.trace.next_time()
            if math.isfinite(first) and first > 0:
                t = first
        pace.start(t)
        log.info("all %d nodes have agents: clock starts at t=%.1f (%s)", len(self.cluster.nodes), t,
                 "lockstep" if pace.clock.lockstep else f"paced x{pace.clock.speed:g}")
        pace.broadcast(self.agents.sessions.values(), kills, sync=pace.clock.lockstep)

    def pause(self) -> None:
        if self.pace.pause(self.agents.sessions.values()):
            self.commit()  # a paused run is durable as it stands

    def resume(self) -> None:
        self.pace.resume(self.agents.sessions.values())

    def set_speed(self, speed: float | None) -> None:
        """A number: paced at that speed from now on. None: lockstep."""
        self.pace.set_speed(speed, self.agents.sessions.values())

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        pace, stepper = self.pace, self.stepper
        while not pace.stopping:
            pace.kick.clear()
            timeout = None
            if pace.started and not pace.clock.paused:
                if pace.clock.lockstep:
                    if not pace.pending:
                        stepper.lockstep_step()
                        if not pace.pending and not stepper.idle:
                            await asyncio.sleep(0)  # no agent to wait for: let the servicers in
                            continue
                else:
                    timeout = stepper.paced_tick()
            self.end.check(self.replay_done, self.view, self.commit)
            if self.journal.due():
                self.commit()
            if pace.kick.is_set():
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(pace.kick.wait(), timeout)

    @property
    def replay_done(self) -> bool:
        """Every trace job fed, every journalled one back in the engine, every job in it ended."""
        return (self.pace.started and self.trace.exhausted() and not self.ledger.unresumed
                and self.ledger.terminal >= len(self.engine.jobs))

    def commit(self) -> None:
        """Commit the journal's open group with the clock: every outcome up to the engine's time
        is then durable, and the agents are told so (with the next clock update) so that they
        can forget the ends they keep for a restarted scheduler."""
        self.journal.set_meta("clock", self.engine.now)
        try:
            self.journal.commit()
        except JournalUnavailable:
            return  # logged by the journal; kept and retried; the agents keep their ends meanwhile
        self.pace.durable(self.engine.now)

    def stop(self) -> None:
        self.end.stop()
        self.pace.stop()
        for s in list(self.agents.sessions.values()):
            s.outbox.put_nowait(None)
        self.feed.close()
