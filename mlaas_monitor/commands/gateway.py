"""``analysim gateway``: serve the store's models over HTTP and gRPC until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import os
import sys

from analysim.argtypes import nonneg_int, port, positive_int, rate
from analysim.errors import UserError
from analysim.logs import add_logging_arguments, setup_logging
from analysim.portfile import write_port_file
from analysim.tls import add_tls_arguments, tls_from_args


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "gateway",
        help="serve the MLaaS gateway (REST + gRPC) over a store",
        description="The admin key comes from ANALYSIM_ADMIN_KEY or --admin-key-file; there is no default.",
    )
    p.add_argument("--db", required=True, help="SQLite store (created if absent)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port, default=8080, help="HTTP port (0 = any free port)")
    p.add_argument("--grpc-port", type=port, default=50051, help="gRPC port (0 = any free port)")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="address of the unauthenticated /metrics, /healthz, /readyz listener (default 127.0.0.1)")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="its port (default 0: any free port; -1: none, /metrics only on --port with the admin key)")
    p.add_argument("--admin-key-file", help="file holding the admin key (else $ANALYSIM_ADMIN_KEY)")
    p.add_argument("--port-file", help='write {"host", "http", "grpc"} here (atomically) once listening')
    p.add_argument("--max-body-bytes", type=positive_int, default=1 << 20, help="larger bodies get 413 (default 1 MiB)")
    p.add_argument("--max-batch-rows", type=positive_int, default=1000, help="larger batches get 413 (default 1000)")
    p.add_argument("--default-quota-rows", type=nonneg_int, help="per-user row quota (default: unlimited)")
    p.add_argument("--default-rate-limit", type=rate, help="per-user requests/s (default: unlimited)")
    p.add_argument("--no-monitor", action="store_true",
                   help="serve without the extraction monitor (by default the gateway runs one beside itself on its store)")
    p.add_argument("--monitor-url", metavar="URL",
                   help="subscribe to a shared monitor service (python -m mlaas_monitor.monitor serve) instead of running one")
    p.add_argument("--monitor-key-file", help="file holding the key for --monitor-url (default: this gateway's admin key)")
    p.add_argument("--monitor-checkpoint-interval", type=float, default=1.0, metavar="S",
                   help="checkpoint the monitor's state at most every S seconds (default 1; "
                        "whatever is not checkpointed is replayed from the query log)")  # fmt: skip
    p.add_argument("--synchronous", choices=("NORMAL", "FULL"), default="NORMAL",
                   help="SQLite durability: NORMAL survives a killed process, FULL also a power cut")  # fmt: skip
    add_tls_arguments(p, server=True, mutual=False)  # HTTPS and gRPC over TLS
    add_logging_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mlaas_monitor.admin_key import load_admin_key
    from mlaas_monitor.server import Bound, run_forever
    from mlaas_monitor.service import Gateway, Limits
    from mlaas_monitor.store import Store

    setup_logging("gateway", args.log_level, args.log_format)
    tls = tls_from_args(args)
    tls.server_credentials()  # unreadable or mismatched files: one line before the store is opened
    if args.metrics_port < -1 or args.metrics_port > 65535:
        raise UserError(f"--metrics-port must be -1 or a port number, got {args.metrics_port}")
    admin_key = load_admin_key(os.environ, args.admin_key_file)
    store = Store(args.db, args.synchronous, background_checkpoint=True)
    limits = Limits(args.max_body_bytes, args.max_batch_rows, args.default_quota_rows, args.default_rate_limit)
    gw = Gateway(store, admin_key, limits)

    def ready(b: Bound) -> None:
        if args.port_file:
            write_port_file(args.port_file, b.ports())
        metrics = "" if b.metrics_port is None else f" metrics http://{args.metrics_host}:{b.metrics_port}/metrics"
        print(f"gateway{'' if args.no_monitor else ' (monitored)'}: {'https' if tls.cert else 'http'}://{b.host}:{b.http_port} grpc {b.host}:{b.grpc_port}"
              f"{metrics} ({len(store.model_ids())} models, store {args.db})", flush=True)  # fmt: skip

    extensions = []
    if args.no_monitor and args.monitor_url:
        raise UserError("--no-monitor and --monitor-url contradict each other: pick one")
    if args.monitor_url:
        from mlaas_monitor.monitor.client import monitor_client_extension

        key = load_admin_key({}, args.monitor_key_file) if args.monitor_key_file else admin_key
        extensions.append(monitor_client_extension(args.monitor_url, key))
    elif not args.no_monitor:
        from mlaas_monitor.monitor.client import local_monitor_extension

        extensions.append(local_monitor_extension(args.monitor_checkpoint_interval))
    try:
        metrics_at = None if args.metrics_port == -1 else (args.metrics_host, args.metrics_port)
        run_forever(gw, args.host, args.port, args.grpc_port, ready, extensions=extensions, tls=tls,
                    metrics_at=metrics_at)
    except OSError as e:
        raise UserError(f"cannot serve on {args.host}: {e}") from e
    finally:
        store.close()
    print("gateway: stopped", file=sys.stderr, flush=True)
    return 0
