"""``python -m mlaas_monitor.monitor gateway ...``: ``analysim gateway``, which runs the
extraction monitor in process unless told ``--no-monitor``. ``serve``: the monitor as its own service,
following the store's query log. Also ``attack`` and ``monitor-eval``."""

from __future__ import annotations

import argparse
import os

from analysim.argtypes import port
from analysim.envconfig import apply_env
from analysim.errors import UserError, run_command
from analysim.logs import add_logging_arguments
from mlaas_monitor.commands import attack, gateway, monitor_eval


def run_serve(args: argparse.Namespace) -> int:
    from analysim.logs import setup_logging
    from mlaas_monitor.admin_key import load_admin_key
    from mlaas_monitor.monitor.daemon import run_service

    setup_logging("monitor", args.log_level, args.log_format)
    if args.checkpoint_interval <= 0:
        raise UserError(f"--checkpoint-interval must be a positive number of seconds, got {args.checkpoint_interval}")
    admin_key = load_admin_key(os.environ, args.admin_key_file)
    run_service(args.db, args.state, admin_key, args.host, args.port, args.port_file, args.checkpoint_interval,
                exit_with_stdin=args.exit_with_stdin)  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlaas_monitor.monitor", description="MLaaS gateway with the extraction monitor")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    gateway.register(sub)  # the gateway with the monitor in process, as `analysim gateway` runs it
    w = sub.add_parser("serve", help="the monitor as its own service: follows the store's query log, pushes enforcement to the gateways")
    w.add_argument("--db", required=True, help="the gateways' store (models, accounts, the query log)")
    w.add_argument("--state", help="this monitor's own SQLite file (default: its tables in the store)")
    w.add_argument("--admin-key-file", help="file holding the admin key (else $ANALYSIM_ADMIN_KEY)")
    w.add_argument("--host", default="127.0.0.1")
    w.add_argument("--port", type=port, default=8070, help="HTTP port of the admin API, /metrics and the decisions feed (0: any)")
    w.add_argument("--port-file", help='write {"host", "http"} here once listening')
    w.add_argument("--checkpoint-interval", type=float, default=1.0, metavar="S",
                   help="checkpoint state and cursor at most every S seconds (default 1; at once on a warning)")
    w.add_argument("--exit-with-stdin", action="store_true",
                   help="stop when stdin closes (how a gateway ties the monitor it starts to its own life)")
    add_logging_arguments(w)
    w.set_defaults(func=run_serve)
    attack.register(sub)
    monitor_eval.register(sub)
    apply_env(parser)
    args = parser.parse_args(argv)
    return run_command(f"mlaas_monitor.monitor {args.command}", lambda: args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
