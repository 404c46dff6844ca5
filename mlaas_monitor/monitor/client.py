"""A gateway's side of the extraction monitor, which runs as its own process
(``daemon.py``): either one this gateway starts beside itself on its own store (the
default, ``local_monitor_extension``) or a shared service every replica subscribes to
(``analysim gateway --monitor-url URL``, ``monitor_client_extension``).

The gateway long-polls the monitor's enforcement decisions and applies them before
answering (a dict lookup on the event loop); the monitor's admin routes are forwarded to
it, after the gateway's own admin check, and the metrics of the monitor a gateway starts
are part of that gateway's /metrics (a shared monitor is scraped on its own). The monitor does its work in its own process: none of it competes with this
event loop for the GIL. When the monitor is down the gateway keeps serving with the last
decisions it received, says so in ``analysim_gateway_monitor_up``, and resubscribes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from aiohttp import web
from prometheus_client import Counter, Gauge
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from analysim.errors import UserError
from mlaas_monitor.admin_key import ENV_VAR
from mlaas_monitor.http_app import add_openapi, read_body
from mlaas_monitor.monitor.openapi import monitor_openapi
from mlaas_monitor.monitor.service import ADMIN_ROUTES, DECISIONS_PATH, GROUP_NAME, MAX_GROUP_MEMBERS
from mlaas_monitor.service import ApiError, Gateway
from mlaas_monitor.store_backends import is_postgres_url

log = logging.getLogger(__name__)
POLL_WAIT_S = 20.0  # how long one long poll may be held by the monitor
RETRY_S = 1.0  # back-off before resubscribing to a monitor that is down
START_TIMEOUT_S = 600.0  # the monitor reads the whole log once before it listens
RESTART_BACKOFF_S = (1.0, 30.0)  # a dead child monitor is restarted after 1 s, doubling up to 30 s
SCRAPE_TIMEOUT_S = 2.0
# How long a forwarded admin request may wait for the monitor's answer: a monitor that is
# stopped (SIGSTOP) or wedged still accepts connections, and would hold the admin route.
FORWARD_TIMEOUT_S = 10.0
# The gateway's own monitor runs below the gateway's CPU priority: answering queries is the
# product, folding them in can wait a few milliseconds (it follows the log and catches up).
# Without it, the scheduler lets the monitor's wake-ups take the core the gateway runs on.
LOCAL_MONITOR_NICENESS = 10
# The checkout (or site-packages) our mlaas_monitor was imported from: the monitor child runs
# the same code, whatever directory the gateway was started in (``python -m`` would otherwise
# import the package from the current directory first).
CODE_ROOT = Path(__file__).resolve().parents[2]
Extension = Callable[[Gateway, web.Application, grpc.aio.Server], None]


Spawn = Callable[[], tuple[str, str, "subprocess.Popen[bytes]"]]  # starts a monitor: (url, key, process)


class MonitorClient:
    def __init__(self, url: str, key: str, child: subprocess.Popen[bytes] | None = None,
                 respawn: Spawn | None = None) -> None:  # fmt: skip
        """``child``: the monitor process this gateway started (its metrics then join the
        gateway's; a shared monitor is its own scrape target, or every replica would
        report its series once more); ``respawn`` starts it again when it has died."""
        # The monitor's URL and admin key, the process this gateway started (None: a shared monitor), and how to start it again (None: not ours)
        self.url, self.key, self.child, self.respawn = url.rstrip("/"), key, child, respawn
        self.auth = {"Authorization": f"Bearer {key}"}  # the admin key as a request header
        self.restarts: Counter | None = None  # monitor restarts (None until metrics are registered)
        self._restart_wait = RESTART_BACKOFF_S[0]  # seconds before the next restart (grows per failed start)
        self.token: str | None = None  # the decisions snapshot's token last received (None: none yet)
        self.decisions: dict[str, dict[str, str]] = {}  # model -> user -> action, as last received
        self.problem: str | None = None  # why enforcement does not follow the monitor now (/readyz says it)
        self.up: Gauge | None = None  # 1 while the decisions follow the monitor (None until metrics are registered)
        self._session: aiohttp.ClientSession | None = None  # the HTTP session to the monitor (None: not started)
        self._task: asyncio.Task[None] | None = None  # the decisions long-poll loop (None: not started)

    # ---- enforcement ----

    def enforce(self, user: str, model_id: str) -> str:
        """The gateway's hook: 'none', 'degrade' or 'refuse' for this user's next query, as
        the monitor last decided."""
        return self.decisions.get(model_id, {}).get(user, "none")

    def _take(self, snapshot: dict[str, Any]) -> None:
        self.decisions = snapshot["decisions"]  # replaced whole: a reader sees one or the other
        self.token = snapshot["token"]
        # A monitor that answers but no longer follows the log decides nothing new: not up.
        stuck = None if snapshot.get("following", True) else snapshot.get("problem", "not following the query log")
        if stuck != self.problem and stuck is not None:
            log.error("monitor %s: %s; serving with its last decisions", self.url, stuck)
        self.problem = None if stuck is None else f"monitor {self.url}: {stuck}"
        if self.up is not None:
            self.up.set(0 if stuck else 1)

    def seed(self) -> None:
        """The current decisions, before the gateway answers anything (blocking; at start)."""
        with urllib.request.urlopen(urllib.request.Request(f"{self.url}{DECISIONS_PATH}", headers=self.auth), timeout=30) as r:
            self._take(json.loads(r.read()))

    async def follow(self) -> None:
        """Long-poll the decisions until cancelled; keep the last ones while the monitor is down."""
        assert self._session is not None and self.up is not None
        down_since: float | None = None
        while True:
            params = {"wait": str(POLL_WAIT_S), **({"after": self.token} if self.token else {})}
            try:
                async with self._session.get(f"{self.url}{DECISIONS_PATH}", params=params, headers=self.auth,
                                             timeout=aiohttp.ClientTimeout(total=POLL_WAIT_S + 10)) as r:  # fmt: skip
                    if r.status != 200:
                        raise aiohttp.ClientResponseError(r.request_info, (), status=r.status, message=await r.text())
                    self._take(await r.json())
                if down_since is not None:
                    log.warning("monitor %s is back after %.1f s; enforcement follows it again", self.url, time.monotonic() - down_since)
                    down_since = None
                self._restart_wait = RESTART_BACKOFF_S[0]
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as e:
                self.up.set(0)
                self.problem = f"monitor {self.url} unreachable ({e or type(e).__name__})"
                if down_since is None:
                    down_since = time.monotonic()
                    log.warning("monitor %s unreachable (%s); serving with its last decisions", self.url, e)
                if self.child is not None and self.child.poll() is not None and self.respawn is not None:
                    await self._restart_child()
                else:
                    await asyncio.sleep(RETRY_S)  # a retry back-off, not synchronisation

    async def _restart_child(self) -> None:
        """Our monitor process died (killed, out of memory): start another, with a back-off
        that doubles while restarts fail to answer. It resumes from its durable cursor."""
        assert self.child is not None and self.respawn is not None and self.restarts is not None
        code = self.child.returncode
        self.problem = f"the extraction monitor exited ({code}); restarting it"
        log.error("the extraction monitor (pid %d) exited with status %s; restarting it in %g s", self.child.pid, code,
                  self._restart_wait)  # fmt: skip
        await asyncio.sleep(self._restart_wait)  # a restart back-off, not synchronisation
        self._restart_wait = min(RESTART_BACKOFF_S[1], 2 * self._restart_wait)
        try:
            url, key, child = await asyncio.to_thread(self.respawn)
        except (UserError, OSError) as e:
            log.error("restarting the extraction monitor failed: %s", e)
            return
        self.restarts.inc()
        self.url, self.key, self.child = url.rstrip("/"), key, child
        self.auth = {"Authorization": f"Bearer {key}"}
        self.token = None  # another run of the monitor: the next poll answers at once
        log.warning("the extraction monitor restarted (pid %d) at %s", child.pid, self.url)

    # ---- admin routes ----

    async def forward(self, request: web.Request) -> web.Response:
        """The admin request, its body received within the gateway's body timeout, sent to the
        monitor; 503 when it does not answer within FORWARD_TIMEOUT_S."""
        assert self._session is not None
        body = await read_body(request)
        try:
            async with self._session.request(request.method, f"{self.url}{request.path_qs}", data=body or None,
                                             headers={**self.auth, "Content-Type": "application/json"},
                                             timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S)) as r:  # fmt: skip
                return web.Response(body=await r.read(), status=r.status, content_type="application/json",
                                    headers={k: v for k, v in r.headers.items() if k in ("Allow", "Retry-After")})  # fmt: skip
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ApiError(503, "monitor_unavailable", f"the extraction monitor did not answer: {e}",
                           headers={"Retry-After": "1"}) from e  # fmt: skip

    # ---- installation ----

    def install(self, gw: Gateway, app: web.Application, server: grpc.aio.Server) -> None:
        self.up = Gauge("analysim_gateway_monitor_up", "1 while the extraction monitor's decisions feed answers.",
                        registry=gw.metrics.registry)  # fmt: skip
        self.restarts = Counter("analysim_gateway_monitor_restarts_total",
                                "Times this gateway restarted its own extraction monitor process after it died.",
                                registry=gw.metrics.registry)  # fmt: skip
        gw.readiness_checks.append(lambda: self.problem)
        try:
            self.seed()
        except urllib.error.HTTPError as e:
            if e.code in (401, 403):  # misconfigured, not down: say so now, in one line
                raise UserError(f"the monitor at {self.url} refused the key (HTTP {e.code}): pass its admin key "
                                "with --monitor-key-file") from e  # fmt: skip
            log.warning("monitor %s answered %d at start; serving without decisions until it answers", self.url, e.code)
            self.up.set(0)
            self.problem = f"monitor {self.url} answered {e.code}"
        except (OSError, ValueError, KeyError) as e:  # fail open: serve, resubscribe in the background
            log.warning("monitor %s unreachable at start (%s); serving without decisions until it answers", self.url, e)
            self.up.set(0)
            self.problem = f"monitor {self.url} unreachable ({e})"
        gw.enforcement = self.enforce
        if self.child is not None:
            gw.metrics.registry.register(_MonitorMetrics(self))

        async def handler(request: web.Request) -> web.StreamResponse:
            gw.require_admin(gw.authenticate(request.headers.get("Authorization")))
            return await self.forward(request)

        for method, path in ADMIN_ROUTES:
            app.router.add_route(method, path, handler)
        add_openapi(app, monitor_openapi(MAX_GROUP_MEMBERS, GROUP_NAME.pattern))

        async def start(app: web.Application) -> None:
            self._session = aiohttp.ClientSession()
            self._task = asyncio.create_task(self.follow())

        async def stop(app: web.Application) -> None:
            if self._task is not None:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
            if self._session is not None:
                await self._session.close()
            self.stop_child()

        app.on_startup.append(start)
        app.on_cleanup.append(stop)

    def stop_child(self) -> None:
        """Close the child's stdin (it stops, checkpointing first) and wait for it."""
        if self.child is None:
            return
        with contextlib.suppress(OSError):
            assert self.child.stdin is not None
            self.child.stdin.close()
        try:
            self.child.wait(60)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()
        self.child = None


