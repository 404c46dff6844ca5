"""The extraction monitor's engine: the pure per-model cores fed with the query log, their
durable state (``persist.MonitorDB``) and cursor, the admin views, Prometheus metrics and
the enforcement decisions it publishes to the gateways.

It runs in one process of its own (``python -m mlaas_monitor.monitor serve``, see
``daemon.py``), which every gateway either starts beside itself (the default) or subscribes
to (``--monitor-url``). Events come from the store's query log, read in sequence order
after a durable cursor: one reader, one order, so a replay reproduces every status, and no
Python work of the monitor's competes with a gateway's event loop for its GIL. Everything
here runs on the service's event loop (admin views see a state between two events).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from mlaas_monitor.http_app import json_response, read_json
from mlaas_monitor.monitor.config import ACTIONS, METHODS, ConfigError
from mlaas_monitor.monitor.core import GROUP_PREFIX, POOL_REASONS, ModelMonitor
from mlaas_monitor.monitor.coverage import leaf_fractions, merge_all
from mlaas_monitor.monitor.decisions import Decisions
from mlaas_monitor.monitor.persist import MonitorDB
from mlaas_monitor.monitor.pool import EXPOSURE
from mlaas_monitor.monitor.rows import REASONS, row_problem
from mlaas_monitor.monitor.subject import Evaluation, ExtractionWarning, SubjectState
from mlaas_monitor.service import USER_NAME, ApiError, bad_field
from mlaas_monitor.store import Store
from mlaas_monitor.store_records import ModelUnavailable
from mlaas_monitor.stream import QueryEvent

log = logging.getLogger(__name__)
CHECKPOINT_INTERVAL_S = 1.0
MAX_GROUP_MEMBERS = 1000
REPLAY_PAGE = 2000
# The longest the monitor folds the log before it decides, publishes what enforcement does
# and serves the gateways' long polls again: a decision reaches them within about this
# much more than the evaluation that made it (a page of the log can take seconds).
SLICE_S = 0.02
UPDATE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
GROUP_NAME = USER_NAME  # same alphabet: no ':' so that "group:NAME" is unambiguous
MAX_WAIT_S = 30.0  # longest long-poll of /v1/monitor/decisions


class MonitorBase:
    """The per-model cores, folding events in, recording evaluations and warnings,
    checkpoints (``Monitor`` adds the log, the users and the views)."""

    def __init__(self, db: MonitorDB, registry: CollectorRegistry, checkpoint_interval: float) -> None:
        self.db = db  # the monitor's tables (checkpoints, history, warnings, configs, groups)
        self.configs = self.db.configs()  # model -> its monitor settings, as last stored
        self.groups: dict[str, tuple[str, ...]] = self.db.groups()  # declared group name -> its member accounts
        self.monitors: dict[str, ModelMonitor] = {}  # model -> its monitor state
        self.checkpoint_interval = checkpoint_interval  # seconds between two checkpoints of the dirty subjects
        # Model -> subjects changed since the last checkpoint
        self._dirty: dict[str, dict[str, SubjectState]] = defaultdict(dict)
        self._history: list[Evaluation] = []  # evaluations not yet written, in order
        self._warnings: list[ExtractionWarning] = []  # warnings not yet written, in order
        reg = registry
        # Per model, subject and method: the status as last evaluated
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
        # The model's exposure (pool.py): best_copy over every answered row, a running maximum.
        # A gauge of its own, not a subject's status: it is reported, never alarmed on.
        self.m_exposure = Gauge(
            "analysim_extraction_exposure_ratio",
            "Share of the model its answers to every account together have given away (best_copy over all rows).",
            ["model"], registry=reg,
        )  # fmt: skip
        # Warnings raised, by model and method
        self.m_warnings = Counter(
            "analysim_extraction_warnings_total", "Extraction warnings raised, by model and method.",
            ["model", "method"], registry=reg,
        )  # fmt: skip
        # Seconds to fold a batch of query events
        self.m_update = Histogram(
            "analysim_monitor_update_duration_seconds", "Time to fold a batch of query events into the monitor.",
            buckets=UPDATE_BUCKETS, registry=reg,
        )  # fmt: skip
        # Subject evaluations (tree refits) per model
        self.m_refits = Counter("analysim_monitor_refits_total", "Subject evaluations (tree refits).", ["model"], registry=reg)
        # Enforcement decisions taken or lifted, by model, action and rule
        self.m_actions = Counter(
            "analysim_monitor_actions_total",
            "Enforcement decisions taken or lifted, by model, action (none: lifted) and rule (subject, pool).",
            ["model", "action", "rule"], registry=reg,
        )  # fmt: skip
        # While the pool is warned: how much its extent falls without each account's rows.
        self.m_attribution = Gauge(
            "analysim_extraction_attribution_ratio",
            "Fall of auto:pool's best_copy without the account's rows (the accounts with the most pooled rows).",
            ["model", "account"], registry=reg,
        )  # fmt: skip
        reg.register(_ThresholdCollector(self))

    def _current(self, subject: str) -> bool:
        """Whether a subject's status is still published: a deleted group's is not."""
        return not subject.startswith(GROUP_PREFIX) or subject[len(GROUP_PREFIX):] in self.groups

    def _publish_all(self, mon: ModelMonitor) -> None:
        for s in [*mon.users.values(), *mon.groups.values(), *mon.pools.values()]:
            self._publish(mon.model_id, s.name, s.status, mon)

    def _publish(self, model_id: str, subject: str, status: dict[str, float], mon: ModelMonitor) -> None:
        if subject == EXPOSURE:
            self.m_exposure.labels(model_id).set(status["best_copy"])
        elif self._current(subject):
            for method in METHODS:
                self.m_status.labels(model_id, subject, method).set(status[method])
            self.m_intent.labels(model_id, subject).set(mon.intent_alarm(status))

    def forget(self, subject: str) -> None:
        """Drop a subject's status series (a revoked user, a deleted group): a dashboard or an
        alert must not keep showing a subject that can no longer query."""
        for model_id in list(self.monitors):
            for method in METHODS:
                with contextlib.suppress(KeyError):
                    self.m_status.remove(model_id, subject, method)
            with contextlib.suppress(KeyError):
                self.m_intent.remove(model_id, subject)

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
            self._publish(e.model, e.subject, e.status, mon)
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
        history, warnings = self._history, self._warnings
        self._history, self._warnings = [], []
        for model_id, mon in self.monitors.items():
            dirty = self._dirty.pop(model_id, {})
            h = [e for e in history if e.model == model_id]
            w = [x for x in warnings if x.model == model_id]
            if dirty or h or w:
                self.db.save(mon, list(dirty.values()), h, w)


class Monitor(MonitorBase):
    """The engine over a store: models, users and the query log come from ``store``; its
    own state (``db``) may live in the same file or its own."""

    def __init__(self, store: Store, db: MonitorDB, registry: CollectorRegistry,
                 checkpoint_interval: float = CHECKPOINT_INTERVAL_S) -> None:  # fmt: skip
        super().__init__(db, registry, checkpoint_interval)
        # The gateway's store (the query log, the users) and the metrics registry
        self.store, self.registry = store, registry
        self.decisions = Decisions()  # what enforcement does, as the gateways long-poll it
        self.cursor = 0  # the last log seq folded; each model's durable cursor is its checkpoint seq
        self._ahead: deque[QueryEvent] = deque()  # the page read past the cursor, not folded yet (seq order)
        self._restore_upto: dict[str, int] = {}  # model -> its checkpoint seq at start
        self._unavailable: dict[str, str] = {}  # model -> why it cannot be loaded (its events are skipped)
        self._revoked: dict[str, bool] = {}  # user -> revoked, as of the last refresh_users
        self._acted: dict[str, dict[str, tuple[str, str]]] = {}  # model -> user -> (action, why) last published
        self._attributed: dict[str, list[tuple[str, float, int]]] = {}  # model -> the attribution last exported
        self._last_flush = time.monotonic()  # monotonic time of the last checkpoint flush
        # Seconds from a query's commit to the monitor folding it in
        self.m_lag = Histogram(
            "analysim_monitor_lag_seconds", "Time from a query's commit to the monitor folding it in.",
            buckets=LAG_BUCKETS, registry=registry,
        )  # fmt: skip
        # The last query-log seq read
        self.m_cursor = Gauge("analysim_monitor_cursor", "The last query-log seq the monitor has read.", registry=registry)
        # Query-log rows quarantined (not folded), by reason
        self.m_quarantined = Counter(
            "analysim_monitor_quarantined_rows_total",
            "Query-log rows the monitor could not fold (recorded in monitor_quarantine and skipped), by reason.",
            ["reason"], registry=registry,
        )  # fmt: skip
        for reason in REASONS:  # 0, not absent, until the first: an alert on increase() sees it
            self.m_quarantined.labels(reason)

    # ---- users (the store's) ----

    def refresh_users(self) -> None:
        """Re-read the accounts; forget the series of users revoked since (a dashboard or an
        alert must not keep showing a subject that can no longer query)."""
        now = {u.name: u.revoked is not None for u in self.store.users()}
        for name, revoked in now.items():
            if revoked and not self._revoked.get(name, False):
                self.forget(name)
        self._revoked = now

    def has_user(self, name: str) -> bool:
        if name not in self._revoked:
            self.refresh_users()
        return name in self._revoked

    def _current(self, subject: str) -> bool:
        return super()._current(subject) and not self._revoked.get(subject, False)

    # ---- models ----

    def model_ids(self) -> list[str]:
        """The store's models that load (the others are logged once and left out)."""
        out = []
        for mid in self.store.model_ids():
            with contextlib.suppress(ApiError):
                self.monitor(mid)
                out.append(mid)
        return out

    def monitor(self, model_id: str) -> ModelMonitor:
        mon = self.monitors.get(model_id)
        if mon is None:
            try:
                model = self.store.load_model(model_id)
            except ModelUnavailable as e:  # isolated, as the gateway does: the other models are watched
                if self._unavailable.get(model_id) != e.reason:
                    log.error("not monitoring %s: %s", model_id, e.reason)
                    self._unavailable[model_id] = e.reason
                raise ApiError(503, "model_unavailable", f"model {model_id!r} is unavailable: {e.reason}", "model_id") from e
            if model is None:
                raise ApiError(404, "unknown_model", f"no such model {model_id!r}", "model_id")
            self._unavailable.pop(model_id, None)
            mon = ModelMonitor(model, self.configs.get(model_id))
            try:
                cp = self.db.load(mon)
            except ValueError:  # the model was replaced with a different tree: start over from the log
                log.warning("monitor state of %s does not fit its tree; rebuilding from the query log", model_id)
                mon, cp = ModelMonitor(model, self.configs.get(model_id)), None
            self.monitors[model_id] = mon  # registered first: flush() saves only known models
            self._restore_upto[model_id] = cp.seq if cp else 0
            if self.cursor:  # found while following the log: catch this model up to the cursor
                self._catch_up(mon)
            self._publish_all(mon)
            for action in ACTIONS:  # 0, not absent, until the first: a dashboard and increase() see it
                for rule in ("subject", "pool"):
                    self.m_actions.labels(model_id, action, rule)
            self._decide(mon)
        return mon

    def _catch_up(self, mon: ModelMonitor) -> None:
        after = 0
        while after < self.cursor:
            page = [e for e in self.store.events_after(after, mon.model_id, REPLAY_PAGE) if e.seq <= self.cursor]
            for e in page:
                self._take(mon, e)
            if len(page) < REPLAY_PAGE:
                break
            after = page[-1].seq

    # ---- the log ----

    def _quarantine(self, e: QueryEvent, reason: str, detail: str) -> None:
        """A row that cannot be folded: recorded once (seq, reason), counted, logged; skipped."""
        if self.db.quarantine(e.seq, e.model_id, e.user, reason, detail):
            self.m_quarantined.labels(reason).inc()
            log.error("monitor: query-log row %d (model %r, user %r) quarantined, not folded: %s", e.seq, e.model_id,
                      e.user, detail)

    def _take(self, mon: ModelMonitor, e: QueryEvent) -> bool:
        """One logged query: rows up to the model's checkpoint give back only the raw
        queries (T_u, the links and PRADA need them; the log is their one copy), rows after
        it are folded in as new. True when folded; a row that is not valid is quarantined."""
        problem = row_problem(mon, e)
        if problem is not None:
            self._quarantine(e, *problem)
            return False
        if e.seq <= self._restore_upto.get(mon.model_id, 0):
            if e.seq > mon.last_restored:
                mon.restore_queries(e.user, e.features, e.labels)
                mon.last_restored = e.seq
            return False
        if e.seq > mon.last_seq:
            self._fold(mon, e)
            return True
        return False

    def read(self, limit: int = REPLAY_PAGE, budget: float = SLICE_S) -> int:
        """Fold the log after the cursor for about ``budget`` seconds (at least one event; a
        page of ``limit`` is read ahead), then decide for the models touched; the number of
        events folded (0: the log has nothing new)."""
        if not self._ahead:
            self._ahead.extend(self.store.events_after(self.cursor, None, limit))
        if not self._ahead:
            return 0
        start = time.perf_counter()
        touched: dict[str, ModelMonitor] = {}
        n = 0
        while self._ahead and (n == 0 or time.perf_counter() - start < budget):
            e = self._ahead.popleft()
            n += 1
            self.cursor = e.seq
            mon = self._fold_logged(e)
            if mon is not None:
                touched[mon.model_id] = mon
                self.m_lag.observe(max(0.0, time.time() - e.timestamp))
        for mon in touched.values():
            self._decide(mon)
        self.m_cursor.set(self.cursor)
        if touched:
            self.m_update.observe(time.perf_counter() - start)
        self.maybe_flush()
        return n

    def _fold_logged(self, e: QueryEvent) -> ModelMonitor | None:
        """One row of the log: its model's monitor when it was folded in; None when it was
        quarantined, is replayed only, or its model is unavailable (caught up once it loads)."""
        if e.problem is not None:  # (its model may not even be text: no monitor to ask)
            self._quarantine(e, "undecodable", e.problem)
            return None
        try:
            mon = self.monitor(e.model_id)
        except ApiError as err:
            if err.status == 404:  # the gateway logs queries of its models only
                self._quarantine(e, "unknown_model", f"no model {e.model_id!r} in the store")
            return None
        return mon if self._take(mon, e) else None

    def maybe_flush(self) -> None:
        """Checkpoint at most every interval, at once on a warning (a warning is an event)."""
        if self._warnings or time.monotonic() - self._last_flush >= self.checkpoint_interval:
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        super().flush()

    def close(self) -> None:
        self.flush()
        self.db.close()

    def _decide(self, mon: ModelMonitor) -> None:
        """Publish what enforcement does per account; log (and count) each decision taken,
        changed or lifted, with its reason."""
        decided = mon.decisions(self.groups)
        before = self._acted.get(mon.model_id, {})
        changed = [(u, *decided.get(u, ("none", "lifted"))) for u in sorted(set(decided) | set(before))
                   if decided.get(u, ("none",))[0] != before.get(u, ("none",))[0]]  # fmt: skip
        if changed:
            now = time.time()
            self.db.record_actions([(mon.model_id, u, a, why, mon.last_seq, now) for u, a, why in changed])
            for u, a, why in changed:
                self.m_actions.labels(mon.model_id, a, "pool" if why.startswith(POOL_REASONS) else "subject").inc()
                log.warning("enforcement: model %s user %s -> %s (%s)", mon.model_id, u, a, why)
        self._acted[mon.model_id] = decided
        self.decisions.set(mon.model_id, {u: a for u, (a, _) in decided.items()})
        if mon.attribution != self._attributed.get(mon.model_id):
            for account, _, _ in self._attributed.get(mon.model_id, []):
                with contextlib.suppress(KeyError):
                    self.m_attribution.remove(mon.model_id, account)
            for account, fall, _ in mon.attribution:
                self.m_attribution.labels(mon.model_id, account).set(fall)
            self._attributed[mon.model_id] = list(mon.attribution)

    # ---- admin views ----

    def model_view(self, model_id: str) -> dict[str, Any]:
        mon = self.monitor(model_id)
        return {
            "model": model_id,
            "last_seq": mon.last_seq,
            "cursor": self.cursor,
            "total_queries": mon.schedule.total_queries,
            "config": mon.config.to_dict(),
            "default_method": mon.config.default_method,
            "users": [s.public() for _, s in sorted(mon.users.items())],
            "groups": [{**s.public(), "n_queries": sum(mon.users[m].n_queries for m in s.members if m in mon.users)}
                       for _, s in sorted(mon.groups.items())],  # fmt: skip
            # Subjects pooled by what the rows are, from any account (pool.py), and the
            # model's exposure (best_copy over every answered row).
            "pools": [s.public() for _, s in sorted(mon.pools.items())] if mon.config.pool else [],
            "exposure": mon.exposure,
            "pool_standing": mon.pool_standing(),
            "attribution": [{"account": a, "fall": fall, "pooled_rows": n} for a, fall, n in mon.attribution],
        }

    def actions_view(self, model_id: str) -> dict[str, Any]:
        """Every enforcement decision taken, changed or lifted on the model, with its reason,
        and what enforcement does now."""
        self.monitor(model_id)  # 404 for an unknown model
        return {"model": model_id, "actions": self.db.actions(model_id),
                "current": [{"user": u, "action": a, "reason": why} for u, (a, why) in sorted(self._acted.get(model_id, {}).items())]}  # fmt: skip

    def subject_view(self, model_id: str, subject: str) -> dict[str, Any]:
        mon = self.monitor(model_id)
        s = self._subject(mon, subject)
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
        out["history"] = self._history_of(model_id, s.name)
        if s.members:
            out["member_status"] = {
                m: (mon.users[m].status if m in mon.users else dict.fromkeys(METHODS, 0.0)) for m in s.members
            }
        return out

    def _subject(self, mon: ModelMonitor, subject: str) -> SubjectState:
        """The named subject of this model (a declared group or a known user not seen yet
        starts empty); 404 for any other name."""
        s = mon.subject(subject)
        if s is not None:
            return s
        if subject.startswith(GROUP_PREFIX) and subject[len(GROUP_PREFIX):] in self.groups:
            return mon.group(subject, self.groups[subject[len(GROUP_PREFIX):]])
        if self.has_user(subject):
            return mon.user(subject)
        raise ApiError(404, "unknown_subject", f"no such user or group {subject!r}", "subject")

    def _history_of(self, model_id: str, subject: str) -> list[dict[str, Any]]:
        """A subject's evaluations: the durable points, then those not yet checkpointed (same shape)."""
        pending = [{"n_queries": e.n_queries, "seq": e.seq, "ts": e.ts, **e.status, **({"members": list(e.members)} if e.members else {})}
                   for e in self._history if e.model == model_id and e.subject == subject]  # fmt: skip
        return self.db.history(model_id, subject) + pending

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
        if type(name) is not str or not GROUP_NAME.fullmatch(name):
            raise bad_field("name", "expected 1-64 characters: letters, digits, '_', '.', '@', '-'")
        members = body.get("members")
        if type(members) is not list or not 1 <= len(members) <= MAX_GROUP_MEMBERS:
            raise bad_field("members", f"expected a list of 1 to {MAX_GROUP_MEMBERS} user names")
        for i, m in enumerate(members):
            if type(m) is not str or not self.has_user(m):
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
        """Refit and score every subject of a model now (e.g. at the end of an experiment),
        after folding in the whole log as it stands."""
        mon = self.monitor(model_id)
        while self.read():
            pass
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


