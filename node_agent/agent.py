"""A node agent: N fake nodes in one process, one stream to the scheduler.

Jobs are not run, they are timed: a Launch says when the job starts (virtual time), how much
work is left, the restore/migration overhead and the slowdown of its placement, and the agent
computes ``end = start + overhead + remaining * slowdown`` — the simulation core's own formula
and float arithmetic, which is what makes a lockstep replay identical to ``analysim simulate``.
A multi-node job spanning several agents is reported finished by the agent holding its first
node (its leader) only; the others just free their GPUs at the same time.

Clock: in lockstep the agent's time moves only with the scheduler's clock updates, each one
answered by an Ack with the completions up to that time and its lookahead (the earliest end
still pending). Paced, it extrapolates ``t0 + speed x (wall - w0)`` from the last update and
reports each completion as soon as its own clock passes it, with the completion's virtual time.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
import time
from dataclasses import dataclass, field

import grpc

from analysim._protos.v1 import agent_pb2 as apb
from analysim._protos.v1 import agent_pb2_grpc as apb_grpc
from analysim.core.cluster import NodeSpec
from analysim.core.job import GPU_MILLI
from analysim.tls import TlsFiles, secure_channel
from analysim.tokens import bearer
from node_agent.telemetry import gpu_sample, unit

log = logging.getLogger("node_agent")
INF = math.inf


class FatalError(Exception):
    """The scheduler refused us for good (e.g. our nodes are not its nodes)."""


@dataclass(slots=True)
class FakeJob:
    job_id: str
    launch_id: int
    mine: list[tuple[str, tuple[int, ...]]]  # (node, GPU slots) on this agent
    gpu_milli: int
    start_s: float
    end_s: float
    duration_s: float
    remaining_s: float
    leader: bool
    launch: apb.Launch  # as given: reported again when the agent registers anew
    fails: bool = False  # ends in a failure at end_s instead of completing


@dataclass
class Clock:
    t0: float = 0.0
    w0: float = field(default_factory=time.monotonic)
    speed: float = 1.0
    lockstep: bool = True
    paused: bool = False

    def now(self) -> float:
        if self.lockstep or self.paused:
            return self.t0
        return self.t0 + self.speed * (time.monotonic() - self.w0)


class Agent:
    def __init__(self, agent_id: str, nodes: list[NodeSpec], seed: int = 0, fail_rate: float = 0.0) -> None:
        self.agent_id, self.nodes, self.seed, self.fail_rate = agent_id, nodes, seed, fail_rate
        self.node_by_name = {n.name: n for n in nodes}
        self.clock = Clock()
        self.jobs: dict[str, FakeJob] = {}
        self.heap: list[tuple[float, int, str]] = []
        self.used: dict[str, list[int]] = {}
        self.gpu_job: dict[str, list[str]] = {}
        self.connected = False
        self.sent = 0
        self.received = 0
        self.completed = 0
        self.anomalies = 0
        self._started: list[apb.JobEvent] = []
        # Ends not yet durable at the scheduler (after its ClockUpdate.durable_s): reported again
        # to a restarted scheduler, so that none is lost with it.
        self.ended: list[apb.RunningJob] = []
        self.reset()

    def reset(self) -> None:
        """Nothing running. (A new session does not reset: the jobs are reported in the Register,
        and the scheduler resumes them or sends Kill commands.)"""
        self.jobs.clear()
        self.heap.clear()
        self._started = []
        self.used = {n.name: [0] * n.gpus for n in self.nodes}
        self.gpu_job = {n.name: [""] * n.gpus for n in self.nodes}

    # ------------------------------------------------------------- commands

    def handle(self, msg: apb.ConnectResponse) -> apb.ConnectRequest | None:
        """Apply a message from the scheduler; return what to send back (if anything)."""
        self.received += 1
        for cmd in msg.commands:
            which = cmd.WhichOneof("kind")
            if which == "launch":
                self._start(cmd.launch, cmd.time_s)
            elif which == "preempt":
                self._stop(cmd.preempt.job_id, cmd.time_s)
            elif which == "kill":
                self._stop(cmd.kill.job_id, cmd.time_s)
            elif which == "migrate":
                self._stop(cmd.migrate.target.job_id, cmd.time_s)
                if any(s.node in self.node_by_name for s in cmd.migrate.target.slots):
                    self._start(cmd.migrate.target, cmd.time_s)
        events, self._started = self._started, []
        ack = None
        if msg.HasField("clock"):
            c = msg.clock
            if self.ended and self.ended[0].end_s < c.durable_s:
                self.ended = [e for e in self.ended if e.end_s >= c.durable_s]
            self.clock.t0, self.clock.w0 = c.time_s, time.monotonic()
            self.clock.speed, self.clock.lockstep, self.clock.paused = c.speed or 1.0, c.lockstep, c.paused
            events += self.due(self.clock.now())
            if c.lockstep and c.step:
                ack = apb.Ack(step=c.step, time_s=c.time_s, lookahead_s=self.lookahead())
        if ack is None and not events:
            return None
        return apb.ConnectRequest(events=events, ack=ack)

    def _start(self, la: apb.Launch, t: float) -> None:
        mine = [(s.node, tuple(s.gpus)) for s in la.slots if s.node in self.node_by_name]
        if not mine:
            log.warning("launch of %s names none of my nodes; ignored", la.job_id)
            self.anomalies += 1
            return
        if la.job_id in self.jobs:
            self._stop(la.job_id, t)
        # The simulation core's formula, the same floats: identical end times.
        end = t + la.overhead_s + la.remaining_s * la.slowdown
        if end != la.end_s and la.end_s:
            log.warning("job %s: computed end %.6f differs from the scheduler's %.6f", la.job_id, end, la.end_s)
        fails = False
        if self.fail_rate > 0 and unit(self.seed, la.job_id, la.launch_id) < self.fail_rate:
            # Injected fault, the same on every agent holding a part of the job (same seed): it
            # fails part-way through this run.
            fails = True
            end = t + (end - t) * unit(self.seed, la.job_id, la.launch_id, "at")
        job = FakeJob(la.job_id, la.launch_id, mine, la.gpu_milli or GPU_MILLI, t, end, la.duration_s,
                      la.remaining_s, leader=la.slots[0].node in self.node_by_name, launch=la, fails=fails)
        for node, gpus in mine:
            used, owners = self.used[node], self.gpu_job[node]
            for g in gpus:
                if g >= len(used):
                    log.warning("job %s: GPU %d of %s does not exist", la.job_id, g, node)
                    self.anomalies += 1
                    continue
                used[g] += job.gpu_milli
                if used[g] > GPU_MILLI:
                    log.warning("GPU %d of %s over-allocated by job %s", g, node, la.job_id)
                    self.anomalies += 1
                if not owners[g]:
                    owners[g] = la.job_id
        self.jobs[la.job_id] = job
        heapq.heappush(self.heap, (end, la.launch_id, la.job_id))
        if job.leader:
            self._started.append(apb.JobEvent(kind=apb.JobEvent.KIND_STARTED, job_id=la.job_id, launch_id=la.launch_id,
                                              time_s=t))

    def _stop(self, job_id: str, t: float) -> FakeJob | None:
        job = self.jobs.pop(job_id, None)
        if job is None:
            return None
        for node, gpus in job.mine:
            used, owners = self.used[node], self.gpu_job[node]
            for g in gpus:
                if g < len(used):
                    used[g] = max(0, used[g] - job.gpu_milli)
                    if owners[g] == job_id:
                        owners[g] = ""
        return job  # heap entry goes stale: skipped by launch id

    def due(self, upto: float) -> list[apb.JobEvent]:
        """Jobs whose end has come, removed; FINISHED events for those this agent leads."""
        out = []
        heap = self.heap
        while heap and heap[0][0] <= upto:
            end, lid, job_id = heapq.heappop(heap)
            job = self.jobs.get(job_id)
            if job is None or job.launch_id != lid:
                continue
            self._stop(job_id, end)
            if job.leader:
                self.ended.append(apb.RunningJob(launch=job.launch, start_s=job.start_s, end_s=end, failed=job.fails))
            if job.leader and job.fails:
                out.append(apb.JobEvent(kind=apb.JobEvent.KIND_FAILED, job_id=job_id, launch_id=lid, time_s=end,
                                        message="injected failure (--fail-rate)"))
            elif job.leader:
                self.completed += 1
                out.append(apb.JobEvent(kind=apb.JobEvent.KIND_FINISHED, job_id=job_id, launch_id=lid, time_s=end))
        return out

    def lookahead(self) -> float:
        heap = self.heap
        while heap:
            end, lid, job_id = heap[0]
            job = self.jobs.get(job_id)
            if job is not None and job.launch_id == lid:
                return end
            heapq.heappop(heap)
        return INF

    # ------------------------------------------------------------ telemetry

    def gpu_states(self, node: NodeSpec, t: float) -> list[apb.GpuState]:
        out = []
        used, owners = self.used[node.name], self.gpu_job[node.name]
        for g in range(node.gpus):
            util, mem, total, power, temp = gpu_sample(self.seed, node.name, g, node.gpu_model, owners[g],
                                                       min(used[g], GPU_MILLI) / GPU_MILLI, t)
            out.append(apb.GpuState(index=g, utilization=util, memory_used_bytes=mem, memory_total_bytes=total,
                                    power_watts=power, temperature_celsius=temp, health=apb.GPU_HEALTH_OK,
                                    job_id=owners[g]))
        return out

    def heartbeat(self) -> apb.Heartbeat:
        t = self.clock.now()
        return apb.Heartbeat(virtual_time_s=t, nodes=[apb.NodeTelemetry(node=n.name, gpus=self.gpu_states(n, t))
                                                      for n in self.nodes])

    def register_request(self) -> apb.RegisterRequest:
        return apb.RegisterRequest(agent_id=self.agent_id, nodes=[
            apb.NodeInfo(name=n.name, rack=n.rack, gpu_model=n.gpu_model, gpus=n.gpus, cpu_milli=n.cpu_milli,
                         memory_mib=n.memory_mib) for n in self.nodes],
            running=[*(apb.RunningJob(launch=j.launch, start_s=j.start_s) for j in self.jobs.values()), *self.ended])

    def hold_clock(self) -> None:
        """No scheduler: virtual time stands still here until one says otherwise, so that the
        jobs keep their progress and none ends unreported."""
        self.clock.t0, self.clock.w0 = self.clock.now(), time.monotonic()
        self.clock.paused = True


class Connection:
    """Registers, holds the stream, answers the scheduler, sends heartbeats; reconnects."""

    def __init__(self, agent: Agent, target: str, connect_timeout_s: float = 60.0, token: str | None = None,
                 tls: TlsFiles | None = None) -> None:
        self.agent, self.target, self.connect_timeout_s = agent, target, connect_timeout_s
        self.metadata = bearer(token)
        self.tls = tls or TlsFiles()
        self._lock = asyncio.Lock()
        self._call = None
        self._timer: asyncio.TimerHandle | None = None
        self._broken = False  # this session's stream failed under a write: read() then sees it cancelled
        self.sessions = 0

    async def _send(self, msg: apb.ConnectRequest) -> None:
        call = self._call
        if call is None:
            return
        try:
            async with self._lock:  # grpc.aio allows one write at a time
                await call.write(msg)
        except (grpc.RpcError, asyncio.InvalidStateError, grpc.aio.UsageError) as e:
            # The stream is over under us: e.g. we were stalled (SIGSTOP, a VM pause) past the
            # heartbeat deadline and the scheduler closed it while we still held its clock
            # updates. End the session; run() registers anew.
            if self._call is call:
                log.info("agent %s: stream to %s closed while writing (%s); reconnecting", self.agent.agent_id,
                         self.target, type(e).__name__)
                self._broken = True
                call.cancel()
            return
        self.agent.sent += 1

    async def run(self, stop: asyncio.Event) -> None:
        last_ok = time.monotonic()
        backoff = 0.05
        while not stop.is_set():
            try:
                await self._session(stop)
                last_ok = time.monotonic()
                backoff = 0.05
            except FatalError:
                raise
            except (grpc.RpcError, OSError) as e:
                code = e.code() if isinstance(e, grpc.aio.AioRpcError) else None
                if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED,
                            grpc.StatusCode.PERMISSION_DENIED):
                    raise FatalError(f"{code.name}: {e.details()}") from None
                log.info("scheduler at %s not reachable (%s); retrying", self.target,
                         code.name if code else type(e).__name__)
            except Exception as e:  # noqa: BLE001 — any other stream failure: reconnect, never exit
                log.warning("agent %s: session with %s failed (%s: %s); reconnecting", self.agent.agent_id,
                            self.target, type(e).__name__, e)
            finally:
                self.agent.connected = False
                self.agent.hold_clock()
                self._call = None
            if stop.is_set():
                break
            if time.monotonic() - last_ok > self.connect_timeout_s:
                raise FatalError(f"no scheduler at {self.target} for {self.connect_timeout_s:g} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff)
            backoff = min(1.0, backoff * 2)

    async def _session(self, stop: asyncio.Event) -> None:
        agent = self.agent
        async with secure_channel(self.target, self.tls, aio=True) as channel:
            stub = apb_grpc.AgentServiceStub(channel)
            resp = await stub.Register(agent.register_request(), timeout=10, metadata=self.metadata)
            call = stub.Connect(metadata=self.metadata)
            self._call, self._broken = call, False
            await self._send(apb.ConnectRequest(session_id=resp.session_id, heartbeat=agent.heartbeat()))
            agent.connected = True
            self.sessions += 1
            log.info("agent %s: session %d with %s, %d node(s)", agent.agent_id, self.sessions, self.target,
                     len(agent.nodes))
            loop = asyncio.get_running_loop()
            hb = loop.create_task(self._heartbeats(max(0.05, resp.heartbeat_interval.ToTimedelta().total_seconds())))

            async def cancel_on_stop() -> None:
                await stop.wait()
                call.cancel()

            stopper = loop.create_task(cancel_on_stop())
            try:
                while True:
                    try:
                        msg = await call.read()
                    except asyncio.CancelledError:
                        if stop.is_set() or self._broken:
                            return  # stopping, or the stream broke under a write (see _send)
                        raise
                    if msg is grpc.aio.EOF:
                        return
                    reply = agent.handle(msg)
                    if reply is not None:
                        await self._send(reply)
                    self._arm()
            finally:
                hb.cancel()
                stopper.cancel()
                if self._timer is not None:
                    self._timer.cancel()

    async def _heartbeats(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            await self._send(apb.ConnectRequest(heartbeat=self.agent.heartbeat()))

    def _arm(self) -> None:
        """Paced mode: wake up when the earliest pending job ends on our clock."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        c = self.agent.clock
        if c.lockstep or c.paused:
            return
        nxt = self.agent.lookahead()
        if nxt == INF:
            return
        delay = max(0.0, (nxt - c.now()) / c.speed)
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        events = self.agent.due(self.agent.clock.now())
        if events:
            asyncio.get_running_loop().create_task(self._send(apb.ConnectRequest(events=events)))
        self._arm()
