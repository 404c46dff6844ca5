"""The store's tables: their DDL (for SQLite and PostgreSQL alike), the migrations from each
earlier schema version, what each table holds (what re-creating it empty would lose), and a
model's response policy as the models table's columns."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from mlaas_monitor.model import Policy
from mlaas_monitor.store_backends import Connection

SCHEMA_VERSION = 4

# {INT}, {REAL}, {BLOB}: the backend's types. "user" is quoted: a reserved word in PostgreSQL.
DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sequences (name TEXT PRIMARY KEY, next {INT} NOT NULL);
CREATE TABLE IF NOT EXISTS models (
    id TEXT PRIMARY KEY,
    created {REAL} NOT NULL,
    spec TEXT NOT NULL,                -- JSON: schema, classes, tree arrays, card, validation set
    reveal_confidence {INT} NOT NULL,
    confidence_decimals {INT} NOT NULL,
    reveal_leaf {INT} NOT NULL,
    price_micros {INT} NOT NULL,
    top_k {INT} NOT NULL DEFAULT 1,    -- output post-processing (model.Policy)
    confidence_noise {REAL} NOT NULL DEFAULT 0,
    noise_seed {INT} NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY,
    key_hash TEXT NOT NULL UNIQUE,     -- sha256 of the API key (the key itself is never stored)
    created {REAL} NOT NULL,
    revoked {REAL},
    quota_rows {INT},
    rate_limit {REAL},
    rows_used {INT} NOT NULL DEFAULT 0, -- the ledger's rows for this user, kept in the charge's transaction
    bucket_tokens {REAL},              -- the rate limit's token bucket (NULL: full)
    bucket_stamp {REAL}                -- wall-clock time of its last update
);
CREATE TABLE IF NOT EXISTS query_log (
    id {INT} PRIMARY KEY,              -- from sequences 'query_log', never reused (nothing is deleted)
    ts {REAL} NOT NULL,
    "user" TEXT NOT NULL,
    model TEXT NOT NULL,
    n_rows {INT} NOT NULL,
    n_features {INT} NOT NULL,
    features {BLOB} NOT NULL,          -- little-endian float64, row-major
    labels {BLOB} NOT NULL,            -- little-endian int32 class indices
    confidences {BLOB},                -- float64 as revealed, NULL when hidden
    leaves {BLOB},                     -- int32, NULL when hidden
    request_key TEXT,                  -- the client's Idempotency-Key, if it sent one
    request_digest {BLOB}              -- sha256 of (model, encoded rows): a reused key must match
);
CREATE INDEX IF NOT EXISTS query_log_model ON query_log(model, id);
CREATE TABLE IF NOT EXISTS ledger (
    query_id {INT} PRIMARY KEY REFERENCES query_log(id),
    ts {REAL} NOT NULL,
    "user" TEXT NOT NULL,
    model TEXT NOT NULL,
    rows {INT} NOT NULL,
    amount_micros {INT} NOT NULL
);
CREATE INDEX IF NOT EXISTS ledger_user ON ledger("user", model);
"""
TABLES = re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", DDL)
# Version v -> v + 1, run in order inside the schema transaction (an older store's tables
# already exist, so DDL's CREATE ... IF NOT EXISTS left them as they were).
MIGRATIONS: dict[int, list[str | tuple[str, str, str]]] = {
    # 1 -> 2: idempotency keys on the query log.
    1: [("query_log", "request_key", "TEXT"), ("query_log", "request_digest", "{BLOB}")],
    # 2 -> 3: quota and rate-limit state in the users' rows (shared by replicas).
    2: [
        ("users", "rows_used", "{INT} NOT NULL DEFAULT 0"),
        ("users", "bucket_tokens", "{REAL}"),
        ("users", "bucket_stamp", "{REAL}"),
        'UPDATE users SET rows_used = COALESCE((SELECT SUM(rows) FROM ledger WHERE ledger."user" = users.name), 0)',
    ],
    # 3 -> 4: top-k and noise on confidences in the response policy (defaults: as before).
    3: [
        ("models", "top_k", "{INT} NOT NULL DEFAULT 1"),
        ("models", "confidence_noise", "{REAL} NOT NULL DEFAULT 0"),
        ("models", "noise_seed", "{INT} NOT NULL DEFAULT 0"),
    ],
}
# The policy's columns, in Policy's field order (model.Policy(*row) rebuilds it).
POLICY_COLUMNS = "reveal_confidence, confidence_decimals, reveal_leaf, price_micros, top_k, confidence_noise, noise_seed"
# After the migrations, on every open (each is idempotent).
DDL_AFTER = [
    'CREATE UNIQUE INDEX IF NOT EXISTS query_log_request ON query_log("user", request_key) WHERE request_key IS NOT NULL',
    "INSERT INTO sequences (name, next) SELECT 'query_log', (SELECT COALESCE(MAX(id), 0) + 1 FROM query_log)"
    " WHERE NOT EXISTS (SELECT 1 FROM sequences WHERE name = 'query_log')",
    "INSERT INTO sequences (name, next) SELECT 'config', 1 WHERE NOT EXISTS (SELECT 1 FROM sequences WHERE name = 'config')",
]


