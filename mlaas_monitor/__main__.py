"""``python -m mlaas_monitor gateway|model ...``: the same commands as ``analysim gateway``
and ``analysim model``."""

from __future__ import annotations

import argparse

from analysim.envconfig import apply_env
from analysim.errors import run_command
from mlaas_monitor.commands import gateway, model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlaas_monitor", description="MLaaS gateway and model store")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    gateway.register(sub)
    model.register(sub)
    apply_env(parser)
    args = parser.parse_args(argv)
    return run_command(f"mlaas_monitor {args.command}", lambda: args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
