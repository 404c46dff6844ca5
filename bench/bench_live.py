#!/usr/bin/env python3
"""Live-emulation benchmark: the scheduler service and its agents (at most 2 processes) on
127.0.0.1 replaying the Philly extract on a 135x8 cluster (1,080 GPUs, the size of SenseTime's
Helios Venus cluster).

1. Lockstep (--speed max) over the first --jobs jobs: speedup (virtual seconds per wall
   second), stream messages per second, decision latency p50/p99, CPU and peak RSS of every
   process, and the identity check against the offline run (jobs.csv compared row by row);
   once per --security setting: plain (no tokens, plaintext), auth (bearer tokens), auth+tls
   (tokens and mutual TLS with throwaway certificates), so that their cost shows.
2. Paced, at each of --speeds: the divergence from the offline run (mean and max |dJCT|, as a
   share of the mean JCT); the highest speed under 1 %. A paced run lasts makespan / speed wall
   seconds and the extract's makespan is set by its longest jobs (weeks), so this part replays a
   window: --paced-jobs consecutive jobs from day --paced-day on, durations capped at
   --paced-cap-h hours, written as a canonical trace (the offline reference uses the same file).

    .venv/bin/python bench/bench_live.py                     # both parts
    .venv/bin/python bench/bench_live.py --skip-paced        # lockstep only

Skips cleanly (exit 0) when the trace is absent.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analysim.clusters import parse_cluster  # noqa: E402
from analysim.core.job import JobSpec  # noqa: E402
from analysim.report import write_run  # noqa: E402
from analysim.simulation import RunOptions, run  # noqa: E402
from analysim.tls import TlsFiles  # noqa: E402
from analysim.traces import Trace, load_trace, write_canonical  # noqa: E402
from scheduler_svc.launcher import LocalRun  # noqa: E402

DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "philly.csv"
CLK = os.sysconf("SC_CLK_TCK")


def proc_usage(pid: int) -> dict:
    """CPU seconds and peak RSS of a live process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK
    peak = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
    return {"cpu_s": cpu, "peak_rss_mib": peak / 2**20}


def paced_window(jobs: list[JobSpec], day: float, n: int, cap_h: float) -> list[JobSpec]:
    """``n`` consecutive jobs from ``day`` on, rebased to t=0, durations capped at ``cap_h``."""
    jobs = sorted(jobs, key=lambda j: j.submit_s)
    first = next(i for i, j in enumerate(jobs) if j.submit_s >= day * 86400)
    chosen = jobs[first: first + n]
    t0 = chosen[0].submit_s
    return [replace(j, submit_s=j.submit_s - t0, duration_s=min(j.duration_s, cap_h * 3600)) for j in chosen]


