"""``analysim kueue-perf``: replay one of Kueue's scheduler performance scenarios and report what
Kueue's recorder and checker report, beside what real Kueue recorded (analysim.kueue_perf)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path
from typing import Any

import yaml

from analysim.argtypes import control_plane
from analysim.core.records import PREEMPTION_COSTS
from analysim.envconfig import apply_env
from analysim.kueue_perf import Recorder, compare, read_generator, read_rangespec, write_inputs


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "kueue-perf", help="replay a Kueue scheduler performance scenario (its generator.yaml)",
        description="Replay a scenario of Kueue's scheduler performance test (test/performance/scheduler/configs/"
                    "*/generator.yaml) under its partition, and report per workload class the mean time to "
                    "admission and per ClusterQueue class the usage, as Kueue's recorder does, beside the "
                    "averages real Kueue recorded (--rangespec; docs/kueue.md, 'Kueue's performance scenarios').")
    p.add_argument("generator", metavar="GENERATOR.yaml")
    p.add_argument("--rangespec", metavar="RANGESPEC.yaml", help="Kueue's checker bounds, whose comments carry "
                   "real Kueue's recorded averages")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder for the inputs, the run and the report")
    p.add_argument("--control-plane", type=control_plane, metavar="kueue[,FIELD=VALUE...]",
                   help="pace the replay by the control-plane model (docs/kueue.md); default: none")
    p.add_argument("--preemption-cost", choices=PREEMPTION_COSTS, default="restart",
                   help="what a victim keeps (default restart: Kueue's runner runs an evicted workload again from "
                        "its admission)")
    p.add_argument("--events", action="store_true", help="also write every decision of the replay to "
                   "DIR/events.csv (docs/kueue.md, 'The events file'); the report does not need it")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from analysim.cli import build_parser
    from analysim.cli.simulate import main as simulate

    scenario = read_generator(args.generator)
    spec = read_rangespec(args.rangespec) if args.rangespec else None
    out: Path = args.out
    partition, trace, cluster = write_inputs(scenario, out)
    flags = ["simulate", "--trace", str(trace), "--cluster", cluster, "--partition", str(partition), "--no-plots",
             "--no-progress", "--preemption-cost", args.preemption_cost, "--out", str(out / "run")]
    if args.events:
        flags += ["--events", str(out / "events.csv")]
    if args.control_plane is not None:
        flags += ["--control-plane", args.control_plane]
    parser = build_parser("simulate")
    apply_env(parser)
    replay = parser.parse_args(flags)  # (the replay is `analysim simulate` with these flags, run here)
    recorder = Recorder(scenario)
    print(f"kueue-perf: {len(scenario.workloads):,} workloads, {len(scenario.nominal):,} ClusterQueues on {cluster}")
    (out / "run").mkdir(exist_ok=True)
    with open(out / "run" / "simulate.log", "w") as log, contextlib.redirect_stdout(log):
        code = simulate(replay, follow=recorder)  # (its tables, one row per ClusterQueue, go to run/simulate.log)
    if code:
        return code
    summary = recorder.summary()
    _write(out / "summary.yaml", yaml.safe_dump(summary, sort_keys=False))
    report = {"generator": str(args.generator), "rangespec": args.rangespec,
              "control_plane": None if args.control_plane is None else flags[flags.index("--control-plane") + 1],
              "preemption_cost": args.preemption_cost, "summary": summary,
              "comparison": compare(summary, spec) if spec else None}
    _write(out / "kueue-perf.json", json.dumps(report, indent=2) + "\n")
    print(_table(report))
    print(f"wrote {out / 'summary.yaml'}, {out / 'kueue-perf.json'}")
    return 0


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _table(report: dict) -> str:
    rows = report["comparison"]
    if rows is None:
        s = report["summary"]
        lines = [f"{'figure':<34} {'AnalySIM':>10}"]
        lines += [f"time to admission, {c} (ms)".ljust(34) + f" {e['averageTimeToAdmissionMs']:>10,}"
                  for c, e in s["workloadClasses"].items()]
        lines += [f"ClusterQueue usage, {c} (%)".ljust(34) + f" {e['usagePercent']:>10.1f}"
                  for c, e in s["clusterQueueClasses"].items()]
        lines.append(f"{'wall (ms)':<34} {s['wallMs']:>10,}")
        return "\n".join(lines)
    lines = [f"{'figure':<34} {'AnalySIM':>10} {'real Kueue':>11} {'difference':>11} {'bound':>9} check"]
    for r in rows:
        kueue = "–" if r["kueue"] is None else f"{r['kueue']:,.1f}" if r["unit"] == "points" else f"{r['kueue']:,.0f}"
        diff = ("–" if r["difference"] is None else f"{r['difference']:+.1f} pt" if r["unit"] == "points"
                else f"{100 * r['difference']:+.0f} %")
        ours = f"{r['ours']:,.1f}" if r["unit"] == "points" else f"{r['ours']:,}"
        bound = "–" if r["bound"] is None else f"{r['bound']:,.0f}" if r["unit"] != "points" else f"{r['bound']:g}"
        check = "–" if r["passes"] is None else "pass" if r["passes"] else "FAIL"
        lines.append(f"{r['figure']:<34} {ours:>10} {kueue:>11} {diff:>11} {bound:>9} {check}")
    return "\n".join(lines)