class _ThresholdCollector(Collector):
    """``analysim_extraction_threshold{model,method}``: each model's warning thresholds, so
    that an alert compares a status with the threshold the monitor itself warns at."""

    def __init__(self, mon: MonitorBase) -> None:
        self.mon = mon  # the model monitor whose thresholds are exported

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("analysim_extraction_threshold", "Warning threshold per model and method.",
                              labels=["model", "method"])
        for model_id, mon in sorted(self.mon.monitors.items()):
            for method, t in sorted(mon.config.thresholds.items()):
                g.add_metric([model_id, method], t)
        yield g


# (method, path) of every admin route of the monitor: the service serves them, and a
# gateway forwards them to its monitor (client.py) so that one admin API holds both.
ADMIN_ROUTES = (
    ("GET", "/v1/admin/monitor"), ("GET", "/v1/admin/monitor/{model}"), ("POST", "/v1/admin/monitor/{model}/evaluate"),
    ("GET", "/v1/admin/monitor/{model}/config"), ("PUT", "/v1/admin/monitor/{model}/config"),
    ("GET", "/v1/admin/monitor/{model}/users/{name}"), ("GET", "/v1/admin/monitor/{model}/groups/{name}"),
    ("GET", "/v1/admin/monitor/{model}/subjects/{subject}"), ("GET", "/v1/admin/warnings"),
    ("GET", "/v1/admin/groups"), ("POST", "/v1/admin/groups"), ("GET", "/v1/admin/groups/{name}"),
    ("DELETE", "/v1/admin/groups/{name}"), ("GET", "/v1/admin/monitor/{model}/actions"),
)  # fmt: skip
DECISIONS_PATH = "/v1/monitor/decisions"


