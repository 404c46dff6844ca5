"""An agent flooding the scheduler with bad reports in one message (100,000 reports of jobs it
does not run, one report repeated 20,000 times, telemetry for 5,000 nodes it does not hold):
every report is counted, none multiplies into the scheduler's log (rate-limited per source,
the lines left out counted in analysim_log_lines_suppressed_total)."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc

from analysim._protos.v1 import agent_pb2 as apb
from analysim._protos.v1 import agent_pb2_grpc as apb_grpc
from analysim.tokens import bearer
from tests.polling import scaled
from tests.test_live_helpers import live, sample_sum, scrape, wait_until

NODES = [f"node-{i:04d}" for i in range(4)]


def test_a_flood_of_bad_reports_is_counted_not_logged(tmp_path: Path) -> None:
    with live(tmp_path, ["--jobs", "0"], "4x8", 4, agents=0) as (run, client):
        md = bearer(run.token("agent-0"))
        with grpc.insecure_channel(run.target, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
            stub = apb_grpc.AgentServiceStub(ch)
            reg = stub.Register(apb.RegisterRequest(agent_id="agent-0", nodes=[
                apb.NodeInfo(name=n, rack="rack-00", gpu_model="V100", gpus=8) for n in NODES]), timeout=10, metadata=md)
            finished = apb.JobEvent.KIND_FINISHED
            flood = apb.ConnectRequest(events=[
                *(apb.JobEvent(kind=finished, job_id=f"no-such-job-{i:06d}", launch_id=i, time_s=1.0) for i in range(100_000)),
                *(apb.JobEvent(kind=finished, job_id="again", launch_id=7, time_s=1.0) for _ in range(20_000)),
            ], heartbeat=apb.Heartbeat(nodes=[apb.NodeTelemetry(node=f"elsewhere-{i}") for i in range(5_000)]))
            assert flood.ByteSize() > 3_000_000
            stop = threading.Event()

            def requests():  # noqa: ANN202
                yield apb.ConnectRequest(session_id=reg.session_id)
                yield flood
                stop.wait(scaled(60))

            call = stub.Connect(requests(), metadata=md)
            try:
                def ignored(reason: str) -> float:
                    return sample_sum(scrape(run.scheduler.info["host"], run.scheduler.info["metrics"])
                                      ["analysim_agent_reports_ignored"], "analysim_agent_reports_ignored_total",
                                      reason=reason)  # fmt: skip

                wait_until(lambda: ignored("unknown_job") == 100_001, 60, "every bad report counted")
                assert ignored("duplicate") == 19_999
                assert ignored("oversized_heartbeat") == 1
                metrics = scrape(run.scheduler.info["host"], run.scheduler.info["metrics"])
                left_out = sample_sum(metrics["analysim_log_lines_suppressed"], "analysim_log_lines_suppressed_total",
                                      source="agent-0")  # fmt: skip
            finally:
                stop.set()
                call.cancel()
        log = run.scheduler.log.read_text()
    lines = [line for line in log.splitlines() if "agent-0" in line]
    assert len(lines) <= 60, len(lines)
    assert len(log) < 20_000, len(log)
    assert left_out >= 100_000 - 60
