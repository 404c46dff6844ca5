"""Command line of the scheduler service: ``python -m scheduler_svc serve ...`` (and what
``analysim up`` starts)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import tempfile
from pathlib import Path

from analysim.argtypes import port, positive_int, wall_seconds
from analysim.envconfig import apply_env
from analysim.errors import UserError, run_command
from analysim.inputs import add_run_arguments, load_inputs, run_options
from analysim.logs import add_logging_arguments, setup_logging
from analysim.tls import add_tls_arguments, tls_from_args


def parse_speed(text: str) -> float | None:
    """``max`` (lockstep) or a positive number of virtual seconds per wall second."""
    if text == "max":
        return None
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"speed must be 'max' or a positive number, not {text!r}") from None
    if not 0 < v <= 1e9:
        raise argparse.ArgumentTypeError(f"speed must be in (0, 1e9], got {v:g}")
    return v


def add_service_arguments(p: argparse.ArgumentParser) -> None:
    add_run_arguments(p)
    p.add_argument("--policy", default="fifo", help="queue policy (as analysim simulate)")
    p.add_argument("--placement", default="consolidate", help="placement (as analysim simulate)")
    p.add_argument("--speed", type=parse_speed, default=None,
                   help="'max' (default): lockstep, as fast as the agents answer; S: S virtual seconds per wall second")
    p.add_argument("--paced-lag", type=float, default=0.0, metavar="S",
                   help="paced mode: take events up S wall seconds after they are due, so that agents' reports "
                        "up to S late are still exact (decisions keep their virtual times; default 0)")
    p.add_argument("--heartbeat-deadline", type=wall_seconds(0.05, 3600), default=5.0, metavar="S",
                   help="wall seconds without a message before an agent's nodes are marked down (default 5)")
    p.add_argument("--journal", type=Path, help="SQLite journal (default: a fresh file in a temporary folder); "
                                                "an existing one is resumed")
    p.add_argument("--accept-journal-loss", action="store_true",
                   help="resume from a damaged --journal (failed integrity check, WAL frames SQLite drops, a WAL cut "
                        "or deleted, a table lost, values no scheduler writes, an empty file) with what it still "
                        "holds, logging what is lost (every acknowledged job by id); without it such a journal is "
                        "refused")
    p.add_argument("--out", type=Path, help="write summary.json, jobs.csv, timeseries.csv here at the end of the replay (checked at "
                        "start: a folder that can be made and written, with 16 MB free)")
    p.add_argument("--plots", action="store_true", help="with --out, also the PNG plots")
    p.add_argument("--events", type=Path, metavar="FILE",
                   help="write every decision to this CSV as analysim simulate --events does (FILE.partial until the "
                        "replay ends)")
    p.add_argument("--no-offline-check", action="store_true",
                   help="skip the offline run that the summary's fidelity figures compare against")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=0, help="gRPC port (default 0: any free port)")
    p.add_argument("--metrics-port", type=port, default=0, help="Prometheus /metrics port (default 0: any)")
    p.add_argument("--port-file", help="write the bound ports here (JSON) once serving")
    p.add_argument("--exit-when-done", action="store_true", help="stop once every trace job is accounted for")
    add_logging_arguments(p)
    add_tls_arguments(p, server=True)


def add_auth_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agent-token-file", metavar="FILE",
                   help="bearer tokens of node agents, one a line, each optionally followed by the nodes it may "
                        "register (e.g. 'TOKEN node-0000..node-0007'); see docs/live.md")
    p.add_argument("--client-token-file", metavar="FILE", help="bearer tokens of clients (submit, cancel, read)")
    p.add_argument("--operator-token-file", metavar="FILE",
                   help="bearer tokens of operators (clients that may also pause, resume and set the speed)")


def authenticator(args: argparse.Namespace, node_order: list[str]):  # noqa: ANN201
    """The scheduler's Authenticator from the token files (disabled when none is given)."""
    from scheduler_svc.auth import AGENT, CLIENT, OPERATOR, Authenticator

    auth = Authenticator()
    files = {role: getattr(args, f"{role}_token_file", None) for role in (AGENT, CLIENT, OPERATOR)}
    for role, path in files.items():
        if path:
            auth.add_file(role, path, node_order)
    if auth.enabled and not (files[AGENT] and (files[CLIENT] or files[OPERATOR])):
        raise UserError("with authentication on, give --agent-token-file and a --client-token-file or "
                        "--operator-token-file (otherwise that side could not connect)")
    if not auth.enabled and args.host not in ("127.0.0.1", "localhost", "::1"):
        raise UserError(f"--host {args.host}: serving beyond loopback needs --agent-token-file and "
                        "--client-token-file/--operator-token-file (anyone could drive the scheduler)")
    return auth


