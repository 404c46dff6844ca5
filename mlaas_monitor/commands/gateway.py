"""``analysim gateway``: serve the store's models over HTTP and gRPC until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import functools
import os
import sys

from analysim.argtypes import nonneg_int, port, positive_int, rate
from analysim.errors import UserError
from analysim.logs import add_logging_arguments, setup_logging
from analysim.portfile import write_port_file
from analysim.tls import add_tls_arguments, tls_from_args
from mlaas_monitor.store_backends import is_postgres_url, redacted


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "gateway",
        help="serve the MLaaS gateway (REST + gRPC) over a store",
        description="The admin key comes from ANALYSIM_ADMIN_KEY or --admin-key-file; there is no default.",
    )
    p.add_argument("--db", required=True,
                   help="the store: a SQLite file (created if absent) or a PostgreSQL URL postgresql://USER@HOST/DB "
                        "(shared by replicas; the password from the URL or $PGPASSWORD)")  # fmt: skip
    p.add_argument("--workers", type=positive_int, default=1,
                   help="gateway processes sharing the HTTP and gRPC ports (SO_REUSEPORT); more than 1 needs "
                        "a PostgreSQL --db (default 1)")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port, default=8080, help="HTTP port (0 = any free port)")
    p.add_argument("--grpc-port", type=port, default=50051, help="gRPC port (0 = any free port)")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="address of the unauthenticated /metrics, /healthz, /readyz listener (default 127.0.0.1)")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="its port (default 0: any free port; -1: none, /metrics only on --port with the admin key); "
                        "with --workers N, worker i uses this port + i")  # fmt: skip
    p.add_argument("--admin-key-file", help="file holding the admin key (else $ANALYSIM_ADMIN_KEY)")
    p.add_argument("--port-file", help='write {"host", "http", "grpc", "metrics", "workers"} here (atomically) once listening')
    p.add_argument("--max-body-bytes", type=positive_int, default=1 << 20, help="larger bodies get 413 (default 1 MiB)")
    p.add_argument("--max-batch-rows", type=positive_int, default=1000, help="larger batches get 413 (default 1000)")
    p.add_argument("--body-timeout", type=float, default=10.0, metavar="S",
                   help="a request body must arrive whole within S seconds, else 408 (default 10)")
    p.add_argument("--max-uploads", type=positive_int, default=128, metavar="N",
                   help="bodies received at once, at most; beyond, 503 with Retry-After at once (default 128)")
    p.add_argument("--idle-timeout", type=float, default=15.0, metavar="S",
                   help="close a connection that has sent no complete request head for S seconds, before its first "
                        "request or after one (default 15)")
    p.add_argument("--max-connections", type=nonneg_int, default=0, metavar="N",
                   help="open HTTP connections at most; at the cap a new one closes the oldest idle one (default 0: "
                        "the descriptor limit less 128)")
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
    setup_logging("gateway", args.log_level, args.log_format)
    tls = tls_from_args(args)
    tls.server_credentials()  # unreadable or mismatched files: one line before the store is opened
    if args.metrics_port < -1 or args.metrics_port > 65535 - (args.workers - 1):
        raise UserError(f"--metrics-port must be -1 or a port number (with room for {args.workers} workers), got {args.metrics_port}")
    postgres = is_postgres_url(args.db)
    if args.workers > 1 and not postgres:
        raise UserError(f"--workers {args.workers} needs a PostgreSQL store (--db postgresql://...): a SQLite file is "
                        "one process's store (its writers would queue on one lock)")  # fmt: skip
    if args.no_monitor and args.monitor_url:
        raise UserError("--no-monitor and --monitor-url contradict each other: pick one")
    if not args.no_monitor and not args.monitor_url and (args.workers > 1 or postgres):
        raise UserError("the in-process extraction monitor a gateway starts sees one process's SQLite store: with "
                        "--workers or a PostgreSQL --db, run the monitor service (python -m mlaas_monitor.monitor serve "
                        "--db ... --state FILE) and pass --monitor-url, or pass --no-monitor")  # fmt: skip
    if args.workers > 1:
        return _run_workers(args)
    _serve(args)
    return 0


def _serve(args: argparse.Namespace, worker: int | None = None) -> None:
    """One gateway process (``worker``: its index among ``--workers``, which share the ports)."""
    from mlaas_monitor.admin_key import load_admin_key
    from mlaas_monitor.server import Bound, run_forever
    from mlaas_monitor.service import Gateway, Limits
    from mlaas_monitor.store import Store

    tls = tls_from_args(args)
    admin_key = load_admin_key(os.environ, args.admin_key_file)
    store = Store(args.db, args.synchronous, background_checkpoint=True)
    limits = Limits(args.max_body_bytes, args.max_batch_rows, args.default_quota_rows, args.default_rate_limit,
                    args.body_timeout, args.max_uploads, args.idle_timeout, args.max_connections)
    gw = Gateway(store, admin_key, limits)

    def ready(b: Bound) -> None:
        if args.port_file:
            write_port_file(args.port_file, {**b.ports(), "pid": os.getpid()})
        if worker is None:
            metrics = "" if b.metrics_port is None else f" metrics http://{args.metrics_host}:{b.metrics_port}/metrics"
            print(f"gateway{'' if args.no_monitor else ' (monitored)'}: {'https' if tls.cert else 'http'}://{b.host}:{b.http_port} grpc {b.host}:{b.grpc_port}"
                  f"{metrics} ({len(store.model_ids())} models, store {store.describe()})", flush=True)  # fmt: skip

    extensions = []
    if args.monitor_url:
        from mlaas_monitor.monitor.client import monitor_client_extension

        key = load_admin_key({}, args.monitor_key_file) if args.monitor_key_file else admin_key
        extensions.append(monitor_client_extension(args.monitor_url, key))
    elif not args.no_monitor:
        from mlaas_monitor.monitor.client import local_monitor_extension

        extensions.append(local_monitor_extension(args.monitor_checkpoint_interval, args.log_format))
    try:
        metrics_at = None if args.metrics_port == -1 else (args.metrics_host, args.metrics_port)
        run_forever(gw, args.host, args.port, args.grpc_port, ready, extensions=extensions, tls=tls,
                    metrics_at=metrics_at, reuse_port=worker is not None)
    except OSError as e:
        raise UserError(f"cannot serve on {args.host}: {e}") from e
    finally:
        store.close()
    if worker is None:
        print("gateway: stopped", file=sys.stderr, flush=True)


def _worker_main(args: argparse.Namespace, index: int, port_file: str) -> None:
    """A worker process of --workers (spawned: a fresh interpreter)."""
    from analysim.errors import run_command
    from mlaas_monitor.workers import exit_with_parent

    setup_logging("gateway", args.log_level, args.log_format)
    exit_with_parent()
    args.port_file = port_file
    if args.metrics_port > 0:
        args.metrics_port += index
    sys.exit(run_command(f"analysim gateway (worker {index})", lambda: _serve(args, index) or 0))


def _run_workers(args: argparse.Namespace) -> int:
    from mlaas_monitor.store import Store
    from mlaas_monitor.workers import Supervisor, reserve_port

    # The schema is created or migrated once, here, before the workers open the store.
    Store(args.db).close()
    held = [reserve_port(args.host, args.port), reserve_port(args.host, args.grpc_port)]
    args.port, args.grpc_port = (s.getsockname()[1] for s in held)
    tls = tls_from_args(args)

    def on_change(workers: list[dict[str, object]]) -> None:
        ports = {"host": args.host, "http": args.port, "grpc": args.grpc_port,
                 "workers": [{"pid": w["pid"], "metrics": w.get("metrics")} for w in workers]}  # fmt: skip
        if workers[0].get("metrics") is not None:
            ports["metrics"] = workers[0]["metrics"]
        if args.port_file:
            write_port_file(args.port_file, ports)
        metrics = " ".join(f"http://{args.metrics_host}:{w['metrics']}/metrics" for w in workers if w.get("metrics"))
        print(f"gateway ({len(workers)} workers): {'https' if tls.cert else 'http'}://{args.host}:{args.port} grpc "
              f"{args.host}:{args.grpc_port}{' metrics ' + metrics if metrics else ''} (store {redacted(args.db)})",
              flush=True)  # fmt: skip

    try:
        Supervisor(args.workers, functools.partial(_worker_main, args), on_change).run()
    finally:
        for s in held:
            s.close()
    print("gateway: stopped", file=sys.stderr, flush=True)
    return 0
