"""``python -m mlaas_monitor.monitor serve``: the extraction monitor as its own process.

It follows the store's query log (every gateway replica writes there) after a durable
cursor, folds each query into the engine (``service.Monitor``) in sequence order, and
serves over HTTP, every route behind the admin key: the admin API, ``/metrics`` and the
enforcement decisions the gateways long-poll (``/v1/monitor/decisions``). A gateway
started without ``--monitor-url`` runs one as its child, on its own store.

The cursor of each model is its checkpoint's seq, written in the same transaction as the
state it covers: after a restart (SIGKILL included) nothing is folded twice and nothing is
lost; the rows up to the checkpoint are read once more only for the raw queries (T_u,
the links and PRADA need them, and the log is their one copy), never re-evaluated.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import signal
import sys
import time
from pathlib import Path
from typing import IO

from aiohttp import web
from prometheus_client import CollectorRegistry

from analysim.errors import UserError
from analysim.portfile import write_port_file
from mlaas_monitor import auth
from mlaas_monitor.http_app import error_response
from mlaas_monitor.monitor.persist import MonitorDB
from mlaas_monitor.monitor.service import Monitor, add_routes
from mlaas_monitor.service import ApiError
from mlaas_monitor.store import Store
from mlaas_monitor.store_backends import is_postgres_url

log = logging.getLogger(__name__)
POLL_S = 0.005  # an idle follower looks at the log this often (one indexed read)
USERS_EVERY_S = 1.0  # and at the accounts (revocations) this often
RETRY_S = 1.0
LOCK_WAIT_S = 30.0
SHUTDOWN_GRACE_S = 5.0
# After its decisions change, the follower folds nothing more until the long polls waiting
# for them are answered, or this long (a gateway that stops reading must not stall it).
ANSWER_WAIT_S = 1.0


def hold_lock(state: str) -> IO[bytes]:
    """One monitor per state file: an exclusive lock beside it, held while running. A
    monitor restarted at once (its predecessor still flushing) waits for it."""
    f = open(f"{state}.monitor-lock", "wb")  # noqa: SIM115 (held for the process's life)
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if time.monotonic() > deadline:
                f.close()
                raise UserError(f"{state}: another monitor is running on this state file") from None
            time.sleep(0.1)  # a lock wait, not synchronisation of a test


def build_app(mon: Monitor, admin_key: str) -> web.Application:
    admin_hash = auth.hash_key(admin_key)

    def authorize(request: web.Request) -> None:
        token = auth.bearer_token(request.headers.get("Authorization"))
        if token is None:
            raise ApiError(401, "unauthenticated", "missing API key: send 'Authorization: Bearer KEY'", "Authorization")
        if not auth.same_hash(auth.hash_key(token), admin_hash):
            raise ApiError(401, "unauthenticated", "invalid key: the monitor needs the admin key", "Authorization")

    @web.middleware
    async def errors(request: web.Request, handler):  # type: ignore[no-untyped-def]
        try:
            return await handler(request)
        except ApiError as e:
            return error_response(e)
        except web.HTTPException as e:  # router 404/405
            allow = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
            code = {404: "not_found", 405: "method_not_allowed"}.get(e.status, "http_error")
            return error_response(ApiError(e.status, code, e.reason, headers=allow))
        except Exception:  # a bug: answer JSON, log it, keep serving
            log.exception("internal error on %s %s", request.method, request.path)
            return error_response(ApiError(500, "internal", "internal error"))

    app = web.Application(middlewares=[errors])
    add_routes(mon, app, authorize)
    return app


async def follow(mon: Monitor, stop: asyncio.Event) -> None:
    """Fold the log in as it grows, a slice at a time (``Monitor.read``: the loop serves
    requests between slices), until ``stop``. A slice that changed what enforcement does is
    followed by the answers to the gateways' long polls before the next slice."""
    users_at = 0.0
    failing_since: float | None = None
    while not stop.is_set():
        try:
            version = mon.decisions.version
            n = mon.read()
            if time.monotonic() - users_at >= USERS_EVERY_S:
                mon.refresh_users()
                users_at = time.monotonic()
            if n == 0:
                mon.maybe_flush()
        except Exception as e:  # the store busy or gone: the cursor stays, retry; say we are stuck
            if failing_since is None:
                failing_since = time.monotonic()
                log.exception("monitor: reading the query log failed at seq %d; retrying every %g s", mon.cursor, RETRY_S)
            mon.decisions.set_problem(f"not following the query log after seq {mon.cursor}: {type(e).__name__}: {e}")
            await asyncio.sleep(RETRY_S)
            continue
        if failing_since is not None:
            log.warning("monitor: following the query log again after %.1f s", time.monotonic() - failing_since)
            failing_since = None
            mon.decisions.set_problem(None)
        if mon.decisions.version != version:
            await mon.decisions.answered(ANSWER_WAIT_S)
        await asyncio.sleep(POLL_S if n == 0 else 0)


async def _stdin_closed() -> None:
    """Wait until the parent that started us (a gateway) closes our stdin, e.g. by dying."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.read(4096):
        pass


def run_service(db: str, state: str | None, admin_key: str, host: str, port: int, port_file: str | None,
                checkpoint_interval: float, exit_with_stdin: bool = False) -> None:  # fmt: skip
    from mlaas_monitor.server import run_loop

    postgres = is_postgres_url(db)
    if not postgres and not Path(db).is_file():
        raise UserError(f"--db: no store at {db}")
    if postgres and not state:
        raise UserError("--state FILE is needed with a PostgreSQL --db (the monitor keeps its state in SQLite)")
    state = state or db
    lock = hold_lock(state)
    store = Store(db)
    # Sharing the store's file: its gateways checkpoint the WAL (a checkpoint here would be
    # an fsync in the monitor's loop, and fight theirs).
    mdb = MonitorDB(state, autocheckpoint=postgres or Path(state).resolve() != Path(db).resolve())
    mon: Monitor | None = None

    async def main() -> None:
        nonlocal mon
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        mon = Monitor(store, mdb, CollectorRegistry(auto_describe=True), checkpoint_interval)
        mon.refresh_users()
        started = time.perf_counter()
        mon.model_ids()  # load every model and its checkpoint
        while mon.read():  # then the log up to now, before anyone is told we are ready
            await asyncio.sleep(0)
        log.info("monitor: caught up to seq %d in %.2f s", mon.cursor, time.perf_counter() - started)
        runner = web.AppRunner(build_app(mon, admin_key), access_log=None, handle_signals=False,
                               shutdown_timeout=SHUTDOWN_GRACE_S)  # fmt: skip
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        bound = runner.addresses[0][1]
        tasks = [asyncio.create_task(follow(mon, stop))]
        if exit_with_stdin:
            tasks.append(asyncio.create_task(_stdin_closed()))
            tasks[-1].add_done_callback(lambda _: stop.set())
        if port_file:
            write_port_file(port_file, {"host": host, "http": bound})
        if not exit_with_stdin:  # a gateway's own monitor: the gateway's first line is the gateway's
            print(f"monitor: http://{host}:{bound} following {store.describe()} from seq {mon.cursor}", flush=True)
        try:
            await stop.wait()
        finally:
            mon.decisions.close()  # the gateways' long polls answer now, not after their wait
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await runner.cleanup()

    try:
        run_loop(main())
    except OSError as e:
        raise UserError(f"cannot serve on {host}: {e}") from e
    finally:
        if mon is not None:
            mon.close()
        else:
            mdb.close()
        store.close()
        with contextlib.suppress(OSError):
            lock.close()
