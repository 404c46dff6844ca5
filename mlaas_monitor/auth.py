"""API keys: random 32-byte tokens, stored only as their SHA-256 (a fast hash is enough for
high-entropy secrets), compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_PREFIX = "ak_"
MIN_ADMIN_KEY_LENGTH = 16


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def same_hash(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header, or None."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token