def run(args: argparse.Namespace) -> int:
    from analysim.report import check_out_folder
    from scheduler_svc.core import LiveScheduler
    from scheduler_svc.journal import Journal, JournalUnavailable
    from scheduler_svc.metrics import SchedulerMetrics
    from scheduler_svc.server import serve
    from scheduler_svc.settings import LiveSettings

    setup_logging("scheduler", args.log_level, args.log_format)
    if not 0 <= args.paced_lag <= 10:
        raise UserError(f"--paced-lag must be between 0 and 10 wall seconds, got {args.paced_lag:g}")
    if args.mode != "replay":
        raise UserError("the live scheduler replays traces in time: --mode inflate is offline only")
    if args.plots:
        from analysim.report import pyplot

        pyplot()  # matplotlib is there, or a one-line error now rather than at the end of the replay
    if args.out is not None:
        check_out_folder(args.out)  # a file, an unwritable folder, a full disk: now, not at the replay's end
    trace, cluster = load_inputs(args)
    opts = run_options(args, args.policy, args.placement)
    auth = authenticator(args, [n.name for n in cluster.nodes])
    tls = tls_from_args(args)
    tls.server_credentials()  # unreadable or half-given TLS files: an error now, not after the replay starts
    # Without --journal, a fresh one in a folder of its own that no later start can name: removed
    # when this process ends, however it ends but killed (left behind, it is a file per start).
    own_folder = None if args.journal else Path(tempfile.mkdtemp(prefix="analysim-journal-"))
    journal_path = args.journal or own_folder / "journal.db"

    async def main() -> bool:
        # The scheduler's asyncio objects must be made on the loop that runs them.
        journal = Journal(journal_path, accept_loss=args.accept_journal_loss)
        try:
            settings = LiveSettings(speed=args.speed, trace_source=trace.source, trace_filtered=trace.filtered,
                                    heartbeat_deadline_s=args.heartbeat_deadline, out=args.out, plots=args.plots,
                                    offline_check=not args.no_offline_check, paced_lag_s=args.paced_lag,
                                    events=args.events)
            live = LiveScheduler(cluster, opts, trace.jobs, journal=journal, metrics=SchedulerMetrics(),
                                 settings=settings)
        except (ValueError, JournalUnavailable) as e:
            journal.close()
            raise UserError(str(e)) from None
        # The trace and the engine's tables live for the whole run: out of the collector's sight,
        # so that full collections (latency spikes on a lockstep step) stay cheap.
        gc.collect()
        gc.freeze()
        return await serve(live, args.host, args.port, args.metrics_port, args.port_file, args.exit_when_done,
                           auth=auth, tls=tls)

    try:
        return 0 if asyncio.run(main()) else 1  # 1: the run's end could not be written to --out (logged)
    finally:
        if own_folder is not None:
            shutil.rmtree(own_folder, ignore_errors=True)


def write_tokens(args: argparse.Namespace) -> int:
    from analysim.clusters import parse_cluster
    from scheduler_svc import auth

    nodes = [n.name for n in parse_cluster(args.cluster).nodes]
    d = auth.write_tokens(args.out, nodes, args.agents, keep=not args.new)
    print(f"tokens for {min(args.agents, len(nodes))} agents of {args.cluster} in {d}")
    return 0


def main(argv: list[str] | None = None) -> int:

    p = argparse.ArgumentParser(prog="python -m scheduler_svc", description="AnalySIM live scheduler service")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the scheduler service")
    add_service_arguments(serve)
    add_auth_arguments(serve)  # not `analysim up`'s: it makes tokens for its own processes
    tokens = sub.add_parser("tokens", help="write the token files a scheduler and its agents need",
                            description="Write agents.tokens (each agent's token with the nodes of its slice), "
                                        "agent-<i>.token, client.token and operator.token into --out (mode 600), "
                                        "for --agents agents sharing --cluster's nodes as --agent-index slices. "
                                        "Files already holding the same slices are kept.")
    tokens.add_argument("--cluster", default="philly", help="the scheduler's cluster (default philly)")
    tokens.add_argument("--agents", type=positive_int, required=True, metavar="N", help="how many agents")
    tokens.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder to write them in")
    tokens.add_argument("--new", action="store_true", help="always write new tokens")
    apply_env(p)
    args = p.parse_args(argv)
    return run_command("scheduler_svc", lambda: run(args) if args.command == "serve" else write_tokens(args))