def live_run(work: Path, sched_args: list[str], cluster: str, agents: int, deadline_s: float,
             security: str = "plain") -> tuple[dict, dict]:
    names = [n.name for n in parse_cluster(cluster).nodes]
    tls, tls_args = TlsFiles(), []
    if "tls" in security:
        from tests.tlscerts import CA  # throwaway certificates (the cryptography package, a dev extra)

        ca = CA(work.parent, f"ca-{work.name}")
        cert = ca.issue(f"scheduler-{work.name}")
        tls = TlsFiles(ca=ca.files.cert, cert=cert.cert, key=cert.key)
        tls_args = ["--tls-cert", cert.cert, "--tls-key", cert.key, "--tls-ca", ca.files.cert]
    with LocalRun(work, tls=tls) as lr:
        if "auth" in security:
            lr.provision(names, agents)
        lr.start_scheduler([*sched_args, *tls_args, "--cluster", cluster, "--log-level", "WARNING"])
        lr.start_agents(cluster, len(names), agents)
        with lr.client() as c:
            c.wait_ready()
            end = time.monotonic() + deadline_s
            while not c.cluster_state(queue_limit=1).replay_done:
                if time.monotonic() > end:
                    raise SystemExit(f"replay not done after {deadline_s:g} s; logs in {work}")
                time.sleep(0.2)
            usage = {"scheduler": proc_usage(lr.scheduler.pid)}
            for i, p in sorted(lr.agents.items()):
                usage[f"agent{i}"] = proc_usage(p.pid)
            summary = c.summary()[1]
    return summary, usage


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--cluster", default="135x8")
    ap.add_argument("--policy", default="fifo")
    ap.add_argument("--jobs", type=int, default=20000, help="lockstep: the first N jobs (default 20,000)")
    ap.add_argument("--agents", type=int, default=2, help="agent processes (default 2)")
    ap.add_argument("--paced-jobs", type=int, default=2000, help="paced window: N jobs (default 2,000)")
    ap.add_argument("--paced-day", type=float, default=40.0, help="paced window: from this day on (default 40)")
    ap.add_argument("--paced-cap-h", type=float, default=12.0, help="paced window: duration cap, hours (default 12)")
    ap.add_argument("--speeds", default="1000,2000,5000,10000,20000,50000")
    ap.add_argument("--paced-lag", type=float, default=0.0, help="the scheduler's --paced-lag (default 0)")
    ap.add_argument("--security", default="plain,auth,auth+tls",
                    help="lockstep runs, one per setting: plain, auth (tokens), auth+tls (tokens + mutual TLS)")
    ap.add_argument("--repeat", type=int, default=1, help="lockstep rounds over the --security settings (default 1)")
    ap.add_argument("--skip-paced", action="store_true")
    ap.add_argument("--skip-lockstep", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "bench_live")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the processes it started
    if not args.trace.exists():
        print(f"bench_live: {args.trace} not found; skipped")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-live-") as tmp:  # the runs' work files, removed at the end
        return measure(args, Path(tmp))


