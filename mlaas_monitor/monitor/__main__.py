"""``python -m mlaas_monitor.monitor gateway ...``: ``analysim gateway``, which runs the
extraction monitor in process unless told ``--no-monitor``. ``watch``: the monitor as its own service,
following a gateway's gRPC query stream. Also ``attack`` and ``monitor-eval``."""

from __future__ import annotations

import argparse
import os

from analysim.envconfig import apply_env
from analysim.errors import UserError, run_command
from mlaas_monitor.commands import attack, gateway, monitor_eval


def run_watch(args: argparse.Namespace) -> int:
    import asyncio
    import signal
    from pathlib import Path

    from aiohttp import web

    from analysim.portfile import write_port_file
    from mlaas_monitor.admin_key import load_admin_key
    from mlaas_monitor.monitor.remote import RemoteMonitor
    from mlaas_monitor.server import run_loop

    admin_key = load_admin_key(os.environ, args.admin_key_file)
    if not Path(args.models_db).is_file():
        raise UserError(f"--models-db: no store at {args.models_db}")
    rm = RemoteMonitor(args.target, admin_key, args.models_db, args.state)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        runner = web.AppRunner(rm.build_app(), access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, args.host, args.port).start()
        port = runner.addresses[0][1]
        follow = asyncio.create_task(rm.run())
        stopping = asyncio.create_task(stop.wait())
        if args.port_file:
            write_port_file(args.port_file, {"host": args.host, "http": port})
        print(f"monitor: following {args.target}, http://{args.host}:{port}", flush=True)
        try:
            await asyncio.wait({follow, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if follow.done():
                follow.result()  # raises what stopped it (e.g. a refused key)
        finally:
            follow.cancel()
            stopping.cancel()
            await asyncio.gather(follow, return_exceptions=True)
            await runner.cleanup()

    try:
        run_loop(main())
    except OSError as e:
        raise UserError(f"cannot serve on {args.host}: {e}") from e
    finally:
        rm.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlaas_monitor.monitor", description="MLaaS gateway with the extraction monitor")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    gateway.register(sub)  # the gateway with the monitor in process, as `analysim gateway` runs it
    w = sub.add_parser("watch", help="the monitor as its own service, over the gateway's gRPC query stream")
    w.add_argument("--target", required=True, help="the gateway's gRPC address, HOST:PORT")
    w.add_argument("--models-db", required=True, help="the gateway's store (read for the models' trees and S)")
    w.add_argument("--state", required=True, help="this monitor's own SQLite file (created if absent)")
    w.add_argument("--admin-key-file", help="file holding the gateway's admin key (else $ANALYSIM_ADMIN_KEY)")
    w.add_argument("--host", default="127.0.0.1")
    w.add_argument("--port", type=int, default=0, help="HTTP port for /metrics and /v1/admin/monitor (0: any)")
    w.add_argument("--port-file", help='write {"host", "http"} here once listening')
    w.set_defaults(func=run_watch)
    attack.register(sub)
    monitor_eval.register(sub)
    apply_env(parser)
    args = parser.parse_args(argv)
    return run_command(f"mlaas_monitor.monitor {args.command}", lambda: args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
