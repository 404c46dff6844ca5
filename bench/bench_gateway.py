#!/usr/bin/env python3
"""Benchmark the MLaaS gateway: rows/s and p50/p99 latency for single-row requests and
100-row batches, over HTTP and gRPC, from loopback clients in a separate process.

The gateway runs as its own process (``python -m mlaas_monitor gateway``) over a fresh
store holding a German-credit tree; this process is the client (closed loop, N concurrent
in-flight requests on keep-alive connections). After the run, the ledger is checked
against the rows the client saw answered.

    .venv/bin/python bench/bench_gateway.py --duration 10 --concurrency 8

Scenarios (--scenarios, comma-separated): http-1, http-100 (REST, rows per request),
grpc-1, grpc-100 (gRPC; batches as PackedRows), grpcrows-100 (gRPC, repeated Row),
grpcstream-1, grpcstream-100 (PredictStream: one stream per client, PackedRows), and
grpchealth-1 (the gRPC health check: grpc.aio's own floor, for reference). --pin pins the
gateway to CPU 0 and the client to CPU 1; --profile FILE runs the gateway under cProfile.

--workers N runs `analysim gateway --workers N` (N processes on the same ports; N > 1 needs a
PostgreSQL store). --db postgresql://... puts the store in that (empty) database;
--temp-postgres starts a throwaway PostgreSQL cluster (tests/pg.py, PostgreSQL's default
durability: fsync on, synchronous_commit on) and also reports the database's CPU per request.

--load h2load drives the same scenarios with nghttp2's h2load (C; HTTP/1.1 for REST, HTTP/2
for gRPC; Debian package nghttp2-client) instead of the Python clients, which on 2 cores
take CPU from the gateway they measure. h2load repeats one request body per scenario and
cannot read gRPC status trailers, so every answer is checked through the ledger instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import platform
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mlaas_monitor.datasets import load_dataset  # noqa: E402
from mlaas_monitor.schema import NUMERIC  # noqa: E402
from mlaas_monitor.store import Store  # noqa: E402
from mlaas_monitor.training import train_model  # noqa: E402

GERMAN = ROOT.parent / "shared" / "datasets" / "german.data"


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())
        if proc.poll() is not None:
            raise SystemExit(f"gateway exited with {proc.returncode}")
        time.sleep(0.02)
    raise SystemExit("gateway did not start")


def client_rows(dataset: str, model_id: str, db: str) -> tuple[list[list], object]:
    ds = load_dataset(dataset)
    model = train_model(ds, model_id, max_leaf_nodes=26, seed=0)
    store = Store(db)
    store.add_model(model)
    store.close()
    kinds = [f.kind for f in model.schema.features]
    rows = [[float(v) if k == NUMERIC else v for v, k in zip(r, kinds, strict=True)] for r in ds.data]
    return rows, model


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu(pids: list[int]) -> float:
    """CPU seconds of these processes and all their descendants (those alive now)."""
    from tests.procs import descendants

    total = 0.0
    for pid in {p for root in pids for p in (root, *descendants(root))}:
        with contextlib.suppress(OSError, IndexError, ValueError):  # exited meanwhile
            total += cpu_seconds(pid)
    return total


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def summarise(name: str, latencies: list[float], rows_per_req: int, elapsed: float, errors: int) -> dict:
    lat = np.array(latencies) * 1000
    n = len(latencies)
    return {
        "scenario": name,
        "requests": n,
        "errors": errors,
        "req_per_s": n / elapsed,
        "rows_per_s": n * rows_per_req / elapsed,
        "p50_ms": float(np.percentile(lat, 50)) if n else None,
        "p99_ms": float(np.percentile(lat, 99)) if n else None,
    }


async def answered(reader: asyncio.StreamReader) -> bool:
    """Read one HTTP/1.1 response: whether it is a 200 with predictions. The body is not
    parsed, so that the client spends its CPU on load rather than on JSON."""
    head = await reader.readuntil(b"\r\n\r\n")
    k = head.lower().find(b"content-length:")
    data = await reader.readexactly(int(head[k + 15 : head.find(b"\r\n", k)]))
    return head.startswith(b"HTTP/1.1 200") and data.startswith(b'{"predictions":[')


async def run_http(url: str, key: str, model: str, batches: list[list], duration: float, conc: int) -> tuple:
    """Closed-loop keep-alive HTTP/1.1 clients, one connection each. Hand-rolled on asyncio
    streams because a full client library costs more CPU per request than the gateway
    does, and the client would be what we measure."""
    host, port = url.removeprefix("http://").split(":")
    requests = []
    sizes = [len(b) for b in batches]
    for b in batches:
        body = json.dumps({"rows": b}).encode()
        requests.append(
            f"POST /v1/models/{model}/predict HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        )
    latencies: list[float] = []
    errors = 0
    answered_rows = 0
    end = time.perf_counter() + duration

    async def worker(i: int) -> None:
        nonlocal errors, answered_rows
        reader, writer = await asyncio.open_connection(host, int(port))
        j = i
        while time.perf_counter() < end:
            req, size = requests[j % len(requests)], sizes[j % len(requests)]
            j += conc
            t0 = time.perf_counter()
            writer.write(req)
            # A 200 answers every row of the request (or none).
            if await answered(reader):
                latencies.append(time.perf_counter() - t0)
                answered_rows += size
            else:
                errors += 1
        writer.close()
        await writer.wait_closed()

    start = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(conc)))
    elapsed = time.perf_counter() - start
    return latencies, elapsed, errors, answered_rows


async def run_grpc(
    target: str, key: str, model: str, batches: list[list], duration: float, conc: int, form: str = "rows"
) -> tuple:
    import grpc

    from analysim._protos.v1 import prediction_pb2 as pb
    from analysim._protos.v1 import prediction_pb2_grpc as pb_grpc

    def value(v: object) -> pb.Value:
        return pb.Value(text=v) if isinstance(v, str) else pb.Value(number=v)

    def packed(b: list[list]) -> pb.PredictRequest:
        nums = [v for r in b for v in r if not isinstance(v, str)]
        cats = [v for r in b for v in r if isinstance(v, str)]
        return pb.PredictRequest(model_id=model, packed=pb.PackedRows(n_rows=len(b), numbers=nums, categories=cats))

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    check = health_pb2.HealthCheckRequest()
    if form in ("packed", "stream"):
        reqs = [packed(b) for b in batches]
    else:
        reqs = [pb.PredictRequest(model_id=model, rows=[pb.Row(values=[value(v) for v in r]) for r in b]) for b in batches]
    md = (("authorization", f"Bearer {key}"),)
    latencies: list[float] = []
    errors = 0
    answered_rows = 0
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.PredictionServiceStub(channel)
        # grpchealth: the floor of grpc.aio itself on this machine, a trivial RPC on the same server.
        health_stub = health_pb2_grpc.HealthStub(channel)
        end = time.perf_counter() + duration

        async def stream_worker(i: int) -> None:
            # One PredictStream per worker, one request in flight on it (closed loop).
            nonlocal errors, answered_rows
            call = stub.PredictStream(metadata=md)
            j = i
            while time.perf_counter() < end:
                req = reqs[j % len(reqs)]
                j += conc
                t0 = time.perf_counter()
                await call.write(pb.PredictStreamRequest(request=req))
                resp = await call.read()
                if resp.HasField("answer"):
                    latencies.append(time.perf_counter() - t0)
                    answered_rows += len(resp.answer.predictions)
                else:
                    errors += 1
            await call.done_writing()
            while await call.read() is not grpc.aio.EOF:
                pass

        async def worker(i: int) -> None:
            nonlocal errors, answered_rows
            if form.startswith("stream"):
                return await stream_worker(i)
            j = i
            while time.perf_counter() < end:
                req = reqs[j % len(reqs)]
                j += conc
                t0 = time.perf_counter()
                try:
                    if form == "health":
                        await health_stub.Check(check)
                        latencies.append(time.perf_counter() - t0)
                        continue
                    resp = await stub.Predict(req, metadata=md)
                except grpc.aio.AioRpcError:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - t0)
                answered_rows += len(resp.predictions)

        start = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(conc)))
        elapsed = time.perf_counter() - start
    return latencies, elapsed, errors, answered_rows


def grpc_frame(message: bytes) -> bytes:
    """A gRPC length-prefixed message (uncompressed), the body of a unary call."""
    return b"\0" + len(message).to_bytes(4, "big") + message


def h2load_body(proto: str, model: str, batch: list[list]) -> tuple[bytes, str, list[str]]:
    """(body, path, extra headers) of one request of a scenario."""
    from grpc_health.v1 import health_pb2

    from analysim._protos.v1 import prediction_pb2 as pb

    if proto == "http":
        return json.dumps({"rows": batch}).encode(), f"/v1/models/{model}/predict", ["content-type: application/json"]
    grpc_headers = ["content-type: application/grpc", "te: trailers"]
    if proto == "grpchealth":
        return grpc_frame(health_pb2.HealthCheckRequest().SerializeToString()), "/grpc.health.v1.Health/Check", grpc_headers
    if proto == "grpcrows":
        values = [[pb.Value(text=v) if isinstance(v, str) else pb.Value(number=v) for v in r] for r in batch]
        req = pb.PredictRequest(model_id=model, rows=[pb.Row(values=v) for v in values])
    else:
        nums = [v for r in batch for v in r if not isinstance(v, str)]
        cats = [v for r in batch for v in r if isinstance(v, str)]
        req = pb.PredictRequest(model_id=model, packed=pb.PackedRows(n_rows=len(batch), numbers=nums, categories=cats))
    return grpc_frame(req.SerializeToString()), "/analysim.v1.PredictionService/Predict", grpc_headers


def run_h2load(base: str, key: str, proto: str, body: tuple[bytes, str, list[str]], rows: int, requests: int,
               conc: int) -> tuple:  # fmt: skip
    """One h2load run of ``requests`` requests: closed loop, ``conc`` connections with one
    request in flight each. By count, not by time: a timed run abandons the requests in
    flight at its end, which the gateway still answers and charges."""
    data, path, headers = body
    with tempfile.TemporaryDirectory() as tmp:
        body_file, log_file = Path(tmp) / "body", Path(tmp) / "log"
        body_file.write_bytes(data)
        cmd = ["h2load", "-c", str(conc), "-m", "1", "-n", str(requests),
               "-d", str(body_file), "--log-file", str(log_file), "-H", f"authorization: Bearer {key}"]  # fmt: skip
        for h in headers:
            cmd += ["-H", h]
        if proto == "http":
            cmd.append("--h1")
        out = subprocess.run([*cmd, base + path], capture_output=True, text=True, check=True).stdout
        latencies, errors = [], 0
        for line in log_file.read_text().splitlines():
            _, status, micros = line.split("\t")
            if status == "200":
                latencies.append(int(micros) / 1e6)
            else:
                errors += 1
    elapsed_text = out.split("finished in ", 1)[1].split(",", 1)[0]  # "9.00s", "180.85ms"
    elapsed = float(elapsed_text.rstrip("ms")) / (1000 if elapsed_text.endswith("ms") else 1)
    done = int(out.split(" started, ", 1)[1].split(" done", 1)[0])
    assert done == len(latencies) + errors, out
    # gRPC answers 200 even for a refused call (the status is in the trailers): the ledger
    # check after the run catches any that were not answered.
    return latencies, elapsed, errors, len(latencies) * rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per scenario")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, default=8, help="in-flight requests")
    ap.add_argument("--dataset", default=str(GERMAN))
    ap.add_argument("--scenarios", default="http-1,http-100,grpc-1,grpc-100,grpcrows-100")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--pin", action="store_true", help="pin the gateway to CPU 0 and this client to CPU 1")
    ap.add_argument("--profile", type=Path, help="run the gateway under cProfile, writing its stats here")
    ap.add_argument("--load", choices=["python", "h2load"], default="python", help="the load generator")
    ap.add_argument("--workers", type=int, default=1, help="gateway worker processes (more than 1 needs PostgreSQL)")
    store_arg = ap.add_mutually_exclusive_group()
    store_arg.add_argument("--db", help="the store: an empty PostgreSQL database's URL (default: a SQLite file)")
    store_arg.add_argument("--temp-postgres", action="store_true",
                           help="the store in a throwaway PostgreSQL cluster (fsync on), whose CPU is measured too")
    args = ap.parse_args()
    if args.load == "h2load" and shutil.which("h2load") is None:
        raise SystemExit("--load h2load needs h2load on PATH (Debian: apt install nghttp2-client)")

    cluster = None
    if args.temp_postgres:
        from tests.pg import PgCluster

        cluster = PgCluster(durable=True).start()
    try:
        return run(args, cluster)
    finally:
        if cluster is not None:
            cluster.remove()


def run(args: argparse.Namespace, cluster: object) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        db = cluster.new_database() if cluster is not None else (args.db or str(Path(tmp) / "bench.db"))
        db_pids = [cluster.postmaster_pid()] if cluster is not None else []
        rows, _ = client_rows(args.dataset, "bench", db)
        store = Store(db)
        charged_before = store.ledger_totals()[1]
        store.close()
        admin = secrets.token_urlsafe(24)
        env = {**os.environ, "ANALYSIM_ADMIN_KEY": admin}
        port_file = Path(tmp) / "ports.json"
        proc = subprocess.Popen(
            [sys.executable, *(["-m", "cProfile", "-o", str(args.profile.resolve())] if args.profile else []),
             "-m", "mlaas_monitor", "gateway", "--db", str(db), "--port", "0", "--grpc-port", "0",
             "--port-file", str(port_file), "--no-monitor", "--workers", str(args.workers)],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        if args.pin:
            os.sched_setaffinity(proc.pid, {0})
            os.sched_setaffinity(0, {1})
        try:
            ports = wait_for(port_file, proc, timeout=120)
            server_pids = [proc.pid]  # with its workers (and their supervisor) under --workers
            url, target = f"http://127.0.0.1:{ports['http']}", f"127.0.0.1:{ports['grpc']}"
            import urllib.request

            req = urllib.request.Request(
                f"{url}/v1/admin/users", data=b'{"name": "bench"}', headers={"Authorization": f"Bearer {admin}"}
            )
            key = json.loads(urllib.request.urlopen(req).read())["api_key"]
            results = []
            total_rows = 0
            for scenario in args.scenarios.split(","):
                proto, size = scenario.split("-")
                n = int(size)
                batches = [rows[i : i + n] for i in range(0, len(rows) - n + 1, n)] if n > 1 else [[r] for r in rows]
                dest = url if proto == "http" else target
                if args.load == "h2load" and proto == "grpcstream":
                    raise SystemExit("--load h2load cannot drive grpcstream scenarios (h2load sends one message per call)")
                if args.load == "h2load":
                    body = h2load_body(proto, "bench", batches[0])
                    base = url if proto == "http" else f"http://{target}"
                    runner = functools.partial(run_h2load, base, key, proto, body, 0 if proto == "grpchealth" else n)
                    w = runner(100 * args.concurrency, args.concurrency)
                    requests = max(100, round(len(w[0]) / w[1] * args.duration))  # about --duration s
                    server_cpu0, client_cpu0, db_cpu0 = tree_cpu(server_pids), children_cpu(), tree_cpu(db_pids)
                    lat, elapsed, errors, answered = runner(requests, args.concurrency)
                    server_cpu, client_cpu = tree_cpu(server_pids) - server_cpu0, children_cpu() - client_cpu0
                    db_cpu = tree_cpu(db_pids) - db_cpu0
                elif proto == "http":
                    runner = run_http
                else:
                    # grpc-N sends PackedRows (the batch form), grpcrows-N repeated Row messages,
                    # grpchealth-1 the health check (a reference, not a prediction).
                    form = {"grpcrows": "rows", "grpchealth": "health", "grpcstream": "stream"}.get(proto, "packed")
                    runner = functools.partial(run_grpc, form=form)
                if args.load == "python":
                    w = asyncio.run(runner(dest, key, "bench", batches, args.warmup, args.concurrency))
                    server_cpu0, client_cpu0, db_cpu0 = tree_cpu(server_pids), time.process_time(), tree_cpu(db_pids)
                    lat, elapsed, errors, answered = asyncio.run(
                        runner(dest, key, "bench", batches, args.duration, args.concurrency)
                    )
                    server_cpu, client_cpu = tree_cpu(server_pids) - server_cpu0, time.process_time() - client_cpu0
                    db_cpu = tree_cpu(db_pids) - db_cpu0
                total_rows += w[3] + answered
                res = summarise(scenario, lat, n, elapsed, errors)
                # Which side is saturated: a core is 1.0.
                res["server_cpu"] = server_cpu / elapsed
                res["server_cpu_us_per_req"] = server_cpu / max(1, len(lat)) * 1e6
                res["client_cpu"] = client_cpu / elapsed
                if db_pids:
                    res["db_cpu"] = db_cpu / elapsed
                    res["db_cpu_us_per_req"] = db_cpu / max(1, len(lat)) * 1e6
                results.append(res)
                print(json.dumps(res), flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        store = Store(db)
        charged_rows = store.ledger_totals()[1] - charged_before
        store.close()
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"\nledger rows {charged_rows} == rows answered {total_rows}: {charged_rows == total_rows}")
    pinned = "gateway pinned to CPU 0, client to CPU 1" if args.pin else "unpinned"
    backend = "SQLite" if "://" not in db else "PostgreSQL"
    print(f"\nMachine: {machine}; load {args.load}, concurrency {args.concurrency}, {args.duration:g} s per scenario,"
          f" {pinned}; {args.workers} worker(s), {backend}; load average {os.getloadavg()[0]:.2f}\n")  # fmt: skip
    print("| scenario | requests/s | rows/s | p50 ms | p99 ms | errors | server CPU | server µs/req | db µs/req | client CPU |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        db_us = f"{r['db_cpu_us_per_req']:.0f}" if "db_cpu_us_per_req" in r else "–"
        print(f"| {r['scenario']} | {r['req_per_s']:,.0f} | {r['rows_per_s']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['errors']} "
              f"| {r['server_cpu']:.2f} | {r['server_cpu_us_per_req']:.0f} | {db_us} | {r['client_cpu']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "workers": args.workers, "backend": backend,
                                         "loadavg": os.getloadavg(), "results": results,
                                         "ledger_ok": charged_rows == total_rows}, indent=2))  # fmt: skip
    return 0 if charged_rows == total_rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
