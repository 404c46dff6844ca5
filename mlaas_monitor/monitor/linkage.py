"""Automatic grouping of accounts that share one extraction: linked queries.

Path-finding (and any line search) probes a point by changing one feature at a time, so
its queries differ from an earlier query in exactly one feature. Spread over fresh
accounts (a sybil attack), each account probes points that another account discovered:
its queries differ in one feature from *another account's* queries. Natural queries almost
never do (two rows of a dataset rarely agree on all features but one), and exact repeats
of a row — which users sampling the same data do send — are not counted.

A query of user B *links* B to user A when it differs from a query A sent earlier in
exactly one feature. Users with at least ``min_links`` distinct linked row pairs between
them, and at least ``min_fraction`` (20 %) of the smaller one's rows, are joined (users
who draw from the same data do send a few rows one feature apart — Adult has many such
near-duplicates — but a small share of their queries); the connected components with two or more users are pooled as subjects
``auto:link-FIRST`` (FIRST: the member seen first). Lookups are by hashing: a row's d
*deletion keys* (its hash with feature j masked, for each j) meet those of every row that
differs from it in feature j alone; each key remembers who sent it first.

Pure and a function of the query sequence: a replay in sequence order rebuilds the same
components.
"""

from __future__ import annotations

from collections import Counter
from itertools import islice
from typing import NamedTuple

import numpy as np

LINK_PREFIX = "auto:link-"
MIN_ROWS = 25
# Deletion keys kept (each row has d): past this the oldest quarter is forgotten, so memory
# stays bounded over any number of logged rows (4M keys: 200,000 rows of 20 features, about
# 0.5 GB). Line searches probe around recent rows; a row one feature from a row forgotten
# by then is neither linked nor flagged (docs/monitor.md, Limits).
MAX_KEYS = 4_000_000
# Odd 64-bit multipliers: a row's hash is sum(bits_j * seed_j) mod 2^64 over its float32 bits.
_SEEDS = np.random.default_rng(0x11AA).integers(1, 2**63, size=8192, dtype=np.uint64) | np.uint64(1)


class Linked(NamedTuple):
    """What one ``Linkage.flush`` found, for the rows it linked (in order)."""

    joined: bool  # components were joined
    hashes: list[int]  # per row: its hash (equal rows, equal hashes)
    near: np.ndarray  # per row: one feature from an earlier, different row of any account