class _MonitorMetrics(Collector):
    """The monitor's own metrics (statuses, warnings, lag, ...) inside the gateway's
    /metrics, read from it at scrape time (a short blocking call, every scrape interval)."""

    def __init__(self, client: MonitorClient) -> None:
        self.client = client  # the gateway's client of the monitor read at scrape time

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Metric]:
        req = urllib.request.Request(f"{self.client.url}/metrics", headers=self.client.auth)
        try:
            with urllib.request.urlopen(req, timeout=SCRAPE_TIMEOUT_S) as r:
                text = r.read().decode()
        except (OSError, urllib.error.URLError):
            return  # the monitor is down: analysim_gateway_monitor_up says so
        skip = ("python_", "process_")  # the gateway's own process metrics are already there
        yield from (f for f in text_string_to_metric_families(text) if not f.name.startswith(skip))


def start_local_monitor(db: str, checkpoint_interval: float, log_format: str = "text") -> MonitorClient:
    """Start ``python -m mlaas_monitor.monitor serve`` on this gateway's store, tied to it
    (it stops when our end of its stdin closes, e.g. when we are killed), with a key of
    its own; returns once it has caught up with the log and listens. Restarted if it dies."""

    def spawn() -> tuple[str, str, subprocess.Popen[bytes]]:
        return _spawn_local_monitor(db, checkpoint_interval, log_format)

    return MonitorClient(*spawn(), respawn=spawn)


