"""The node agents as the scheduler sees them: their sessions (register, attach, lose, refuse),
which agent holds which node, what they report (job ends and failures, Acks, heartbeats with GPU
telemetry) and the watchdog that loses the silent ones. The agents' side is the only writer of
the sessions, the node owners and the reports waiting for the engine; the steppers take the
reports (``take_reports``), the others read the sessions and owners."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence

from analysim._protos.v1 import agent_pb2 as apb
from analysim.core.cluster import ClusterSpec
from analysim.core.engine import Engine
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.pace import Pace
from scheduler_svc.sessions import Placements, Session, plausible, possible_end
from scheduler_svc.watch import EventFeed

log = logging.getLogger("scheduler_svc")


class Agents:
    """Every agent session of the run and what the agents reported."""

    def __init__(self, cluster: ClusterSpec, engine: Engine, metrics: SchedulerMetrics, pace: Pace,
                 placements: Placements, feed: EventFeed, heartbeat_deadline_s: float,
                 on_all_nodes: Callable[[], None]) -> None:
        self.cluster = cluster  # the nodes agents may register
        self.engine = engine  # the live engine: nodes go up and down in it
        self.metrics = metrics  # the scheduler's counters (messages, reports ignored, agents lost)
        self.pace = pace  # the clock: Acks, the event time, the loop's wake-up
        self.placements = placements  # what the agents were told runs where (reports are checked against it)
        self.feed = feed  # node_up and node_down to the watchers
        self.heartbeat_deadline_s = heartbeat_deadline_s  # wall seconds of silence before an agent is lost
        self.on_all_nodes = on_all_nodes  # called once, when every node first has an agent: the clock starts
        # session id -> session: the registered sessions not lost (connected or about to be).
        self.sessions: dict[str, Session] = {}
        # node name -> the connected session holding it; a node without one is down.
        self.node_owner: dict[str, Session] = {}
        # node name -> its index in the cluster (and the engine).
        self.node_index = {n.name: i for i, n in enumerate(cluster.nodes)}
        self.lost = 0  # connected sessions lost so far
        # Lockstep: when and why the replay stopped being the offline run's (an agent lost), else None.
        self.diverged: dict | None = None
        self.paused = False  # the end's offline comparison holds the GIL: nobody is timed out then
        # Reported ends waiting for the engine: (virtual time, launch id, job id).
        self.completions: list[tuple[float, int, str]] = []
        # Reported failures waiting for the engine: (virtual time, job id, the agent's message).
        self.failures: list[tuple[float, str, str]] = []

    # ------------------------------------------------------------------ sessions

    def connected(self) -> list[Session]:
        return [s for s in self.sessions.values() if s.connected]

    def register(self, agent_id: str, nodes: Sequence[apb.NodeInfo], principal: str = "",
                 running: Sequence[apb.RunningJob] = ()) -> Session:
        """Check an agent's nodes against the cluster (ValueError if wrong); PermissionError if
        another agent token holds the agent id or one of the nodes."""
        names = self._checked_nodes(nodes)
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

    def _checked_nodes(self, nodes: Sequence[apb.NodeInfo]) -> list[str]:
        """The names of an agent's nodes, each the cluster's with its GPUs, none twice."""
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
        return names

    def attach(self, s: Session) -> None:
        """The session's stream is open: its nodes are up."""
        s.connected = True
        s.last_seen = time.monotonic()
        pace = self.pace
        at = pace.event_time()
        for name in s.nodes:
            self.node_owner[name] = s
            if pace.started and not self.engine.state.up[self.node_index[name]]:
                self.engine.node_up(name, at=at)
                self.feed.publish("node_up", "", (name,), f"agent {s.agent_id}")
        kills = []
        if pace.started and s.running:
            # This scheduler requeued them when the agent was lost: they run elsewhere now.
            kills = [apb.Command(time_s=at, kill=apb.Kill(job_id=r.launch.job_id, reason="requeued while away"))
                     for r in s.running if not r.HasField("end_s")]
            s.running = ()
        s.outbox.put_nowait(apb.ConnectResponse(commands=kills, clock=pace.clock.update(0)))
        pace.count_sent(1)
        if not pace.started and len(self.node_owner) == len(self.cluster.nodes):
            self.on_all_nodes()
        pace.wake()

    def refuse(self, s: Session, reason: str, why: str) -> None:
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
        self.pace.forget(s)
        s.outbox.put_nowait(None)  # ends its stream if still open
        if not was_connected:
            return
        self.lost += 1
        self.metrics.agents_lost.inc()
        log.warning("agent %s lost (%s): %d node(s) down", s.agent_id, why, len(s.nodes))
        at = self.pace.event_time()  # one instant for all its nodes: a paced clock moves between calls
        self._note_divergence(s, why, at)
        for name in s.nodes:
            if self.node_owner.get(name) is s:
                del self.node_owner[name]
                if self.pace.started:
                    self.engine.node_down(name, at=at)
                    self.feed.publish("node_down", "", (name,), f"agent {s.agent_id}: {why}")
        self.pace.wake()

    def _note_divergence(self, s: Session, why: str, at: float) -> None:
        if self.pace.clock.lockstep and self.pace.started and self.diverged is None:
            # Its jobs are requeued from their last checkpoint: the schedule is no longer the
            # offline run's from here on (a paced run is not held to it anyway).
            self.diverged = {"at_s": at, "why": f"agent {s.agent_id} lost ({why}); its jobs were requeued"}
            log.warning("the lockstep replay diverges from the offline run from t=%.1f: %s", at, self.diverged["why"])

    async def watchdog(self) -> None:
        """Agents that stop talking for ``heartbeat_deadline_s`` wall seconds are lost."""
        period = min(0.5, self.heartbeat_deadline_s / 4)
        while not self.pace.stopping:
            await asyncio.sleep(period)
            if self.paused:
                continue
            now = time.monotonic()
            for s in list(self.sessions.values()):
                if now - s.last_seen > self.heartbeat_deadline_s:
                    self.lose(s, f"no message for {now - s.last_seen:.1f} s")

    @contextlib.contextmanager
    def watchdog_paused(self) -> Iterator[None]:
        """Nobody is timed out meanwhile; every session counts as heard from at the end."""
        self.paused = True
        try:
            yield
        finally:
            for s in self.sessions.values():
                s.last_seen = time.monotonic()
            self.paused = False

    # ------------------------------------------------------------------ messages

    def on_message(self, s: Session, msg: apb.ConnectRequest) -> None:
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
            self._on_ack(s, msg.ack)
        elif msg.events and not self.pace.clock.lockstep:
            self.pace.wake()

    def _on_ack(self, s: Session, ack: apb.Ack) -> None:
        pace = self.pace
        if not pace.awaits(s, ack.step):
            return
        if not ack.lookahead_s > pace.t_cur:  # NaN too: the next step could never move on
            self.refuse(s, "lookahead_not_ahead", f"lookahead t={ack.lookahead_s:.6g} is not after "
                        f"the step's t={pace.t_cur:.6g}")
            return
        s.bound = ack.lookahead_s
        pace.acked(s)

    def _on_job_event(self, s: Session, ev: apb.JobEvent) -> None:
        p = self.placements.get(ev.job_id)
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
            self.refuse(s, "impossible_end", f"{apb.JobEvent.Kind.Name(ev.kind)} of {ev.job_id[:80]!r} at "
                        f"t={ev.time_s:.6g}, outside its launch's [{p.start_s:.6g}, {p.end_s:.6g}]")
            return
        if ev.kind == apb.JobEvent.KIND_FINISHED:
            self.completions.append((ev.time_s, ev.launch_id, ev.job_id))
            clock = self.pace.clock
            if not clock.lockstep and log.isEnabledFor(logging.DEBUG):
                log.debug("finished %s at %.1f, reported %.1f virtual s later (engine at %.1f)", ev.job_id,
                          ev.time_s, clock.now() - ev.time_s, self.engine.now)
        elif ev.kind == apb.JobEvent.KIND_FAILED:
            self.failures.append((ev.time_s, ev.job_id, ev.message))

    def _on_heartbeat(self, s: Session, hb: apb.Heartbeat) -> None:
        most = 2 * len(s.nodes) + 8  # an agent sends each of its nodes once
        if len(hb.nodes) > most:
            self.metrics.agent_events.labels("oversized_heartbeat").inc()
            log.warning("agent %s sent telemetry for %d nodes, it holds %d; only the first %d read", s.agent_id,
                        len(hb.nodes), len(s.nodes), most, extra={"source": s.agent_id})
        for node in hb.nodes[:most]:
            if self._telemetry_ok(s, node):
                s.telemetry[node.node] = node

    def _telemetry_ok(self, s: Session, node: apb.NodeTelemetry) -> bool:
        """A node's telemetry is of a node the agent holds, and every GPU's state is possible."""
        i = self.node_index.get(node.node)
        if i is None or node.node not in s.nodes:
            self.metrics.agent_events.labels("unknown_node").inc()
            log.warning("agent %s sent telemetry for node %.80r it does not hold; ignored", s.agent_id, node.node,
                        extra={"source": s.agent_id})
            return False
        gpus = self.cluster.nodes[i].gpus
        bad = [g for g in node.gpus if not plausible(g, gpus)]
        if bad:
            self.metrics.agent_events.labels("impossible_gpu_state").inc()
            log.warning("agent %s: impossible GPU state on %s (GPU %d: util %.3g, memory %.3g/%.3g B, "
                        "%.3g W, %.3g C); telemetry ignored", s.agent_id, node.node, bad[0].index,
                        bad[0].utilization, bad[0].memory_used_bytes, bad[0].memory_total_bytes,
                        bad[0].power_watts, bad[0].temperature_celsius, extra={"source": s.agent_id})
            return False
        return True

    def take_running(self) -> dict[str, list[tuple[Session, apb.RunningJob]]]:
        """job id -> each session's report of it: what the agents said they ran when they
        registered (the restart's recovery takes these once; the sessions keep none after)."""
        reports: dict[str, list[tuple[Session, apb.RunningJob]]] = defaultdict(list)
        for s in self.sessions.values():
            for r in s.running:
                # An ended job is reported by its leader only (the others just freed their GPUs).
                if r.HasField("end_s") and (not r.launch.slots or r.launch.slots[0].node not in s.nodes):
                    continue
                reports[r.launch.job_id].append((s, r))
            s.running = ()
        return reports

    def take_reports(self) -> tuple[list[tuple[float, int, str]], list[tuple[float, str, str]]]:
        """The ends and failures reported since the last call, in the order the engine takes them
        (by time; ends then in launch order, as the offline engine pushed them at launch)."""
        if not self.completions and not self.failures:  # (most lockstep steps: a cheap way out)
            return [], []
        comps, fails = sorted(self.completions), sorted(self.failures)
        self.completions.clear()
        self.failures.clear()
        return comps, fails
