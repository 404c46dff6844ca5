"""``analysim submit``: inject a job into a running scheduler service."""

from __future__ import annotations

import argparse
import math

from analysim.errors import UserError


def add_target(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scheduler", required=True, metavar="HOST:PORT", help="the scheduler's gRPC address")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="submit a job to a running scheduler service",
                       description="Submit one job to a running scheduler (analysim up prints its address). "
                                   "Prints the job's id and state.")
    add_target(p)
    p.add_argument("--gpus", type=int, required=True, help="GPUs the job needs")
    p.add_argument("--duration", type=float, required=True, metavar="S", help="its run time in virtual seconds")
    p.add_argument("--gpu-milli", type=int, default=0, help="share of one GPU in thousandths (GPU-sharing jobs)")
    p.add_argument("--vc", default="", help="virtual cluster (default: 'default')")
    p.add_argument("--user", default="")
    p.add_argument("--gpu-model", action="append", default=[], help="allowed GPU model (repeatable)")
    p.add_argument("--id", default="", help="job id (default: chosen by the scheduler)")
    p.add_argument("--cpu-milli", type=int, default=0)
    p.add_argument("--memory-mib", type=int, default=0)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    import grpc

    from scheduler_svc.client import SchedulerClient

    if args.gpus < 0 or args.gpu_milli < 0 or args.cpu_milli < 0 or args.memory_mib < 0:
        raise UserError("--gpus, --gpu-milli, --cpu-milli and --memory-mib cannot be negative")
    with SchedulerClient(args.scheduler) as c:
        try:
            job = c.submit(args.gpus, args.duration, job_id=args.id, vc=args.vc, user=args.user,
                           gpu_milli=args.gpu_milli, gpu_models=args.gpu_model, cpu_milli=args.cpu_milli,
                           memory_mib=args.memory_mib)
        except grpc.RpcError as e:
            raise UserError(f"{e.code().name}: {e.details()}") from None
    start = "" if math.isnan(job.first_start_s) else f", started at t={job.first_start_s:.1f}"
    print(f"{job.job_id} {job.status} (submitted at t={job.submit_s:.1f}{start})")
    return 0
