"""``python -m mlaas_monitor gateway|model ...``: the same commands as ``analysim gateway``
and ``analysim model``."""

from __future__ import annotations

import argparse
import sys

from analysim.cli import gateway, model
from analysim.errors import UserError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlaas_monitor", description="MLaaS gateway and model store")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    gateway.register(sub)
    model.register(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"mlaas_monitor {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