def add_routes(mon: Monitor, app: web.Application, authorize: Callable[[web.Request], None]) -> None:
    """The admin API, the decisions feed and /metrics; ``authorize`` raises ApiError (401,
    403) unless the request carries the admin key: every route is authorised."""

    def admin(fn: Callable[[web.Request, Any], Any]) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.Response:
            authorize(request)
            body = await read_json(request) if fn in (put_config, create_group) else None
            return json_response(fn(request, body))

        return handler

    def models(request: web.Request, body: Any) -> Any:
        return {"models": [mon.model_view(m) for m in mon.model_ids()]}

    def one_model(request: web.Request, body: Any) -> Any:
        return mon.model_view(request.match_info["model"])

    def user(request: web.Request, body: Any) -> Any:
        return mon.subject_view(request.match_info["model"], request.match_info["name"])

    def group(request: web.Request, body: Any) -> Any:
        return mon.subject_view(request.match_info["model"], GROUP_PREFIX + request.match_info["name"])

    def subject(request: web.Request, body: Any) -> Any:
        return mon.subject_view(request.match_info["model"], request.match_info["subject"])

    def evaluate(request: web.Request, body: Any) -> Any:
        return mon.evaluate_now(request.match_info["model"])

    def get_config(request: web.Request, body: Any) -> Any:
        return mon.monitor(request.match_info["model"]).config.to_dict()

    def put_config(request: web.Request, body: Any) -> Any:
        return mon.set_config(request.match_info["model"], body)

    def warnings(request: web.Request, body: Any) -> Any:
        model = request.query.get("model")
        if model is not None:
            mon.monitor(model)
        return {"warnings": mon.db.warnings(model, request.query.get("subject"))}

    def list_groups(request: web.Request, body: Any) -> Any:
        return {"groups": [{"name": n, "members": list(m)} for n, m in sorted(mon.groups.items())]}

    def create_group(request: web.Request, body: Any) -> Any:
        return mon.create_group(body)

    def get_group(request: web.Request, body: Any) -> Any:
        return mon.group_view(request.match_info["name"])

    def delete_group(request: web.Request, body: Any) -> Any:
        return mon.delete_group(request.match_info["name"])

    def actions(request: web.Request, body: Any) -> Any:
        return mon.actions_view(request.match_info["model"])

    handlers = dict(zip(ADMIN_ROUTES, (models, one_model, evaluate, get_config, put_config, user, group, subject,
                                        warnings, list_groups, create_group, get_group, delete_group, actions),
                        strict=True))  # fmt: skip
    for (method, path), fn in handlers.items():
        app.router.add_route(method, path, admin(fn))

    async def decisions(request: web.Request) -> web.Response:
        """Long poll: ``?after=TOKEN&wait=S`` answers once the decisions differ from TOKEN's
        (at once without a token, or with one of another epoch), else after S seconds."""
        authorize(request)
        try:
            wait = min(MAX_WAIT_S, max(0.0, float(request.query.get("wait", "0"))))
        except ValueError as e:
            raise bad_field("wait", "expected a number of seconds") from e
        return json_response(await mon.decisions.wait(request.query.get("after"), wait))

    async def metrics(request: web.Request) -> web.Response:
        authorize(request)
        mon.refresh_users()  # a user revoked a moment ago has no series in this scrape
        return web.Response(body=generate_latest(mon.registry), content_type="text/plain", charset="utf-8")

    app.router.add_get(DECISIONS_PATH, decisions)
    app.router.add_get("/metrics", metrics)
