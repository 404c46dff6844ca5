"""Today's figures: the rows a reader most wants from each area's benchmarks, measured now and written
as BENCHMARKS.md's current tables (one per area: simulation, kueue, live, gateway, monitor).

    .venv/bin/python bench/current.py                     # every area, into BENCHMARKS.md
    .venv/bin/python bench/current.py --area simulation   # one area; the other tables stay as they are
    .venv/bin/python bench/current.py --dry-run           # the commands each row would run; nothing runs
    .venv/bin/python bench/current.py --quick --file F    # small sizes (a check of the script, not figures)

Each row runs one command (``analysim`` itself, or a benchmark of bench/ with ``--json``) as a child
process from the repository's root, measured by ``bench/measure.py``: wall time, and CPU time (user
+ sys of the command and the processes it started) beside it, with the 1-minute load average at the
row's start and end, since the load of this shared machine moves by 2x within minutes. A row whose
input under ../shared is absent is written as skipped, naming the file. An area whose command fails
is not written (its old table stays) and the script exits 1; an area's table is written as soon as
the area is done, so an interrupted run keeps the areas it finished.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from current_table import MarkerError, Row, render, replace_table, write_atomically
from measure import ROOT, Measured, run_measured

AREAS = ("simulation", "kueue", "live", "gateway", "monitor")
PY = sys.executable
OUT = "{out}"  # in a command: the row's own temporary folder
PHILLY = "../shared/traces/philly.csv"
KUEUE_PERF = "../shared/reference/kueue"
GERMAN = "../shared/datasets/german.data"
QUICK_JOBS = 2000  # --quick: the first jobs of the Philly extract a simulate row runs


@dataclass(frozen=True)
class Spec:
    """One row to measure: its command and how its figures are read from what the command wrote."""

    measured: str  # what the row measures, in a reader's words
    cmd: list[str]  # run from the repository's root; OUT stands for the row's own temporary folder
    needs: tuple[str, ...]  # input files (relative to the root) without which the row is skipped
    figure: Callable[[Path, Measured], str]  # the figures, from the row's folder and its measurement


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _simulate_figure(out: Path, m: Measured) -> str:
    s = _json(out / "summary.json")
    return (f"{s['jobs_total']:,} jobs, {s['jobs_total'] / m.cpu_s:,.0f} jobs per CPU s; "
            f"peak RSS {m.peak_rss_mb:,.0f} MB")


def _simulate(measured: str, args: list[str], quick: bool) -> Spec:
    limit = ["--limit", str(QUICK_JOBS)] if quick else []
    cmd = [PY, "-m", "analysim", "simulate", "--trace", PHILLY, "--cluster", "philly", *args, *limit,
           "--no-plots", "--no-progress", "--out", OUT]
    sized = f"first {QUICK_JOBS:,} jobs" if quick else "whole extract, 82,247 jobs"
    return Spec(f"{measured}: {sized}", cmd, (PHILLY, *[a for a in args if a.endswith(".yaml")]), _simulate_figure)


def _kueue_perf_figure(out: Path, m: Measured) -> str:
    s, report = _json(out / "run" / "summary.json"), _json(out / "kueue-perf.json")
    checks = report["comparison"] or []
    return (f"{s['jobs_completed']:,} workloads run, {s['preemptions']:,} preemptions; "
            f"{sum(c['passes'] for c in checks)} of {len(checks)} of Kueue's checker bounds met; "
            f"peak RSS {m.peak_rss_mb:,.0f} MB")


def _lockstep_figure(out: Path, m: Measured) -> str:
    r = _json(out / "results.json")["lockstep"]
    cpu = ", ".join(f"{p} {u['cpu_s']:.1f}" for p, u in r["processes"].items())
    return (f"×{r['speedup']:,.0f} virtual time, {r['messages_per_s']:,.0f} messages/s; decision latency p50 "
            f"{r['decision_latency_p50_ms']:.2f} ms, p99 {r['decision_latency_p99_ms']:.2f} ms; jobs.csv "
            f"{r['identical_rows']:,} of {r['rows']:,} rows as offline; CPU s: {cpu}")


def _paced_figure(out: Path, m: Measured) -> str:
    r = _json(out / "results.json")["paced"][0]
    return (f"divergence {r['divergence_ratio']:.3%} of the mean JCT; {r['identical_jobs']:,} of {r['jobs']:,} "
            f"jobs start and end as offline; decision latency p99 {r['decision_latency_p99_ms']:.1f} ms")


def _gateway_figure(out: Path, m: Measured) -> str:
    report = _json(out / "gateway.json")
    r = report["results"][0]
    return (f"{r['req_per_s']:,.0f} requests/s ({r['rows_per_s']:,.0f} rows/s); p50 {r['p50_ms']:.2f} ms, "
            f"p99 {r['p99_ms']:.2f} ms; gateway {r['server_cpu_us_per_req']:,.0f} µs CPU per request; ledger "
            + ("equal to the rows answered" if report["ledger_ok"] else "NOT equal to the rows answered"))


def _monitor_throughput_figure(out: Path, m: Measured) -> str:
    t = _json(out / "monitor.json")["throughput"]
    monitor_us = statistics.median(r["monitor_process_cpu_us_per_req"] for r in t["rounds"]["on"])
    rounds = ", ".join(f"{x:.2f}" for x in t["ratio_per_round"])
    return (f"requests/s on/off {t['median_ratio']:.2f}, the median of the rounds' ({rounds}; off "
            f"{t['off']['req_per_s']:,.0f} requests/s); gateway CPU per request on/off "
            f"{t['median_server_cpu_ratio']:.2f}; monitor process {monitor_us:,.0f} µs CPU per request")


def _monitor_cost_figure(out: Path, m: Measured) -> str:
    costs = _json(out / "monitor.json")["in_process_cost"]
    return "CPU µs per query: " + "; ".join(
        f"{c['users']:,} × {c['queries_per_user']:,}: {c['cpu_us_per_query']:,.0f}" for c in costs)


def _monitor_service_figure(out: Path, m: Measured) -> str:
    r = _json(out / "service.json")
    return (f"lag p50 ≤ {r['monitor_lag_p50_s_at_most']:g} s, p99 ≤ {r['monitor_lag_p99_s_at_most']:g} s; "
            f"monitor {r['monitor_cpu_us_per_query']:,.0f} µs CPU per query; caught up "
            f"{r['catch_up_after_load_s']:.2f} s after the load; restart over {r['logged_rows']:,} logged rows "
            f"{r['restart_s']:.1f} s")


def specs(area: str, quick: bool) -> list[Spec]:
    """The rows of ``area``; ``quick``: the smallest sizes that still run every part."""
    if area == "simulation":
        return [_simulate("Philly, fifo, `philly` preset (64 × 8 V100, 15 VCs)", ["--policy", "fifo"], quick),
                _simulate("Philly, tiresias + preemption + migration, `philly` preset",
                          ["--policy", "tiresias", "--preemption", "--migration"], quick)]
    if area == "kueue":
        scenario = "baseline" if quick else "large-scale"
        gen, spec = f"{KUEUE_PERF}/{scenario}/generator.yaml", f"{KUEUE_PERF}/{scenario}/rangespec.yaml"
        sizes = "15,000 workloads, 30" if quick else "50,000 workloads, 1,000"
        return [Spec(f"`kueue-perf`: Kueue's {scenario} scenario ({sizes} ClusterQueues), no control plane",
                     [PY, "-m", "analysim", "kueue-perf", gen, "--rangespec", spec, "--out", OUT + "/perf"],
                     (gen, spec), lambda out, m: _kueue_perf_figure(out / "perf", m)),
                _simulate("Philly under `examples/kueue/philly.yaml`",
                          ["--partition", "examples/kueue/philly.yaml"], quick),
                _simulate("Philly under `examples/kueue/philly-preemption.yaml`",
                          ["--partition", "examples/kueue/philly-preemption.yaml"], quick)]
    if area == "live":
        jobs = 1000 if quick else 20000
        window = ["--paced-jobs", "200", "--speeds", "50000"] if quick else ["--speeds", "5000"]
        speed = "×50,000, a 200-job window" if quick else "×5,000, 2,000 jobs from day 40, durations capped at 12 h"
        return [Spec(f"lockstep replay, first {jobs:,} Philly jobs on 135x8, 2 agent processes, bearer tokens "
                     "(`analysim up`'s default); the offline reference run included in wall and CPU",
                     [PY, "bench/bench_live.py", "--skip-paced", "--security", "auth", "--jobs", str(jobs),
                      "--out", OUT], (PHILLY,), _lockstep_figure),
                Spec(f"paced replay at {speed}, 2 agent processes",
                     [PY, "bench/bench_live.py", "--skip-lockstep", *window, "--out", OUT], (PHILLY,), _paced_figure)]
    if area == "gateway":
        duration = ["--duration", "1", "--warmup", "0.5"] if quick else ["--duration", "8"]
        what = {"http-1": "REST, single-row requests", "http-100": "REST, 100-row batches",
                "grpc-1": "gRPC unary `Predict`, single rows"}
        return [Spec(f"{text} (26-leaf German-credit tree, SQLite store, 4 Python clients in flight)",
                     [PY, "bench/bench_gateway.py", *duration, "--concurrency", "4", "--scenarios", scenario,
                      "--json", OUT + "/gateway.json"], (GERMAN,), _gateway_figure)
                for scenario, text in what.items()]
    if area == "monitor":
        rounds = ["--duration", "1", "--rounds", "1"] if quick else ["--duration", "6", "--rounds", "3"]
        return [Spec("gateway throughput with the monitor on against off (single-row REST, 4 clients, 20 accounts, "
                     f"alternating rounds: {rounds[3]} of each, {rounds[1]} s each)",
                     [PY, "bench/bench_monitor.py", *rounds, "--concurrency", "4", "--skip", "cost,memory,pool",
                      "--json", OUT + "/monitor.json"], (GERMAN,), _monitor_throughput_figure),
                Spec("monitor core in process (26-leaf German-credit tree, uniform single-row queries; users × "
                     "queries each)",
                     [PY, "bench/bench_monitor.py", "--skip", "throughput,memory,pool", "--json", OUT + "/monitor.json"],
                     (GERMAN,), _monitor_cost_figure),
                Spec(f"monitor service behind a gateway (SQLite, {2 if quick else 10} s of single-row load)",
                     [PY, "bench/bench_monitor_service.py", "--duration", "2" if quick else "10",
                      "--json", OUT + "/service.json"], (GERMAN,), _monitor_service_figure)]
    raise ValueError(area)


def shown(cmd: list[str]) -> str:
    """``cmd`` as a reader types it at the repository's root."""
    exe = Path(cmd[0])
    first = os.path.relpath(exe, ROOT) if exe.is_relative_to(ROOT) else cmd[0]
    return shlex.join([first, *(a.replace(OUT, "OUT") for a in cmd[1:])])


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.machine())
    origin = importlib.util.find_spec("analysim.core.engine").origin or ""  # type: ignore[union-attr]
    core = "pure-Python core" if origin.endswith(".py") else "compiled core"
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}, {core}"


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!BENCHMARKS.md"],
                             cwd=ROOT, capture_output=True, text=True).stdout
    return head.strip() + (" + uncommitted changes" if changed.strip() else "")


