#!/usr/bin/env python3
"""Benchmark the extraction monitor: gateway throughput with the monitor on vs off, the
monitor's amortised cost per query, and memory per tracked user.

1. Throughput: two gateway processes over fresh stores holding a 26-leaf German-credit
   tree, ``python -m mlaas_monitor gateway`` (off) and ``python -m mlaas_monitor.monitor
   gateway`` (on), driven in alternating rounds (off, on, off, on, ...) by the same
   closed-loop single-row HTTP clients spreading requests over --users accounts. The ratio
   is on/off requests per second. Per request, the CPU of the gateway process, of the
   monitor process it starts beside itself (when on) and of this client are reported; the
   monitor's own histograms, read through the gateway's /metrics, give its update time
   per query and its lag behind the log (p99).
2. Amortised cost in process: the pure core (ModelMonitor) fed single-row events, for a
   few (users x queries) shapes.
3. Memory: a fresh process tracks --memory-users users (default 10,000) with
   --memory-queries queries each; RSS growth per user.
4. Pool memory: a fresh process takes --pool-rows rows (default a million) of probes that
   join auto:pool from --pool-users accounts; RSS growth and the pool's kept raw rows
   (bounded by pool.MAX_ROWS) at every tenth.

    .venv/bin/python bench/bench_monitor.py --duration 10 --rounds 2 --concurrency 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_gateway import GERMAN, answered, client_rows, cpu_seconds, wait_for  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


def admin_call(url: str, admin: str, method: str, path: str, body: object = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{url}{path}", data=data, method=method, headers={"Authorization": f"Bearer {admin}"})
    raw = urllib.request.urlopen(req).read()
    return raw.decode() if path == "/metrics" else json.loads(raw)


async def drive(url: str, keys: list[str], model: str, rows: list[list], duration: float, conc: int) -> tuple:
    """Closed-loop keep-alive HTTP/1.1 clients (as bench_gateway's), request j from account j % len(keys)."""
    host, port = url.removeprefix("http://").split(":")
    bodies = [json.dumps({"rows": [r]}).encode() for r in rows]
    heads = [f"POST /v1/models/{model}/predict HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {k}\r\n"
             f"Content-Type: application/json\r\nContent-Length: " for k in keys]  # fmt: skip
    latencies: list[float] = []
    errors = 0
    end = time.perf_counter() + duration

    async def worker(i: int) -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(host, int(port))
        j = i
        while time.perf_counter() < end:
            body = bodies[j % len(bodies)]
            req = (heads[j % len(heads)] + f"{len(body)}\r\n\r\n").encode() + body
            j += conc
            t0 = time.perf_counter()
            writer.write(req)
            if await answered(reader):
                latencies.append(time.perf_counter() - t0)
            else:
                errors += 1
        writer.close()
        await writer.wait_closed()

    start = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(conc)))
    return latencies, time.perf_counter() - start, errors


