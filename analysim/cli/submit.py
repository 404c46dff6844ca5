"""``analysim submit``: inject a job into a running scheduler service."""

from __future__ import annotations

import argparse
import os

from analysim.errors import UserError
from analysim.tls import add_tls_arguments, tls_from_args

TOKEN_ENV = "ANALYSIM_TOKEN_FILE"


def add_target(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scheduler", required=True, metavar="HOST:PORT", help="the scheduler's gRPC address")
    add_credentials(p)


def add_credentials(p: argparse.ArgumentParser) -> None:
    """What a scheduler client presents: a bearer token, TLS files."""
    p.add_argument("--token-file", metavar="FILE", default=os.environ.get(TOKEN_ENV),
                   help=f"bearer token (client or operator) when the scheduler requires one (default: ${TOKEN_ENV})")
    add_tls_arguments(p, server=False)


def refusal(e) -> str:  # noqa: ANN001 — a grpc.RpcError
    """A refused call in one line, with what to do about a missing or wrong credential."""
    import grpc

    hint = {grpc.StatusCode.UNAUTHENTICATED: f" (give --token-file or ${TOKEN_ENV})",
            grpc.StatusCode.PERMISSION_DENIED: " (this token's role may not do that)"}.get(e.code(), "")
    if e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details().startswith("vc is required"):
        hint = " (give --vc)"
    return f"{e.code().name}: {e.details()}{hint}"


def connect(args: argparse.Namespace):  # noqa: ANN201 — a scheduler_svc.client.SchedulerClient
    """A client for ``--scheduler`` with the token and TLS options."""
    from scheduler_svc.client import SchedulerClient

    token, tls = credentials(args)
    return SchedulerClient(args.scheduler, token=token, tls=tls)


def credentials(args: argparse.Namespace):  # noqa: ANN201 — (token or None, analysim.tls.TlsFiles)
    """``add_credentials``' options read: unreadable files are one line now."""
    from analysim.tokens import read_token

    token = read_token(args.token_file) if args.token_file else None
    tls = tls_from_args(args)
    tls.channel_credentials()
    return token, tls


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="submit a job to a running scheduler service",
                       description="Submit one job to a running scheduler (analysim up prints its address). "
                                   "Prints the job's id and state.")
    add_target(p)
    p.add_argument("--gpus", type=int, required=True, help="GPUs the job needs")
    p.add_argument("--duration", type=float, required=True, metavar="S", help="its run time in virtual seconds")
    p.add_argument("--gpu-milli", type=int, default=0, help="share of one GPU in thousandths (GPU-sharing jobs)")
    p.add_argument("--vc", default="", help="virtual cluster: required when the cluster names its VCs (the "
                                           "refusal lists them); otherwise 'default'")
    p.add_argument("--user", default="")
    p.add_argument("--gpu-model", action="append", default=[], help="allowed GPU model (repeatable)")
    p.add_argument("--id", default="", help="job id (default: chosen by the scheduler)")
    p.add_argument("--cpu-milli", type=int, default=0)
    p.add_argument("--memory-mib", type=int, default=0)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    import grpc

    from scheduler_svc.bounds import job_problem

    problem = job_problem(args.id, args.gpus, args.gpu_milli, args.duration, args.vc, args.user, args.gpu_model,
                          args.cpu_milli, args.memory_mib)
    if problem is not None:
        raise UserError(problem.replace("num_gpus", "--gpus").replace("duration_s", "--duration")
                        .replace("job_id", "--id").replace("cpu_milli", "--cpu-milli")
                        .replace("memory_mib", "--memory-mib").replace("gpu_milli", "--gpu-milli"))
    with connect(args) as c:
        try:
            job = c.submit(args.gpus, args.duration, job_id=args.id, vc=args.vc, user=args.user,
                           gpu_milli=args.gpu_milli, gpu_models=args.gpu_model, cpu_milli=args.cpu_milli,
                           memory_mib=args.memory_mib)
        except grpc.RpcError as e:
            raise UserError(refusal(e)) from None
    from analysim._protos.v1 import scheduler_pb2 as spb
    from scheduler_svc.contract import word

    start = f", started at t={job.first_start_s:.1f}" if job.HasField("first_start_s") else ""
    print(f"{job.job_id} {word(spb.JobStatus, job.status)} (submitted at t={job.submit_s:.1f}{start})")
    return 0
