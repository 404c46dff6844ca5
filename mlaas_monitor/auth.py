"""API keys: random 32-byte tokens, stored only as their SHA-256 (a fast hash is enough for
high-entropy secrets), compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from collections import Counter

KEY_PREFIX = "ak_"
MIN_ADMIN_KEY_LENGTH = 16
# An admin key must carry at least this many bits by the estimate below: a random
# secrets.token_urlsafe(16) has ~96, 'aaaaaaaaaaaaaaaa' 0, 'password12345678' 62.
MIN_ADMIN_KEY_BITS = 64.0


def key_bits(key: str) -> float:
    """A conservative estimate of a key's entropy in bits: its length times the Shannon
    entropy of its own character frequencies. It cannot see structure (a dictionary word
    scores like random letters), but it catches repeated and few-symbol keys, which a
    length check lets through."""
    n = len(key)
    if n == 0:
        return 0.0
    return max(0.0, -n * sum(c / n * math.log2(c / n) for c in Counter(key).values()))


def admin_key_problem(key: str) -> str | None:
    """Why ``key`` is too weak to be the admin key, or None if it is acceptable."""
    if len(key) < MIN_ADMIN_KEY_LENGTH:
        return f"shorter than {MIN_ADMIN_KEY_LENGTH} characters"
    bits = key_bits(key)
    if bits < MIN_ADMIN_KEY_BITS:
        return (f"too predictable (about {bits:.0f} bits by its character frequencies, at least "
                f"{MIN_ADMIN_KEY_BITS:.0f} needed; use e.g. secrets.token_urlsafe(32))")  # fmt: skip
    return None


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
