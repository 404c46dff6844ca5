#!/usr/bin/env python3
"""Benchmark the monitor service (``python -m mlaas_monitor.monitor serve``) behind a
gateway under load: how far it lags behind the query stream (p99), what it costs per
query in its own process, how long it takes to catch up once the load stops, and how long
a restart takes over the log the run left (including the interpreter's start).

A fresh store (a SQLite file, or ``--db postgresql://...`` for an empty database) holds a
26-leaf German-credit tree; the monitor follows it and the gateway (``--workers N`` over
PostgreSQL) subscribes with ``--monitor-url``. The load is bench_monitor's closed-loop
single-row HTTP clients spread over --users accounts. The lag of a query is the time from
its commit record (the gateway's timestamp) to the monitor folding it in, from the
monitor's own histogram ``analysim_monitor_lag_seconds`` (p99 as the bound of its bucket).

    .venv/bin/python bench/bench_monitor_service.py --duration 10 --concurrency 4
    .venv/bin/python bench/bench_monitor_service.py --db postgresql://USER@/DB --workers 2
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
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_gateway import GERMAN, client_rows, cpu_seconds, wait_for  # noqa: E402
from bench_monitor import admin_call, drive, histogram_quantile  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


def start(args: list[str], port_file: Path, admin: str) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-m", *args, "--port-file", str(port_file)], cwd=ROOT,
                            env={**os.environ, "ANALYSIM_ADMIN_KEY": admin},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return proc, wait_for(port_file, proc, timeout=120)


def samples(url: str, admin: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(admin_call(url, admin, "GET", "/metrics")):  # type: ignore[arg-type]
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def caught_up(gurl: str, murl: str, admin: str, when: str) -> int:
    """Wait until the monitor has folded every row the gateway answered; that count."""
    t0 = time.perf_counter()
    while True:
        # Read again each time: a gateway's rows_used follows the store (other replicas
        # charge too) at its next refresh, within a second.
        answered = sum(int(u["rows_used"]) for u in admin_call(gurl, admin, "GET", "/v1/admin/users")["users"])  # type: ignore[index]
        folded = sum(u["n_queries"] for u in admin_call(murl, admin, "GET", "/v1/admin/monitor/bench")["users"])  # type: ignore[index]
        if folded == answered:
            return answered
        if time.perf_counter() - t0 > 60:
            raise SystemExit(f"the monitor folded {folded} of {answered} rows in 60 s {when}")
        time.sleep(0.01)  # a poll interval while waiting on a condition


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--users", type=int, default=20)
    ap.add_argument("--db", help="an empty PostgreSQL database's URL (default: a fresh SQLite file)")
    ap.add_argument("--workers", type=int, default=1, help="gateway processes (more than 1 needs --db postgresql://)")
    ap.add_argument("--dataset", default=str(GERMAN))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    report: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
                    "load_average_at_start": os.getloadavg(), "workers": args.workers,
                    "backend": "postgresql" if args.db else "sqlite"}  # fmt: skip
    admin = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        db = args.db or str(t / "store.db")
        rows, _ = client_rows(args.dataset, "bench", db)  # type: ignore[arg-type]
        mproc, mports = start(["mlaas_monitor.monitor", "serve", "--db", db, "--state", str(t / "monitor.db"), "--port", "0"],
                              t / "monitor.port", admin)  # fmt: skip
        murl = f"http://127.0.0.1:{mports['http']}"
        gproc = None
        try:
            gproc, gports = start(["mlaas_monitor", "gateway", "--db", db, "--port", "0", "--grpc-port", "0",
                                   "--workers", str(args.workers), "--monitor-url", murl], t / "gateway.port", admin)  # fmt: skip
            gurl = f"http://127.0.0.1:{gports['http']}"
            keys = [admin_call(gurl, admin, "POST", "/v1/admin/users", {"name": f"u{i}"})["api_key"]  # type: ignore[index]
                    for i in range(args.users)]  # fmt: skip
            asyncio.run(drive(gurl, keys, "bench", rows, 1.0, args.concurrency))  # warm-up
            # The monitor loads the model at its first row, while the rows keep coming: the
            # lag is measured from when it has caught up with the warm-up (steady load).
            caught_up(gurl, murl, admin, "after the warm-up")
            cpu0 = cpu_seconds(mproc.pid)
            lag0 = {float(s.labels["le"]): s.value for s in samples(murl, admin)["analysim_monitor_lag_seconds_bucket"]}
            lat, elapsed, errors = asyncio.run(drive(gurl, keys, "bench", rows, args.duration, args.concurrency))
            stopped = time.perf_counter()
            answered = caught_up(gurl, murl, admin, "after the load")
            catch_up = time.perf_counter() - stopped
            cpu = cpu_seconds(mproc.pid) - cpu0
            s = samples(murl, admin)
            lag = [(float(x.labels["le"]), x.value - lag0.get(float(x.labels["le"]), 0.0))
                   for x in s["analysim_monitor_lag_seconds_bucket"]]  # fmt: skip
            a = np.array(lat) * 1000
            report.update({
                "req_per_s": len(lat) / elapsed, "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
                "errors": errors, "monitor_lag_p50_s_at_most": histogram_quantile(list(lag), 0.5),
                "monitor_lag_p99_s_at_most": histogram_quantile(list(lag), 0.99),
                "monitor_cpu_us_per_query": cpu / max(1, len(lat)) * 1e6, "catch_up_after_load_s": catch_up,
                "load_average_at_end": os.getloadavg(),
            })  # fmt: skip
            # A restart: stop (it checkpoints), start again, time until it listens (it has
            # then loaded its state and read the log once for the raw queries).
            mproc.send_signal(signal.SIGTERM)
            mproc.wait(60)
            t0 = time.perf_counter()
            mproc, _ = start(["mlaas_monitor.monitor", "serve", "--db", db, "--state", str(t / "monitor.db"), "--port", "0"],
                             t / "monitor2.port", admin)  # fmt: skip
            report["restart_s"], report["logged_rows"] = time.perf_counter() - t0, answered
        finally:
            for p in (gproc, mproc):
                if p is not None:
                    p.send_signal(signal.SIGTERM)
                    p.wait(60)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