class Server:
    def __init__(self, tmp: Path, name: str, module: str, dataset: str, users: int) -> None:
        self.name = name
        db = tmp / f"{name}.db"
        self.rows, _ = client_rows(dataset, "bench", db)
        self.admin = secrets.token_urlsafe(24)
        port_file = tmp / f"{name}.ports"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "gateway", "--db", str(db), "--port", "0", "--grpc-port", "0",
             "--port-file", str(port_file), *(["--no-monitor"] if name == "off" else [])],
            cwd=ROOT, env={**os.environ, "ANALYSIM_ADMIN_KEY": self.admin}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{wait_for(port_file, self.proc)['http']}"
        self.keys = [admin_call(self.url, self.admin, "POST", "/v1/admin/users", {"name": f"u{i}"})["api_key"]  # type: ignore[index]
                     for i in range(users)]  # fmt: skip
        self.rounds: list[dict] = []

    def children(self) -> list[int]:
        """The gateway's child processes (its monitor, when on)."""
        return [int(p) for p in Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()]

    def run(self, duration: float, conc: int) -> dict:
        kids = self.children()
        cpu0, kid0, me0 = cpu_seconds(self.proc.pid), sum(map(cpu_seconds, kids)), time.process_time()
        lat, elapsed, errors = asyncio.run(drive(self.url, self.keys, "bench", self.rows, duration, conc))
        cpu, kid = cpu_seconds(self.proc.pid) - cpu0, sum(map(cpu_seconds, kids)) - kid0
        me = time.process_time() - me0
        a = np.array(lat) * 1000
        r = {"server": self.name, "req_per_s": len(lat) / elapsed, "p50_ms": float(np.percentile(a, 50)),
             "p99_ms": float(np.percentile(a, 99)), "errors": errors, "server_cpu_us_per_req": cpu / max(1, len(lat)) * 1e6,
             "monitor_process_cpu_us_per_req": kid / max(1, len(lat)) * 1e6,
             "client_cpu_us_per_req": me / max(1, len(lat)) * 1e6, "load_average": os.getloadavg()[0]}  # fmt: skip
        self.rounds.append(r)
        return r

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def monitor_histogram(server: Server) -> tuple[float, float, float, float | None]:
    """(update seconds total, update batches, rows answered, p99 lag in seconds) from the
    gateway's /metrics (the monitor's own are part of it)."""
    text = admin_call(server.url, server.admin, "GET", "/metrics")
    total = count = rows = 0.0
    lag: list[tuple[float, float]] = []
    for fam in text_string_to_metric_families(text):  # type: ignore[arg-type]
        for s in fam.samples:
            if s.name == "analysim_monitor_update_duration_seconds_sum":
                total += s.value
            elif s.name == "analysim_monitor_update_duration_seconds_count":
                count += s.value
            elif s.name == "analysim_gateway_rows_answered_total":
                rows += s.value
            elif s.name == "analysim_monitor_lag_seconds_bucket":
                lag.append((float(s.labels["le"]), s.value))
    return total, count, rows, histogram_quantile(lag, 0.99)


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The upper bound of the first bucket holding the q-quantile (Prometheus buckets are
    cumulative); None when empty."""
    buckets.sort()
    if not buckets or buckets[-1][1] == 0:
        return None
    for le, n in buckets:
        if n >= q * buckets[-1][1]:
            return le
    return None


def in_process_cost(dataset: str, shapes: list[tuple[int, int]]) -> list[dict]:
    from mlaas_monitor.datasets import load_dataset
    from mlaas_monitor.monitor.attacks import Domain
    from mlaas_monitor.monitor.core import ModelMonitor
    from mlaas_monitor.training import train_model

    model = train_model(load_dataset(dataset), "bench", max_leaf_nodes=26, seed=0)
    # Imported before timing: the monitor process pays for the import once, at its first fit.
    import scipy.stats  # noqa: F401
    import sklearn.tree  # noqa: F401

    dom = Domain.from_public(model.public()["features"])
    out = []
    for users, per in shapes:
        X = dom.uniform(np.random.default_rng(0), users * per)
        labels = model.answer(X).labels
        mon = ModelMonitor(model)
        names = [f"u{i}" for i in range(users)]
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(users * per):
            u = names[i % users]
            mon.ingest(u, X[i : i + 1], labels[i : i + 1], i + 1)
            mon.evaluate_due({u}, {}, 0.0)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        # Wall time and this process's CPU time: on a shared machine the CPU time is the cost.
        out.append({"users": users, "queries_per_user": per, "us_per_query": dt / (users * per) * 1e6,
                    "cpu_us_per_query": cpu / (users * per) * 1e6})  # fmt: skip
        print(json.dumps(out[-1]), flush=True)
    return out


def signal_cost(dataset: str, n: int = 5000, batch: int = 25) -> dict:
    """CPU microseconds per query of each signal, folded in batches of ``batch`` rows as the
    monitor folds them: PRADA, the OOD share, Quiring et al.'s closeness to the boundary, and
    the box copy (per evaluation: it is scored on S, not per query)."""
    from mlaas_monitor.datasets import load_dataset
    from mlaas_monitor.model import Policy
    from mlaas_monitor.monitor.attacks import Domain
    from mlaas_monitor.monitor.boundary import BoundaryState
    from mlaas_monitor.monitor.boxcopy import box_copy_fidelity
    from mlaas_monitor.monitor.core import ModelMonitor
    from mlaas_monitor.monitor.coverage import Summary
    from mlaas_monitor.monitor.ood import OodState
    from mlaas_monitor.monitor.prada import PradaState
    from mlaas_monitor.training import train_model

    model = train_model(load_dataset(dataset), "bench", max_leaf_nodes=26, seed=0, policy=Policy(reveal_leaf=True))
    mon = ModelMonitor(model)
    X = Domain.from_public(model.public()["features"]).uniform(np.random.default_rng(1), n)
    y = model.answer(X).labels
    out = {}
    for name, fold in (("prada", lambda st, a, b: mon.prada.fold(st, X[a:b], y[a:b])),
                       ("ood", lambda st, a, b: mon.ood.fold(st, X[a:b])),
                       ("boundary", lambda st, a, b: mon.boundary.fold(st, X[a:b]))):  # fmt: skip
        st = {"prada": PradaState, "ood": OodState, "boundary": BoundaryState}[name]()
        c0 = time.process_time()
        for a in range(0, n, batch):
            fold(st, a, a + batch)
        out[f"{name}_cpu_us_per_query"] = (time.process_time() - c0) / n * 1e6
    summary = Summary.empty(mon.regions.n_leaves, mon.n_features)
    summary.add(mon.regions.leaf_index[model.tree.apply(X)], X)
    c0, reps = time.process_time(), 50
    for _ in range(reps):
        box_copy_fidelity(mon.identities, summary)
    out["box_copy_cpu_ms_per_evaluation"] = (time.process_time() - c0) / reps * 1e3
    out["box_copy_rows_scored"] = int(mon.identities.rows.shape[0])
    print(json.dumps(out), flush=True)
    return out


# What both measuring children start with: the tree on the path given, and their resident size.
CHILD_PRELUDE = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
from mlaas_monitor.datasets import load_dataset
from mlaas_monitor.monitor.attacks import Domain
from mlaas_monitor.monitor.core import ModelMonitor
from mlaas_monitor.training import train_model

def rss() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0
"""


