"""Command line of the node agent: ``analysim agent`` and ``python -m node_agent``."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from analysim.argtypes import port, positive_int
from analysim.clusters import agent_slice, parse_cluster
from analysim.envconfig import apply_env
from analysim.errors import UserError, run_command
from analysim.logs import add_logging_arguments, setup_logging
from analysim.ops_http import start_ops_server
from analysim.portfile import write_port_file
from analysim.tls import add_tls_arguments, tls_from_args
from analysim.tokens import read_token


def agent_index(text: str) -> int:
    """``3`` or ``analysim-agent-3`` (a StatefulSet pod's name, whose ordinal is the index)."""
    tail = text.rsplit("-", 1)[-1]
    if not tail.isdigit():
        raise argparse.ArgumentTypeError(f"expected a number or a name ending in -NUMBER, got {text!r}")
    return int(tail)


def add_agent_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scheduler", required=True, metavar="HOST:PORT", help="the scheduler's gRPC address")
    p.add_argument("--cluster", default="philly",
                   help="the cluster spec the scheduler runs (preset, NxG[:MODEL] or file; default philly)")
    p.add_argument("--nodes", type=int, help="how many of its nodes this process fakes (default: all from --first-node)")
    p.add_argument("--first-node", type=int, default=0, help="index of the first of them in the cluster (default 0)")
    p.add_argument("--agent-index", type=agent_index, metavar="I",
                   help="with --agents N: take slice I of N even slices of the nodes instead of --first-node/--nodes; "
                        "I or a name ending in -I (a StatefulSet pod's name)")
    p.add_argument("--agents", type=positive_int, metavar="N", help="with --agent-index: how many agents share the nodes")
    p.add_argument("--agent-id", help="stable name, kept across restarts (default agent-<index> or agent-<first node>)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic telemetry")
    p.add_argument("--host", default="127.0.0.1", help="address for /metrics (default 127.0.0.1)")
    p.add_argument("--metrics-port", type=port, default=0, help="/metrics port (default 0: any free port)")
    p.add_argument("--port-file", help="write the bound /metrics port here (JSON) once connected")
    p.add_argument("--fail-rate", type=float, default=0.0, metavar="P",
                   help="inject faults: each launch fails part-way with probability P (by --seed; default 0)")
    p.add_argument("--connect-timeout", type=float, default=60.0, metavar="S",
                   help="give up after S wall seconds without a scheduler (default 60)")
    add_logging_arguments(p)
    p.add_argument("--token-file", metavar="FILE",
                   help="this agent's bearer token (the first word of the file) when the scheduler requires one")
    add_tls_arguments(p, server=False)


def run(args: argparse.Namespace) -> int:
    from node_agent.agent import Agent, Connection, FatalError
    from node_agent.metrics import registry_for

    setup_logging("agent", args.log_level, args.log_format)
    cluster = parse_cluster(args.cluster)
    total = len(cluster.nodes)
    if (args.agent_index is None) != (args.agents is None):
        raise UserError("--agent-index and --agents go together")
    if args.agent_index is not None:
        args.first_node, args.nodes = agent_slice(total, args.agents, args.agent_index)
    n = args.nodes if args.nodes is not None else total - args.first_node
    if not (0 <= args.first_node < total and 1 <= n <= total - args.first_node):
        raise UserError(f"--first-node {args.first_node} --nodes {n}: cluster {cluster.name!r} has {total} nodes")
    nodes = list(cluster.nodes[args.first_node: args.first_node + n])
    if not 0.0 <= args.fail_rate <= 1.0:
        raise UserError(f"--fail-rate must be between 0 and 1, got {args.fail_rate}")
    token = read_token(args.token_file) if args.token_file else None
    tls = tls_from_args(args)
    tls.channel_credentials()  # unreadable TLS files: an error now
    default_id = f"agent-{args.agent_index}" if args.agent_index is not None else f"agent-{args.first_node}"
    agent = Agent(args.agent_id or default_id, nodes, seed=args.seed, fail_rate=args.fail_rate)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        def ready() -> tuple[bool, str]:
            return agent.connected, "connected to the scheduler" if agent.connected else "not connected"

        runner, port = await start_ops_server(registry_for(agent, cluster.name), args.host, args.metrics_port, ready)
        if args.port_file:
            write_port_file(args.port_file, {"host": args.host, "metrics": port, "pid": os.getpid()})
        conn = Connection(agent, args.scheduler, args.connect_timeout, token=token, tls=tls)
        try:
            await conn.run(stop)
        except FatalError as e:
            print(f"analysim agent: error: {e}", file=sys.stderr)
            return 2
        finally:
            await runner.cleanup()
        return 0

    return asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m node_agent", description="AnalySIM fake node agent")
    add_agent_arguments(p)
    apply_env(p)
    args = p.parse_args(argv)
    return run_command("node_agent", lambda: run(args))