class RowFailed(Exception):
    """A row's command failed, or wrote no figures: its area is not written."""


def measure(spec: Spec, where: str, timeout_s: float) -> Row:
    missing = [p for p in spec.needs if not (ROOT / p).exists()]
    when = f"{datetime.now(UTC):%Y-%m-%d %H:%M}, {where}"
    if missing:
        return Row(spec.measured, f"skipped: {missing[0]} absent", shown(spec.cmd), None, None, None, machine(), when)
    with tempfile.TemporaryDirectory(prefix="bench-current-") as tmp:
        out, log, scratch = Path(tmp) / "out", Path(tmp) / "output.log", Path(tmp) / "scratch"
        out.mkdir()
        scratch.mkdir()
        start = os.getloadavg()[0]
        with open(log, "w") as f:
            # TMPDIR: what a benchmark leaves in its temporary folders goes with the row's.
            m = run_measured([a.replace(OUT, str(out)) for a in spec.cmd], timeout_s, stdout=f,
                             stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": str(scratch)})
        end = os.getloadavg()[0]
        if m.timed_out:
            figure = f"timed out: killed after {timeout_s:,.0f} s"
        elif m.exit_code != 0:
            raise RowFailed(f"exit {m.exit_code}; its last lines:\n" + "\n".join(log.read_text().splitlines()[-15:]))
        else:
            try:
                figure = spec.figure(out, m)
            except (OSError, KeyError, IndexError, TypeError, ValueError) as e:
                raise RowFailed(f"no figures in what it wrote ({type(e).__name__}: {e})") from e
    return Row(spec.measured, figure, shown(spec.cmd), m.wall_s, m.cpu_s, (start, end), machine(), when)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--area", choices=AREAS, action="append", help="only this area (repeatable; default: all)")
    ap.add_argument("--file", type=Path, default=ROOT / "BENCHMARKS.md", help="the file to write (default: BENCHMARKS.md)")
    ap.add_argument("--quick", action="store_true", help="small sizes: checks the script, not figures to keep")
    ap.add_argument("--dry-run", action="store_true", help="print each row's command; run and write nothing")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds of wall time per row (default 1800)")
    a = ap.parse_args()
    areas = a.area or list(AREAS)
    if not a.file.is_file():
        print(f"current.py: {a.file} not found", file=sys.stderr)
        return 2
    text = a.file.read_text()
    for area in areas:
        try:
            replace_table(text, area, "")
        except MarkerError as e:
            print(f"current.py: {a.file}: {e}", file=sys.stderr)
            return 2
    if a.dry_run:
        for area in areas:
            print(f"{area}:")
            for spec in specs(area, a.quick):
                print(f"  {shown(spec.cmd)}")
        return 0
    where, failed = commit(), False
    for area in areas:
        started, rows = time.perf_counter(), []
        try:
            for spec in specs(area, a.quick):
                rows.append(measure(spec, where, a.timeout))
                print(rows[-1].line(), end="", flush=True)
        except RowFailed as e:
            print(f"current.py: {area}: `{shown(spec.cmd)}` failed, {e}\n{area}: not written", file=sys.stderr)
            failed = True
            continue
        write_atomically(a.file, replace_table(a.file.read_text(), area, render(rows)))
        print(f"{area}: {len(rows)} rows in {time.perf_counter() - started:,.0f} s, written to {a.file}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