MEMORY_CHILD = CHILD_PRELUDE + r"""
users, per, dataset = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
model = train_model(load_dataset(dataset), "bench", max_leaf_nodes=26, seed=0)
dom = Domain.from_public(model.public()["features"])
X = dom.uniform(np.random.default_rng(0), per)
labels = model.answer(X).labels
mon = ModelMonitor(model)
mon.evaluate(mon.user("warmup"), None, 0.0, refit=True)  # import and warm everything first
base = rss()
t0 = time.perf_counter()
for u in range(users):
    name = f"user{u:05d}"
    for i in range(per):
        mon.ingest(name, X[i : i + 1], labels[i : i + 1], u * per + i + 1)
    mon.evaluate(mon.users[name], None, 0.0, refit=True)  # a summary, queries and a status each
after = rss()
print(json.dumps({"users": users, "queries_per_user": per, "rss_base_mb": base / 2**20, "rss_after_mb": after / 2**20,
                  "bytes_per_user": (after - base) / users, "seconds": time.perf_counter() - t0}))
"""


POOL_CHILD = CHILD_PRELUDE + r"""
from mlaas_monitor.model import Policy
from mlaas_monitor.monitor.pool import POOL, POOLED

rows, users, batch, dataset = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
model = train_model(load_dataset(dataset), "bench", max_leaf_nodes=26, seed=0, policy=Policy(reveal_leaf=True))
dom = Domain.from_public(model.public()["features"])
rng = np.random.default_rng(0)
mon = ModelMonitor(model)
mon.evaluate(mon.user("warmup"), None, 0.0, refit=True)
base, t0, c0 = rss(), time.perf_counter(), time.process_time()
points = []
for b in range(rows // batch):
    # Probes as path-finding sends them: uniform points, each next row one feature from the
    # row before it, so that (out of distribution and one feature apart) they join auto:pool.
    X = dom.uniform(rng, batch)
    for i in range(1, batch, 2):
        X[i] = X[i - 1]
        j = rng.integers(dom.d)
        X[i, j] = dom.uniform(rng, 1)[0, j]
    u = f"u{b % users:04d}"
    mon.ingest(u, X, model.answer(X).labels, (b + 1) * batch)
    mon.evaluate_due({u}, {}, 0.0)
    if (b + 1) * batch % (rows // 10) == 0:
        pool = mon.pools[POOL]
        points.append({"rows": (b + 1) * batch, "rss_growth_mb": (rss() - base) / 2**20,
                       "pool_rows": pool.n_queries, "pool_kept_raw_rows": len(mon.kept[POOL].hashes),
                       "pooled_kept_raw_rows": {p: len(mon.kept[p].hashes) for p in POOLED},
                       "link_keys": len(mon.linkage._first), "link_pairs_seen": len(mon.linkage._seen_links),
                       "cpu_us_per_row": (time.process_time() - c0) / ((b + 1) * batch) * 1e6,
                       "seconds": time.perf_counter() - t0})
        print(json.dumps(points[-1]), file=sys.stderr, flush=True)
print(json.dumps({"rows": rows, "users": users, "batch": batch, "rss_base_mb": base / 2**20, "points": points}))
"""