def _spawn_local_monitor(db: str, checkpoint_interval: float, log_format: str) -> tuple[str, str, subprocess.Popen[bytes]]:
    key = secrets.token_urlsafe(32)
    # Our settings are not its settings (ANALYSIM_PORT, ANALYSIM_ADMIN_KEY_FILE, ...).
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANALYSIM_")}
    env[ENV_VAR] = key
    env["PYTHONPATH"] = os.pathsep.join([str(CODE_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    if not is_postgres_url(db):
        db = str(Path(db).resolve())  # (the child runs in CODE_ROOT)
    with tempfile.TemporaryDirectory(prefix="analysim-monitor-") as tmp:
        port_file = Path(tmp) / "monitor.port"
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlaas_monitor.monitor", "serve", "--db", db, "--port", "0", "--port-file",
             str(port_file), "--checkpoint-interval", str(checkpoint_interval), "--exit-with-stdin",
             "--log-level", "WARNING", "--log-format", log_format],  # its warnings join the gateway's output
            stdin=subprocess.PIPE, env=env, cwd=CODE_ROOT,
        )  # fmt: skip
        with contextlib.suppress(OSError):  # not permitted somewhere: it runs, at our priority
            os.setpriority(os.PRIO_PROCESS, proc.pid, os.getpriority(os.PRIO_PROCESS, 0) + LOCAL_MONITOR_NICENESS)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_file.exists():
            if proc.poll() is not None:
                raise UserError(f"the extraction monitor exited with status {proc.returncode} while starting")
            if time.monotonic() > deadline:
                proc.kill()
                raise UserError(f"the extraction monitor did not start within {START_TIMEOUT_S:.0f} s")
            time.sleep(0.02)  # waiting for a child to listen
        port = json.loads(port_file.read_text())["http"]
    return f"http://127.0.0.1:{port}", key, proc


def local_monitor_extension(checkpoint_interval: float = 1.0, log_format: str = "text",
                            keep: list[MonitorClient] | None = None) -> Extension:  # fmt: skip
    """The default: a monitor process of this gateway's own, on its store."""

    def install(gw: Gateway, app: web.Application, server: grpc.aio.Server) -> None:
        client = start_local_monitor(gw.store.path, checkpoint_interval, log_format)
        try:
            client.install(gw, app, server)
        except BaseException:
            client.stop_child()
            raise
        if keep is not None:
            keep.append(client)

    return install


def monitor_client_extension(url: str, key: str, keep: list[MonitorClient] | None = None) -> Extension:
    """A replica subscribing to a shared monitor service at ``url``."""

    def install(gw: Gateway, app: web.Application, server: grpc.aio.Server) -> None:
        client = MonitorClient(url, key)
        client.install(gw, app, server)
        if keep is not None:
            keep.append(client)

    return install
