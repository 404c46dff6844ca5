"""An attacker that knows the monitor: path-finding spread over k accounts, each kept under
the default method's warning threshold, with no declared link between them.

What it knows (the strongest case, Kerckhoffs): the default method, its threshold, and —
through ``status`` — the status the monitor currently gives each of its accounts and every
group any of them is in (monitor-eval passes the monitor's own admin answer; a real
attacker would compute it from its own answers, which is what the status means). How it
stays under:

- **spreading over k accounts**: each account explores the leaves it discovered itself, so
  its probes differ in one feature only from its *own* earlier rows (the link index pools
  accounts whose rows are one feature apart from another account's);
- **retiring** an account before each leaf exploration whose status (or that of any group
  holding it) is within ``safety`` of the threshold, and handing its queued points on;
- **perturbing** a handed-over point in two features before the new account probes it
  (so that its probes are two or more features from the retiring account's rows), keeping
  the perturbed point only if it answers with the same leaf identity.

Pacing buys nothing (the monitor counts queries, not time) and mixing in natural rows
raises the copy a subject can build (the status), so this attacker does neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mlaas_monitor.monitor.attacks import ApiClient, BoxRebuild, Domain, Oracle, Pathfinding

PERTURB_TRIES = 3
BLUR = 1e-5  # pool-aware: each probe moved by up to this share of each continuous feature's range


class AccountOracle(Oracle):
    """Requests go from the account ``current`` (an index into ``clients``)."""

    def __init__(self, clients: list[ApiClient], model_id: str, domain: Domain, budget: int | None) -> None:
        super().__init__(clients, model_id, domain, budget)
        self.current = 0  # the index into clients of the account the next request goes from
        self.sent = [0] * len(clients)  # rows per account
        # (query-log seq of each request, rows sent in all once it was answered): when a
        # warning (which names the seq it came at) found the attacker
        self.answered: list[tuple[int, int]] = []

    def _send(self, X: np.ndarray) -> list[dict[str, Any]]:
        path = f"/v1/models/{self.model_id}/predict"
        body = self.clients[self.current].call("POST", path, {"rows": [self.domain.raw(x) for x in X]})
        out = body["predictions"]
        self.sent[self.current] += len(out)
        self.answered.append((int(body["query_id"]), sum(self.sent)))
        return out  # type: ignore[no-any-return]

    def rows_by(self, seq: int) -> int:
        """Rows the attacker had sent when the query-log row ``seq`` was written."""
        return max((n for q, n in self.answered if q <= seq), default=0)


@dataclass
class Checkpoint:
    """What the monitor said when the attacker looked: after ``queries`` rows in all."""

    queries: int  # rows the attacker had sent in all when it looked
    max_status: float  # the highest default-method status over the attacker's subjects
    warned: bool  # any of its subjects warned by then
    enforced: bool  # any of its subjects meets the enforcement rule by then
    pool_warned: bool = False  # the model's pool of extraction-like rows (pool.py) warned by then


@dataclass
class AdaptiveResult:
    rebuild: BoxRebuild  # the leaves found so far (the path-finder's own rebuild)
    retired: list[int] = field(default_factory=list)  # account indices, in retirement order
    checkpoints: list[Checkpoint] = field(default_factory=list)  # what the monitor said at each look, in order


class AdaptivePathfinding(Pathfinding):
    """Path-finding whose queued points remember the account that found them."""

    def __init__(
        self, oracle: AccountOracle, seed: int, threshold: float, safety: float,
        look: Callable[[int], Checkpoint], starts: list[np.ndarray] | None = None, pool_aware: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(oracle, seed)
        # Knows the pool (pool.py): moves every probe by a hair in each continuous feature, so
        # that no probe is one feature from an earlier row (rows are compared exactly);
        # with fewer than two continuous features it cannot, and probes as before.
        self.blurred = np.flatnonzero(~self.domain.integer) if pool_aware else np.empty(0, np.int64)
        self.accounts = oracle  # the oracle again, as the account oracle it is (which account sends)
        # the threshold each account stays under, how far below it an account retires, and how it looks the monitor up (account index -> what the monitor says)
        self.threshold, self.safety, self.look = threshold, safety, look
        self.owner: dict[int, int] = {}  # id(point) -> account that sent it
        self.starts = starts  # starting points, one per account (None: random ones)
        self.result = AdaptiveResult(self.rebuild)  # the leaves found, the accounts retired and every look
        self.active = list(range(len(oracle.clients)))  # indices of the accounts not retired, in turn order

    def _discover(self, x: np.ndarray, ident: Any, label: Any) -> None:
        if ident not in self.seen:
            self.seen.add(ident)
            p = x.copy()
            self.owner[id(p)] = self.accounts.current
            self.queue.append((p, ident, label))

    def _ask(self, X: np.ndarray) -> list[tuple[Any, Any]] | None:
        if self.blurred.size >= 2:  # every continuous feature: then no probe is one feature from another
            X = X.copy()
            j = self.blurred
            span = (self.domain.hi - self.domain.lo)[j]
            hair = self.rng.uniform(0.5, 1.0, (X.shape[0], j.size)) * BLUR * span
            X[:, j] = np.clip(X[:, j] + hair, self.domain.lo[j], self.domain.hi[j])
        return super()._ask(X)

    def _under(self, account: int) -> bool:
        cp = self.look(account)
        self.result.checkpoints.append(cp)
        return cp.max_status < self.threshold - self.safety

    def _retire(self, account: int) -> None:
        if account in self.active:
            self.active.remove(account)
            self.result.retired.append(account)

    def run(self) -> BoxRebuild:  # type: ignore[override]
        # Every account starts from its own random point (no row in common).
        for a in list(self.active):
            self.accounts.current = a
            x0 = self.domain.uniform(self.rng, 1)[0]
            first = self._ask(x0[None, :])
            if first is None:
                return self.rebuild
            self._discover(x0, *first[0])
        turn = 0
        while self.queue and self.active and not self.exhausted:
            x, ident, label = self.queue.pop(0)
            owner = self.owner.get(id(x), self.active[0])
            if owner not in self.active or not self._under(owner):
                self._retire(owner)
                moved = self._hand_over(x, ident, label, turn)
                turn += 1
                if moved is None:
                    continue
                owner, x = moved
            self.accounts.current = owner
            box = self._leaf(x, ident, label)
            if box is None:
                break
            self.rebuild.leaves.append(box)
        return self.rebuild

    def _hand_over(self, x: np.ndarray, ident: Any, label: Any, turn: int) -> tuple[int, np.ndarray] | None:
        """Move a queued point to an active account that is still under, perturbed in two
        features; None when no account can take it."""
        while self.active:
            a = self.active[turn % len(self.active)]
            if not self._under(a):
                self._retire(a)
                continue
            self.accounts.current = a
            for _ in range(PERTURB_TRIES):
                p = x.copy()
                for j in self.rng.choice(self.domain.d, size=min(2, self.domain.d), replace=False).tolist():
                    p[j] = self.domain.uniform(self.rng, 1)[0][j]
                got = self._ask(p[None, :])
                if got is None:
                    return None
                pid, plab = got[0]
                if pid == ident:
                    return a, p
                self._discover(p, pid, plab)
            return None
        return None
