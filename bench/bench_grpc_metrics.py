#!/usr/bin/env python3
"""What the scheduler's gRPC server metrics (scheduler_svc/grpc_metrics.py, an aio server
interceptor) cost per call and per streamed message: a real grpc.aio server on 127.0.0.1 with
a unary method and a bidirectional stream (as an agent's Connect), served without an interceptor, with one that
changes nothing, and with the metrics one, rounds alternated in one run so that the machine's load affects both alike.

    .venv/bin/python bench/bench_grpc_metrics.py [--calls 3000] [--messages 30000] [--rounds 5]
    valgrind --tool=callgrind --callgrind-out-file=/dev/null .venv/bin/python bench/bench_grpc_metrics.py \
        --only metrics --rounds 1 --calls 200 --messages 2000      # instruction counts, per configuration
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scheduler_svc.grpc_metrics import GrpcServerMetrics  # noqa: E402

SERVICE = "bench.Echo"


async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


async def stream(requests, context: grpc.aio.ServicerContext):  # noqa: ANN001, ANN201
    async for r in requests:
        yield r


class PassThrough(grpc.aio.ServerInterceptor):
    """An interceptor that changes nothing: the cost of intercepting at all."""

    async def intercept_service(self, continuation, details):  # noqa: ANN001, ANN201
        return await continuation(details)


async def serve(interceptors: list) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(interceptors=interceptors)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Stream": grpc.stream_stream_rpc_method_handler(stream)})])  # fmt: skip
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def measure(port: int, calls: int, messages: int) -> tuple[float, float]:
    """(seconds per unary call, seconds per streamed message round trip)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.unary_unary(f"/{SERVICE}/Unary")
        await call(b"x")
        t = time.perf_counter()
        for _ in range(calls):
            await call(b"x")
        per_call = (time.perf_counter() - t) / calls
        s = ch.stream_stream(f"/{SERVICE}/Stream")()
        t = time.perf_counter()
        for _ in range(messages):  # lockstep, as a step: one out, one back
            await s.write(b"x")
            await s.read()
        per_msg = (time.perf_counter() - t) / messages
        await s.done_writing()
    return per_call, per_msg


CONFIGS = {"without": lambda: [], "passthru": lambda: [PassThrough()],
           "metrics": lambda: [GrpcServerMetrics(CollectorRegistry())]}


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--messages", type=int, default=30000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", choices=CONFIGS, help="one configuration (e.g. under valgrind --tool=callgrind)")
    args = p.parse_args()
    servers = {k: await serve(make()) for k, make in CONFIGS.items() if args.only in (None, k)}
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in servers}
    for i in range(args.rounds):
        order = list(servers) if i % 2 == 0 else list(reversed(servers))
        for name in order:
            results[name].append(await measure(servers[name][1], args.calls, args.messages))
    for server, _ in servers.values():
        await server.stop(None)
    med = {k: (statistics.median(c for c, _ in v), statistics.median(m for _, m in v)) for k, v in results.items()}
    print(f"{'':8} {'unary call':>12} {'stream msg':>12}   (medians of {args.rounds} rounds)")
    for k, (c, m) in med.items():
        print(f"{k:8} {c * 1e6:10.1f} us {m * 1e6:10.1f} us")
    for k in ("passthru", "metrics") if "without" in med else ():
        print(f"{k}/without {med[k][0] / med['without'][0]:8.3f} {med[k][1] / med['without'][1]:12.3f}")


if __name__ == "__main__":
    asyncio.run(main())
