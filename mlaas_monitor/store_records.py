"""What the store takes and gives back (users, query records, admissions, refusals, logged
answers) and the errors it raises."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mlaas_monitor.refusal import ApiError

# How soon a client refused with 503 (the database unavailable) should retry.
RETRY_AFTER_S = 1


class StoreUnavailable(ApiError):
    """The database cannot be read or written now (locked, restarting, unreachable): the
    request is refused with 503 and Retry-After, nothing was charged by it."""

    def __init__(self, doing: str, cause: BaseException) -> None:
        super().__init__(503, "store_unavailable", f"the ledger could not be {doing}: {cause}".strip(),
                         headers={"Retry-After": str(RETRY_AFTER_S)})  # fmt: skip


class QueryRefused(Exception):
    """``record_queries`` of a record the store refused (e.g. its idempotency key was taken)."""


class ModelUnavailable(Exception):
    """A stored model that cannot be served (unknown format, malformed spec): the reason,
    so that the gateway can isolate it and keep serving the others."""

    def __init__(self, model_id: str, reason: str) -> None:
        super().__init__(f"model {model_id!r} cannot be loaded: {reason}")
        self.model_id, self.reason = model_id, reason  # the model's id, and why it cannot be served


@dataclass(frozen=True)
class UserRecord:
    name: str  # the user's name (unique)
    key_hash: str  # sha256 of its API key (the key itself is never stored)
    created: float  # wall-clock time the user was created
    revoked: float | None  # when it was revoked (None: not)
    quota_rows: int | None  # its own quota in rows (None: the gateway's default)
    rate_limit: float | None  # its own rate limit in requests/s (None: the gateway's default)
    rows_used: int = 0  # charged rows over the ledger's lifetime

    def public(self) -> dict[str, Any]:
        return {
            "user": self.name,
            "created": self.created,
            "revoked": self.revoked is not None,
            "quota_rows": self.quota_rows,
            "rate_limit": self.rate_limit,
        }


USER_COLUMNS = "name, key_hash, created, revoked, quota_rows, rate_limit, rows_used"


@dataclass(frozen=True)
class Admission:
    """What the commit checks against the user's row, in the charge's transaction: the key
    the request authenticated with is still the user's and not revoked, the rows fit the
    quota, the rate limit has a token. The limits are the row's own, as they are now (set
    through any replica), else the gateway's defaults given here; the rate limit's clock is
    the record's wall-clock ``ts``."""

    key_hash: str  # the key the request authenticated with, hashed
    default_quota_rows: int | None = None  # the gateway's quota in rows for a user without one (None: unlimited)
    # The gateway's rate limit in requests/s for a user without one (None: unlimited)
    default_rate_limit: float | None = None


@dataclass(frozen=True, eq=False)
class QueryRecord:
    """One answered query: its log entry and its charge, committed together."""

    ts: float  # wall-clock time it was answered (the rate limit's clock)
    user: str  # the user charged
    model_id: str  # the model asked
    features: np.ndarray  # (n, d) the rows asked, encoded
    labels: np.ndarray  # (n,) the class index told for each row
    confidences: np.ndarray | None  # (n,) the confidences told (None: hidden by the policy)
    leaves: np.ndarray | None  # (n,) the leaf ids told (None: hidden by the policy)
    amount_micros: int  # the charge, in millionths of the currency unit
    request_key: str | None = None  # the request's Idempotency-Key (None: none sent)
    request_digest: bytes | None = None  # digest of what was sent under that key: the model and the encoded rows
    admission: Admission | None = None  # None: log and charge without checks


@dataclass(frozen=True)
class Refused:
    """A record the commit did not log or charge, and why: "revoked" (the key no longer
    valid), "duplicate" (its idempotency key was taken meanwhile), "quota_exceeded",
    "rate_limited"."""

    reason: str  # "revoked", "duplicate", "quota_exceeded" or "rate_limited"
    limit: float | None = None  # the quota (rows) or the rate limit (requests/s) refused by
    rows_used: int = 0  # the user's, for quota_exceeded
    retry_after: float = 0.0  # seconds until the bucket has a token, for rate_limited


@dataclass(frozen=True, eq=False)
class AnsweredRequest:
    """A logged query found by its idempotency key: what the user was told, and charged."""

    query_id: int  # the logged query's seq
    digest: bytes  # request_digest of what was sent: the model and the encoded rows
    labels: np.ndarray  # (n,) the class indices told
    confidences: np.ndarray | None  # (n,) the confidences told (None: hidden by the policy)
    leaves: np.ndarray | None  # (n,) the leaf ids told (None: hidden by the policy)
    amount_micros: int  # the charge, in millionths of the currency unit

    def problem(self, classes: int) -> str | None:
        """Why these values cannot be what the gateway told, for a model of CLASSES classes
        (a label out of its range, a confidence outside 0..1), or None."""
        bad = self.labels[(self.labels < 0) | (self.labels >= classes)]
        if bad.size:
            return f"label {int(bad[0])} is not one of the model's {classes} classes"
        c = self.confidences
        if c is not None and not np.all((c >= 0.0) & (c <= 1.0)):  # NaN fails too
            return f"confidence {float(c[~((c >= 0.0) & (c <= 1.0))][0])!r} is not within 0..1"
        return None


class AnswerUnreadable(ApiError):
    """The answer logged under an idempotency key cannot be told again: its row is not what the
    gateway writes (a blob of the wrong size or type, a value out of range). 503 for that request
    alone, with what is wrong; it was charged once, when first answered, and is not charged now."""

    def __init__(self, query_id: object, problem: str) -> None:
        super().__init__(503, "answer_unreadable", f"the answer logged for this Idempotency-Key (query {query_id}) "
                         f"is damaged and cannot be sent again: {problem}; send the request with a new "
                         "Idempotency-Key for a new answer")  # fmt: skip
        self.query_id, self.problem = query_id, problem  # the logged query's seq, and what is wrong with its row
