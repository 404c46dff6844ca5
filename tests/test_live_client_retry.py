"""The scheduler answers UNAVAILABLE "retry shortly" (reason writing_out) while a run's end is being
written out: the client retries that refusal, and only that one, instead of every caller looping."""

from __future__ import annotations

from concurrent import futures

import grpc
from grpc_status import rpc_status

from analysim._protos.v1 import scheduler_pb2 as spb
from analysim._protos.v1 import scheduler_pb2_grpc as spb_grpc
from analysim.rpc_status import SCHEDULER_DOMAIN, status_proto
from scheduler_svc.client import SchedulerClient


class BusyThenReady(spb_grpc.SchedulerServiceServicer):
    """A real gRPC server that refuses the first ``busy`` submissions as the scheduler does."""

    def __init__(self, busy: int, reason: str = "writing_out") -> None:
        self.busy, self.reason, self.calls = busy, reason, 0

    def SubmitJob(self, request: spb.SubmitJobRequest, context: grpc.ServicerContext) -> spb.SubmitJobResponse:
        self.calls += 1
        if self.calls <= self.busy:
            context.abort_with_status(rpc_status.to_status(status_proto(
                grpc.StatusCode.UNAVAILABLE, "the run's end is being written out: retry shortly",
                reason=self.reason, domain=SCHEDULER_DOMAIN)))
        return spb.SubmitJobResponse(job=spb.Job(job_id=request.job_id))


def _serve(servicer: BusyThenReady) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(2))
    spb_grpc.add_SchedulerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def test_submit_retries_a_transient_unavailable() -> None:
    servicer = BusyThenReady(busy=2)
    server, port = _serve(servicer)
    try:
        with SchedulerClient(f"127.0.0.1:{port}") as c:
            assert c.submit(num_gpus=1, duration_s=10.0, job_id="c1").job_id == "c1"
        assert servicer.calls == 3
    finally:
        server.stop(None)


def test_retries_are_bounded() -> None:
    servicer = BusyThenReady(busy=100)
    server, port = _serve(servicer)
    try:
        with SchedulerClient(f"127.0.0.1:{port}", timeout_s=60.0) as c:
            try:
                c.submit(num_gpus=1, duration_s=10.0, job_id="c1")
                raise AssertionError("a scheduler that stays busy must be reported")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE
        assert servicer.calls == 8  # the first try and 7 retries over about 6 s
    finally:
        server.stop(None)


def test_other_unavailable_answers_are_not_retried() -> None:
    servicer = BusyThenReady(busy=1, reason="something_else")
    server, port = _serve(servicer)
    try:
        with SchedulerClient(f"127.0.0.1:{port}") as c:
            try:
                c.submit(num_gpus=1, duration_s=10.0, job_id="c1")
                raise AssertionError("only the writing_out refusal is retried")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE
        assert servicer.calls == 1
    finally:
        server.stop(None)
