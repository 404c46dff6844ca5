"""The ``analysim`` command: one entry point, a module per subcommand.

Each subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``func`` to a callable taking the parsed arguments and returning an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

from analysim import __version__
from analysim.envconfig import apply_env
from analysim.errors import run_command

# Subcommand modules, in the order ``analysim --help`` lists them.
SUBCOMMANDS = ("simulate", "compare", "sweep", "kueue-perf", "explain", "fidelity", "report", "trace", "model", "gateway", "attack", "monitor-eval",
               "up", "agent", "submit", "status", "load")


class _Parser(argparse.ArgumentParser):
    """A bad flag or value is one line on stderr and exit 2, not a screenful of usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``only`` just that subcommand's part (the others import
    what they serve, e.g. aiohttp and grpc, which a simulation does not need)."""
    parser = _Parser(
        prog="analysim",
        description="Trace-driven emulation of multi-tenant GPU clusters, and an MLaaS extraction monitor.",
    )
    parser.add_argument("--version", action="version", version=f"analysim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS if only is None else (only,):
        importlib.import_module(f"analysim.cli.{name.replace('-', '_')}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args_given = sys.argv[1:] if argv is None else argv
    # The subcommand comes first; anything else (--help, --version, a typo) gets every one.
    parser = build_parser(args_given[0] if args_given and args_given[0] in SUBCOMMANDS else None)
    apply_env(parser)
    args = parser.parse_args(argv)
    return run_command(f"analysim {args.command}", lambda: args.func(args), say_interrupted=True)