class Linkage:
    def __init__(self, n_features: int, min_links: int = 3, min_fraction: float = 0.2, max_keys: int = MAX_KEYS) -> None:
        self.d = n_features  # d: columns of every query row
        self.max_keys = max_keys  # deletion keys kept at most (the oldest go first)
        # Links that join two accounts: at least min_links, and that share of the smaller account's rows
        self.min_links, self.min_fraction = min_links, min_fraction
        self._rows: Counter[str] = Counter()  # rows linked so far, per user
        self._first: dict[int, tuple[str, int]] = {}  # deletion key -> (first sender, its row hash)
        self._pairs: Counter[tuple[str, str]] = Counter()  # (user, user) -> the links between them
        self._seen_links: set[tuple[int, int]] = set()  # (row hash, row hash): a repeated row links once
        self._order: dict[str, int] = {}  # user -> when first seen
        self._parent: dict[str, str] = {}  # union-find: user -> its parent (a root is its own)
        self._cache: tuple[dict[str, tuple[str, ...]], dict[str, str]] | None = None  # until the next join
        # Rows wait here, in order, and are linked in batches (one numpy pass each) when a
        # component is asked for: the same result as linking each at once, for less.
        self._pending: list[tuple[str, np.ndarray]] = []
        self.pending_rows = 0  # rows in _pending

    @staticmethod
    def _keys(X: np.ndarray) -> tuple[list[int], list[list[int]]]:
        """Per row: its hash and its d deletion keys (the hash with feature j's term replaced
        by a per-feature mark), for a whole batch in a few numpy calls."""
        d = X.shape[1]
        seeds = _SEEDS[: 2 * d] if 2 * d <= _SEEDS.shape[0] else np.resize(_SEEDS, 2 * d)
        bits = np.ascontiguousarray(X, dtype=np.float32).view(np.uint32).astype(np.uint64)
        with np.errstate(over="ignore"):
            terms = bits * seeds[:d]
            full = terms.sum(axis=1, dtype=np.uint64)
            keys = full[:, None] - terms + seeds[d:][None, :]
        return full.tolist(), keys.tolist()

    @classmethod
    def hashes(cls, X: np.ndarray) -> list[int]:
        """Each row's hash (as ``flush`` reports it)."""
        return cls._keys(X)[0] if X.shape[0] else []

    def find(self, user: str) -> str:
        root = user
        while self._parent.get(root, root) != root:
            root = self._parent[root]
        while user != root:  # path compression
            self._parent[user], user = root, self._parent[user]
        return root

    def add(self, user: str, X: np.ndarray) -> None:
        """Take a user's queries (in order); they are linked at the next ``flush``."""
        if user not in self._order:
            self._order[user] = len(self._order)
            self._parent[user] = user
        if X.shape[0] and self.d:
            self._pending.append((user, X))
            self.pending_rows += X.shape[0]

    def flush(self) -> Linked:
        """Link the waiting rows, in the order they came: whether components were joined,
        and per row its hash and whether it is one feature from an earlier row of any
        account (the pool's flag, pool.py)."""
        if not self._pending:
            return Linked(False, [], np.zeros(0, bool))
        users = [u for u, X in self._pending for _ in range(X.shape[0])]
        full, keys = self._keys(np.concatenate([X for _, X in self._pending]))
        self._pending, self.pending_rows = [], 0
        joined = False
        first = self._first
        near = np.zeros(len(users), bool)
        for i, (user, h, row) in enumerate(zip(users, full, keys, strict=True)):
            self._rows[user] += 1
            others: set[str] = set()
            for k in row:
                seen = first.get(k)
                if seen is None:
                    first[k] = (user, h)
                    continue
                if seen[1] == h:  # the row itself, sent before: a repeat links nothing
                    continue
                near[i] = True
                if seen[0] != user:  # a different row of another account, one feature apart
                    link = (h, seen[1]) if h < seen[1] else (seen[1], h)
                    if link not in self._seen_links:  # distinct row pairs: resending a row adds nothing
                        self._seen_links.add(link)
                        others.add(seen[0])
            for o in others:
                pair = (o, user) if o < user else (user, o)
                n = self._pairs[pair] = self._pairs[pair] + 1
                # Sybil accounts link a large share of their rows (path-finding continues
                # from each other's points: 10-100 % on German credit and Adult); users
                # sampling the same data a few (at most 5 % there, up to 9 rows of 2,000).
                # (A floor of MIN_ROWS on the share's base, so that two accounts' first few
                # rows cannot make it alone.)
                base = max(MIN_ROWS, min(self._rows[pair[0]], self._rows[pair[1]]))
                if n >= self.min_links and n >= self.min_fraction * base:
                    joined |= self._union(*pair)
        if len(first) > self.max_keys:  # forget the oldest quarter (dicts keep insertion order)
            for k in list(islice(first, len(first) - 3 * self.max_keys // 4)):
                del first[k]
        return Linked(joined, full, near)

    def _union(self, a: str, b: str) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        if self._order[rb] < self._order[ra]:
            ra, rb = rb, ra
        self._parent[rb] = ra  # the older root names the component
        self._cache = None
        return True

    def _groups(self, flush: bool = True) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
        if flush:
            self.flush()
        if self._cache is None:
            by_root: dict[str, list[str]] = {}
            for u in self._parent:
                by_root.setdefault(self.find(u), []).append(u)
            comps = {LINK_PREFIX + r: tuple(sorted(m)) for r, m in sorted(by_root.items()) if len(m) >= 2}
            self._cache = comps, {u: name for name, members in comps.items() for u in members}
        return self._cache

    def components(self, flush: bool = True) -> dict[str, tuple[str, ...]]:
        """Subject name -> members, for every component of two or more users (without
        ``flush``: as of the last one)."""
        return self._groups(flush)[0]

    def subject_of(self, user: str) -> str | None:
        """The subject of the user's component as of the last ``flush``, or None if it is
        linked to no one. Never flushes: when rows are linked must not depend on who asks
        (enforcement asks at batch boundaries, which depend on timing)."""
        return self._groups(flush=False)[1].get(user)