def pool_memory(dataset: str, rows: int, users: int, batch: int = 50) -> dict:
    """auto:pool over ``rows`` logged rows of probes that join it, spread over ``users``
    accounts: RSS growth, the pool's rows and its kept raw rows at every tenth of the way."""
    out = subprocess.run([sys.executable, "-c", POOL_CHILD, str(ROOT), str(rows), str(users), str(batch), dataset],
                         stdout=subprocess.PIPE, text=True, check=True, cwd=ROOT)  # fmt: skip
    res = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(res), flush=True)
    return res


def memory(dataset: str, users: int, per: int) -> dict:
    out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(ROOT), str(users), str(per), dataset],
                         capture_output=True, text=True, check=True, cwd=ROOT)  # fmt: skip
    res = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(res), flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per round and server")
    ap.add_argument("--rounds", type=int, default=2, help="alternating off/on rounds")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--users", type=int, default=20, help="accounts the throughput clients spread over")
    ap.add_argument("--dataset", default=str(GERMAN))
    ap.add_argument("--memory-users", type=int, default=10_000)
    ap.add_argument("--memory-queries", type=int, default=50)
    ap.add_argument("--pool-rows", type=int, default=1_000_000, help="pool: logged rows that join auto:pool")
    ap.add_argument("--pool-users", type=int, default=1_000, help="pool: accounts those rows come from")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: throughput, cost, memory, pool")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    skip = set(args.skip.split(",")) - {""}
    report: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
                    "load_average_at_start": os.getloadavg()}  # fmt: skip

    if "throughput" not in skip:
        with tempfile.TemporaryDirectory() as tmp:
            off = Server(Path(tmp), "off", "mlaas_monitor", args.dataset, args.users)
            on = Server(Path(tmp), "on", "mlaas_monitor.monitor", args.dataset, args.users)
            try:
                for s in (off, on):
                    s.run(args.warmup, args.concurrency)
                    s.rounds.clear()
                for _ in range(args.rounds):
                    for s in (off, on):
                        print(json.dumps(s.run(args.duration, args.concurrency)), flush=True)
                upd_s, upd_n, rows, lag_p99 = monitor_histogram(on)
            finally:
                off.stop()
                on.stop()
        mean = {s.name: {k: float(np.mean([r[k] for r in s.rounds])) for k in ("req_per_s", "p50_ms", "p99_ms", "server_cpu_us_per_req")}
                for s in (off, on)}  # fmt: skip
        # Adjacent rounds share the machine's conditions (others' load drifts): the median of
        # the per-round ratios is steadier than the ratio of means.
        ratios = [b["req_per_s"] / a["req_per_s"] for a, b in zip(off.rounds, on.rounds, strict=True)]
        cpu_ratios = [b["server_cpu_us_per_req"] / a["server_cpu_us_per_req"] for a, b in zip(off.rounds, on.rounds, strict=True)]
        report["throughput"] = {
            "off": mean["off"], "on": mean["on"], "ratio_on_off": mean["on"]["req_per_s"] / mean["off"]["req_per_s"],
            "ratio_per_round": ratios, "median_ratio": float(np.median(ratios)),
            "median_server_cpu_ratio": float(np.median(cpu_ratios)),
            "rounds": {"off": off.rounds, "on": on.rounds},
            "monitor_update_seconds_total": upd_s, "monitor_update_batches": upd_n, "rows_answered": rows,
            "monitor_us_per_query": upd_s / max(1.0, rows) * 1e6, "monitor_lag_p99_s_at_most": lag_p99,
        }  # fmt: skip
    if "cost" not in skip:
        report["in_process_cost"] = in_process_cost(args.dataset, [(1, 5000), (20, 500), (200, 25), (2000, 5)])
        report["signal_cost"] = signal_cost(args.dataset)
    if "memory" not in skip:
        report["memory"] = memory(args.dataset, args.memory_users, args.memory_queries)
    if "pool" not in skip:
        report["pool_memory"] = pool_memory(args.dataset, args.pool_rows, args.pool_users)

    print("\n" + json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
