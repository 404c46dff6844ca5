"""Time FGD (and best-fit) placement on the openb trace in inflate mode: place pods in trace order
until one cannot be placed.

    .venv/bin/python bench/bench_fragmentation.py [--traces DIR] [--policy fgd|bestfit|both] [--profile]

Reads ../shared/traces/ beside the project root by default; exits 0 with a note when the files are
absent.
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysim.core.cluster import ClusterSpec, ClusterState, NodeSpec  # noqa: E402
from analysim.core.fragmentation import (  # noqa: E402
    FragmentationIndex,
    WorkloadDistribution,
    best_fit_choose,
    fgd_choose,
    fits_mask,
)
from analysim.core.job import JobSpec  # noqa: E402

NODES = "openb_node_list_gpu_node.csv"
PODS = "openb_pod_list_default.csv"


def load(traces: Path) -> tuple[ClusterSpec, list[JobSpec]]:
    with open(traces / NODES, newline="") as fh:
        nodes = tuple(
            NodeSpec(r["sn"], "rack0", r["model"], int(r["gpu"]), int(r["cpu_milli"]), int(r["memory_mib"]))
            for r in csv.DictReader(fh)
        )
    jobs = []
    with open(traces / PODS, newline="") as fh:
        for r in csv.DictReader(fh):
            spec = r["gpu_spec"].strip()
            jobs.append(
                JobSpec(
                    job_id=r["name"],
                    submit_s=float(r["creation_time"] or 0),
                    duration_s=None,
                    num_gpus=int(r["num_gpu"]),
                    gpu_milli=int(r["gpu_milli"]),
                    cpu_milli=int(r["cpu_milli"]),
                    memory_mib=int(r["memory_mib"]),
                    gpu_models=tuple(spec.split("|")) if spec else (),
                    qos=r["qos"],
                )
            )
    return ClusterSpec("openb", nodes), jobs


def inflate(spec: ClusterSpec, jobs: list[JobSpec], policy: str) -> dict[str, float]:
    t0 = time.perf_counter()
    state = ClusterState(spec)
    workload = WorkloadDistribution.from_jobs(jobs)
    index = FragmentationIndex(state, workload)
    t_build = time.perf_counter() - t0
    placed = 0
    t_fit = t_choose = t_apply = 0.0
    clock = time.perf_counter
    for job in jobs:
        t1 = clock()
        cand = fits_mask(state, job)
        t2 = clock()
        if policy == "fgd":
            choice = fgd_choose(index, state, job, cand)
        else:
            choice = best_fit_choose(state, job, cand)
        t3 = clock()
        t_fit += t2 - t1
        t_choose += t3 - t2
        if choice is None:
            break
        node, slots = choice
        state.allocate(node, slots, job.gpu_milli if slots else 0, job.cpu_milli, job.memory_mib)
        index.refresh((node,))
        t_apply += clock() - t3
        placed += 1
    t_place = t_fit + t_choose + t_apply
    total_gpus = spec.total_gpus
    return {
        "classes": len(workload),
        "build_s": t_build,
        "place_s": t_place,
        "placed": placed,
        "us_per_placement": 1e6 * t_place / max(placed, 1),
        "us_fit": 1e6 * t_fit / max(placed, 1),
        "us_choose": 1e6 * t_choose / max(placed, 1),
        "us_apply": 1e6 * t_apply / max(placed, 1),
        "alloc_ratio": 1 - state.free_gpus_total() / total_gpus,
        "frag_gpus": index.cluster_frag_gpus(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    ap.add_argument("--policy", choices=("fgd", "bestfit", "both"), default="both")
    ap.add_argument("--profile", action="store_true", help="cProfile the FGD run, top 25 by own time")
    args = ap.parse_args()
    if not (args.traces / NODES).is_file() or not (args.traces / PODS).is_file():
        print(f"skipped: openb trace not found in {args.traces}")
        return 0
    spec, jobs = load(args.traces)
    print(f"openb: {len(spec.nodes)} nodes, {spec.total_gpus} GPUs, {len(jobs)} pods")
    policies = ("fgd", "bestfit") if args.policy == "both" else (args.policy,)
    for policy in policies:
        if args.profile and policy == "fgd":
            prof = cProfile.Profile()
            prof.enable()
            res = inflate(spec, jobs, policy)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        else:
            res = inflate(spec, jobs, policy)
        print(
            f"{policy:8s} classes={res['classes']} build={res['build_s'] * 1e3:.1f} ms "
            f"placed={res['placed']} in {res['place_s']:.2f} s ({res['us_per_placement']:.0f} us/placement: "
            f"fit mask {res['us_fit']:.0f}, choose {res['us_choose']:.0f}, allocate+refresh {res['us_apply']:.0f}) "
            f"GPU alloc={100 * res['alloc_ratio']:.1f}% frag={res['frag_gpus']:.1f} GPUs"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