def measure(args: argparse.Namespace, work: Path) -> int:
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
                     "trace": str(args.trace), "cluster": args.cluster, "policy": args.policy}
    trace = load_trace(args.trace)
    cluster = parse_cluster(args.cluster)

    if not args.skip_lockstep:
        # The reference: the offline run of the same inputs (not timed), jobs.csv row by row.
        t = time.perf_counter()
        ref = run(trace.jobs, cluster, RunOptions(policy=args.policy, limit=args.jobs), trace_filtered=trace.filtered)
        offline_wall = time.perf_counter() - t
        write_run(args.out / "offline", ref.summary, ref.jobs, ref.timeseries, plots=False)
        off_rows = (args.out / "offline" / "jobs.csv").read_text().splitlines()
        results["lockstep_by_security"] = {}
        # Rounds interleave the settings, so that a change of load on a shared machine hits all alike.
        for security in [s for _ in range(args.repeat) for s in args.security.split(",")]:
            out = args.out / f"lockstep-{security}"
            common = ["--trace", str(args.trace), "--limit", str(args.jobs), "--policy", args.policy]
            summary, usage = live_run(work / f"lockstep-{security}", [*common, "--out", str(out), "--no-offline-check"],
                                      args.cluster, args.agents, 3600, security)
            live_rows = (out / "jobs.csv").read_text().splitlines()
            same = sum(a == b for a, b in zip(live_rows[1:], off_rows[1:], strict=False))
            lv = summary["live"]
            r = {
                "jobs": summary["jobs_total"], "completed": summary["jobs_completed"],
                "identical_rows": same, "rows": len(off_rows) - 1, "identical_file": live_rows == off_rows,
                "wall_s": summary["wall_s"], "virtual_s": lv["virtual_s"], "speedup": lv["speedup"],
                "steps": lv["steps"], "messages_per_s": lv["messages_per_s"],
                "messages": lv["messages_sent"] + lv["messages_received"],
                "decision_latency_p50_ms": lv["decision_latency_p50_s"] * 1e3,
                "decision_latency_p99_ms": lv["decision_latency_p99_s"] * 1e3,
                "decision_latency_max_ms": lv["decision_latency_max_s"] * 1e3,
                "processes": usage, "offline_wall_s": offline_wall, "loadavg": os.getloadavg(),
            }
            results["lockstep_by_security"].setdefault(security, []).append(r)
            results.setdefault("lockstep", r)
            print(f"lockstep [{security}]: {r['completed']}/{r['jobs']} jobs, {r['identical_rows']}/{r['rows']} jobs.csv "
                  f"rows identical (file identical: {r['identical_file']}); {r['virtual_s'] / 86400:.1f} virtual days in "
                  f"{r['wall_s']:.1f} s = x{r['speedup']:,.0f}; {r['messages_per_s']:,.0f} msg/s; decision latency p50 "
                  f"{r['decision_latency_p50_ms']:.2f} ms p99 {r['decision_latency_p99_ms']:.2f} ms; load average "
                  f"{r['loadavg'][0]:.2f}")
            for name, u in usage.items():
                print(f"  {name}: CPU {u['cpu_s']:.2f} s, peak RSS {u['peak_rss_mib']:.0f} MiB")
        for security, runs in results["lockstep_by_security"].items():
            med = {k: statistics.median(r[k] for r in runs) for k in ("speedup", "messages_per_s", "wall_s")}
            cpu = {p: statistics.median(r["processes"][p]["cpu_s"] for r in runs) for p in runs[0]["processes"]}
            print(f"median of {len(runs)} [{security}]: x{med['speedup']:,.0f}, {med['messages_per_s']:,.0f} msg/s, "
                  f"{med['wall_s']:.1f} s wall; CPU s " + ", ".join(f"{p} {c:.2f}" for p, c in cpu.items()))

    if not args.skip_paced:
        results["paced"] = []
        window = paced_window(trace.jobs, args.paced_day, args.paced_jobs, args.paced_cap_h)
        wpath = args.out / "paced_window.csv"
        write_canonical(Trace(window, "philly window", "canonical"), wpath)
        results["paced_window"] = {"jobs": len(window), "from_day": args.paced_day, "cap_h": args.paced_cap_h,
                                   "file": str(wpath)}
        for speed in [float(s) for s in args.speeds.split(",")]:
            common = ["--trace", str(wpath), "--policy", args.policy, "--paced-lag", str(args.paced_lag)]
            summary, usage = live_run(work / f"paced-{speed:g}", [*common, "--speed", f"{speed:g}"], args.cluster,
                                      args.agents, 3600)
            fid = summary["fidelity"]
            row = {"speed": speed, "paced_lag_s": args.paced_lag, "wall_s": summary["wall_s"], "jobs": summary["jobs_completed"],
                   "mean_abs_delta_jct_s": fid["mean_abs_delta_jct_s"], "max_abs_delta_jct_s": fid["max_abs_delta_jct_s"],
                   "offline_avg_jct_s": fid["offline_avg_jct_s"], "divergence_ratio": fid["divergence_ratio"],
                   "identical_jobs": fid["identical_jobs"],
                   "decision_latency_p99_ms": summary["live"]["decision_latency_p99_s"] * 1e3}
            results["paced"].append(row)
            print(f"paced x{speed:,.0f}: {row['jobs']} jobs in {row['wall_s']:.1f} s; |dJCT| mean "
                  f"{row['mean_abs_delta_jct_s']:.1f} s max {row['max_abs_delta_jct_s']:.1f} s = "
                  f"{row['divergence_ratio']:.3%} of mean JCT {row['offline_avg_jct_s']:.0f} s")
        ok = [r["speed"] for r in results["paced"] if r["divergence_ratio"] < 0.01]
        results["paced_max_speed_under_1pct"] = max(ok) if ok else None
        print(f"highest speed with divergence under 1 % of mean JCT: {results['paced_max_speed_under_1pct']}")
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
