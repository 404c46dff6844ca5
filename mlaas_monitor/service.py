"""The gateway's serving logic, shared by the REST and gRPC front ends: authentication,
authorisation, validation, rate limits and quotas, prediction, charging, publishing.

Protocol-neutral: front ends pass in the bearer token and decoded JSON-like values and map
``ApiError`` to their own status codes. The only I/O is through the Store.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mlaas_monitor import auth
from mlaas_monitor.commit import GroupCommitter
from mlaas_monitor.limits import quota_allows
from mlaas_monitor.metrics import Metrics
from mlaas_monitor.model import MICROS, Answer, Model, PolicyError, render_predictions
from mlaas_monitor.refusal import ApiError
from mlaas_monitor.schema import RowError
from mlaas_monitor.store import Store
from mlaas_monitor.store_records import (
    Admission,
    AnsweredRequest,
    ModelUnavailable,
    QueryRecord,
    Refused,
    UserRecord,
)
from mlaas_monitor.stream import QueryEvent, QueryStream

log = logging.getLogger(__name__)
# SQLite integers are signed 64-bit: larger quotas would fail in the store, not in validation.
MAX_QUOTA_ROWS = 2**63 - 1

# Matched with fullmatch: with match, "$" would also accept a trailing newline ("bob\n" beside "bob").
USER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
MAX_ID_LENGTH = 200
REQUEST_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")  # printable ASCII, no spaces
REQUEST_KEY_FIELD = "Idempotency-Key"
Packed = tuple[int, Sequence[float], Sequence[str]]  # (n_rows, numbers, categories)
# Decides, before a query is answered, what its user may be told: (user, model id) ->
# "none", "degrade" (label only) or "refuse". The extraction monitor installs one.
Enforcement = Callable[[str, str], str]


def request_digest(model_id: str, X: Any) -> bytes:
    """Identifies a request's content, so that a reused idempotency key can be told apart
    from a retry: the model and the encoded rows (what the tree saw)."""
    h = hashlib.sha256(model_id.encode())
    h.update(b"\0%d:%d\0" % X.shape)
    h.update(X.astype("<f8").tobytes())
    return h.digest()


def bad_field(field: str, problem: str, code: str = "invalid_request") -> ApiError:
    return ApiError(400, code, f"{field}: {problem}", field)


@dataclass(frozen=True, eq=False)
class PredictResult:
    """An answered query. Fresh: ``answer`` rendered under ``model``'s policy (which the
    enforcement may have degraded). Replayed: ``replay`` holds what the user was told the
    first time, and nothing was charged now."""

    model: Model  # the model asked
    answer: Answer | None  # what was answered, under the (possibly degraded) policy (None: a replay)
    query_id: int  # the query's seq in the log
    charged: float  # what was charged, in the currency unit (0 on a replay)
    replay: AnsweredRequest | None = None  # the answer first logged under the Idempotency-Key (None: a fresh answer)
    # A replay under a top-k policy: the same rows answered again (the request digest
    # guarantees they are the ones first sent), for the ranked list the log does not keep.
    again: Answer | None = None

    @property
    def replayed(self) -> bool:
        return self.replay is not None

    def predictions(self) -> list[dict[str, Any]]:
        if self.replay is not None:
            r = self.replay
            top = self.model.revealed_top(self.again) if self.again is not None else None
            return render_predictions(self.model.classes, r.labels, r.confidences, r.leaves, top)
        assert self.answer is not None
        return self.model.render(self.answer)

    def to_dict(self) -> dict[str, Any]:
        return {"predictions": self.predictions(), "query_id": self.query_id, "charged": self.charged}

    def to_json(self) -> bytes:
        """Same bytes as a compact json.dumps(to_dict()); a fresh answer is built from
        per-leaf fragments."""
        if self.answer is None:
            preds = json.dumps(self.predictions(), separators=(",", ":"))
        else:
            preds = self.model.predictions_json(self.answer)
        return f'{{"predictions":{preds},"query_id":{self.query_id},"charged":{json.dumps(self.charged)}}}'.encode()


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1 << 20  # a request body's bytes at most (beyond: 413)
    max_batch_rows: int = 1000  # rows per predict request at most
    default_quota_rows: int | None = None  # per user, over the ledger's lifetime
    default_rate_limit: float | None = None  # requests per second per user
    body_timeout_s: float = 10.0  # a request body must arrive whole within this (else 408)
    max_uploads: int = 128  # bodies being received at once, at most (beyond: 503 at once)
    idle_timeout_s: float = 15.0  # a connection with no request (none yet, or after one) is closed after this
    max_connections: int = 0  # open HTTP connections, at most (connections.ConnectionCap); 0: from the fd limit


@dataclass(frozen=True)
class Principal:
    user: str | None  # None for the admin
    admin: bool = False  # the request authenticated with the admin key


@dataclass
class _User:
    """A user as this process knows it: the store's row as last read (other replicas may
    change it; the commit checks the row itself), and rows of its queries in flight here."""

    record: UserRecord  # the store's row as last read
    used_rows: int = 0  # rows charged as of that row (the store's count)
    reserved_rows: int = 0  # answered, and not yet counted in used_rows

    def saw_store_count(self, rows_used: int) -> None:
        """Take the store's count of this user's rows (other replicas charge too). A query of
        ours still reserved may already be in that count, and will add its rows when its
        request resumes: so with queries in flight, take only what the count proves (it is
        at least ``rows_used - reserved_rows`` without them), never less than we had."""
        if self.reserved_rows == 0:
            self.used_rows = rows_used
        else:
            self.used_rows = max(self.used_rows, rows_used - self.reserved_rows)


class Gateway:
    def __init__(
        self,
        store: Store,
        admin_key: str,
        limits: Limits | None = None,
        metrics: Metrics | None = None,
        stream: QueryStream | None = None,
    ) -> None:
        problem = auth.admin_key_problem(admin_key)
        if problem is not None:
            raise ValueError(f"the admin key is {problem}")
        self.store = store  # models, users, the query log and the ledger
        self.limits = limits or Limits()  # request sizes, quotas, rate limits, timeouts
        self.metrics = metrics or Metrics()  # the gateway's Prometheus metrics
        self.stream = stream or QueryStream()  # answered queries pushed to subscribers (the gRPC stream)
        self._admin_hash = auth.hash_key(admin_key)  # sha256 of the admin key (the key itself is not kept)
        self._models: dict[str, Model] = {}  # model id -> the model as loaded
        self._unavailable: dict[str, str] = {}  # model id -> why it cannot be loaded
        # model id -> (row's created, reason) of a row that failed: not parsed again (a large
        # broken row parsed on every request stalled the event loop) until it is written anew.
        self._broken: dict[str, tuple[float | None, str]] = {}
        self._by_hash: dict[str, _User] = {}  # API key hash -> the user it authenticates
        self._by_name: dict[str, _User] = {}  # user name -> the user
        # Group-commits every record answered in one event-loop tick
        self.committer = GroupCommitter(store, self.metrics.commit_batch.observe)
        # (user, model) -> the monitor's action on the next answer (None: no monitor)
        self.enforcement: Enforcement | None = None
        self._degraded: dict[str, tuple[Model, Model]] = {}  # model id -> (model, label-only copy)
        self._keys_in_flight: set[tuple[str, str]] = set()  # (user, idempotency key)
        self.on_revoke: list[Callable[[str], None]] = []  # called with the user's name (e.g. the monitor forgets them)
        # Extensions' readiness: each returns why the gateway is not ready (e.g. its monitor
        # makes no progress), or None.
        self.readiness_checks: list[Callable[[], str | None]] = []
        # The store's config generation as last read: users and policies reloaded when it moves
        self._config_generation = store.config_generation()
        for rec in store.users():
            self._install(rec)
        self.metrics.watch_users(self._usage_by_user)

    def has_user(self, name: str) -> bool:
        """Whether an account of that name exists (revoked ones too)."""
        return name in self._by_name

    # ---- auth ----

    def _install(self, rec: UserRecord) -> _User:
        u = self._by_name.get(rec.name)
        if u is None:
            u = self._by_name[rec.name] = _User(rec, rec.rows_used)
        else:  # the same object: requests in flight hold it, and count their rows into it
            self._by_hash.pop(u.record.key_hash, None)
            u.record = rec
            u.saw_store_count(rec.rows_used)
        if rec.revoked is None:
            self._by_hash[rec.key_hash] = u
        return u

    def authenticate(self, authorization: str | None) -> Principal:
        token = auth.bearer_token(authorization)
        if token is None:
            raise ApiError(401, "unauthenticated", "missing API key: send 'Authorization: Bearer KEY'", "Authorization")
        h = auth.hash_key(token)
        if auth.same_hash(h, self._admin_hash):
            return Principal(None, admin=True)
        u = self._by_hash.get(h)
        if u is None:
            # A key this process has not seen: another replica may have created or rotated it.
            rec = self.store.user_by_key_hash(h)
            if rec is not None and rec.revoked is None:
                u = self._install(rec)
        if u is None or not auth.same_hash(h, u.record.key_hash):
            raise ApiError(401, "unauthenticated", "invalid or revoked API key", "Authorization")
        return Principal(u.record.name)

    @staticmethod
    def require_admin(p: Principal) -> None:
        if not p.admin:
            raise ApiError(403, "forbidden", "this endpoint needs the admin key")

    @staticmethod
    def require_user(p: Principal) -> str:
        if p.user is None:
            raise ApiError(403, "forbidden", "the admin key cannot query models; create a user and use its key")
        return p.user

    # ---- models ----

    def model(self, model_id: str) -> Model:
        m = self._models.get(model_id)
        if m is None:
            if len(model_id) > MAX_ID_LENGTH:
                raise ApiError(404, "unknown_model", "no such model", "model_id")
            # Models trained while the gateway runs become servable without a restart, and
            # a broken one is tried again once its row changes (it may have been replaced),
            # isolated meanwhile: its routes answer 503 with the reason, every other model
            # keeps serving.
            broken = self._broken.get(model_id)
            created: float | None = None
            try:
                created = self.store.model_created(model_id)
                if broken is not None and broken[0] == created:
                    raise ApiError(503, "model_unavailable", f"model {model_id!r} is unavailable: {broken[1]}", "model_id")
                m = self.store.load_model(model_id)
            except ModelUnavailable as e:
                if broken != (created, e.reason):  # a failure counted once until the row changes
                    self.metrics.model_load_failures.labels(model_id).inc()
                self._broken[model_id] = (created, e.reason)
                self._mark_unavailable(model_id, e.reason)
                raise ApiError(503, "model_unavailable", f"model {model_id!r} is unavailable: {e.reason}", "model_id") from e
            if m is None:
                raise ApiError(404, "unknown_model", f"no such model {model_id!r}", "model_id")
            self._broken.pop(model_id, None)
            if self._unavailable.pop(model_id, None) is not None:
                log.warning("model %s loads again; serving it", model_id)
                self.metrics.model_unavailable.labels(model_id).set(0)
            self._models[model_id] = m
        return m

    def _mark_unavailable(self, model_id: str, reason: str) -> None:
        if self._unavailable.get(model_id) != reason:
            log.error("model %s is unavailable (its routes answer 503): %s", model_id, reason)
            self._unavailable[model_id] = reason
            self.metrics.model_unavailable.labels(model_id).set(1)

    def unavailable_models(self) -> dict[str, str]:
        """Stored models that could not be loaded, with the reason (after ``list_models``
        or a request has tried them)."""
        return dict(self._unavailable)

    def available_model_ids(self) -> list[str]:
        """The store's models that load; the others are marked unavailable."""
        ids = []
        for mid in self.store.model_ids():
            try:
                self.model(mid)
            except ApiError:
                continue
            ids.append(mid)
        return ids

    def list_models(self) -> list[dict[str, Any]]:
        return [self.model(mid).public() for mid in self.available_model_ids()]

    def set_policy(self, model_id: str, patch: Any) -> dict[str, Any]:
        m = self.model(model_id)
        if type(patch) is not dict:
            raise bad_field("body", "expected a JSON object of policy fields")
        try:
            policy = m.policy.updated(patch)
        except PolicyError as e:
            raise bad_field(e.field, e.problem) from e
        self.store.set_policy(model_id, policy)
        self._models[model_id] = replace(m, policy=policy)
        return policy.to_dict()

    # ---- predictions ----

    def degraded(self, model: Model) -> Model:
        """``model`` under a label-only policy (same price): what a degraded user is told."""
        cached = self._degraded.get(model.id)
        if cached is None or cached[0] is not model:
            policy = replace(model.policy, reveal_confidence=False, reveal_leaf=False)
            cached = self._degraded[model.id] = (model, replace(model, policy=policy))
        return cached[1]

    def check_batch(self, n_rows: int, field: str = "rows") -> None:
        if n_rows > self.limits.max_batch_rows:
            raise ApiError(
                413, "batch_too_large", f"{field}: {n_rows} rows exceed the limit of {self.limits.max_batch_rows}", field
            )

    async def predict(
        self,
        principal: Principal,
        model_id: str,
        rows: Any,
        packed: Packed | None = None,
        request_key: str | None = None,
    ) -> PredictResult:
        """Answer, charge and publish one query; raises ApiError before any charge.

        ``rows`` is the JSON-like list of rows; gRPC clients may send ``packed`` instead.
        With a ``request_key`` (the client's Idempotency-Key), a retry of an answered query
        returns the original answer and is not charged again: a client whose connection
        broke after the charge can collect what it paid for.
        """
        name = self.require_user(principal)
        model = self.model(model_id)
        if request_key is not None and not REQUEST_KEY.fullmatch(request_key):
            raise bad_field(REQUEST_KEY_FIELD, "expected 1-255 printable ASCII characters without spaces")
        try:
            if packed is None:
                if type(rows) is list:
                    self.check_batch(len(rows))
                X = model.schema.encode_rows(rows)
            else:
                self.check_batch(packed[0], "packed.n_rows")
                X = model.schema.encode_packed(*packed)
        except RowError as e:
            raise ApiError(400, "invalid_row", str(e), e.field) from e
        digest = None
        if request_key is not None:
            digest = request_digest(model_id, X)
            replay = self._replay(name, model, request_key, digest, X)
            if replay is not None:
                return replay
        served = model
        if self.enforcement is not None:
            action = self.enforcement(name, model_id)
            if action == "refuse":
                raise ApiError(403, "extraction_refused", "queries refused: this account's extraction status is"
                               " above the model owner's limit", "model_id")  # fmt: skip
            if action == "degrade":
                served = self.degraded(model)
        n = X.shape[0]
        u = self._by_name[name]
        quota = u.record.quota_rows if u.record.quota_rows is not None else self.limits.default_quota_rows
        if not quota_allows(u.used_rows, u.reserved_rows, quota, n):
            # The quota does not refill, so no Retry-After, unless only queries still being
            # committed hold the rows: then a retry in a moment may fit.
            only_reserved = quota is not None and u.used_rows + n <= quota
            raise ApiError(429, "quota_exceeded", f"row quota of {quota} would be exceeded ({u.used_rows} used)",
                           headers={"Retry-After": "1"} if only_reserved else None)  # fmt: skip
        ans = model.answer(X)
        # The log keeps what the user was told, so the monitor and a replay see exactly that.
        conf, leaves = served.revealed(ans)
        amount = n * model.policy.price_micros
        # The quota and the rate limit are enforced by the commit, against the user's row in
        # the store: replicas sharing it see one quota, one bucket and the same limits.
        admission = Admission(u.record.key_hash, self.limits.default_quota_rows, self.limits.default_rate_limit)
        record = QueryRecord(time.time(), name, model_id, X, ans.labels, conf, leaves, amount, request_key, digest,
                             admission)  # fmt: skip
        u.reserved_rows += n
        if request_key is not None:
            self._keys_in_flight.add((name, request_key))
        try:
            seq = await self.committer.commit(record)
        finally:
            u.reserved_rows -= n
            if request_key is not None:
                self._keys_in_flight.discard((name, request_key))
        if isinstance(seq, Refused):
            return self._refused(seq, u, model, request_key, digest, X)
        u.used_rows += n
        self.metrics.observe_answer(model_id, n, amount / MICROS)
        if self.stream.active:
            self.stream.publish(QueryEvent(seq, record.ts, name, model_id, X, ans.labels, conf, leaves))
        return PredictResult(served, ans, seq, amount / MICROS)

    def _refused(self, r: Refused, u: _User, model: Model, request_key: str | None,
                 digest: bytes | None, X: np.ndarray) -> PredictResult:  # fmt: skip
        """What to tell a client whose answered query the commit refused (nothing was charged)."""
        name = u.record.name
        if r.reason == "duplicate":  # the same key committed meanwhile, through another replica
            assert request_key is not None and digest is not None
            replay = self._replay(name, model, request_key, digest, X)
            if replay is not None:
                return replay
            raise ApiError(409, "request_in_progress", "a request with this Idempotency-Key is still being"
                           " answered; retry it", REQUEST_KEY_FIELD)  # fmt: skip
        if r.reason == "quota_exceeded":
            u.saw_store_count(r.rows_used)
            raise ApiError(429, "quota_exceeded", f"row quota of {r.limit:.0f} would be exceeded ({r.rows_used} used)")
        if r.reason == "rate_limited":
            raise ApiError(429, "rate_limited", f"rate limit of {r.limit:g} requests/s exceeded",
                           headers={"Retry-After": str(max(1, math.ceil(r.retry_after)))})  # fmt: skip
        self._reload_user(name)  # revoked or rotated by another replica
        raise ApiError(401, "unauthenticated", "invalid or revoked API key", "Authorization")

    def _replay(self, user: str, model: Model, request_key: str, digest: bytes, X: np.ndarray) -> PredictResult | None:
        """The earlier answer to this user's request with this key, or None if there is none."""
        if (user, request_key) in self._keys_in_flight:
            raise ApiError(409, "request_in_progress", "a request with this Idempotency-Key is still being"
                           " answered; retry it", REQUEST_KEY_FIELD)  # fmt: skip
        # StoreUnavailable, AnswerUnreadable (its logged row damaged): 503
        prior = self.store.answered_request(user, request_key, len(model.classes))
        if prior is None:
            return None
        if prior.digest != digest:  # the digest covers the model too
            raise ApiError(422, "idempotency_key_reused", f"this Idempotency-Key was used for a different request"
                           f" (query {prior.query_id})", REQUEST_KEY_FIELD)  # fmt: skip
        self.metrics.observe_replay(model.id)
        again = model.answer(X) if model.policy.top_k >= 2 and prior.confidences is not None else None
        return PredictResult(model, None, prior.query_id, prior.amount_micros / MICROS, prior, again)

    # ---- usage ----

    def usage(self, principal: Principal, user: str | None = None) -> dict[str, Any]:
        if user is None or user == "":
            if principal.user is None:
                raise bad_field("user", "the admin must name a user: ?user=NAME")
            user = principal.user
        elif not principal.admin and user != principal.user:
            raise ApiError(403, "forbidden", "you can only see your own usage", "user")
        if user not in self._by_name:
            raise ApiError(404, "unknown_user", f"no such user {user!r}", "user")
        rows = self.store.usage(user)
        return {
            "user": user,
            "queries": sum(q for _, q, _, _ in rows),
            "rows": sum(r for _, _, r, _ in rows),
            "charged": sum(a for *_, a in rows) / MICROS,
            "models": [{"model": m, "queries": q, "rows": r, "charged": a / MICROS} for m, q, r, a in rows],
        }

    # ---- admin: users ----

    def create_user(self, body: Any) -> dict[str, Any]:
        if type(body) is not dict:
            raise bad_field("body", "expected a JSON object")
        unknown = set(body) - {"name", "quota_rows", "rate_limit"}
        if unknown:
            raise bad_field(sorted(unknown)[0], "unknown field")
        name = body.get("name")
        if type(name) is not str or not USER_NAME.fullmatch(name):
            raise bad_field("name", "expected 1-64 characters: letters, digits, '_', '.', '@', '-'")
        quota, rate = self._limits_fields(body)
        key = auth.new_key()
        if not self.store.add_user(name, auth.hash_key(key), quota, rate):
            raise ApiError(409, "user_exists", f"user {name!r} already exists", "name")
        rec = next(r for r in self.store.users() if r.name == name)
        self._install(rec)
        return {"user": name, "api_key": key, "quota_rows": quota, "rate_limit": rate}

    @staticmethod
    def _limits_fields(body: dict[str, Any]) -> tuple[int | None, float | None]:
        quota = body.get("quota_rows")
        if quota is not None and (type(quota) is not int or not 0 <= quota <= MAX_QUOTA_ROWS):
            raise bad_field("quota_rows", f"expected an integer from 0 to {MAX_QUOTA_ROWS} or null")
        rate = body.get("rate_limit")
        if rate is not None and (type(rate) not in (int, float) or not 0 < rate < 1e9):
            raise bad_field("rate_limit", "expected a positive number (requests per second) or null")
        return quota, None if rate is None else float(rate)

    def _user(self, name: str) -> _User:
        u = self._by_name.get(name)
        if u is None:
            raise ApiError(404, "unknown_user", f"no such user {name!r}", "user")
        return u

    def rotate_key(self, name: str) -> dict[str, Any]:
        self._user(name)
        key = auth.new_key()
        self.store.update_user(name, key_hash=auth.hash_key(key), revoked=None)
        self._reload_user(name)
        return {"user": name, "api_key": key}

    def revoke_key(self, name: str) -> dict[str, Any]:
        self._user(name)
        self.store.update_user(name, revoked=time.time())
        self._reload_user(name)
        for listener in self.on_revoke:
            listener(name)
        return {"user": name, "revoked": True}

    def update_limits(self, name: str, body: Any) -> dict[str, Any]:
        self._user(name)
        if type(body) is not dict:
            raise bad_field("body", "expected a JSON object")
        unknown = set(body) - {"quota_rows", "rate_limit"}
        if unknown:
            raise bad_field(sorted(unknown)[0], "unknown field")
        quota, rate = self._limits_fields(body)
        fields: dict[str, Any] = {}
        if "quota_rows" in body:
            fields["quota_rows"] = quota
        if "rate_limit" in body:
            fields["rate_limit"] = rate
        if fields:
            self.store.update_user(name, **fields)
        return self._reload_user(name).record.public()

    def list_users(self) -> list[dict[str, Any]]:
        return [
            {**u.record.public(), "rows_used": u.used_rows} for u in sorted(self._by_name.values(), key=lambda u: u.record.name)
        ]

    def _usage_by_user(self) -> list[tuple[str, int, int | None]]:
        """(user, rows used, row quota) of every user with a valid key, for /metrics."""
        d = self.limits.default_quota_rows
        return [(name, u.used_rows, u.record.quota_rows if u.record.quota_rows is not None else d)
                for name, u in sorted(self._by_name.items()) if u.record.revoked is None]

    def _reload_user(self, name: str) -> _User:
        rec = next(r for r in self.store.users() if r.name == name)
        return self._install(rec)

    def refresh(self) -> None:
        """Catch up with changes other replicas made to the store: users, keys, limits and
        policies when the store's config generation moved; rows used every time (for
        /metrics and the quota's fast path; the commit enforces the quota regardless)."""
        generation = self.store.config_generation()
        users = self.store.users()
        if generation != self._config_generation:
            self._config_generation = generation
            for rec in users:
                old = self._by_name.get(rec.name)
                if old is None or old.record != rec:
                    self._install(rec)
            policies = self.store.policies()
            for mid, m in list(self._models.items()):
                policy = policies.get(mid)
                if policy is None:  # gone, or no longer servable: the next request loads it again
                    del self._models[mid]
                elif m.policy != policy:
                    self._models[mid] = replace(m, policy=policy)
        for rec in users:
            u = self._by_name.get(rec.name)
            if u is not None:
                u.saw_store_count(rec.rows_used)

    def shutdown(self) -> None:
        self.committer.flush_now()
        self.stream.close()
