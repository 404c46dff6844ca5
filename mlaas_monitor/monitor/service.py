"""The monitor as a gateway extension: a query-stream listener feeding the pure core, its
durable state in the gateway's store, admin routes under /v1/admin, Prometheus metrics and
optional enforcement. ``monitor_extension()`` is an ``mlaas_monitor.server.Extension``.

Events are queued by the listener and folded in by one worker thread, in the order they
were published, so that neither a query's response nor the event loop waits for a refit
(scikit-learn's fits, numpy and SQLite release the GIL) and a replay still sees the same
sequence. The admin views take the same lock as the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from mlaas_monitor.http_app import add_openapi, json_response, read_json
from mlaas_monitor.monitor.core import (
    GROUP_PREFIX,
    METHODS,
    ConfigError,
    Evaluation,
    ExtractionWarning,
    ModelMonitor,
    SubjectState,
)
from mlaas_monitor.monitor.coverage import leaf_fractions, merge_all
from mlaas_monitor.monitor.openapi import monitor_openapi
from mlaas_monitor.monitor.persist import MonitorDB
from mlaas_monitor.service import USER_NAME, ApiError, Gateway, bad_field
from mlaas_monitor.stream import QueryEvent

log = logging.getLogger(__name__)
CHECKPOINT_INTERVAL_S = 1.0
MAX_GROUP_MEMBERS = 1000
REPLAY_PAGE = 2000
UPDATE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
GROUP_NAME = USER_NAME  # same alphabet: no ':' so that "group:NAME" is unambiguous


class MonitorBase:
    """What the in-gateway monitor and a remote one (``remote.RemoteMonitor``) share: the
    per-model cores, folding events in, recording evaluations and warnings, checkpoints."""

    def __init__(self, db: MonitorDB, registry: CollectorRegistry, checkpoint_interval: float) -> None:
        self.db = db
        self.configs = self.db.configs()
        self.groups: dict[str, tuple[str, ...]] = self.db.groups()
        self.monitors: dict[str, ModelMonitor] = {}
        self.checkpoint_interval = checkpoint_interval
        self._dirty: dict[str, dict[str, SubjectState]] = defaultdict(dict)
        self._history: list[Evaluation] = []
        self._warnings: list[ExtractionWarning] = []
        self._save_handle: asyncio.TimerHandle | None = None
        reg = registry
        self.m_status = Gauge(
            "analysim_extraction_status", "Extraction status per model, subject (user or group:NAME) and method.",
            ["model", "subject", "method"], registry=reg,
        )  # fmt: skip
        # The monitor's own intent decision per subject (what enforcement with intent acts on):
        # the extraction alert pages for a warned subject only while it is 1.
        self.m_intent = Gauge(
            "analysim_extraction_intent_alarm",
            "1 while a subject's queries look like an attack (the model's PRADA or out-of-distribution alarm), else 0.",
            ["model", "subject"], registry=reg,
        )  # fmt: skip
        self.m_warnings = Counter(
            "analysim_extraction_warnings_total", "Extraction warnings raised, by model and method.",
            ["model", "method"], registry=reg,
        )  # fmt: skip
        self.m_update = Histogram(
            "analysim_monitor_update_duration_seconds", "Time to fold a batch of query events into the monitor.",
            buckets=UPDATE_BUCKETS, registry=reg,
        )  # fmt: skip
        self.m_refits = Counter("analysim_monitor_refits_total", "Subject evaluations (tree refits).", ["model"], registry=reg)
        reg.register(_ThresholdCollector(self))

    def _current(self, subject: str) -> bool:
        """Whether a subject's status is still published: a deleted group's is not."""
        return not subject.startswith(GROUP_PREFIX) or subject[len(GROUP_PREFIX):] in self.groups

    def _publish_all(self, mon: ModelMonitor) -> None:
        for s in [*mon.users.values(), *mon.groups.values()]:
            if self._current(s.name):
                for method in METHODS:
                    self.m_status.labels(mon.model_id, s.name, method).set(s.status[method])
                self.m_intent.labels(mon.model_id, s.name).set(mon.intent_alarm(s.status))

    def forget(self, subject: str) -> None:
        """Drop a subject's status series (a revoked user, a deleted group): a dashboard or an
        alert must not keep showing a subject that can no longer query."""
        for model_id in list(self.monitors):
            for method in METHODS:
                with contextlib.suppress(KeyError):
                    self.m_status.remove(model_id, subject, method)
            with contextlib.suppress(KeyError):
                self.m_intent.remove(model_id, subject)

    def _schedule_save(self) -> None:
        if self._warnings:
            self.flush()  # a warning is an event: durable at once
        elif self._save_handle is None:
            self._save_handle = asyncio.get_running_loop().call_later(self.checkpoint_interval, self.flush)


    def _fold(self, mon: ModelMonitor, e: QueryEvent) -> None:
        """One event, then whatever evaluation is due: evaluating per event (not per batch)
        makes the history a function of the event sequence alone, so a replay after a
        restart reproduces it exactly."""
        self._dirty[mon.model_id][e.user] = mon.ingest(e.user, e.features, e.labels, e.seq)
        evals, warns = mon.evaluate_due({e.user}, self.groups, e.timestamp)
        self._record(mon, evals, warns)

    def _record(self, mon: ModelMonitor, evals: list[Evaluation], warns: list[ExtractionWarning]) -> None:
        for e in evals:
            s = mon.subject(e.subject)
            if s is not None:
                self._dirty[mon.model_id][s.name] = s
            if self._current(e.subject):
                for method, v in e.status.items():
                    self.m_status.labels(e.model, e.subject, method).set(v)
                self.m_intent.labels(e.model, e.subject).set(mon.intent_alarm(e.status))
        if evals:
            self.m_refits.labels(mon.model_id).inc(len(evals))
        for w in warns:
            self.m_warnings.labels(w.model, w.method).inc()
            log.warning("extraction warning: model %s subject %s %s=%.3f >= %.3f after %d queries",
                        w.model, w.subject, w.method, w.status, w.threshold, w.n_queries)  # fmt: skip
        self._history += evals
        self._warnings += warns

    def flush(self) -> None:
        """Checkpoint every model with changes (one transaction per model)."""
        if self._save_handle is not None:
            self._save_handle.cancel()
            self._save_handle = None
        history, warnings = self._history, self._warnings
        self._history, self._warnings = [], []
        for model_id, mon in self.monitors.items():
            dirty = self._dirty.pop(model_id, {})
            h = [e for e in history if e.model == model_id]
            w = [x for x in warnings if x.model == model_id]
            if dirty or h or w:
                self.db.save(mon, list(dirty.values()), h, w)


class Monitor(MonitorBase):
    def __init__(self, gw: Gateway, db_path: str | None = None, checkpoint_interval: float = CHECKPOINT_INTERVAL_S) -> None:
        shared = db_path is None or db_path == gw.store.path
        db = MonitorDB(db_path or gw.store.path, autocheckpoint=not (shared and gw.store.checkpoints_in_background))
        super().__init__(db, gw.metrics.registry, checkpoint_interval)
        self.gw = gw
        self._pending: list[QueryEvent] = []
        self._scheduled = False
        self._unlisten: Callable[[], None] | None = None
        # One worker: events are folded in publication order, off the event loop.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="monitor")
        self.lock = threading.RLock()  # the worker's state, also read by the admin views
        self._queue_lock = threading.Lock()
        self._last_flush = time.monotonic()
        # model -> user -> 'degrade' | 'refuse', decided by the worker after each batch and
        # read by the gateway's hook on the event loop (a dict lookup, no lock).
        self._decisions: dict[str, dict[str, str]] = {}

    def _current(self, subject: str) -> bool:
        u = self.gw._by_name.get(subject)
        return super()._current(subject) and (u is None or u.record.revoked is None)

    # ---- models ----

    def monitor(self, model_id: str) -> ModelMonitor:
        mon = self.monitors.get(model_id)
        if mon is None:
            model = self.gw.model(model_id)  # ApiError 404 for an unknown model
            mon = ModelMonitor(model, self.configs.get(model_id))
            self.monitors[model_id] = mon  # registered first: flush() saves only known models
            self._recover(mon)
        return mon

    def _recover(self, mon: ModelMonitor) -> None:
        """Load the checkpoint, then replay the query log: raw queries up to it, new events after."""
        try:
            cp = self.db.load(mon)
        except ValueError:  # the model was replaced with a different tree: start over from the log
            log.warning("monitor state of %s does not fit its tree; rebuilding from the query log", mon.model_id)
            fresh = ModelMonitor(self.gw.model(mon.model_id), mon.config)
            mon.__dict__.update(fresh.__dict__)  # same object: already registered
            cp = None
        upto = cp.seq if cp else 0
        after = 0
        while True:
            page = self.gw.store.events_after(after, mon.model_id, REPLAY_PAGE)
            for e in page:
                if e.seq <= upto:
                    mon.restore_queries(e.user, e.features, e.labels)
                else:
                    self._fold(mon, e)
                after = e.seq
            if len(page) < REPLAY_PAGE:
                break
        self._publish_all(mon)
        self._decide(mon)
        self.flush()

    # ---- the stream ----

    def on_event(self, event: QueryEvent) -> None:
        with self._queue_lock:
            self._pending.append(event)
            if self._scheduled:
                return
            self._scheduled = True
        self._worker.submit(self._work)

    def _work(self) -> None:
        try:
            with self.lock:
                self._process()
                # Checkpoint at most every interval (at once on a warning); the worker is the
                # only writer, so a timer would only add a thread.
                if self._warnings or time.monotonic() - self._last_flush >= self.checkpoint_interval:
                    self.flush()
        except Exception:  # a bug must not stop the monitor: the log keeps the events for a replay
            log.exception("monitor update failed")

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        super().flush()

    def _process(self) -> None:
        with self._queue_lock:
            self._scheduled = False
            events, self._pending = self._pending, []
        if not events:
            return
        start = time.perf_counter()
        by_model: dict[str, list[QueryEvent]] = defaultdict(list)
        for e in events:
            by_model[e.model_id].append(e)
        for model_id, evs in by_model.items():
            try:
                mon = self.monitor(model_id)
            except ApiError:
                continue
            for e in evs:
                if e.seq > mon.last_seq:  # else already folded in (recovered from the log)
                    self._fold(mon, e)
            self._decide(mon)
        self.m_update.observe(time.perf_counter() - start)

    def _decide(self, mon: ModelMonitor) -> None:
        if mon.config.enforcement.action == "none":
            self._decisions.pop(mon.model_id, None)
            return
        decided = {u: a for u in mon.users if (a := mon.enforcement_for(u, self.groups)) != "none"}
        self._decisions[mon.model_id] = decided  # replaced whole: readers see one or the other

    def settle(self) -> None:
        """Fold in every event published so far (waits for the worker)."""
        with self.lock:
            self._process()

    def close(self) -> None:
        # Stop listening first: a query committed during shutdown is in the log and is
        # replayed at the next start; it must not reach a closed database now.
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        self._worker.shutdown(wait=True)
        with self.lock:
            self._process()
            self.flush()
            self.db.close()

    # ---- enforcement ----

    def enforce(self, user: str, model_id: str) -> str:
        """The gateway's enforcement hook: 'none', 'degrade' or 'refuse' for this user's
        next query on this model (the gateway applies it before answering and logs what
        the user was told, so a degraded answer reaches the monitor as label-only)."""
        return self._decisions.get(model_id, {}).get(user, "none")

    # ---- admin views ----

    def model_view(self, model_id: str) -> dict[str, Any]:
        mon = self.monitor(model_id)
        return {
            "model": model_id,
            "last_seq": mon.last_seq,
            "total_queries": mon.total_queries,
            "config": mon.config.to_dict(),
            "default_method": mon.config.default_method,
            "users": [s.public() for _, s in sorted(mon.users.items())],
            "groups": [{**s.public(), "n_queries": sum(mon.users[m].n_queries for m in s.members if m in mon.users)}
                       for _, s in sorted(mon.groups.items())],  # fmt: skip
        }

    def subject_view(self, model_id: str, subject: str) -> dict[str, Any]:
        mon = self.monitor(model_id)
        s = mon.subject(subject)
        if s is None:
            if subject.startswith(GROUP_PREFIX) and subject[len(GROUP_PREFIX):] in self.groups:
                s = mon.group(subject, self.groups[subject[len(GROUP_PREFIX):]])
            elif self.gw.has_user(subject):
                s = mon.user(subject)
            else:
                raise ApiError(404, "unknown_subject", f"no such user or group {subject!r}", "subject")
        out = s.public()
        out["model"] = model_id
        members = [mon.users[m] for m in s.members if m in mon.users]
        for x in [s, *members]:
            mon.fold(x)
        if s.summary is None:  # a group: its count now, not at its last evaluation
            out["n_queries"] = sum(m.n_queries for m in members)
        summary = s.summary if s.summary is not None else merge_all(
            [m.summary for m in members if m.summary is not None], mon.regions.n_leaves, mon.n_features)  # fmt: skip
        out["leaves"] = {
            "nodes": mon.regions.leaf_nodes.tolist(),
            "counts": summary.counts.tolist(),
            "covered_fraction": leaf_fractions(mon.regions, summary).tolist(),
        }
        # Durable points, then those not yet checkpointed (same shape).
        pending = [{"n_queries": e.n_queries, "seq": e.seq, "ts": e.ts, **e.status, **({"members": list(e.members)} if e.members else {})}
                   for e in self._history if e.model == model_id and e.subject == s.name]  # fmt: skip
        out["history"] = self.db.history(model_id, s.name) + pending
        if s.members:
            out["member_status"] = {
                m: (mon.users[m].status if m in mon.users else dict.fromkeys(METHODS, 0.0)) for m in s.members
            }
        return out

    def set_config(self, model_id: str, patch: Any) -> dict[str, Any]:
        mon = self.monitor(model_id)
        try:
            cfg = mon.config.updated(patch)
        except ConfigError as e:
            raise bad_field(e.field, e.problem) from e
        mon.config = self.configs[model_id] = cfg
        self.db.save_config(model_id, cfg)
        self._decide(mon)
        return cfg.to_dict()

    def create_group(self, body: Any) -> dict[str, Any]:
        if type(body) is not dict:
            raise bad_field("body", "expected a JSON object with name and members")
        unknown = set(body) - {"name", "members"}
        if unknown:
            raise bad_field(str(sorted(unknown)[0])[:40], "unknown field")
        name = body.get("name")
        if type(name) is not str or not GROUP_NAME.match(name):
            raise bad_field("name", "expected 1-64 characters: letters, digits, '_', '.', '@', '-'")
        members = body.get("members")
        if type(members) is not list or not 1 <= len(members) <= MAX_GROUP_MEMBERS:
            raise bad_field("members", f"expected a list of 1 to {MAX_GROUP_MEMBERS} user names")
        for i, m in enumerate(members):
            if type(m) is not str or not self.gw.has_user(m):
                raise bad_field(f"members[{i}]", "no such user")
        if name in self.groups:
            raise ApiError(409, "group_exists", f"group {name!r} already exists", "name")
        mem = tuple(sorted(set(members)))
        self.groups[name] = mem
        self.db.save_group(name, mem)
        # Evaluate at once on every model the members have queried.
        for mon in self.monitors.values():
            evals, warns = mon.evaluate_group_now(name, mem, time.time())
            self._record(mon, evals, warns)
            self._decide(mon)
        self.flush()
        return {"name": name, "members": list(mem)}

    def evaluate_now(self, model_id: str) -> dict[str, Any]:
        """Refit and score every subject of a model now (e.g. at the end of an experiment)."""
        mon = self.monitor(model_id)
        self._process()  # fold in whatever is queued first
        evals, warns = mon.evaluate_due(set(mon.users), self.groups, time.time(), force=True)
        self._record(mon, evals, warns)
        self._decide(mon)
        self.flush()
        return self.model_view(model_id)

    def delete_group(self, name: str) -> dict[str, Any]:
        if name not in self.groups:
            raise ApiError(404, "unknown_group", f"no such group {name!r}", "name")
        del self.groups[name]
        self.db.delete_group(name)
        self.forget(GROUP_PREFIX + name)
        return {"name": name, "deleted": True}

    def group_view(self, name: str) -> dict[str, Any]:
        if name not in self.groups:
            raise ApiError(404, "unknown_group", f"no such group {name!r}", "name")
        subject = GROUP_PREFIX + name
        status = {m: mon.groups[subject].public() for m, mon in self.monitors.items() if subject in mon.groups}
        return {"name": name, "members": list(self.groups[name]), "models": status}

    # ---- installation ----

    def install(self, gw: Gateway, app: web.Application, server: grpc.aio.Server) -> None:
        import sklearn.tree  # noqa: F401  (imported now, not inside the first query's update)

        for model_id in gw.available_model_ids():  # a model that fails to load is isolated by the gateway
            self.monitor(model_id)  # recover before the servers accept anything
        self._unlisten = gw.stream.add_listener(self.on_event)
        gw.on_revoke.append(self.forget)
        self.gw.enforcement = self.enforce
        add_routes(self, app)

        async def on_cleanup(app: web.Application) -> None:
            self.close()

        app.on_cleanup.append(on_cleanup)


class _ThresholdCollector(Collector):
    """``analysim_extraction_threshold{model,method}``: each model's warning thresholds, so
    that an alert compares a status with the threshold the monitor itself warns at."""

    def __init__(self, mon: MonitorBase) -> None:
        self.mon = mon

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("analysim_extraction_threshold", "Warning threshold per model and method.",
                              labels=["model", "method"])
        for model_id, mon in sorted(self.mon.monitors.items()):
            for method, t in sorted(mon.config.thresholds.items()):
                g.add_metric([model_id, method], t)
        yield g


def add_routes(mon: Monitor, app: web.Application) -> None:
    gw = mon.gw

    def admin(fn: Callable[[web.Request], Any]) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.Response:
            gw.require_admin(gw.authenticate(request.headers.get("Authorization")))
            if asyncio.iscoroutinefunction(fn):
                body = await fn(request)  # reads the body first, then locks (below)
            else:
                with mon.lock:  # a consistent view: not while the worker folds events in
                    body = fn(request)
            return json_response(body)

        return handler

    def models(request: web.Request) -> Any:
        return {"models": [mon.model_view(m) for m in gw.available_model_ids()]}

    def one_model(request: web.Request) -> Any:
        return mon.model_view(request.match_info["model"])

    def subject(request: web.Request) -> Any:
        return mon.subject_view(request.match_info["model"], request.match_info["subject"])

    def user(request: web.Request) -> Any:
        return mon.subject_view(request.match_info["model"], request.match_info["name"])

    def group(request: web.Request) -> Any:
        return mon.subject_view(request.match_info["model"], GROUP_PREFIX + request.match_info["name"])

    def evaluate(request: web.Request) -> Any:
        return mon.evaluate_now(request.match_info["model"])

    def get_config(request: web.Request) -> Any:
        return mon.monitor(request.match_info["model"]).config.to_dict()

    async def put_config(request: web.Request) -> Any:
        body = await read_json(request)
        with mon.lock:
            return mon.set_config(request.match_info["model"], body)

    def warnings(request: web.Request) -> Any:
        model = request.query.get("model")
        if model is not None:
            gw.model(model)
        return {"warnings": mon.db.warnings(model, request.query.get("subject"))}

    def list_groups(request: web.Request) -> Any:
        return {"groups": [{"name": n, "members": list(m)} for n, m in sorted(mon.groups.items())]}

    async def create_group(request: web.Request) -> Any:
        body = await read_json(request)
        with mon.lock:
            return mon.create_group(body)

    def get_group(request: web.Request) -> Any:
        return mon.group_view(request.match_info["name"])

    def delete_group(request: web.Request) -> Any:
        return mon.delete_group(request.match_info["name"])

    r = app.router
    r.add_get("/v1/admin/monitor", admin(models))
    r.add_get("/v1/admin/monitor/{model}", admin(one_model))
    r.add_post("/v1/admin/monitor/{model}/evaluate", admin(evaluate))
    r.add_get("/v1/admin/monitor/{model}/config", admin(get_config))
    r.add_put("/v1/admin/monitor/{model}/config", admin(put_config))
    r.add_get("/v1/admin/monitor/{model}/users/{name}", admin(user))
    r.add_get("/v1/admin/monitor/{model}/groups/{name}", admin(group))
    r.add_get("/v1/admin/monitor/{model}/subjects/{subject}", admin(subject))
    r.add_get("/v1/admin/warnings", admin(warnings))
    r.add_get("/v1/admin/groups", admin(list_groups))
    r.add_post("/v1/admin/groups", admin(create_group))
    r.add_get("/v1/admin/groups/{name}", admin(get_group))
    r.add_delete("/v1/admin/groups/{name}", admin(delete_group))
    add_openapi(app, monitor_openapi(MAX_GROUP_MEMBERS, GROUP_NAME.pattern))  # describe exactly these routes


def monitor_extension(
    db_path: str | None = None, checkpoint_interval: float = CHECKPOINT_INTERVAL_S, keep: list[Monitor] | None = None
) -> Callable[[Gateway, web.Application, grpc.aio.Server], None]:
    """An Extension for ``serve``/``GatewayThread``; ``keep`` receives the Monitor (for tests
    and benchmarks that look at it in process)."""

    def install(gw: Gateway, app: web.Application, server: grpc.aio.Server) -> None:
        m = Monitor(gw, db_path, checkpoint_interval)
        m.install(gw, app, server)
        if keep is not None:
            keep.append(m)

    return install


