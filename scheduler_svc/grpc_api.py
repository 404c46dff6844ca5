"""gRPC front end of the scheduler: SchedulerService (clients) and AgentService (node agents)
on one grpc.aio server, with standard health checking and reflection."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from analysim.core.job import GPU_MILLI, JobSpec
from analysim.report import json_safe
from protos.analysim.v1 import agent_pb2 as apb
from protos.analysim.v1 import agent_pb2_grpc as apb_grpc
from protos.analysim.v1 import scheduler_pb2 as spb
from protos.analysim.v1 import scheduler_pb2_grpc as spb_grpc
from scheduler_svc.core import InvalidJob, LiveScheduler
from scheduler_svc.summary import build_summary

log = logging.getLogger("scheduler_svc")
NAN = math.nan
WATCH_BUFFER = 10_000


def job_info(rec: dict) -> spb.JobInfo:
    def num(x: object) -> float:
        return NAN if x is None or x == "" else float(x)

    return spb.JobInfo(
        job_id=rec["job_id"], status=rec.get("status", ""), vc=rec.get("vc", ""), user=rec.get("user", "") or "",
        num_gpus=int(rec.get("num_gpus", 0)), gpu_milli=int(rec.get("gpu_milli", GPU_MILLI)),
        duration_s=num(rec.get("duration_s")), submit_s=num(rec.get("submit_s")),
        first_start_s=num(rec.get("first_start_s")), end_s=num(rec.get("end_s")), nodes=rec.get("nodes", []),
        preemptions=int(rec.get("preemptions", 0)), migrations=int(rec.get("migrations", 0)),
        restarts=int(rec.get("restarts", 0)), source=rec.get("source", ""),
    )


def clock_state(live: LiveScheduler) -> spb.ClockState:
    c = live.clock
    return spb.ClockState(time_s=c.now(), speed=live.achieved_speed() if c.lockstep else c.speed,
                          lockstep=c.lockstep, paused=c.paused, started=live.started,
                          wall_s=(time.monotonic() - live.wall_start) if live.wall_start else 0.0)


class SchedulerServicer(spb_grpc.SchedulerServiceServicer):
    def __init__(self, live: LiveScheduler) -> None:
        self.live = live

    async def SubmitJob(self, request: spb.JobRequest, context: grpc.aio.ServicerContext) -> spb.JobInfo:
        live = self.live
        milli = request.gpu_milli or GPU_MILLI
        job_id = request.job_id or live.next_client_id()
        spec = JobSpec(job_id=job_id, submit_s=live._event_time(), duration_s=request.duration_s,  # noqa: SLF001
                       num_gpus=request.num_gpus, gpu_milli=milli, cpu_milli=request.cpu_milli,
                       memory_mib=request.memory_mib, vc=request.vc or "default", user=request.user,
                       gpu_models=tuple(request.gpu_models))
        try:
            live.submit_client(spec)
        except InvalidJob as e:
            live.metrics.rejected.labels(e.reason).inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except KeyError:
            live.metrics.rejected.labels("duplicate_id").inc()
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"job {job_id!r} already exists")
        return job_info(live.job_record(job_id))

    async def CancelJob(self, request: spb.JobId, context: grpc.aio.ServicerContext) -> spb.JobInfo:
        try:
            self.live.cancel(request.job_id)
        except KeyError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no job {request.job_id!r}")
        return job_info(self.live.job_record(request.job_id))

    async def GetJob(self, request: spb.JobId, context: grpc.aio.ServicerContext) -> spb.JobInfo:
        rec = self.live.job_record(request.job_id)
        if rec is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no job {request.job_id!r}")
        return job_info(rec)

    async def ListJobs(self, request: spb.ListJobsRequest, context: grpc.aio.ServicerContext) -> spb.ListJobsResponse:
        live = self.live
        ids = list(live.restored) + list(live.engine.jobs) + list(live._held)  # noqa: SLF001
        recs = []
        for job_id in ids:
            rec = live.job_record(job_id)
            if request.status and rec["status"] != request.status:
                continue
            if request.vc and rec["vc"] != request.vc:
                continue
            recs.append(rec)
        limit = request.limit or 100
        page = recs[request.offset: request.offset + limit]
        return spb.ListJobsResponse(jobs=[job_info(r) for r in page], total=len(recs))

    async def WatchEvents(self, request: spb.WatchRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[spb.Event]:
        q: asyncio.Queue = asyncio.Queue(WATCH_BUFFER)
        kinds = set(request.kinds)
        self.live.watchers.append(q)
        try:
            # A handshake: from here on, the client misses nothing.
            yield spb.Event(time_s=self.live.clock.now(), kind="watching")
            while True:
                ev = await q.get()
                if ev is None:
                    return
                if not kinds or ev.kind in kinds:
                    yield ev
        finally:
            if q in self.live.watchers:
                self.live.watchers.remove(q)

    async def GetClusterState(self, request: spb.ClusterStateRequest,
                              context: grpc.aio.ServicerContext) -> spb.ClusterState:
        live = self.live
        eng = live.engine
        st = eng.state
        c = live.counts()
        up_mask = [bool(st.up[i]) and live.started and name in live.node_owner
                   for i, name in enumerate(eng.node_names)]
        out = spb.ClusterState(
            clock=clock_state(live), gpus_total=eng.spec.total_gpus, gpus_allocated=eng.allocated_gpus,
            nodes_up=sum(up_mask), nodes_down=len(up_mask) - sum(up_mask), jobs_submitted=sum(c.values()),
            jobs_pending=c["pending"], jobs_running=c["running"], jobs_completed=c["completed"],
            jobs_failed=c["failed"], jobs_cancelled=c["cancelled"], pending_gpu_demand=eng.pending_demand,
            agents=sum(1 for s in live.sessions.values() if s.connected), replay_done=live.done,
            trace_jobs=live.trace_total, policy=eng.policy.name,
        )
        limit = request.queue_limit or 20
        for i, job in enumerate(eng.pending_jobs()):
            if i >= limit:
                break
            out.queue.append(job_info(live.job_record(job.job_id)))
        if request.nodes:
            for i, n in enumerate(eng.spec.nodes):
                owner = live.node_owner.get(n.name)
                f = st.free_milli[i, : n.gpus]
                ns = spb.NodeStatus(name=n.name, rack=n.rack, gpu_model=n.gpu_model, gpus=n.gpus, up=up_mask[i],
                                    agent_id=owner.agent_id if owner else "", free_gpus=float(f.sum()) / GPU_MILLI)
                tel = {g.index: g for g in owner.telemetry.get(n.name, apb.NodeTelemetry()).gpus} if owner else {}
                for g in range(n.gpus):
                    t = tel.get(g)
                    gi = spb.GpuInfo(index=g, allocated=(GPU_MILLI - int(f[g])) / GPU_MILLI)
                    if t is not None:
                        gi.utilization, gi.memory_used_bytes, gi.memory_total_bytes = (
                            t.utilization, t.memory_used_bytes, t.memory_total_bytes)
                        gi.power_watts, gi.temperature_celsius = t.power_watts, t.temperature_celsius
                        gi.health = apb.GpuHealth.Name(t.health)
                    ns.gpu.append(gi)
                out.nodes.append(ns)
        return out

    async def Pause(self, request: spb.ClockRequest, context: grpc.aio.ServicerContext) -> spb.ClockState:
        self.live.pause()
        return clock_state(self.live)

    async def Resume(self, request: spb.ClockRequest, context: grpc.aio.ServicerContext) -> spb.ClockState:
        self.live.resume()
        return clock_state(self.live)

    async def SetSpeed(self, request: spb.SpeedRequest, context: grpc.aio.ServicerContext) -> spb.ClockState:
        if not request.max and not (math.isfinite(request.speed) and 0 < request.speed <= 1e9):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"speed must be a number in (0, 1e9], or max; got {request.speed}")
        self.live.set_speed(None if request.max else request.speed)
        return clock_state(self.live)

    async def GetSummary(self, request: spb.SummaryRequest, context: grpc.aio.ServicerContext) -> spb.SummaryResponse:
        live = self.live
        summary = live.summary if live.done else build_summary(live)
        return spb.SummaryResponse(done=live.done, summary_json=json.dumps(json_safe(summary)))


class AgentServicer(apb_grpc.AgentServiceServicer):
    def __init__(self, live: LiveScheduler) -> None:
        self.live = live

    async def Register(self, request: apb.RegisterRequest, context: grpc.aio.ServicerContext) -> apb.RegisterResponse:
        if not request.agent_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "agent_id is required")
        try:
            s = self.live.register(request.agent_id, request.nodes)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        log.info("agent %s registered %d node(s)", request.agent_id, len(request.nodes))
        return apb.RegisterResponse(session_id=s.session_id, clock=self.live.clock.update(0),
                                    heartbeat_interval_s=self.live.heartbeat_deadline_s / 4)

    async def Connect(self, request_iterator: AsyncIterator[apb.AgentMessage],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[apb.SchedulerMessage]:
        live = self.live
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        s = live.sessions.get(first.session_id)
        if s is None or s.connected or s.lost:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "unknown or already connected session: call Register first")
        live.attach(s)
        live.on_agent_message(s, first)
        why = ["stream closed"]

        async def read() -> None:
            try:
                async for msg in request_iterator:
                    live.on_agent_message(s, msg)
            except (grpc.RpcError, asyncio.CancelledError) as e:
                why[0] = f"stream error: {e!r}"[:200]
            finally:
                live.lose(s, why[0])

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while True:
                msg = await s.outbox.get()
                if msg is None:
                    return
                yield msg
        finally:
            reader.cancel()
            live.lose(s, why[0])


def build_server(live: LiveScheduler) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
    server = grpc.aio.server(interceptors=[live.metrics.grpc_server],
                             options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    spb_grpc.add_SchedulerServiceServicer_to_server(SchedulerServicer(live), server)
    apb_grpc.add_AgentServiceServicer_to_server(AgentServicer(live), server)
    hs = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    names = (
        spb.DESCRIPTOR.services_by_name["SchedulerService"].full_name,
        apb.DESCRIPTOR.services_by_name["AgentService"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    )
    reflection.enable_server_reflection(names, server)
    return server, hs


async def set_serving(hs: health.aio.HealthServicer, serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ("", "analysim.v1.SchedulerService", "analysim.v1.AgentService"):
        await hs.set(name, status)
