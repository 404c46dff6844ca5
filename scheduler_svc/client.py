"""A small synchronous Python client for the scheduler service.

    with SchedulerClient("127.0.0.1:50051") as c:
        job = c.submit(num_gpus=4, duration_s=3600, vc="ee9e8c")  # a VC of the cluster's
        print(c.get_job(job.job_id).status, c.cluster_state().clock.time_s)

Methods return the message an RPC's response wraps (a Job, a ClusterState, a ClockState).
Errors are ``grpc.RpcError`` (e.g. INVALID_ARGUMENT with the server's message in ``details()``
and an ErrorInfo/BadRequest in its rich status: ``analysim.rpc_status.refusal_of(e)``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from analysim._protos.v1 import scheduler_pb2 as spb
from analysim._protos.v1 import scheduler_pb2_grpc as spb_grpc
from analysim.rpc_status import refusal_of
from analysim.tls import TlsFiles, secure_channel
from analysim.tokens import bearer
from scheduler_svc.contract import summary_dict, value

# While a run's end is being written out the scheduler refuses submissions with UNAVAILABLE and
# reason "writing_out": nothing was done, retry shortly. The client retries that refusal alone
# (not a transport failure, e.g. a TLS mismatch, which must surface at once), so callers don't
# each need a loop.
WRITING_OUT_RETRIES = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)


class NotServing(TimeoutError):
    """The scheduler did not answer its health check: why, in one line (the last RpcError)."""

    def __init__(self, target: str, last: grpc.RpcError | None, after_s: float | None = None) -> None:
        when = f"after {after_s:g} s" if after_s is not None else "(waiting would not help)"
        why = f": {last.code().name}: {last.details()}" if last is not None else ""
        super().__init__(f"scheduler at {target} not serving {when}{why}")
        self.last = last  # the last health check's error; None when none was made


def _final(e: grpc.RpcError) -> bool:
    """A refusal of this client's TLS, not a server still starting: a handshake that failed
    (gRPC's message for it, or the certificate error OpenSSL names)."""
    details = (e.details() or "").lower()
    return e.code() == grpc.StatusCode.UNAVAILABLE and any(
        w in details for w in ("handshake failed", "certificate_verify_failed", "certificate verify failed",
                               "ssl_error", "tlsv1 alert", "verification check failed"))


class SchedulerClient:
    def __init__(self, target: str, timeout_s: float = 10.0, token: str | None = None,
                 tls: TlsFiles | None = None, deadline_scale: float = 1.0) -> None:
        self.target = target  # host:port of the scheduler's gRPC server
        # How many times longer than on a quiet machine things take where this client runs:
        # every call's timeout and every wait's deadline is stretched by it (tests measure it).
        self.deadline_scale = deadline_scale
        self.timeout_s = timeout_s * deadline_scale  # each call's deadline, wall seconds
        self.channel = secure_channel(target, tls or TlsFiles())  # one channel for every call
        self.stub = spb_grpc.SchedulerServiceStub(self.channel)  # SchedulerService over it
        self.md = bearer(token)  # the call metadata carrying the token (empty without one)

    def __enter__(self) -> SchedulerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def wait_ready(self, deadline_s: float = 30.0) -> None:
        """Until the health service says SERVING; else NotServing naming the last error, at
        once when that error cannot pass by waiting (a TLS handshake refused)."""
        stub = health_pb2_grpc.HealthStub(self.channel)
        deadline_s *= self.deadline_scale
        end = time.monotonic() + deadline_s
        last: grpc.RpcError | None = None
        while True:
            try:
                r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError as e:
                last = e
                if _final(e):
                    raise NotServing(self.target, e) from None
            if time.monotonic() > end:
                raise NotServing(self.target, last, deadline_s)
            time.sleep(0.05)

    def submit(self, num_gpus: int, duration_s: float, *, job_id: str = "", vc: str = "", user: str = "",
               gpu_milli: int = 0, gpu_models: Sequence[str] = (), cpu_milli: int = 0,
               memory_mib: int = 0) -> spb.Job:
        req = spb.SubmitJobRequest(job_id=job_id, num_gpus=num_gpus, gpu_milli=gpu_milli, duration_s=duration_s, vc=vc,
                             user=user, gpu_models=list(gpu_models), cpu_milli=cpu_milli, memory_mib=memory_mib)
        for pause in WRITING_OUT_RETRIES:
            try:
                return self.stub.SubmitJob(req, timeout=self.timeout_s, metadata=self.md).job
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or refusal_of(e)["code"] != "writing_out":
                    raise
            time.sleep(pause)
        return self.stub.SubmitJob(req, timeout=self.timeout_s, metadata=self.md).job

    def cancel(self, job_id: str) -> spb.Job:
        return self.stub.CancelJob(spb.CancelJobRequest(job_id=job_id), timeout=self.timeout_s, metadata=self.md).job

    def get_job(self, job_id: str) -> spb.Job:
        return self.stub.GetJob(spb.GetJobRequest(job_id=job_id), timeout=self.timeout_s, metadata=self.md).job

    def explain(self, job_id: str) -> spb.ExplainJobResponse:
        """Why a job is where it is now (a pending one: the reason it is not admitted)."""
        return self.stub.ExplainJob(spb.ExplainJobRequest(job_id=job_id), timeout=self.timeout_s, metadata=self.md)

    def list_jobs(self, status: str = "", vc: str = "", limit: int = 100, offset: int = 0) -> spb.ListJobsResponse:
        """``status``: a word ("pending", "running"...) or "" for all."""
        req = spb.ListJobsRequest(status=value(spb.JobStatus, status), vc=vc, limit=limit, offset=offset)
        return self.stub.ListJobs(req, timeout=self.timeout_s, metadata=self.md)

    def cluster_state(self, nodes: bool = False, queue_limit: int = 20) -> spb.ClusterState:
        return self.stub.GetClusterState(spb.GetClusterStateRequest(nodes=nodes, queue_limit=queue_limit),
                                         timeout=self.timeout_s, metadata=self.md).state

    def watch(self, kinds: Sequence[str] = ()) -> Iterator[spb.WatchEventsResponse]:
        """Events as they happen (an endless iterator of responses, each with an ``event``;
        cancel it with ``.cancel()``). ``kinds``: words ("launch", "complete"...), empty: all."""
        req = spb.WatchEventsRequest(kinds=[value(spb.EventKind, k) for k in kinds])
        return self.stub.WatchEvents(req, metadata=self.md)

    def pause(self) -> spb.ClockState:
        return self.stub.Pause(spb.PauseRequest(), timeout=self.timeout_s, metadata=self.md).clock

    def resume(self) -> spb.ClockState:
        return self.stub.Resume(spb.ResumeRequest(), timeout=self.timeout_s, metadata=self.md).clock

    def set_speed(self, speed: float | None) -> spb.ClockState:
        """A number: paced; None: lockstep (``--speed max``)."""
        req = spb.SetSpeedRequest(max=True) if speed is None else spb.SetSpeedRequest(speed=speed)
        return self.stub.SetSpeed(req, timeout=self.timeout_s, metadata=self.md).clock

    def summary(self) -> tuple[bool, dict]:
        r = self.stub.GetSummary(spb.GetSummaryRequest(), timeout=max(self.timeout_s, 60.0), metadata=self.md)
        return r.done, summary_dict(r.summary)

    def wait_done(self, deadline_s: float, poll_s: float = 0.1) -> dict:
        """Until the replay is done; its summary (or TimeoutError)."""
        deadline_s *= self.deadline_scale
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.cluster_state(queue_limit=1).replay_done:
                return self.summary()[1]
            time.sleep(poll_s)
        raise TimeoutError(f"replay not done after {deadline_s:g} s")
