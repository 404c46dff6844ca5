"""``analysim agent``: run N fake GPU nodes in this process against a scheduler service."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from node_agent.cli import add_agent_arguments

    p = sub.add_parser("agent", help="fake node agent(s) for a running scheduler service",
                       description="Run --nodes fake GPU nodes of --cluster (from --first-node) in one process: they "
                                   "register with the scheduler, run its jobs in virtual time, and publish per-GPU "
                                   "telemetry on /metrics. See docs/live.md.")
    add_agent_arguments(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from node_agent.cli import run

    return run(args)