# The columns of each table as DDL declares them (the newest version's).
_COLUMNS: dict[str, list[str]] = {
    table: [d.split()[0].strip('"') for d in re.sub(r"--[^\n]*", "", body).split(",") if d.strip()]
    for table, body in re.findall(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*?)\);", DDL, re.S)
}
# What a table missing from an existing store would lose if it were re-created empty. The
# sequences table is not here: it is derived (from the query log) and older stores lack it.
_HOLDS = {
    "models": "every model it serves",
    "users": "every user and API key",
    "query_log": "every logged query (what the monitor and idempotency keys read)",
    "ledger": "every charge (users' usage would restart at 0)",
    "meta": "the store's schema version",
}


def _columns_at(version: int) -> dict[str, set[str]]:
    """Each table's columns in a store of schema VERSION: the newest's less those a later migration adds."""
    added = {(s[0], s[1]) for v, steps in MIGRATIONS.items() if v >= version for s in steps if isinstance(s, tuple)}
    return {t: {c for c in cols if (t, c) not in added} for t, cols in _COLUMNS.items()}


def read_version(db: Connection) -> int | str | None:
    """meta's schema version: a number, the text stored when it is not one, None when absent."""
    row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    if row is None:
        return None
    try:
        return int(row[0])
    except (TypeError, ValueError):
        return str(row[0])


def damage(present: dict[str, set[str]], version: int | str | None) -> str | None:
    """What an existing store (PRESENT: each table's columns, empty when absent; VERSION: as
    meta reads) lacks that its schema version had, and what re-creating it would lose; None
    when it is whole."""
    missing, lost = [], []
    for table, holds in _HOLDS.items():
        if not present[table]:
            missing.append(f"{table} table")
            lost.append(holds)
    if present["meta"] and version is None:
        missing.append("schema version (meta's schema_version row)")
        lost.append(_HOLDS["meta"])
    if isinstance(version, str) or (isinstance(version, int) and version < 1):
        return (f"the store's schema version {version!r} is not a version this AnalySIM wrote: refusing to open it; "
                "restore the store from a backup")  # fmt: skip
    if isinstance(version, int) and version <= SCHEMA_VERSION:
        for table, cols in _columns_at(version).items():
            if present[table] and table in _HOLDS:
                for col in sorted(cols - present[table]):
                    missing.append(f"column {table}.{col}")
                    lost.append(f"the {col} of every {table} row")
    if not missing:
        return None
    one = len(missing) == 1
    return (f"the store's {', '.join(missing)} {'is' if one else 'are'} missing: refusing to re-create "
            f"{'it' if one else 'them'} empty, which would lose {'; '.join(lost)}; restore the store from a backup")


def policy_row(p: Policy) -> tuple[Any, ...]:
    return (int(p.reveal_confidence), p.confidence_decimals, int(p.reveal_leaf), p.price_micros, p.top_k,
            p.confidence_noise, p.noise_seed)  # fmt: skip


def policy_of(row: Sequence[Any]) -> Policy:
    """The policy of a models row; ValueError (PolicyError) or TypeError when it cannot be served."""
    return Policy(bool(row[0]), int(row[1]), bool(row[2]), int(row[3]), int(row[4]), float(row[5]),
                  int(row[6])).checked()  # fmt: skip
