"""Agents are checked like clients: a real gRPC client acting as a hostile agent (authenticated
with a real agent token) acknowledges a lockstep step with a lookahead that is not ahead (0, -1,
-inf, NaN), or reports an end before its launch or far past the end the launch gives. Each is
refused: its stream ends with INVALID_ARGUMENT, ``analysim_agents_refused_total{reason}`` counts
it, it is lost (its jobs requeued), and the lockstep replay never waits on it: with a real agent
taking its nodes back, the replay completes."""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from analysim._protos.v1 import agent_pb2 as apb
from analysim._protos.v1 import agent_pb2_grpc as apb_grpc
from analysim.clusters import parse_cluster
from analysim.rpc_status import refusal_of
from analysim.tokens import bearer
from scheduler_svc.launcher import LocalRun
from tests.polling import scaled
from tests.test_live_helpers import local_run, sample_sum, scrape

CLUSTER = "4x8"
# agent-0's slice of the 4 nodes: the first placements go there, so the hostile agent gets launches.
HOSTILE_NODES = ("node-0000", "node-0001")


class HostileAgent:
    """A gRPC client that registers agent-0's nodes with agent-0's token and answers every clock
    update with ``answer(response) -> ConnectRequest``. ``status``: the stream's end."""

    def __init__(self, run: LocalRun, answer: Callable[[apb.ConnectResponse], apb.ConnectRequest]) -> None:
        self.channel = grpc.insecure_channel(run.target)
        stub = apb_grpc.AgentServiceStub(self.channel)
        md = bearer(run.token("agent-0"))
        nodes = {n.name: n for n in parse_cluster(CLUSTER).nodes}
        reg = stub.Register(apb.RegisterRequest(agent_id="agent-0", nodes=[
            apb.NodeInfo(name=n, rack=nodes[n].rack, gpu_model=nodes[n].gpu_model, gpus=nodes[n].gpus)
            for n in HOSTILE_NODES]), timeout=10, metadata=md)
        self.outbox: queue.Queue = queue.Queue()
        self.outbox.put(apb.ConnectRequest(session_id=reg.session_id))
        self.call = stub.Connect(self._requests(), metadata=md)
        self.error: grpc.RpcError | None = None
        self.done = threading.Event()
        self.reader = threading.Thread(target=self._read, args=(answer,), daemon=True)
        self.reader.start()

    def _requests(self) -> Iterator[apb.ConnectRequest]:
        while (msg := self.outbox.get()) is not None:
            yield msg

    def _read(self, answer: Callable[[apb.ConnectResponse], apb.ConnectRequest]) -> None:
        try:
            for resp in self.call:
                if resp.clock.lockstep and resp.clock.step:
                    self.outbox.put(answer(resp))
        except grpc.RpcError as e:
            self.error = e
        finally:
            self.done.set()

    def close(self) -> None:
        self.outbox.put(None)
        self.call.cancel()
        self.channel.close()


def _ack(resp: apb.ConnectResponse, lookahead: float) -> apb.Ack:
    return apb.Ack(step=resp.clock.step, time_s=resp.clock.time_s, lookahead_s=lookahead)


def _refused_then_replay_completes(tmp_path: Path, answer: Callable[[apb.ConnectResponse], apb.ConnectRequest],
                                   reason: str) -> None:
    run = local_run(tmp_path / "procs")
    hostile = None
    try:
        run.provision([n.name for n in parse_cluster(CLUSTER).nodes], 2)
        run.start_scheduler(["--jobs", "40", "--seed", "4", "--no-offline-check", "--cluster", CLUSTER,
                             "--log-level", "WARNING"])
        run.start_agent(1, CLUSTER, 2, 2)
        hostile = HostileAgent(run, answer)
        assert hostile.done.wait(scaled(60)), "the hostile agent's stream still open"
        assert hostile.error is not None and hostile.error.code() == grpc.StatusCode.INVALID_ARGUMENT, hostile.error
        assert refusal_of(hostile.error)["code"] == reason
        host, port = run.scheduler.info["host"], run.scheduler.info["metrics"]
        m = scrape(host, port)
        assert sample_sum(m["analysim_agents_refused"], "analysim_agents_refused_total", reason=reason) == 1
        assert sample_sum(m["analysim_agents_refused"], "analysim_agents_refused_total") == 1
        run.start_agent(0, CLUSTER, 0, 2)  # a real agent takes the nodes back
        with run.client() as client:
            summary = client.wait_done(120)
        assert summary["jobs_completed"] == summary["jobs_total"] == 40, summary
    finally:
        if hostile is not None:
            hostile.close()
        run.stop()
    assert "Traceback" not in run.scheduler.log.read_text(), run.scheduler.tail(40)


@pytest.mark.parametrize("lookahead", [0.0, -1.0, -math.inf, math.nan], ids=["zero", "negative", "-inf", "nan"])
def test_a_lookahead_that_is_not_ahead_is_refused(tmp_path: Path, lookahead: float) -> None:
    def answer(resp: apb.ConnectResponse) -> apb.ConnectRequest:
        # "Not ahead": at or before the step's own time (0 when the step is at 0: one past it then).
        at = lookahead if lookahead != 0.0 else resp.clock.time_s
        return apb.ConnectRequest(ack=_ack(resp, at))

    _refused_then_replay_completes(tmp_path, answer, "lookahead_not_ahead")


@pytest.mark.parametrize("when", ["before_launch", "far_past_end"])
def test_an_end_outside_its_launch_is_refused(tmp_path: Path, when: str) -> None:
    def answer(resp: apb.ConnectResponse) -> apb.ConnectRequest:
        events = []
        for c in resp.commands:
            if c.HasField("launch"):
                la = c.launch
                t = c.time_s - 100.0 if when == "before_launch" else la.end_s + 1e12
                events.append(apb.JobEvent(kind=apb.JobEvent.KIND_FINISHED, job_id=la.job_id, launch_id=la.launch_id,
                                           time_s=t))
        return apb.ConnectRequest(events=events, ack=_ack(resp, math.inf))

    _refused_then_replay_completes(tmp_path, answer, "impossible_end")
