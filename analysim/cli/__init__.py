"""The ``analysim`` command: one entry point, a module per subcommand.

Each subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``func`` to a callable taking the parsed arguments and returning an exit code.
"""

from __future__ import annotations

import argparse
import importlib
from typing import NoReturn

from analysim import __version__
from analysim.envconfig import apply_env
from analysim.errors import run_command

# Subcommand modules, in the order ``analysim --help`` lists them.
SUBCOMMANDS = ("simulate", "compare", "sweep", "report", "trace", "model", "gateway", "attack", "monitor-eval",
               "up", "agent", "submit", "status", "load")


class _Parser(argparse.ArgumentParser):
    """A bad flag or value is one line on stderr and exit 2, not a screenful of usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="analysim",
        description="Trace-driven emulation of multi-tenant GPU clusters, and an MLaaS extraction monitor.",
    )
    parser.add_argument("--version", action="version", version=f"analysim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"analysim.cli.{name.replace('-', '_')}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    apply_env(parser)
    args = parser.parse_args(argv)
    return run_command(f"analysim {args.command}", lambda: args.func(args), say_interrupted=True)
