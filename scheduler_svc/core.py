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
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from analysim._protos.v1 import agent_pb2 as apb
from analysim.core.cluster import ClusterSpec
from analysim.core.engine import Engine, InfeasibleJob
from analysim.core.job import GPU_MILLI, JobRun, JobSpec, JobStatus
from analysim.core.metrics import MetricsRecorder
from analysim.core.partition import Partition
from analysim.core.records import Decision
from analysim.errors import UserError
from analysim.events import EventsCsv, kueue_state, queue_in, why_pending
from analysim.partitions import assign_queues
from analysim.simulation import RunOptions, filter_for_cluster, run_policy, summary_header
from scheduler_svc.clock import VirtualClock
from scheduler_svc.journal import TERMINAL, Journal, JournalUnavailable
from scheduler_svc.latency import LatencyQuantiles
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.sessions import Placed, Session, plausible, possible_end
from scheduler_svc.summary import build_summary, fidelity

log = logging.getLogger("scheduler_svc")
INF = math.inf
CLOCK_BROADCAST_S = 1.0  # paced mode: re-anchor the agents' clocks this often (wall)
PACED_MAX_WAIT_S = 0.25


class InvalidJob(ValueError):
    """A client's job that can never run here: INVALID_ARGUMENT, with this message."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class _LiveRecorder(MetricsRecorder):
    """The standard recorder, which also keeps each ended job's row by id (for the journal)."""

    rows: dict[str, dict]

    def job_ended(self, engine: Engine, job: JobRun) -> None:
        super().job_ended(engine, job)
        self.rows[job.job_id] = self.jobs[-1]


