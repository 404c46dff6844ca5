"""Subjects pooled by what the queries are, not by who sent them.

Per-subject thresholds cannot see an extraction whose pieces each stay below them: an
attacker that spreads path-finding over many accounts without declared links, and keeps
each account and each link group under the threshold, takes the whole model unwarned
(docs/monitor.md, "The adaptive attacker"). What its pieces share is what the queries look
like. Each answered row of a model is tested, in log order, for three signs of extraction:

- ``FLAG_OOD``: farther than tau from every row of S (the OOD test, ``ood.py``);
- ``FLAG_MARGIN``: inside a security margin of the leaf it reached (Quiring et al.'s
  closeness to the boundary, ``boundary.py``);
- ``FLAG_NEAR``: one feature from an earlier, different row of *any* account, the same
  account's included (the link index's keys, ``linkage.py``, read as a flag on the row).

A row that is one feature from an earlier row and also out of distribution or in a margin
(``joins_pool``: each sign alone is common in natural traffic) joins one pooled subject per
model, ``auto:pool``, once its account has shown the signs on ``REPEATED`` rows and
``REPEATED_SHARE`` of its rows (the account's latest such rows wait for it: a coincidence
falls on a row now and then, extraction on nearly every row), scored by ``best_copy`` as one
user that sent them all, and warned, metered and exported like a group. Two more
pooled subjects take rows by another rule: ``auto:model``, every answered row (the model's
*exposure*: what its answers together have given away; reported, never warned), and
``auto:young``, every row an account sent before its first evaluation (``first_eval``), so
that many short accounts cannot add up unseen (warned like any subject: the threshold is
the owner's budget for what unevaluated accounts hold together).

Memory is bounded per pooled subject: its per-leaf summary and star boxes (O(leaves x
features), as a user's), and at most ``MAX_ROWS`` distinct raw rows (by hash) for the tree
refit, with their senders (attribution). Rows past the cap still reach the summary and the
star boxes (the box copies stay exact); the refit sees the first MAX_ROWS distinct rows.
Pure: arrays in, arrays out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

POOL = "auto:pool"
EXPOSURE = "auto:model"
YOUNG = "auto:young"
POOLED = (POOL, EXPOSURE, YOUNG)
MAX_ROWS = 20_000  # distinct raw rows a pooled subject keeps for its tree refit
FLAG_OOD, FLAG_MARGIN, FLAG_NEAR = 1, 2, 4
# An account whose pooled rows reach this many, and this share of its linked rows, is
# extracting: all its rows join auto:pool. A customer's rows rarely join at all (none of
# German credit's benign rows; Adult's near-duplicates in a margin or far from S are a few
# per cent of its rows); a path-finder's nearly all do.
EXTRACTING_MIN = 3
EXTRACTING_SHARE = 0.2
# An account's rows that show the signs join auto:pool once they are REPEATED and
# REPEATED_SHARE of its rows (those before join then). In a benign population the signs
# fall on rows by coincidence, at 0-0.3 % of its rows (500 users on German credit: 41-101
# of 29,000-34,000 rows; Adult: 12 of 31,286); path-finding shows them on 97-100 % of its
# probes. Over 20 populations of 50 and 500 users no account showed them on a third row
# (13 on a second); three rows that are also 5 % of the account's rows are a chance
# event only for an account of at most 60 rows (P(Poisson(0.18) >= 3) < 1e-3 at 0.3 %),
# while a path-finding account passes on its third probe and is held back by two rows; to
# stay out, it would have to send 19 other rows per probe (docs/monitor.md, "Benign
# populations"). Rows waiting are at most REPEATED - 1 per account (the latest).
REPEATED = 3
REPEATED_SHARE = 0.05


def flags(far: np.ndarray, close: np.ndarray, near: np.ndarray) -> np.ndarray:
    """Per row the bit mask of the signs it shows."""
    return (far * FLAG_OOD | close * FLAG_MARGIN | near * FLAG_NEAR).astype(np.int64)


def joins_pool(mask: np.ndarray) -> np.ndarray:
    """Whether rows with these flags join the pool: one feature from an earlier row *and*
    out of distribution or in a margin. Either sign alone is common in natural traffic (the
    OOD test's tail is 5 % of it by construction; margins learnt from S hold 32-35 % of the
    training rows of German credit, wine and breast_cancer; 11 % of Adult's rows are one
    feature from another), so a pool of any one grows with the customers' traffic and, on
    a model their rows copy well, warns about them. Together they held 0.0 % of German
    credit's benign rows against 97-100 % of path-finding's probes (docs/monitor.md)."""
    return ((mask & FLAG_NEAR) != 0) & ((mask & (FLAG_OOD | FLAG_MARGIN)) != 0)


@dataclass(eq=False)
class Kept:
    """Which of a pooled subject's rows are kept raw: distinct rows, at most ``max_rows``."""

    max_rows: int = MAX_ROWS  # distinct rows kept raw at most (the tree refit's input)
    hashes: set[int] = field(default_factory=set)  # the kept rows' hashes (a resent row is not kept twice)
    owners: list[str] = field(default_factory=list)  # per kept row, in order: the account that sent it

    def select(self, users: list[str], hashes: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(kept, past_cap): rows to keep raw (new and distinct, within the cap), and new
        distinct rows past the cap (they reach the summary only). Repeats are in neither."""
        kept = np.zeros(len(hashes), bool)
        past = np.zeros(len(hashes), bool)
        for i, (u, h) in enumerate(zip(users, hashes, strict=True)):
            if h in self.hashes:
                continue
            if len(self.hashes) < self.max_rows:
                self.hashes.add(h)
                self.owners.append(u)
                kept[i] = True
            else:
                past[i] = True
        return kept, past


@dataclass(eq=False)
class PoolLedger:
    """Per account, how its rows reached one model's pools, and when auto:pool grew and was
    warned: what the pool response (attribution, new accounts, extracting accounts) reads.
    Rows are counted in log order, ingested or restored, so a replay rebuilds it."""

    rows_seen: int = 0  # answered rows of the model so far, in log order
    first_seen: dict[str, int] = field(default_factory=dict)  # account -> rows_seen before its first row
    sent: Counter[str] = field(default_factory=Counter)  # account -> its rows as the pools saw them
    linked: Counter[str] = field(default_factory=Counter)  # account -> its rows linked and pooled so far
    pooled_by: Counter[str] = field(default_factory=Counter)  # account -> its rows auto:pool took (past the cap too)
    extracting: set[str] = field(default_factory=set)  # accounts whose every row joins auto:pool (EXTRACTING_*)
    shown: Counter[str] = field(default_factory=Counter)  # account -> its rows that showed the signs (joins_pool)
    # account -> its rows that showed the signs and wait for REPEATED of them: (row, label, hash) in log order
    waiting: dict[str, list[tuple[np.ndarray, int, int]]] = field(default_factory=dict)
    grew_at: int = 0  # rows_seen when auto:pool last took a row
    warned_at: int | None = None  # rows_seen when auto:pool was first warned (None: not since start)

    def arrived(self, user: str, rows: int) -> None:
        """An account's rows, in log order."""
        self.first_seen.setdefault(user, self.rows_seen)
        self.rows_seen += rows

    def young(self, user: str, rows: int, first_eval: int) -> bool:
        """Whether the account was still young (before its first evaluation) when it sent
        these rows; counts them."""
        was = self.sent[user] < first_eval
        self.sent[user] += rows
        return was

    def repeated(self, users: list[str], X: np.ndarray, y: np.ndarray, hashes: list[int],
                 signs: np.ndarray) -> tuple[np.ndarray, tuple[list[str], np.ndarray, np.ndarray, list[int]]]:  # fmt: skip
        """Of these rows (in log order), those that show the signs: (which of them join
        auto:pool now, and the waiting rows of earlier batches that join with them, as
        users, rows, labels and hashes, in log order). A row joins once its account has
        shown the signs on REPEATED rows and REPEATED_SHARE of its rows, itself included
        (its rows counted in log order, this one's included); before that it waits."""
        joins = np.zeros(len(users), bool)
        released: list[tuple[str, np.ndarray, int, int]] = []
        here: dict[str, list[int]] = {}  # account -> its rows of this batch still waiting
        batch: Counter[str] = Counter()  # account -> its rows of this batch so far
        for i, u in enumerate(users):
            batch[u] += 1
            if not signs[i]:
                continue
            self.shown[u] += 1
            if self.shown[u] < max(REPEATED, REPEATED_SHARE * (self.linked[u] + batch[u])):
                here.setdefault(u, []).append(i)
                continue
            released += [(u, *w) for w in self.waiting.pop(u, [])]
            for j in here.pop(u, []):
                joins[j] = True
            joins[i] = True
        for u, idx in here.items():
            waits = self.waiting.setdefault(u, [])
            waits.extend((X[j], int(y[j]), hashes[j]) for j in idx)
            del waits[: max(0, len(waits) - (REPEATED - 1))]  # the latest REPEATED - 1 wait
        released_X = np.array([r for _, r, _, _ in released]).reshape(len(released), X.shape[1])
        return joins, ([u for u, _, _, _ in released], released_X, np.array([lab for _, _, lab, _ in released], y.dtype),
                       [h for _, _, _, h in released])  # fmt: skip

    def pool_took(self, users: Iterable[str]) -> None:
        """auto:pool took rows of these accounts (one entry per row) now."""
        self.grew_at = self.rows_seen
        self.pooled_by.update(users)

    def newly_extracting(self, users: list[str]) -> list[str]:
        """These rows' accounts (one entry per row) were linked: the accounts that have
        become extracting by it (most of their rows pooled), in name order."""
        self.linked.update(users)
        return [u for u in sorted(set(users) - self.extracting)
                if self.pooled_by[u] >= max(EXTRACTING_MIN, EXTRACTING_SHARE * self.linked[u])]  # fmt: skip

    def pooled_share(self, user: str) -> str:
        """How much of the account auto:pool holds, as the action log's reasons say it."""
        return f"{self.pooled_by[user]} of its {self.linked[user]} rows pooled"

    def warned(self) -> None:
        if self.warned_at is None:
            self.warned_at = self.rows_seen

    def standing(self, hold: int) -> bool:
        """auto:pool (warned) took a row within the last ``hold`` rows of the model."""
        return self.rows_seen - self.grew_at <= hold

    def new_pooled_since_warning(self) -> list[str]:
        """Accounts first seen since the warning that auto:pool has taken a row of. Signing
        up is not a sign: customers sign up during an attack too. A new account gets no
        allowance the extracting rule gives an established one (EXTRACTING_MIN rows, a share
        of its rows): its first pooled row is enough, so a coalition moving to fresh
        accounts is cut off at its first extraction-like row that is linked."""
        if self.warned_at is None:
            return []
        # Among the pooled accounts only (asked at each decision: every account ever seen would
        # be a scan of all customers), in the order they were first seen (first_seen's values
        # are distinct: rows_seen grows with each row).
        since = self.warned_at
        first = self.first_seen
        return sorted((u for u, n in self.pooled_by.items() if n and first.get(u, -1) >= since), key=first.__getitem__)
