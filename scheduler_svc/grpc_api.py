"""gRPC front end of the scheduler: SchedulerService (clients) and AgentService (node agents)
on one grpc.aio server, with standard health checking and reflection."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import NoReturn

import grpc
from google.protobuf import duration_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from analysim import rpc_status
from analysim._protos.v1 import agent_pb2 as apb
from analysim._protos.v1 import agent_pb2_grpc as apb_grpc
from analysim._protos.v1 import scheduler_pb2 as spb
from analysim._protos.v1 import scheduler_pb2_grpc as spb_grpc
from analysim.core.job import GPU_MILLI, JobSpec
from analysim.grpc_decode import MalformedRequestGuard
from analysim.grpc_reflection import SERVICE_NAMES as REFLECTION_NAMES
from analysim.grpc_reflection import add_reflection
from analysim.report import json_safe
from scheduler_svc import bounds
from scheduler_svc.auth import Authenticator, AuthInterceptor
from scheduler_svc.contract import job_proto, summary_struct, value, word
from scheduler_svc.core import LiveScheduler
from scheduler_svc.intake import InvalidJob, default_vc
from scheduler_svc.journal import JournalUnavailable
from scheduler_svc.read_model import LiveView, RunQueries
from scheduler_svc.summary import build_summary

log = logging.getLogger("scheduler_svc")
WATCH_BUFFER = 10_000


async def refuse(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str, reason: str,
                 field: str | None = None) -> NoReturn:
    """End a call with a rich status: ErrorInfo(reason) and, with a field, a BadRequest."""
    await rpc_status.abort(context, code, message, reason=reason, domain=rpc_status.SCHEDULER_DOMAIN, field=field)


async def _check_id(context: grpc.aio.ServicerContext, field: str, value: str) -> None:
    """INVALID_ARGUMENT for an id out of its bound (never echoed back whole)."""
    problem = bounds.id_problem(field, value)
    if problem is not None:
        await refuse(context, grpc.StatusCode.INVALID_ARGUMENT, problem, "out_of_bounds", field=field)


# The SubmitJobRequest field an engine refusal is about, when its message does not start with it.
_REASON_FIELD = {"unknown_vc": "vc", "unknown_gpu_model": "gpu_models", "larger_than_cluster": "num_gpus",
                 "no_local_queue": "vc", "larger_than_queue_quota": "num_gpus"}


def _job_field(message: str, reason: str) -> str | None:
    """Which request field a refused job is about: the bounds and most engine messages start
    with its name ("num_gpus must be ...")."""
    first = message.split()[0].rstrip(":") if message else ""
    if first in spb.SubmitJobRequest.DESCRIPTOR.fields_by_name:
        return first
    return _REASON_FIELD.get(reason)


def clock_state(live: LiveView) -> spb.ClockState:
    c = live.clock
    out = spb.ClockState(time_s=c.now(), speed=live.achieved_speed() if c.lockstep else c.speed,
                         lockstep=c.lockstep, paused=c.paused, started=live.started)
    if live.wall_start:
        out.wall_elapsed.FromTimedelta(timedelta(seconds=time.monotonic() - live.wall_start))
    return out


class SchedulerServicer(spb_grpc.SchedulerServiceServicer):
    """Clients' calls: submissions, cancellations and the clock's controls go to the scheduler's
    parts; queries read its read model."""

    def __init__(self, live: LiveScheduler) -> None:
        self.live = live  # the scheduler (its intake and clock controls)
        self.view: RunQueries = live.view  # what the queries read

    async def SubmitJob(self, request: spb.SubmitJobRequest,
                        context: grpc.aio.ServicerContext) -> spb.SubmitJobResponse:
        live, view = self.live, self.view
        r = request
        problem = bounds.job_problem(r.job_id, r.num_gpus, r.gpu_milli, r.duration_s, r.vc, r.user,
                                     r.gpu_models, r.cpu_milli, r.memory_mib)
        if problem is not None:
            live.metrics.rejected.labels("out_of_bounds").inc()
            await refuse(context, grpc.StatusCode.INVALID_ARGUMENT, problem, "out_of_bounds",
                         field=_job_field(problem, "out_of_bounds"))
        if live.end.out_error is not None:
            await refuse(context, grpc.StatusCode.FAILED_PRECONDITION, f"the run has ended, but {live.end.out_error}; it "
                         "takes no more jobs: restart it with a writable --out", "out_unwritable")
        if live.end.writing_out:
            await refuse(context, grpc.StatusCode.UNAVAILABLE, "the run's end is being written out: retry shortly",
                         "writing_out")
        milli = request.gpu_milli or GPU_MILLI
        job_id = request.job_id or live.intake.next_client_id()
        spec = JobSpec(job_id=job_id, submit_s=live.pace.event_time(), duration_s=request.duration_s,
                       num_gpus=request.num_gpus, gpu_milli=milli, cpu_milli=request.cpu_milli,
                       memory_mib=request.memory_mib, vc=request.vc or default_vc(live.cluster), user=request.user,
                       gpu_models=tuple(request.gpu_models))
        try:
            live.intake.submit(spec)
        except JournalUnavailable as e:
            # Not recorded, not in the engine: the client may retry the same id once it is.
            live.metrics.rejected.labels(e.reason).inc()
            code = grpc.StatusCode.RESOURCE_EXHAUSTED if e.reason == "disk_full" else grpc.StatusCode.UNAVAILABLE
            await refuse(context, code, f"the scheduler's journal cannot be written ({'disk full' if e.reason == 'disk_full' else 'I/O error'}): "
                         "submissions are refused until it can; nothing was recorded", f"journal_{e.reason}")
        except InvalidJob as e:
            live.metrics.rejected.labels(e.reason).inc()
            await refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(e), e.reason, field=_job_field(str(e), e.reason))
        except KeyError:
            live.metrics.rejected.labels("duplicate_id").inc()
            what = "a job of the trace" if job_id in live.intake.trace_ids else "a job"
            await refuse(context, grpc.StatusCode.ALREADY_EXISTS, f"job {job_id!r} already exists ({what})",
                         "duplicate_id", field="job_id")
        return spb.SubmitJobResponse(job=job_proto(view.job_record(job_id)))

    async def CancelJob(self, request: spb.CancelJobRequest,
                        context: grpc.aio.ServicerContext) -> spb.CancelJobResponse:
        await _check_id(context, "job_id", request.job_id)
        try:
            self.live.intake.cancel(request.job_id)
        except KeyError:
            await refuse(context, grpc.StatusCode.NOT_FOUND, f"no job {request.job_id!r}", "unknown_job")
        return spb.CancelJobResponse(job=job_proto(self.view.job_record(request.job_id)))

    async def GetJob(self, request: spb.GetJobRequest, context: grpc.aio.ServicerContext) -> spb.GetJobResponse:
        await _check_id(context, "job_id", request.job_id)
        rec = self.view.job_record(request.job_id)
        if rec is None:
            await refuse(context, grpc.StatusCode.NOT_FOUND, f"no job {request.job_id!r}", "unknown_job")
        return spb.GetJobResponse(job=job_proto(rec))

    async def ListJobs(self, request: spb.ListJobsRequest, context: grpc.aio.ServicerContext) -> spb.ListJobsResponse:
        view = self.view
        if request.limit > bounds.LIST_LIMIT_MAX:
            await refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                         f"limit must be at most {bounds.LIST_LIMIT_MAX}, got {request.limit}", "out_of_bounds",
                         field="limit")
        if request.status not in spb.JobStatus.values():
            await refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"status {request.status} is not a JobStatus",
                         "out_of_bounds", field="status")
        if (problem := bounds.text_problem("vc", request.vc)) is not None:
            await refuse(context, grpc.StatusCode.INVALID_ARGUMENT, problem, "out_of_bounds", field="vc")
        status = word(spb.JobStatus, request.status)
        ids = view.job_ids()
        recs = []
        for job_id in ids:
            rec = view.job_record(job_id)
            if status and rec["status"] != status:
                continue
            if request.vc and rec["vc"] != request.vc:
                continue
            recs.append(rec)
        limit = request.limit or 100
        page = recs[request.offset: request.offset + limit]
        return spb.ListJobsResponse(jobs=[job_proto(r) for r in page], total=len(recs))

    async def WatchEvents(self, request: spb.WatchEventsRequest,
                          context: grpc.aio.ServicerContext) -> AsyncIterator[spb.WatchEventsResponse]:
        if len(request.kinds) > bounds.WATCH_KINDS_MAX:
            await refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"at most {bounds.WATCH_KINDS_MAX} kinds",
                         "out_of_bounds", field="kinds")
        q: asyncio.Queue = asyncio.Queue(WATCH_BUFFER)
        kinds = set(request.kinds)
        watchers = self.live.feed.watchers
        watchers.append(q)
        try:
            # A handshake: from here on, the client misses nothing.
            yield spb.WatchEventsResponse(event=spb.Event(time_s=self.view.clock.now(),
                                                          kind=spb.EVENT_KIND_WATCHING))
            while True:
                ev = await q.get()
                if ev is None:
                    return
                if not kinds or ev.kind in kinds:
                    yield spb.WatchEventsResponse(event=ev)
        finally:
            if q in watchers:
                watchers.remove(q)

    async def GetClusterState(self, request: spb.GetClusterStateRequest,
                              context: grpc.aio.ServicerContext) -> spb.GetClusterStateResponse:
        live = self.view
        eng = live.engine
        st = eng.state
        c = live.counts()
        up_mask = [bool(st.up[i]) and live.started and live.agent_of(name) is not None
                   for i, name in enumerate(eng.node_names)]
        out = spb.ClusterState(
            clock=clock_state(live), gpus_total=eng.spec.total_gpus, gpus_allocated=eng.allocated_gpus,
            nodes_up=sum(up_mask), nodes_down=len(up_mask) - sum(up_mask), jobs_submitted=sum(c.values()),
            jobs_pending=c["pending"], jobs_running=c["running"], jobs_completed=c["completed"],
            jobs_failed=c["failed"], jobs_cancelled=c["cancelled"], pending_gpu_demand=eng.pending_demand,
            agents=live.agents_connected(), replay_done=live.done,
            trace_jobs=live.trace_total, policy=eng.policy.name,
        )
        limit = request.queue_limit or 20
        for i, job in enumerate(eng.pending_jobs()):
            if i >= limit:
                break
            out.queue.append(job_proto(live.job_record(job.job_id)))
        if request.nodes:
            for i, n in enumerate(eng.spec.nodes):
                owner = live.agent_of(n.name)
                f = st.free_milli[i, : n.gpus]
                ns = spb.NodeStatus(name=n.name, rack=n.rack, gpu_model=n.gpu_model, gpus=n.gpus, up=up_mask[i],
                                    agent_id=owner.agent_id if owner else "", free_gpus=float(f.sum()) / GPU_MILLI)
                tel = {g.index: g for g in owner.telemetry.get(n.name, apb.NodeTelemetry()).gpus} if owner else {}
                for g in range(n.gpus):
                    gi = spb.GpuInfo(index=g, allocated=(GPU_MILLI - int(f[g])) / GPU_MILLI)
                    if g in tel:
                        gi.telemetry.CopyFrom(tel[g])
                    ns.gpu.append(gi)
                out.nodes.append(ns)
        return spb.GetClusterStateResponse(state=out)

    async def Pause(self, request: spb.PauseRequest, context: grpc.aio.ServicerContext) -> spb.PauseResponse:
        self.live.pause()
        return spb.PauseResponse(clock=clock_state(self.view))

    async def Resume(self, request: spb.ResumeRequest, context: grpc.aio.ServicerContext) -> spb.ResumeResponse:
        self.live.resume()
        return spb.ResumeResponse(clock=clock_state(self.view))

    async def SetSpeed(self, request: spb.SetSpeedRequest, context: grpc.aio.ServicerContext) -> spb.SetSpeedResponse:
        lockstep = request.WhichOneof("pace") == "max" and request.max
        if not lockstep and not (math.isfinite(request.speed) and 0 < request.speed <= 1e9):
            await refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                         f"speed must be a number in (0, 1e9], or max; got {request.speed}", "out_of_bounds",
                         field="speed")
        self.live.set_speed(None if lockstep else request.speed)
        return spb.SetSpeedResponse(clock=clock_state(self.view))

    async def GetSummary(self, request: spb.GetSummaryRequest,
                         context: grpc.aio.ServicerContext) -> spb.GetSummaryResponse:
        live = self.view
        summary = live.summary if live.done else build_summary(live)
        return spb.GetSummaryResponse(done=live.done, summary=summary_struct(json_safe(summary)))


    async def ExplainJob(self, request: spb.ExplainJobRequest,
                         context: grpc.aio.ServicerContext) -> spb.ExplainJobResponse:
        await _check_id(context, "job_id", request.job_id)
        got = self.view.explain(request.job_id)
        if got is None:
            known = self.view.job_record(request.job_id) is not None
            await refuse(context, grpc.StatusCode.NOT_FOUND,
                         f"job {request.job_id!r} has ended and left the engine" if known else f"no job {request.job_id!r}",
                         "unknown_job")
        return spb.ExplainJobResponse(status=value(spb.JobStatus, got["status"]), time_s=got["time_s"],
                                      reason=got["reason"], detail=got["detail"], queue=got["queue"])

class AgentServicer(apb_grpc.AgentServiceServicer):
    """Node agents' calls, to the scheduler's agents part."""

    def __init__(self, live: LiveScheduler, auth: Authenticator) -> None:
        self.agents = live.agents  # the sessions the calls open, feed and end
        self.metrics = live.metrics  # refused registrations are counted
        self.auth = auth  # who may register which nodes

    def _principal(self, context: grpc.aio.ServicerContext) -> str:
        """Which agent token made the call ("" without authentication)."""
        if not self.auth.enabled:
            return ""
        who = self.auth.identify(context.invocation_metadata())
        return who.name if who is not None else ""

    async def Register(self, request: apb.RegisterRequest, context: grpc.aio.ServicerContext) -> apb.RegisterResponse:
        await _check_id(context, "agent_id", request.agent_id)
        if len(request.nodes) > bounds.AGENT_NODES_MAX:
            await refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"at most {bounds.AGENT_NODES_MAX} nodes",
                         "out_of_bounds", field="nodes")
        if self.auth.enabled:
            who = self.auth.identify(context.invocation_metadata())
            # Nodes the cluster does not have are INVALID_ARGUMENT below; these are someone else's.
            names = {n.name for n in request.nodes if n.name in self.agents.node_index}
            foreign = sorted(names - who.nodes) if who.nodes is not None else []
            if foreign:
                self.metrics.refused_calls.labels("foreign_node").inc()
                log.warning("agent token %s tried to register node(s) %s it was not given", who.name,
                            ", ".join(foreign[:5]))
                await refuse(context, grpc.StatusCode.PERMISSION_DENIED,
                             f"this agent token may not register node {foreign[0]!r}", "foreign_node", field="nodes")
        try:
            s = self.agents.register(request.agent_id, request.nodes, principal=self._principal(context),
                                   running=request.running)
        except PermissionError as e:
            await refuse(context, grpc.StatusCode.PERMISSION_DENIED, str(e), "agent_conflict")
        except ValueError as e:
            await refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(e), "invalid_nodes", field="nodes")
        log.info("agent %s registered %d node(s)", request.agent_id, len(request.nodes))
        interval = duration_pb2.Duration()
        interval.FromTimedelta(timedelta(seconds=self.agents.heartbeat_deadline_s / 4))
        return apb.RegisterResponse(session_id=s.session_id, clock=self.agents.pace.clock.update(0),
                                    heartbeat_interval=interval)

    async def Connect(self, request_iterator: AsyncIterator[apb.ConnectRequest],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[apb.ConnectResponse]:
        agents = self.agents
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        s = agents.sessions.get(first.session_id)
        if s is None or s.connected or s.lost or s.principal != self._principal(context):
            await refuse(context, grpc.StatusCode.FAILED_PRECONDITION,
                         "unknown or already connected session: call Register first", "unknown_session")
        agents.attach(s)
        agents.on_message(s, first)
        why = ["stream closed"]

        async def read() -> None:
            try:
                async for msg in request_iterator:
                    agents.on_message(s, msg)
            except (grpc.RpcError, asyncio.CancelledError) as e:
                why[0] = f"stream error: {e!r}"[:200]
            finally:
                agents.lose(s, why[0])

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while True:
                msg = await s.outbox.get()
                if msg is None:
                    if s.refused is not None:
                        await refuse(context, grpc.StatusCode.INVALID_ARGUMENT, s.refused[1], s.refused[0])
                    return
                yield msg
        except asyncio.CancelledError:
            # The server stopping cancels the streams still open: the stream ends here, the agent
            # lost as below. (Raised on, gRPC logs it as an unhandled exception with a traceback.)
            why[0] = "scheduler stopping"
        finally:
            reader.cancel()
            agents.lose(s, why[0])


def build_server(live: LiveScheduler, auth: Authenticator) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
    # Metrics outermost: a call the auth interceptor refuses is still counted, by its status code.
    interceptors = [live.metrics.grpc_server]
    if auth.enabled:
        interceptors.append(AuthInterceptor(auth, lambda why: live.metrics.refused_calls.labels(why).inc()))
    interceptors.append(MalformedRequestGuard(rpc_status.SCHEDULER_DOMAIN))  # innermost: after authentication
    # No SO_REUSEPORT: a second scheduler on the same port fails to bind instead of sharing the
    # clients with this one.
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", bounds.MESSAGE_MAX_BYTES),
                                      ("grpc.so_reuseport", 0)],
                             interceptors=interceptors)
    spb_grpc.add_SchedulerServiceServicer_to_server(SchedulerServicer(live), server)
    apb_grpc.add_AgentServiceServicer_to_server(AgentServicer(live, auth), server)
    hs = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    names = (
        spb.DESCRIPTOR.services_by_name["SchedulerService"].full_name,
        apb.DESCRIPTOR.services_by_name["AgentService"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        *REFLECTION_NAMES,
    )
    add_reflection(server, reflection.aio.ReflectionServicer(names))
    return server, hs


async def set_serving(hs: health.aio.HealthServicer, serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ("", "analysim.v1.SchedulerService", "analysim.v1.AgentService"):
        await hs.set(name, status)