class LiveScheduler:
    def __init__(self, cluster: ClusterSpec, opts: RunOptions, trace_jobs: Sequence[JobSpec], *,
                 journal: Journal, metrics: SchedulerMetrics, speed: float | None = None,
                 trace_source: str = "", trace_filtered: dict[str, int] | None = None,
                 heartbeat_deadline_s: float = 5.0, out: Path | None = None, plots: bool = False,
                 offline_check: bool = True, paced_lag_s: float = 0.0, events: Path | None = None) -> None:
        self.cluster, self.opts, self.journal, self.metrics = cluster, opts, journal, metrics
        self.heartbeat_deadline_s = heartbeat_deadline_s
        self.paced_lag_s = paced_lag_s
        self.out, self.plots, self.offline_check = out, plots, offline_check
        self.trace_source = trace_source
        # Kueue's policy on a cluster with a partition (--partition), as analysim simulate takes it.
        policy = run_policy(cluster, opts)
        # Exactly what analysim.simulation.run does with a trace, so that the runs can be compared.
        jobs = sorted(trace_jobs, key=lambda j: j.submit_s)[: opts.limit] if opts.limit else list(trace_jobs)
        self.offline_input = jobs
        self.trace_filtered = trace_filtered
        span = (jobs[-1].submit_s - jobs[0].submit_s) if jobs else 0.0
        interval = max(1.0, math.ceil(span / max(opts.sample_points, 1))) if span > 0 else 60.0
        self.recorder = _LiveRecorder(sample_interval_s=interval, fgd=opts.fgd_metric)
        self.recorder.rows = {}
        self.engine = Engine(cluster, policy, replace(opts.engine_config(), predict_completions=False),
                             recorder=self.recorder, workload=jobs)
        if self.recorder.fgd:
            # Built now rather than at the first sample: a first build costs tens of milliseconds,
            # a stall a paced replay would feel (its incremental refresh keeps it exact after).
            self.engine.fragmentation_index()
        # The events file (--events), written as the engine decides, as analysim simulate writes it.
        self.events: EventsCsv | None = None
        if events is not None:
            self.events = EventsCsv(events)
            self.events.open()
            self.events.attach(self.engine)
        # Its own policy: plugins keep state (a partition's quota usage) that is the live engine's.
        self._validator = Engine(cluster, run_policy(cluster, opts), self.engine.config)
        kept, reasons = filter_for_cluster(jobs, self.engine, "replay")
        self.header = summary_header(cluster, policy.name, opts, len(jobs), trace_filtered, reasons)
        self.trace_total = len(kept)
        # Client ids may not take these, arrived or not: a trace job is never displaced.
        self.trace_ids = frozenset(j.job_id for j in kept)
        self.clock = VirtualClock(speed)
        self.sessions: dict[str, Session] = {}
        self.node_owner: dict[str, Session] = {}
        self.node_index = {n.name: i for i, n in enumerate(cluster.nodes)}
        self.placed: dict[str, Placed] = {}
        self.source: dict[str, str] = {}
        self.restored: dict[str, dict] = {}  # jobs that ended before a restart: their records
        self.started = False
        self.done = False
        self.summary: dict | None = None
        self.t_cur = 0.0
        self._step = 0
        self._pending_acks: set[Session] = set()
        self._completions: list[tuple[float, int, str]] = []
        self._failures: list[tuple[float, str, str]] = []
        self._dec_idx = 0
        self._terminal = 0
        self._kick = asyncio.Event()
        self._stopping = False
        self._idle = True
        self._last_clock_broadcast = 0.0
        self._watchdog_paused = False
        self.latencies = LatencyQuantiles()  # fixed size, however long the run
        self.steps = 0
        self.wall_start: float | None = None
        self.wall_done: float | None = None
        self.virtual_start = 0.0
        self.agents_lost = 0
        self.watchers: list[asyncio.Queue] = []
        self._client_seq = 0
        self.trace_skipped = 0
        self._finishing = False
        # Lockstep: when and why the replay stopped being the offline run's (an agent lost), else None.
        self.diverged: dict | None = None
        self.out_error: str | None = None  # why the run's end could not be written to --out (it then takes no jobs)
        self._fidelity: dict | None = None
        self._started_ids: set[str] = set()
        self._unresumed: dict[str, JobSpec] = {}  # journalled, not ended: resumed or resubmitted at the start
        self.jobs_resumed = 0
        self._restore(kept)
        metrics.attach(self)

    # ------------------------------------------------------------------ restart

    def _restore(self, kept: list[JobSpec]) -> None:
        """Resume from the journal: ended jobs keep their records; the others wait for the agents
        (``_resume_reported``): those still running on them continue, the rest are resubmitted."""
        ident = {"trace": self.trace_source, "cluster": self.cluster.name, "policy": self.engine.policy.name,
                 "seed": self.opts.seed, "trace_jobs": len(kept)}
        if self.cluster.partition is not None:  # what the file says, wherever it is: another says another run
            what = replace(self.cluster.partition, source="")
            ident["partition"] = hashlib.sha256(repr(what).encode()).hexdigest()[:16]
        meta = self.journal.meta()
        if meta.get("identity") not in (None, ident):
            raise UserError(f"journal {self.journal.path} belongs to another run ({meta['identity']}); "
                            f"this one is {ident}: give a fresh --journal")
        self.journal.set_meta("identity", ident)
        # Launch ids name a launch across scheduler lives too: agents keep jobs launched by the
        # previous one, so each life numbers its launches from its own epoch.
        epoch = int(meta.get("epoch", 0)) + 1
        self.journal.set_meta("epoch", epoch)
        self._launch_seq = epoch << 40
        rows = self.journal.jobs()
        seen = set()
        if rows:
            t = float(meta.get("clock", 0.0))
            if t > 0:
                self.engine.run(until=t)  # no events yet: only moves the clock
            self.t_cur = t
            self.clock.set(t)
            for job_id, source, spec, status, record in rows:
                seen.add(job_id)
                self.source[job_id] = source
                if source == "client":
                    self._client_seq += 1
                if status in TERMINAL and record is not None:
                    self.restored[job_id] = record
                    self.recorder.add_row(record)
                else:
                    self._unresumed[job_id] = spec
            log.info("resumed from %s at t=%.1f: %d ended, %d to resume or resubmit", self.journal.path, t,
                     len(self.restored), len(self._unresumed))
        self.trace_jobs = [j for j in kept if j.job_id not in seen]
        self._cursor = 0
        self.journal.commit()

    def _resume_reported(self) -> dict[Session, list]:
        """Every node has an agent again after a restart: the jobs the agents still run continue
        where they are (when the journal has them and every part of each is reported the same
        way), and the ends they report that the journal missed are taken; the other journalled
        jobs are resubmitted. Kill commands for what is not kept."""
        reports: dict[str, list[tuple[Session, apb.RunningJob]]] = defaultdict(list)
        for s in self.sessions.values():
            for r in s.running:
                # An ended job is reported by its leader only (the others just freed their GPUs).
                if r.HasField("end_s") and (not r.launch.slots or r.launch.slots[0].node not in s.nodes):
                    continue
                reports[r.launch.job_id].append((s, r))
            s.running = ()
        kills: dict[Session, list] = defaultdict(list)
        keep = []
        # Trace jobs that arrived after the journal's last commit, which an agent runs or ran:
        # taken from the trace now (the replay would read them again anyway).
        arrived = {j.job_id: j for j in self.trace_jobs if j.job_id in reports}
        if arrived:
            self.trace_jobs = [j for j in self.trace_jobs if j.job_id not in arrived]
            for spec in arrived.values():
                self._unresumed[spec.job_id] = spec
                self.source[spec.job_id] = "trace"
                self.metrics.submitted.labels(spec.vc, "trace").inc()
            self.journal.add_jobs(arrived.values(), "trace")
        for job_id, parts in reports.items():
            first = parts[0][1]
            la, start = first.launch, first.start_s
            holders = {self.node_owner.get(sl.node) for sl in la.slots}
            ended = first.HasField("end_s")
            if ended and job_id not in self._unresumed:
                continue  # its outcome is in the journal already
            if (job_id in self._unresumed and math.isfinite(start) and start >= 0
                    and (not ended or math.isfinite(first.end_s) and first.end_s >= start)
                    and all(r.launch.launch_id == la.launch_id and r.start_s == start for _, r in parts)
                    # every part of a running job must be there; an ended one, by its leader alone
                    and (ended or holders == {s for s, _ in parts}) and None not in holders):
                keep.append((job_id, la, start, tuple(holders), first))
            elif not ended:
                for s, _ in parts:
                    kills[s].append(apb.Command(time_s=self.t_cur, kill=apb.Kill(job_id=job_id, reason="not resumed")))
        # Ended ones first, in order of their ends (their GPUs may have gone to a later launch),
        # each taken up as running and then ended at its time; then the ones still running.
        keep.sort(key=lambda k: (not k[4].HasField("end_s"), k[4].end_s, k[2]))
        t = max([self.t_cur, *(start for _, _, start, _, _ in keep)])
        resumed = 0
        for job_id, la, start, holders, report in keep:
            spec = self._unresumed[job_id]
            gpus = tuple((self.node_index[sl.node], tuple(sl.gpus)) for sl in la.slots)
            try:
                job = self.engine.resume_running(spec, gpus, la.slowdown, start, la.remaining_s, la.overhead_s)
            except (InfeasibleJob, KeyError, IndexError) as e:
                log.warning("job %s reported running, but cannot be resumed (%s): resubmitted", job_id, e)
                for s in holders:
                    kills[s].append(apb.Command(time_s=self.t_cur, kill=apb.Kill(job_id=job_id, reason="not resumed")))
                continue
            del self._unresumed[job_id]
            self._started_ids.add(job_id)
            self.placed[job_id] = Placed(la.launch_id, job.completion_token, holders, start,
                                         self.engine.expected_end(job))
            resumed += 1
            if report.HasField("end_s"):
                end = max(report.end_s, self.engine.now)
                (self.engine.job_failed if report.failed else self.engine.job_finished)(job_id, at=end)
                self.engine.run(until=end)  # nothing else is queued yet: only this job ends
                t = max(t, end)
                continue
            end = self.engine.expected_end(job)
            for s in holders:
                s.bound = min(s.bound, end)
        # The clock resumes at the latest time the agents have shown; nothing happened after it.
        self.engine.run(until=t)
        self.t_cur = t
        for spec in self._unresumed.values():
            self._engine_submit(spec)
        if self._unresumed or resumed:
            log.info("after the restart: %d job(s) resumed where they were, %d resubmitted, %d report(s) refused",
                     resumed, len(self._unresumed), sum(len(v) for v in kills.values()))
        self.jobs_resumed = resumed
        self._unresumed.clear()
        return kills
    # --------------------------------------------------------------- the trace

    def _feed(self, until: float) -> None:
        jobs, i, n = self.trace_jobs, self._cursor, len(self.trace_jobs)
        if i >= n or jobs[i].submit_s > until:
            return
        batch = []
        while i < n and jobs[i].submit_s <= until:
            spec = jobs[i]
            i += 1
            try:
                self._engine_submit(spec)
            except InfeasibleJob as e:  # a client took the id first
                log.warning("trace job skipped: %s", e)
                self.trace_skipped += 1
                continue
            self.source[spec.job_id] = "trace"
            self.metrics.submitted.labels(spec.vc, "trace").inc()
            batch.append(spec)
        self._cursor = i
        self.journal.add_jobs(batch, "trace")

    def _engine_submit(self, spec: JobSpec) -> None:
        """Into the engine; a job that only the nodes down right now could hold is held there
        ("not now") until they come back, one that no node set could hold is refused ("never")."""
        self.engine.submit(spec, hold=True)

    def _trace_next(self) -> float:
        return self.trace_jobs[self._cursor].submit_s if self._cursor < len(self.trace_jobs) else INF

    # ------------------------------------------------------------------ agents

    def register(self, agent_id: str, nodes: Sequence[apb.NodeInfo], principal: str = "",
                 running: Sequence[apb.RunningJob] = ()) -> Session:
        """Check an agent's nodes against the cluster (ValueError if wrong); PermissionError if
        another agent token holds the agent id or one of the nodes."""
        if not nodes:
            raise ValueError("an agent must register at least one node")
        names = []
        for n in nodes:
            i = self.node_index.get(n.name)
            if i is None:
                raise ValueError(f"node {n.name!r} is not part of cluster {self.cluster.name!r}")
            spec = self.cluster.nodes[i]
            if (n.gpus, n.gpu_model) != (spec.gpus, spec.gpu_model):
                raise ValueError(f"node {n.name!r}: registered with {n.gpus}x{n.gpu_model}, but the cluster "
                                 f"has {spec.gpus}x{spec.gpu_model}")
            names.append(n.name)
        if len(set(names)) != len(names):
            raise ValueError("a node is registered twice")
        for name in names:
            owner = self.node_owner.get(name)
            if owner is not None and owner.agent_id != agent_id:
                raise ValueError(f"node {name!r} is held by agent {owner.agent_id!r}")
        # The same agent coming back (a restart, a broken stream): its previous session is over.
        # Only the same credentials may take over a session: a token cannot push another off.
        replaced = [s for s in self.sessions.values() if s.agent_id == agent_id or set(s.nodes) & set(names)]
        for s in replaced:
            if s.principal != principal:
                raise PermissionError(f"agent {s.agent_id!r} (nodes {s.nodes[0]}..) is registered with other "
                                      "credentials")
        for s in replaced:
            self.lose(s, "replaced by a new registration")
        s = Session(agent_id=agent_id, session_id=uuid.uuid4().hex, nodes=tuple(names), principal=principal,
                    running=tuple(running))
        self.sessions[s.session_id] = s
        return s

    def attach(self, s: Session) -> None:
        """The session's stream is open: its nodes are up."""
        s.connected = True
        s.last_seen = time.monotonic()
        at = self.event_time()
        for name in s.nodes:
            self.node_owner[name] = s
            if self.started and not self.engine.state.up[self.node_index[name]]:
                self.engine.node_up(name, at=at)
                self._publish("node_up", "", (name,), f"agent {s.agent_id}")
        kills = []
        if self.started and s.running:
            # This scheduler requeued them when the agent was lost: they run elsewhere now.
            kills = [apb.Command(time_s=at, kill=apb.Kill(job_id=r.launch.job_id, reason="requeued while away"))
                     for r in s.running if not r.HasField("end_s")]
            s.running = ()
        s.outbox.put_nowait(apb.ConnectResponse(commands=kills, clock=self.clock.update(0)))
        self._count_sent(1)
        if not self.started and len(self.node_owner) == len(self.cluster.nodes):
            self._start()
        self._kick.set()

    def refuse_agent(self, s: Session, reason: str, why: str) -> None:
        """An agent that sent what no honest agent sends (a lookahead that is not ahead, an end
        outside its launch) is refused: counted, its stream ended with INVALID_ARGUMENT, and lost
        (its jobs requeued), so that lockstep never waits on it nor takes its word."""
        if s.lost:
            return
        self.metrics.agents_refused.labels(reason).inc()
        log.warning("agent %s refused: %s", s.agent_id, why, extra={"source": s.agent_id})
        s.refused = (reason, why)
        self.lose(s, f"refused: {why}")

    def lose(self, s: Session, why: str) -> None:
        if s.lost:
            return
        was_connected = s.connected
        s.lost, s.connected = True, False
        self.sessions.pop(s.session_id, None)
        self._pending_acks.discard(s)
        s.outbox.put_nowait(None)  # ends its stream if still open
        if not was_connected:
            return
        self.agents_lost += 1
        self.metrics.agents_lost.inc()
        log.warning("agent %s lost (%s): %d node(s) down", s.agent_id, why, len(s.nodes))
        at = self.event_time()  # one instant for all its nodes: a paced clock moves between calls
        if self.clock.lockstep and self.started and self.diverged is None:
            # Its jobs are requeued from their last checkpoint: the schedule is no longer the
            # offline run's from here on (a paced run is not held to it anyway).
            self.diverged = {"at_s": at, "why": f"agent {s.agent_id} lost ({why}); its jobs were requeued"}
            log.warning("the lockstep replay diverges from the offline run from t=%.1f: %s", at, self.diverged["why"])
        for name in s.nodes:
            if self.node_owner.get(name) is s:
                del self.node_owner[name]
                if self.started:
                    self.engine.node_down(name, at=at)
                    self._publish("node_down", "", (name,), f"agent {s.agent_id}: {why}")
        self._kick.set()

    def job_ids(self) -> list[str]:
        """Every job this run knows: restored from the journal as ended, in the engine, and
        journalled but not yet resumed or resubmitted."""
        return list(self.restored) + list(self.engine.jobs) + list(self._unresumed)

    def event_time(self) -> float:
        """When an outside event happens: the time the agents were last told (lockstep), or now."""
        return self.t_cur if self.clock.lockstep else max(self.clock.now(), self.engine.now)

    def on_agent_message(self, s: Session, msg: apb.ConnectRequest) -> None:
        if s.lost:
            return
        s.last_seen = time.monotonic()
        self.metrics.received.inc()
        seen: set[tuple[int, str, int]] = set()
        for ev in msg.events:
            if s.lost:  # refused by an earlier report of this message
                return
            key = (ev.kind, ev.job_id, ev.launch_id)
            if key in seen:  # the same report again in one message: counted, not taken (nor logged) twice
                self.metrics.agent_events.labels("duplicate").inc()
                continue
            seen.add(key)
            self._on_job_event(s, ev)
        if msg.HasField("heartbeat"):
            self._on_heartbeat(s, msg.heartbeat)
        if msg.HasField("ack"):
            ack = msg.ack
            if s in self._pending_acks and ack.step == self._step:
                if not ack.lookahead_s > self.t_cur:  # NaN too: the next step could never move on
                    self.refuse_agent(s, "lookahead_not_ahead", f"lookahead t={ack.lookahead_s:.6g} is not after "
                                      f"the step's t={self.t_cur:.6g}")
                    return
                s.bound = ack.lookahead_s
                self._pending_acks.discard(s)
                if not self._pending_acks:
                    self._kick.set()
        elif msg.events and not self.clock.lockstep:
            self._kick.set()

    def _on_job_event(self, s: Session, ev: apb.JobEvent) -> None:
        p = self.placed.get(ev.job_id)
        if ev.kind == apb.JobEvent.KIND_STARTED:
            # Only a confirmation (the engine started it already); paced, it can cross a preemption.
            return
        if p is None or p.launch_id != ev.launch_id or s not in p.sessions:
            reason = "unknown_job" if ev.job_id not in self.engine.jobs else "stale_launch"
            log.warning("agent %s reported %s for %.80r (launch %d): %s; ignored", s.agent_id,
                        apb.JobEvent.Kind.Name(ev.kind), ev.job_id, ev.launch_id, reason.replace("_", " "),
                        extra={"source": s.agent_id})
            self.metrics.agent_events.labels(reason).inc()
            return
        if not math.isfinite(ev.time_s):
            self.metrics.agent_events.labels("bad_time").inc()
            return
        if not possible_end(p, ev.time_s):
            self.refuse_agent(s, "impossible_end", f"{apb.JobEvent.Kind.Name(ev.kind)} of {ev.job_id[:80]!r} at "
                              f"t={ev.time_s:.6g}, outside its launch's [{p.start_s:.6g}, {p.end_s:.6g}]")
            return
        if ev.kind == apb.JobEvent.KIND_FINISHED:
            self._completions.append((ev.time_s, ev.launch_id, ev.job_id))
            if not self.clock.lockstep and log.isEnabledFor(logging.DEBUG):
                log.debug("finished %s at %.1f, reported %.1f virtual s later (engine at %.1f)", ev.job_id,
                          ev.time_s, self.clock.now() - ev.time_s, self.engine.now)
        elif ev.kind == apb.JobEvent.KIND_FAILED:
            self._failures.append((ev.time_s, ev.job_id, ev.message))

    def _on_heartbeat(self, s: Session, hb: apb.Heartbeat) -> None:
        most = 2 * len(s.nodes) + 8  # an agent sends each of its nodes once
        if len(hb.nodes) > most:
            self.metrics.agent_events.labels("oversized_heartbeat").inc()
            log.warning("agent %s sent telemetry for %d nodes, it holds %d; only the first %d read", s.agent_id,
                        len(hb.nodes), len(s.nodes), most, extra={"source": s.agent_id})
        for node in hb.nodes[:most]:
            i = self.node_index.get(node.node)
            if i is None or node.node not in s.nodes:
                self.metrics.agent_events.labels("unknown_node").inc()
                log.warning("agent %s sent telemetry for node %.80r it does not hold; ignored", s.agent_id, node.node,
                            extra={"source": s.agent_id})
                continue
            gpus = self.cluster.nodes[i].gpus
            bad = [g for g in node.gpus if not plausible(g, gpus)]
            if bad:
                self.metrics.agent_events.labels("impossible_gpu_state").inc()
                log.warning("agent %s: impossible GPU state on %s (GPU %d: util %.3g, memory %.3g/%.3g B, "
                            "%.3g W, %.3g C); telemetry ignored", s.agent_id, node.node, bad[0].index,
                            bad[0].utilization, bad[0].memory_used_bytes, bad[0].memory_total_bytes,
                            bad[0].power_watts, bad[0].temperature_celsius, extra={"source": s.agent_id})
                continue
            s.telemetry[node.node] = node

    async def watchdog(self) -> None:
        """Agents that stop talking for ``heartbeat_deadline_s`` wall seconds are lost."""
        period = min(0.5, self.heartbeat_deadline_s / 4)
        while not self._stopping:
            await asyncio.sleep(period)
            if self._watchdog_paused:
                continue
            now = time.monotonic()
            for s in list(self.sessions.values()):
                if now - s.last_seen > self.heartbeat_deadline_s:
                    self.lose(s, f"no message for {now - s.last_seen:.1f} s")

    # ------------------------------------------------------------------ clients

    @property
    def writing_out(self) -> bool:
        """The replay's end is being written to --out: a submission now waits (UNAVAILABLE)."""
        return self._finishing and not self.done

    def _taken(self, job_id: str) -> bool:
        return (job_id in self.engine.jobs or job_id in self.restored or job_id in self.trace_ids
                or job_id in self._unresumed)

    def submit_client(self, spec: JobSpec) -> None:
        if self._taken(spec.job_id):
            raise KeyError(spec.job_id)
        self.validate(spec)
        # Durable before the engine takes it (JournalUnavailable: refused, and nothing of it is
        # anywhere): an acknowledged job survives a crash, a refused one never runs.
        self.journal.add_client_job(spec)
        if self.done:
            # A job after the end: the run is open again, and --out is written again when it ends.
            self.done = self._finishing = False
        self._engine_submit(spec)
        self.source[spec.job_id] = "client"
        self.metrics.submitted.labels(spec.vc, "client").inc()
        self._publish("submit", spec.job_id, (), "client")
        self._kick.set()

    def next_client_id(self) -> str:
        while True:
            self._client_seq += 1
            job_id = f"client-{self._client_seq:06d}"
            if not self._taken(job_id):
                return job_id

    def known_vcs(self) -> list[str]:
        """Every value a job's vc takes on this run: the partition's LocalQueues under a partition,
        else the cluster's VCs, else "default". Every per-VC metric has a series for each, at 0
        until something happens, so that "none" reads as 0 rather than as no data."""
        c = self.cluster
        if c.partition is not None:
            return sorted(lq for lq, _ in c.partition.queue_of)
        return [v.name for v in c.vcs] or ["default"]

    def default_vc(self) -> str:
        """What a submission without a vc means: "default" on a cluster that names no VCs; on one
        that does, nothing ("vc is required", with the list), rather than a VC it has not."""
        return "" if self.cluster.vcs or self.cluster.partition is not None else "default"

    def validate(self, spec: JobSpec) -> None:
        c = self.cluster
        if not spec.job_id or len(spec.job_id) > 200:
            raise InvalidJob("job_id must be 1 to 200 characters", "bad_id")
        if spec.duration_s is None or not math.isfinite(spec.duration_s) or spec.duration_s < 0:
            raise InvalidJob(f"duration_s must be a finite number >= 0, got {spec.duration_s}", "bad_duration")
        if spec.num_gpus < 1:
            raise InvalidJob("num_gpus must be at least 1", "bad_gpus")
        if not 0 < spec.gpu_milli <= GPU_MILLI or (spec.gpu_milli < GPU_MILLI and spec.num_gpus != 1):
            raise InvalidJob("gpu_milli must be in 1..1000, and below 1000 only for a 1-GPU job", "bad_gpus")
        if c.vcs and not spec.vc:
            raise InvalidJob(f"vc is required on this cluster; its virtual clusters: {', '.join(v.name for v in c.vcs)}",
                             "unknown_vc")
        if c.vcs and c.vc(spec.vc) is None:
            raise InvalidJob(f"unknown virtual cluster {spec.vc!r}; known: {', '.join(v.name for v in c.vcs)}",
                             "unknown_vc")
        if c.partition is not None:
            self._validate_queue(spec, c.partition)
        unknown = [m for m in spec.gpu_models if m not in c.gpu_models]
        if unknown:
            raise InvalidJob(f"unknown GPU model {unknown[0]!r}; this cluster has {', '.join(c.gpu_models)}",
                             "unknown_gpu_model")
        biggest = max(n.gpus for n in c.nodes)
        try:
            # Against the whole cluster, not the live engine: a job is not invalid because some
            # nodes are down right now (it waits for them).
            self._validator.check_feasible(spec)
        except InfeasibleJob as e:
            extra = f" (the largest node has {biggest} GPUs, the cluster {c.total_gpus})" \
                if e.reason == "larger_than_cluster" else ""
            raise InvalidJob(str(e) + extra, e.reason) from None

    def _validate_queue(self, spec: JobSpec, partition: Partition) -> None:
        """Under a partition, a job's vc names its LocalQueue, whose ClusterQueue must be able to
        admit it some day (the trace's jobs are filtered the same way: analysim.partitions)."""
        queues = ", ".join(lq for lq, _ in partition.queue_of)
        if not spec.vc:
            raise InvalidJob(f"vc is required under a partition: the job's LocalQueue, one of {queues}", "no_local_queue")
        _, refused = assign_queues([spec], partition)
        cq = partition.queue_for(spec.vc)
        why = {"no_local_queue": f"no LocalQueue {spec.vc!r} in the partition; its LocalQueues: {queues}",
               "resource_not_covered": f"ClusterQueue {cq!r} has no quota (or no nodes) for a resource the job asks for",
               "larger_than_queue_quota": f"larger than ClusterQueue {cq!r} can ever admit, borrowing all it may"}
        for reason in refused:
            raise InvalidJob(why.get(reason, reason), reason)

    def cancel(self, job_id: str) -> None:
        job = self.engine.jobs.get(job_id)
        if job is None:
            raise KeyError(job_id)
        self.engine.cancel(job_id, at=self.event_time())
        self._kick.set()

    # --------------------------------------------------------------- the clock

    def _start(self) -> None:
        self.started = True
        kills = self._resume_reported()
        if self.t_cur == 0.0 and not self.journal.meta().get("clock"):
            # Paced mode starts at the first arrival, as the offline run does; lockstep would
            # jump there anyway.
            first = self._trace_next()
            if math.isfinite(first) and first > 0:
                self.t_cur = first
        self.clock.set(self.t_cur)
        self.virtual_start = self.t_cur
        self.wall_start = time.monotonic()
        log.info("all %d nodes have agents: clock starts at t=%.1f (%s)", len(self.cluster.nodes), self.t_cur,
                 "lockstep" if self.clock.lockstep else f"paced x{self.clock.speed:g}")
        self._broadcast(kills, sync=self.clock.lockstep)

    def pause(self) -> None:
        if not self.clock.paused:
            self.clock.set(self.clock.now())
            self.clock.paused = True
            self._broadcast({}, sync=False)
            self.commit()  # a paused run is durable as it stands

    def resume(self) -> None:
        if self.clock.paused:
            self.clock.paused = False
            self.clock.set(self.clock.t0)
            self._broadcast({}, sync=self.clock.lockstep)
            self._kick.set()

    def set_speed(self, speed: float | None) -> None:
        """A number: paced at that speed from now on. None: lockstep."""
        now = self.clock.now() if not self.clock.lockstep else self.t_cur
        self.clock.lockstep = speed is None
        if speed is not None:
            self.clock.speed = float(speed)
        self.clock.set(now)
        self.t_cur = max(self.t_cur, now)
        self._pending_acks.clear()
        if self.started and not self.clock.paused:
            self._broadcast({}, sync=self.clock.lockstep)
        self._kick.set()

    def achieved_speed(self) -> float:
        if self.wall_start is None:
            return 0.0
        end = self.wall_done or time.monotonic()
        return (self.clock.now() - self.virtual_start) / max(end - self.wall_start, 1e-9)

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        while not self._stopping:
            self._kick.clear()
            timeout = None
            if self.started and not self.clock.paused:
                if self.clock.lockstep:
                    if not self._pending_acks:
                        self._lockstep_step()
                        if not self._pending_acks and not self._idle:
                            await asyncio.sleep(0)  # no agent to wait for: let the servicers in
                            continue
                else:
                    timeout = self._paced_tick()
            self._check_done()
            if self.journal.due():
                self.commit()
            if self._kick.is_set():
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout)

    def commit(self) -> None:
        """Commit the journal's open group with the clock: every outcome up to the engine's time
        is then durable, and the agents are told so (with the next clock update) so that they
        can forget the ends they keep for a restarted scheduler."""
        self.journal.set_meta("clock", self.engine.now)
        try:
            self.journal.commit()
        except JournalUnavailable:
            return  # logged by the journal; kept and retried; the agents keep their ends meanwhile
        self.clock.durable_s = self.engine.now

    def stop(self) -> None:
        if self.events is not None:  # (stopped before the replay's end: no events file, as no jobs.csv)
            self.events.close(ok=False)
            self.events = None
        self._stopping = True
        self._kick.set()
        for s in list(self.sessions.values()):
            s.outbox.put_nowait(None)

    def _deliver(self) -> None:
        """Agents' reports into the engine, completions in launch order within a time (the order
        in which the offline engine, which pushed each completion at launch, takes them)."""
        if self._completions:
            comps = sorted(self._completions)
            self._completions.clear()
            for t, lid, job_id in comps:
                p = self.placed.get(job_id)
                if p is not None and p.launch_id == lid:
                    self.engine.job_finished(job_id, at=t)
        if self._failures:
            for t, job_id, msg in sorted(self._failures):
                if job_id in self.placed:
                    log.info("job %s failed on its agent: %s", job_id, msg or "no reason given")
                    self.engine.job_failed(job_id, at=t)
            self._failures.clear()

    def _lockstep_step(self) -> None:
        T = self.t_cur
        w = time.perf_counter()
        self._deliver()
        self._feed(T)
        nxt = self.engine.next_event_time()
        ran = nxt is not None and nxt <= T
        if ran:
            self.engine.run(until=T)
        cmds = self._collect()
        t_next = min(_or_inf(self.engine.next_event_time()), self._trace_next(),
                     min((s.bound for s in self.sessions.values() if s.connected), default=INF))
        if t_next == INF and not cmds:
            self._idle = True
            if ran:
                self._observe_latency(w)
            return
        self._idle = False
        self.t_cur = max(T, t_next) if t_next < INF else T
        self.clock.set(self.t_cur)
        self._broadcast(cmds, sync=True)
        self.steps += 1
        if ran:
            self._observe_latency(w)

    def _paced_tick(self) -> float:
        vnow = self.clock.now()
        w = time.perf_counter()
        self._deliver()
        self._feed(vnow)
        # Only up to the events that are due, never on to "now": the engine's clock stays at its
        # last event, so a completion reported a little late is still taken at its own time
        # unless a later event has been processed meanwhile. With a lag, events are taken up
        # only once they are `paced_lag_s` wall seconds old: reports later than that are the
        # only ones that can diverge (decisions keep their exact virtual times).
        lag = self.paced_lag_s * self.clock.speed
        horizon = vnow - lag
        ran = False
        while (nxt := self.engine.next_event_time()) is not None and nxt <= horizon:
            self.engine.run(until=nxt)
            ran = True
        cmds = self._collect()
        t = time.monotonic()
        if cmds or t - self._last_clock_broadcast >= CLOCK_BROADCAST_S:
            self._broadcast(cmds, sync=False, only=None if t - self._last_clock_broadcast >= CLOCK_BROADCAST_S
                            else set(cmds))
        if ran:
            self._observe_latency(w)
            self.steps += 1
        nxt = min(_or_inf(self.engine.next_event_time()), self._trace_next())
        if not math.isfinite(nxt):
            return PACED_MAX_WAIT_S
        return min(PACED_MAX_WAIT_S, max(0.0, (nxt + lag - self.clock.now()) / self.clock.speed))

    def _observe_latency(self, w: float) -> None:
        d = time.perf_counter() - w
        self.latencies.add(d)
        self.metrics.latency.observe(d)

    def _broadcast(self, cmds: dict[Session, list], sync: bool, only: set[Session] | None = None) -> None:
        """Send each connected agent its commands and the clock; in lockstep, expect every Ack."""
        if sync:
            self._step += 1
        upd = self.clock.update(self._step if sync else 0)
        n = 0
        for s in self.sessions.values():
            if not s.connected or (only is not None and s not in only):
                continue
            s.outbox.put_nowait(apb.ConnectResponse(commands=cmds.get(s, ()), clock=upd))
            n += 1
            if sync:
                self._pending_acks.add(s)
        self._count_sent(n)
        self._last_clock_broadcast = time.monotonic()

    def _count_sent(self, n: int) -> None:
        self.metrics.sent.inc(n)

    # -------------------------------------------------------- decisions -> commands

    def _collect(self) -> dict[Session, list]:
        """Turn the engine's new decisions into per-agent commands: stops first, then starts in
        launch order. Compares what the agents were told with what the engine now runs, so a job
        launched and preempted within one pass costs nothing on the wire."""
        dec = self.engine.decisions
        if self._dec_idx == len(dec):
            return {}
        new = dec[self._dec_idx:]
        self._dec_idx = len(dec)
        last: dict[str, tuple[int, str, float]] = {}
        migrated: set[str] = set()
        for i, d in enumerate(new):
            self._account(d)
            last[d.job_id] = (i, d.kind, d.time)
            if d.kind == "migrate":
                migrated.add(d.job_id)
        out: dict[Session, list] = defaultdict(list)
        starts = []
        jobs = self.engine.jobs
        for job_id, (i, kind, t) in last.items():
            job = jobs[job_id]
            cur = self.placed.get(job_id)
            running = job.status is JobStatus.RUNNING
            if cur is not None and running and cur.token == job.completion_token:
                continue
            if cur is not None:
                del self.placed[job_id]
                if running and job_id in migrated:
                    pass  # the Migrate command reaches the old agents too
                elif job.status is not JobStatus.COMPLETED:
                    if job.status is JobStatus.PENDING and kind == "preempt":
                        cmd = apb.Command(time_s=t, preempt=apb.Preempt(job_id=job_id, checkpoint=True))
                    else:
                        cmd = apb.Command(time_s=t, kill=apb.Kill(job_id=job_id, reason=kind))
                    for s in cur.sessions:
                        if s.connected:
                            out[s].append(cmd)
            if running:
                starts.append((i, job_id, cur if job_id in migrated else None))
        starts.sort()
        names = self.engine.node_names
        for _, job_id, old in starts:
            job = jobs[job_id]
            pl = job.placement
            self._launch_seq += 1
            end = self.engine.expected_end(job)
            launch = apb.Launch(
                job_id=job_id, launch_id=self._launch_seq,
                slots=[apb.GpuSlots(node=names[n], gpus=slots) for n, slots in pl.gpus],
                gpu_milli=job.spec.gpu_milli, remaining_s=job.remaining_s, overhead_s=job.overhead_s,
                slowdown=pl.slowdown, end_s=end, duration_s=job.spec.duration_s or 0.0)
            targets: list[Session] = []
            for n, _ in pl.gpus:
                s = self.node_owner.get(names[n])
                if s is None:
                    log.error("job %s placed on %s, which has no agent", job_id, names[n])
                elif s not in targets:
                    targets.append(s)
            # The launch time is the job's, not the engine's now: a paced tick may cover several
            # event times, and the agent computes the end from it.
            t = job.last_start_s
            if old is not None:
                cmd = apb.Command(time_s=t, migrate=apb.Migrate(target=launch))
                for s in old.sessions:
                    if s.connected and s not in targets:
                        out[s].append(cmd)
            else:
                cmd = apb.Command(time_s=t, launch=launch)
            for s in targets:
                out[s].append(cmd)
                if end < s.bound:
                    s.bound = end
            self.placed[job_id] = Placed(self._launch_seq, job.completion_token, tuple(targets), t, end)
        return out

    def _account(self, d: Decision) -> None:
        """Metrics, journal and watchers for one decision."""
        job = self.engine.jobs[d.job_id]
        vc = job.spec.vc
        m = self.metrics
        kind = d.kind
        if kind == "launch":
            m.vc(m.started, vc).inc()
            if d.job_id not in self._started_ids:
                self._started_ids.add(d.job_id)
                m.queueing.observe(d.time - job.spec.submit_s)
        elif kind == "complete":
            m.vc(m.completed, vc).inc()
            m.jct.observe(d.time - job.spec.submit_s)
            self._ended(job)
        elif kind == "preempt":
            m.vc(m.preempted, vc).inc()
        elif kind == "migrate":
            m.vc(m.migrated, vc).inc()
        elif kind == "requeue":
            m.vc(m.requeued, vc).inc()
        elif kind == "cancel":
            m.vc(m.cancelled, vc).inc()
            self._ended(job)
        elif kind == "fail":
            m.vc(m.failed, vc).inc()
            self._ended(job)
        if m.kueue is not None:
            m.kueue.on_decision(d, job)
        if self.watchers:
            self._publish(kind, d.job_id, d.nodes, "", d.time)

    def _ended(self, job: JobRun) -> None:
        self._terminal += 1
        self.placed.pop(job.job_id, None)
        rec = self.recorder.rows.get(job.job_id)
        self.journal.ended(job.job_id, job.status.value, rec or {"job_id": job.job_id, "status": job.status.value})

    def _publish(self, kind: str, job_id: str, nodes: Sequence[str], message: str, t: float | None = None) -> None:
        if not self.watchers:
            return
        from analysim._protos.v1 import scheduler_pb2 as spb
        from scheduler_svc.contract import value

        ev = spb.Event(time_s=self.engine.now if t is None else t, kind=value(spb.EventKind, kind), job_id=job_id,
                       nodes=nodes, message=message)
        for q in list(self.watchers):
            if q.qsize() >= q.maxsize - 1 and q.maxsize > 0:
                self.watchers.remove(q)  # too slow: cut it off rather than buffer without bound
                q.put_nowait(None)
            else:
                q.put_nowait(ev)

    # ------------------------------------------------------------------ the end

    @property
    def replay_done(self) -> bool:
        return (self.started and self._cursor >= len(self.trace_jobs) and not self._unresumed
                and self._terminal >= len(self.engine.jobs))

    def _check_done(self) -> None:
        if self.done or not self.replay_done or self._finishing:
            return
        self._finishing = True
        self.wall_done = time.monotonic()
        self.commit()
        asyncio.get_running_loop().create_task(self._finish())

    async def _finish(self) -> None:
        summary = build_summary(self)
        if self._fidelity is not None:
            summary["fidelity"] = self._fidelity  # the trace's offline run does not change
        elif self.offline_check and self.offline_input:
            self._watchdog_paused = True  # the comparison holds the GIL for a while
            try:
                summary["fidelity"] = self._fidelity = await asyncio.to_thread(fidelity, self)
            finally:
                for s in self.sessions.values():
                    s.last_seen = time.monotonic()
                self._watchdog_paused = False
        if self.events is not None:
            self.events.pending()
            self.events.close(ok=True)
            self.events = None
        if self.out is not None:
            from analysim.report import write_run

            try:
                await asyncio.to_thread(write_run, self.out, summary, self.recorder.jobs, self.recorder.timeseries(),
                                        self.plots)
            except Exception as e:  # noqa: BLE001 — whatever the writer raises, the run still ends
                self.out_error = f"cannot write the run's end to --out {self.out}: {e}"
                log.error("%s; the run is done without it, and takes no more jobs", self.out_error)
                summary["out_error"] = self.out_error
        self.summary = summary
        self.done = True
        self._publish("done", "", (), f"{summary['jobs_completed']} completed")
        log.info("replay done: %d jobs completed, %d failed, %d cancelled in %.1f s wall (x%.0f)",
                 summary["jobs_completed"], summary["jobs_failed"], summary["jobs_cancelled"],
                 summary["wall_s"], summary["live"]["speedup"])

    # ------------------------------------------------------------------ queries

    def job_record(self, job_id: str) -> dict | None:
        """A job's state as a dict (JobInfo's fields), or None if unknown."""
        job = self.engine.jobs.get(job_id)
        if job is None and job_id in self._unresumed:
            s = self._unresumed[job_id]
            return {"job_id": job_id, "status": "pending", "vc": s.vc, "user": s.user, "num_gpus": s.num_gpus,
                    "gpu_milli": s.gpu_milli, "duration_s": s.duration_s, "submit_s": s.submit_s,
                    "source": self.source.get(job_id, "")}
        if job is None:
            rec = self.restored.get(job_id)
            if rec is None:
                return None
            return {**rec, "source": self.source.get(job_id, ""), "nodes": [n for n in rec.get("nodes", "").split("|") if n]}
        s = job.spec
        nodes = job.placement.nodes if job.placement else (job.placements_seen[-1] if job.placements_seen else ())
        names = self.engine.node_names
        return {
            "job_id": s.job_id, "status": job.status.value, "vc": s.vc, "user": s.user, "num_gpus": s.num_gpus,
            "gpu_milli": s.gpu_milli, "duration_s": s.duration_s or 0.0, "submit_s": s.submit_s,
            "first_start_s": job.first_start_s, "end_s": job.end_s, "nodes": [names[n] for n in nodes],
            "preemptions": job.preemptions, "migrations": job.migrations, "restarts": job.restarts,
            "source": self.source.get(job_id, ""),
        }

    def explain(self, job_id: str) -> dict | None:
        """Why a job is where it is now (ExplainJobResponse's fields): for a pending one, the reason
        it is not admitted (analysim.events.why_pending); None if the engine does not know it."""
        job = self.engine.jobs.get(job_id)
        if job is None:
            return None
        reason = detail = ""
        if job.status is JobStatus.PENDING:
            reason, detail = why_pending(self.engine, job)
        return {"status": job.status.value, "time_s": self.engine.now, "reason": reason, "detail": detail,
                "queue": queue_in(kueue_state(self.engine), job.spec.vc)}

    def counts(self) -> dict[str, int]:
        c: dict[str, int] = defaultdict(int)
        for job in self.engine.jobs.values():
            c[job.status.value] += 1
        for rec in self.restored.values():
            c[rec.get("status", "completed")] += 1
        c["pending"] += len(self._unresumed)
        return c


def _or_inf(t: float | None) -> float:
    return INF if t is None else t


