"""Prometheus metrics of one gateway, in its own registry (several gateways can share a
process, e.g. in tests)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from analysim.ops_http import add_standard_metrics

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# analysim_gateway_rejections_total's reasons: every error code the gateway answers a request
# with (docs/gateway.md's error table; the router's not_found, method_not_allowed, http_error).
REJECTION_CODES = ("invalid_request", "invalid_row", "malformed_json", "malformed_body", "unauthenticated",
                   "forbidden", "extraction_refused", "unknown_model", "unknown_user", "unknown_group",
                   "unknown_subject", "user_exists", "group_exists", "request_in_progress", "idempotency_key_reused",
                   "body_too_large", "batch_too_large", "body_timeout", "quota_exceeded", "rate_limited",
                   "too_many_uploads", "store_unavailable", "model_unavailable", "monitor_unavailable",
                   "answer_unreadable", "internal", "not_found", "method_not_allowed", "http_error")
# analysim_gateway_connections_capped_total's kinds (connections.ConnectionCap).
CAPPED_KINDS = ("idle", "busy")


class Metrics:
    def __init__(self) -> None:
        # The gateway's own registry: what /metrics renders
        self.registry = CollectorRegistry(auto_describe=True)
        # Requests, by route and status
        self.requests = Counter(
            "analysim_gateway_requests_total",
            "Requests handled, by protocol, route and status.",
            ["protocol", "route", "status"],
            registry=self.registry,
        )
        # Seconds per request, by route
        self.latency = Histogram(
            "analysim_gateway_request_duration_seconds",
            "Time from request received to response ready, by protocol and route.",
            ["protocol", "route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        # Rows answered, by model
        self.rows = Counter(
            "analysim_gateway_rows_answered_total",
            "Rows answered (and charged), by model.",
            ["model"],
            registry=self.registry,
        )
        # Credits charged, by model
        self.charged = Counter(
            "analysim_gateway_charged_credits_total",
            "Credits charged to users, by model.",
            ["model"],
            registry=self.registry,
        )
        # Requests refused, by reason
        self.rejections = Counter(
            "analysim_gateway_rejections_total",
            "Requests refused, by reason (the JSON error code).",
            ["reason"],
            registry=self.registry,
        )
        # Answers replayed for an Idempotency-Key
        self.replays = Counter(
            "analysim_gateway_idempotent_replays_total",
            "Retried requests answered from the ledger by their Idempotency-Key (not charged again), by model.",
            ["model"],
            registry=self.registry,
        )
        # Queries per group commit
        self.commit_batch = Histogram(
            "analysim_gateway_commit_batch_queries",
            "Queries per group commit of the query log and ledger.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=self.registry,
        )
        # Per model: 1 while it cannot be served
        self.model_unavailable = Gauge(
            "analysim_gateway_model_unavailable",
            "1 while a stored model cannot be loaded (its routes answer 503), by model.",
            ["model"],
            registry=self.registry,
        )
        # Connections refused at the connection cap
        self.connections_capped = Counter(
            "analysim_gateway_connections_capped_total",
            "HTTP connections closed at the connection cap: the oldest idle one (idle) or, every one busy, the new one (busy).",
            ["kind"],
            registry=self.registry,
        )
        # Stored models that failed to load, by model
        self.model_load_failures = Counter(
            "analysim_gateway_model_load_failures_total",
            "Times a stored model's row was parsed and failed validation (once per version of the row), by model.",
            ["model"],
            registry=self.registry,
        )
        # Every reason's series from the start, at 0: an alert on increase() sees the first one.
        for code in REJECTION_CODES:
            self.rejections.labels(code)
        for kind in CAPPED_KINDS:
            self.connections_capped.labels(kind)
        add_standard_metrics(self.registry, "gateway")
        # labels() costs a dict lookup and lock; cache the children on the hot path.
        self._children: dict[tuple[str, ...], object] = {}

    def observe_request(self, protocol: str, route: str, status: int | str, seconds: float) -> None:
        key = (protocol, route, str(status))
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = (self.requests.labels(*key), self.latency.labels(protocol, route))
        req, lat = child  # type: ignore[misc]
        req.inc()
        lat.observe(seconds)

    def observe_answer(self, model: str, rows: int, credits: float) -> None:
        key = ("answer", model)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = (self.rows.labels(model), self.charged.labels(model))
        r, c = child  # type: ignore[misc]
        r.inc(rows)
        c.inc(credits)

    def watch_users(self, usage: Callable[[], Iterable[tuple[str, int, int | None]]]) -> None:
        """Per-user rows and quotas, read when scraped: ``usage()`` yields (user, rows used
        over the ledger's lifetime, row quota or None) for each user whose key is valid."""
        self.registry.register(_UserCollector(usage))

    def observe_replay(self, model: str) -> None:
        self.replays.labels(model).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _UserCollector(Collector):
    def __init__(self, usage: Callable[[], Iterable[tuple[str, int, int | None]]]) -> None:
        self.usage = usage  # per user: (name, rows used, quota); read at scrape time

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        rows = CounterMetricFamily("analysim_gateway_user_rows", "Rows charged to each user (the ledger's lifetime).",
                                   labels=["user"])
        quota = GaugeMetricFamily("analysim_gateway_user_quota_rows", "Each user's row quota (users with one).",
                                  labels=["user"])
        for user, used, q in self.usage():
            rows.add_metric([user], used)
            if q is not None:
                quota.add_metric([user], q)
        yield rows
        yield quota
