"""Extraction attacks as real HTTP clients of the gateway, and the models they rebuild.

Strategies (``STRATEGIES``): benign (rows of a dataset), random (uniform over the model
card's feature domain), pathfinding (Tramèr et al., USENIX Security 2016, Algorithm 1, with
the leaf-identity oracle), each optionally split across K accounts (colluding). Adaptive
attackers (``ADAPTIVE``): sybil (pathfinding over fresh accounts, each used for at most a
few queries, with no declared group), natural (samples the data distribution, as a benign
user does, in bulk, and fits a copy), confidence (pathfinding reading leaves from label +
confidence only, ignoring leaf ids), slow (pathfinding one row per request, paced). Attackers
work on encoded vectors (category index, as the public schema defines it) and send raw
rows; every row sent is one query. Each attacker rebuilds the model from its answers:
pathfinding from the leaf boxes it discovered, the others by fitting a tree on the answers.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from analysim.errors import UserError

STRATEGIES = ("benign", "random", "pathfinding")
ADAPTIVE = ("sybil", "natural", "confidence", "slow")
CONTINUOUS_STEPS = 20  # binary-search steps on a continuous feature (precision range / 2^20)


# ---- the public schema, as an attacker sees it ----


@dataclass(frozen=True)
class Domain:
    """Per feature: kind, bounds (categories as indices 0..n-1), whether whole-valued."""

    names: tuple[str, ...]  # the features' names, in column order
    categorical: np.ndarray  # (d,) bool
    integer: np.ndarray  # (d,) bool (categorical features are whole-valued too)
    lo: np.ndarray  # (d,) each feature's lower bound
    hi: np.ndarray  # (d,) each feature's upper bound
    categories: tuple[tuple[str, ...], ...]  # empty for numeric features

    @classmethod
    def from_public(cls, features: Sequence[dict[str, Any]]) -> Domain:
        cat = np.array([f["type"] == "categorical" for f in features])
        lo = np.array([0.0 if c else float(f["min"]) for f, c in zip(features, cat, strict=True)])
        hi = np.array([len(f["categories"]) - 1.0 if c else float(f["max"]) for f, c in zip(features, cat, strict=True)])
        integer = np.array([bool(c or f.get("integer", False)) for f, c in zip(features, cat, strict=True)])
        cats = tuple(tuple(f["categories"]) if c else () for f, c in zip(features, cat, strict=True))
        return cls(tuple(f["name"] for f in features), cat, integer, lo, hi, cats)

    @property
    def d(self) -> int:
        return len(self.names)

    def raw(self, x: np.ndarray) -> list[Any]:
        """An encoded vector as the row a client sends (category strings, plain numbers)."""
        out: list[Any] = []
        for j, v in enumerate(x.tolist()):
            if self.categorical[j]:
                out.append(self.categories[j][int(v)])
            elif self.integer[j]:
                out.append(int(v))
            else:
                out.append(v)
        return out

    def encode(self, rows: Sequence[Sequence[Any]]) -> np.ndarray:
        """Raw dataset rows (text or numbers, in feature order) as encoded vectors; rows
        with a category the model does not know are dropped."""
        tables = [{c: i for i, c in enumerate(cats)} for cats in self.categories]
        out = []
        for r in rows:
            try:
                out.append([tables[j][str(v)] if self.categorical[j] else float(v) for j, v in enumerate(r)])
            except (KeyError, ValueError):
                continue
        return np.array(out, dtype=np.float64).reshape(-1, self.d)

    def uniform(self, rng: np.random.Generator, n: int) -> np.ndarray:
        X = rng.uniform(self.lo, self.hi, size=(n, self.d))
        whole = np.floor(rng.uniform(self.lo, self.hi + 1.0, size=(n, self.d)))
        return np.where(self.integer, np.minimum(whole, self.hi), X)


# ---- the gateway, over HTTP ----


class ApiClient:
    """One account: keep-alive HTTP/1.1 to the gateway; an error is a one-line UserError. A read
    (GET) answered 503 with Retry-After (the gateway's monitor busy past its forward timeout, e.g.
    evaluating on a loaded machine) is asked again after that delay, for up to ``retry_for``
    seconds, as an HTTP client should; nothing else is retried (a 503 predict is not charged, and
    whether to send it again is the caller's choice)."""

    def __init__(self, url: str, key: str, timeout: float = 30.0, retry_for: float = 120.0) -> None:
        u = urlsplit(url if "://" in url else f"http://{url}")
        if u.scheme != "http" or not u.hostname:
            raise UserError(f"--gateway: expected http://HOST:PORT, got {url!r}")
        # the gateway's host and port, the account's API key, and seconds a request may take
        self.host, self.port, self.key, self.timeout = u.hostname, u.port or 80, key, timeout
        self.retry_for = retry_for  # seconds a GET answered 503 with Retry-After is retried
        # the keep-alive connection (None: opened on the next call)
        self._conn: http.client.HTTPConnection | None = None

    def call(self, method: str, path: str, body: Any = None) -> Any:
        deadline = time.monotonic() + self.retry_for
        while True:
            status, retry_after, out = self._once(method, path, body)
            if status == 200:
                return out
            if (method != "GET" or status != 503 or retry_after is None
                    or time.monotonic() + retry_after > deadline):
                err = out.get("error", {}) if isinstance(out, dict) else {}
                raise UserError(f"gateway answered {status} on {method} {path}: {err.get('message', out)}")
            time.sleep(retry_after)  # the server's own Retry-After: a back-off, not synchronisation

    def _once(self, method: str, path: str, body: Any) -> tuple[int, float | None, Any]:
        """One request: its status, its Retry-After in seconds (None: none, or not a number of
        seconds), and its decoded body."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        for attempt in (0, 1):  # one reconnect: the server may have closed an idle connection
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self._conn.request(method, path, body=data, headers=headers)
                resp = self._conn.getresponse()
                payload = resp.read()
                break
            except (OSError, http.client.HTTPException) as e:
                self.close()
                if attempt:
                    raise UserError(f"gateway {self.host}:{self.port} unreachable: {e}") from e
        try:
            out = json.loads(payload)
        except ValueError:
            out = {"error": {"message": payload[:200].decode(errors="replace")}}
        retry_after: float | None = None
        with contextlib.suppress(ValueError):  # (absent, or an HTTP date: not waited on)
            retry_after = max(0.0, min(60.0, float(resp.getheader("Retry-After") or "")))
        return resp.status, retry_after, out

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class Oracle:
    """The model behind K accounts: requests go round-robin, rows are counted as queries."""

    def __init__(self, clients: Sequence[ApiClient], model_id: str, domain: Domain, budget: int | None) -> None:
        if not clients:
            raise UserError("at least one account is needed")
        # the accounts (one client each), the model asked, its feature domain, and the query cap (None: none)
        self.clients, self.model_id, self.domain, self.budget = list(clients), model_id, domain, budget
        self.queries = 0  # rows sent so far, over every account
        self._next = 0  # the account of the next request (round-robin)
        self.log_X: list[np.ndarray] = []  # every row sent, encoded, in order
        self.log_labels: list[int] = []  # the label of every answer, in order
        self.log_ident: list[Any] = []  # the leaf identity each answer revealed (None: label only)
        # called after each answered request (truth tracking, progress)
        self.on_request: Callable[[Oracle], None] | None = None
        # How the attacker reads a leaf identity from an answer (``rounding_identity`` for
        # noisy confidences); the log's identities and path-finding's should agree.
        self.identity: Callable[[dict[str, Any]], Any] = leaf_identity

    @classmethod
    def connect(cls, url: str, keys: Sequence[str], model_id: str, budget: int | None) -> Oracle:
        clients = [ApiClient(url, k) for k in keys]
        info = clients[0].call("GET", f"/v1/models/{model_id}")
        return cls(clients, model_id, Domain.from_public(info["features"]), budget)

    def remaining(self) -> int | None:
        return None if self.budget is None else self.budget - self.queries

    def ask(self, X: np.ndarray) -> list[dict[str, Any]]:
        """Predictions for the rows of X (clipped to the budget: fewer answers if it runs out)."""
        rem = self.remaining()
        if rem is not None:
            X = X[: max(0, rem)]
        if X.shape[0] == 0:
            return []
        preds = self._send(X)
        self.queries += len(preds)
        self.log_X.append(np.array(X, dtype=np.float64))
        self.log_labels += [p["label"] for p in preds]
        self.log_ident += [self.identity(p) if "leaf" in p or "confidence" in p else None for p in preds]
        if self.on_request is not None:
            self.on_request(self)
        return preds

    def _send(self, X: np.ndarray) -> list[dict[str, Any]]:
        client = self.clients[self._next % len(self.clients)]
        self._next += 1
        return client.call("POST", f"/v1/models/{self.model_id}/predict", {"rows": [self.domain.raw(x) for x in X]})["predictions"]

    def close(self) -> None:
        for c in self.clients:
            c.close()


class SybilOracle(Oracle):
    """Fresh accounts, each used for at most ``per_account`` rows and never again: a request
    that would cross the limit is split, its tail sent from the next account. ``new_key``
    opens an account (the attacker signs up)."""

    def __init__(self, first: ApiClient, model_id: str, domain: Domain, budget: int | None, per_account: int,
                 new_key: Callable[[], str | None], url: str) -> None:  # fmt: skip
        super().__init__([first], model_id, domain, budget)
        # rows per account at most, how an account is opened (None: none left), and the gateway's URL
        self.per_account, self.new_key, self.url = per_account, new_key, url
        self._used = 0  # rows sent from the current account

    def _send(self, X: np.ndarray) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while X.shape[0]:
            if self._used >= self.per_account:
                key = self.new_key()
                if key is None:  # no account left: fewer answers than rows (the attack stops)
                    break
                self.clients.append(ApiClient(self.url, key))
                self.clients[-2].close()
                self._used = 0
            take = min(X.shape[0], self.per_account - self._used)
            path = f"/v1/models/{self.model_id}/predict"
            out += self.clients[-1].call("POST", path, {"rows": [self.domain.raw(x) for x in X[:take]]})["predictions"]
            self._used += take
            X = X[take:]
        return out


class PacedOracle(Oracle):
    """One row per request and a pause between requests: an attacker that slows down."""

    def __init__(self, clients: Sequence[ApiClient], model_id: str, domain: Domain, budget: int | None,
                 pause_s: float) -> None:  # fmt: skip
        super().__init__(clients, model_id, domain, budget)
        self.pause_s = pause_s  # seconds between two requests

    def _send(self, X: np.ndarray) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for x in X:
            time.sleep(self.pause_s)
            out += super()._send(x[None, :])
        return out


def leaf_identity(p: dict[str, Any]) -> Any:
    """The leaf-identity oracle: the leaf id when revealed, else (label, confidence) as on
    BigML (Tramèr et al. use confidences as leaf identifiers)."""
    if "leaf" in p:
        return ("leaf", p["leaf"])
    return confidence_identity(p)


def confidence_identity(p: dict[str, Any]) -> Any:
    """The confidence oracle: (label, confidence, and the ranked top-k list where the policy
    reveals one) even when leaf ids are revealed; leaves that share all of it are merged."""
    top = tuple((t["label"], t["confidence"]) for t in p["top"]) if "top" in p else None
    return ("conf", p["label"], p.get("confidence"), top)


def rounding_identity(decimals: int) -> Callable[[dict[str, Any]], Any]:
    """An oracle for noisy confidences: (label, confidence rounded to ``decimals``). Read as
    they are, noisy confidences make every answer a new leaf (path-finding then never
    finishes one); rounded, the noise mostly vanishes and leaves of close confidence merge."""

    def identity(p: dict[str, Any]) -> Any:
        c = p.get("confidence")
        return ("conf", p["label"], None if c is None else round(float(c), decimals))

    return identity


# ---- rebuilt models ----


class TreeRebuild:
    """A tree fitted (to purity) on the (query, label) pairs an attacker collected: the
    monitor's T_u procedure (``fit_subject_tree``), so that the tree copy has one
    implementation."""

    def __init__(self, X: np.ndarray, labels: Sequence[Any]) -> None:
        from mlaas_monitor.monitor.infogain import fit_subject_tree

        self.labels = list(labels)  # the labels the copy was fitted on, in query order
        names = [str(v) for v in labels]
        self.classes = sorted(set(names))  # the label names, sorted: the tree's class indices
        index = {c: i for i, c in enumerate(self.classes)}
        y = np.array([index[c] for c in names], dtype=np.int64)
        # the tree fitted to purity (None: no answers to fit)
        self.tree = fit_subject_tree(np.asarray(X, np.float32), y) if len(labels) else None

    def predict(self, X: np.ndarray) -> list[str]:
        if self.tree is None:
            return ["?"] * X.shape[0]
        leaves = self.tree.apply(np.asarray(X, np.float64))
        return [self.classes[i] for i in self.tree.value[leaves].argmax(axis=1).tolist()]


@dataclass
class LeafBox:
    label: Any  # the label every row in the box gets
    lo: np.ndarray  # numeric bounds (inclusive; -inf/+inf when the domain edge stayed inside)
    hi: np.ndarray  # numeric upper bounds (inclusive; +inf when the domain edge stayed inside)
    allowed: list[set[int]]  # categorical: the category indices that stay in the leaf


@dataclass
class BoxRebuild:
    """Pathfinding's reconstruction: the discovered leaves as boxes with their labels."""

    domain: Domain  # the features the boxes are in
    # the leaves found, in discovery order (the first box holding a row labels it)
    leaves: list[LeafBox] = field(default_factory=list)

    def predict(self, X: np.ndarray) -> list[str]:
        if not self.leaves:
            return ["?"] * X.shape[0]
        n = X.shape[0]
        dom = self.domain
        cat = dom.categorical
        span = np.where(dom.hi > dom.lo, dom.hi - dom.lo, 1.0)
        d = X.shape[1]
        key = np.zeros((n, len(self.leaves)), dtype=np.float64)
        for k, b in enumerate(self.leaves):
            num = np.less(X, b.lo) | np.greater(X, b.hi)
            num[:, cat] = False
            v = num.sum(axis=1).astype(np.float64)
            for j in np.flatnonzero(cat):
                v += ~np.isin(X[:, j], list(b.allowed[j]))
            # Ties broken by how far outside the box the point lies (numeric features, as
            # shares of their range): below one, so it never outweighs a violated predicate.
            out = np.maximum(np.maximum(b.lo - X, X - b.hi), 0.0) / span
            out[:, cat] = 0.0
            key[:, k] = v + np.nan_to_num(out, posinf=1.0).sum(axis=1) / (d + 1)
        # A point inside a discovered leaf gets its label; elsewhere (an undiscovered leaf)
        # the leaf it is closest to by violated predicates, then by distance.
        best = key.argmin(axis=1)
        return [str(self.leaves[k].label) for k in best.tolist()]


# ---- strategies ----


def run_benign(oracle: Oracle, rows: np.ndarray, seed: int = 0, batch: int = 1) -> TreeRebuild:
    """Rows of the dataset in a seeded random order (each once, then again, up to the budget)."""
    rng = np.random.default_rng(seed)
    if oracle.budget is None:
        oracle.budget = rows.shape[0]
    order = np.concatenate([rng.permutation(rows.shape[0]) for _ in range(-(-oracle.budget // rows.shape[0]))])
    for i in range(0, oracle.budget, batch):
        if not oracle.ask(rows[order[i : i + batch]]):
            break
    return rebuild_from_log(oracle)


def run_random(oracle: Oracle, seed: int = 0, batch: int = 1, default_budget: int = 1000) -> TreeRebuild:
    rng = np.random.default_rng(seed)
    if oracle.budget is None:
        oracle.budget = default_budget
    while oracle.remaining() > 0:  # type: ignore[operator]
        if not oracle.ask(oracle.domain.uniform(rng, batch)):
            break
    return rebuild_from_log(oracle)


def rebuild_from_log(oracle: Oracle) -> TreeRebuild:
    X = np.concatenate(oracle.log_X) if oracle.log_X else np.empty((0, oracle.domain.d))
    return TreeRebuild(X, oracle.log_labels)


def boxes_from_log(
    domain: Domain, X: np.ndarray, labels: Sequence[Any], idents: Sequence[Any], min_queries: int = 1
) -> BoxRebuild | None:
    """The copy any attacker can build from answers that reveal leaf identities, whatever
    it queried: per identity seen at least ``min_queries`` times, the bounding box of its
    queries with that identity (every whole value between the least and the greatest for a
    categorical feature: the tree splits category indices by thresholds). None when the
    answers revealed labels only (or no identity was seen that often)."""
    groups: dict[Any, list[int]] = {}
    for i, ident in enumerate(idents):
        if ident is not None:
            groups.setdefault(ident, []).append(i)
    groups = {k: v for k, v in groups.items() if len(v) >= min_queries}
    if not groups:
        return None
    out = BoxRebuild(domain)
    for rows in groups.values():
        Xg = X[rows]
        lo, hi = Xg.min(axis=0), Xg.max(axis=0)
        allowed = [set(range(int(a), int(b) + 1)) if c else set() for a, b, c in zip(lo, hi, domain.categorical, strict=True)]
        # Open beyond a domain edge the queries reached, as path-finding's boxes are.
        lo, hi = np.where(lo <= domain.lo, -np.inf, lo), np.where(hi >= domain.hi, np.inf, hi)
        out.leaves.append(LeafBox(labels[rows[0]], lo, hi, allowed))
    return out


def star_boxes_from_log(
    domain: Domain, X: np.ndarray, labels: Sequence[Any], idents: Sequence[Any], min_queries: int = 1
) -> BoxRebuild | None:
    """Path-finding's reading of the answers, whatever was queried: per identity, from the
    first query that showed it (its centre), the bounding box of the queries with that
    identity that changed at most one feature of the centre (open beyond a domain edge;
    categorical features as ``boxes_from_log`` reads them, every index between the least and
    the greatest, since the tree splits category indices by thresholds). Where leaves share
    an identity this is the box path-finding builds along each feature, not the bounding box
    of all the identity's queries (which can span most of the domain). Only identities with
    at least ``min_queries`` such queries; None when there is none."""
    centre: dict[Any, int] = {}
    of = np.array([-1 if ident is None else centre.setdefault(ident, i) for i, ident in enumerate(idents)], np.int64)
    if not centre:
        return None
    X = np.asarray(X)[: of.shape[0]]
    star = (of >= 0) & ((X[np.maximum(of, 0)] != X).sum(axis=1) <= 1)
    rows: dict[int, list[int]] = {}
    for i in np.flatnonzero(star).tolist():
        rows.setdefault(int(of[i]), []).append(i)
    rows = {c: m for c, m in rows.items() if len(m) >= min_queries}
    if not rows:
        return None
    out = BoxRebuild(domain)
    for members in rows.values():
        Xg = X[members]
        lo, hi = Xg.min(axis=0), Xg.max(axis=0)
        allowed = [set(range(int(a), int(b) + 1)) if c else set() for a, b, c in zip(lo, hi, domain.categorical, strict=True)]
        lo, hi = np.where(lo <= domain.lo, -np.inf, lo), np.where(hi >= domain.hi, np.inf, hi)
        out.leaves.append(LeafBox(labels[members[0]], lo, hi, allowed))
    return out


def box_copies(domain: Domain, X: np.ndarray, labels: Sequence[Any], idents: Sequence[Any]) -> list[BoxRebuild | None]:
    """The box copies of the answers: every identity's box, only those of identities seen
    more than once (a one-query box is a leaf found but not explored yet), and the same two
    of the star boxes (path-finding's reading, ``star_boxes_from_log``)."""
    return [boxes_from_log(domain, X, labels, idents), boxes_from_log(domain, X, labels, idents, min_queries=2),
            star_boxes_from_log(domain, X, labels, idents), star_boxes_from_log(domain, X, labels, idents, min_queries=2)]  # fmt: skip


def boxes_from_oracle(oracle: Oracle) -> list[BoxRebuild | None]:
    X = np.concatenate(oracle.log_X) if oracle.log_X else np.empty((0, oracle.domain.d))
    return box_copies(oracle.domain, X, oracle.log_labels, oracle.log_ident)


class Pathfinding:
    """Tramèr et al., Algorithm 1: from a point, find its leaf's predicates feature by
    feature (line search on numeric features, one probe per category on categorical ones),
    queue one point per newly seen leaf identity, until the queue is empty."""

    def __init__(
        self, oracle: Oracle, seed: int = 0, start: np.ndarray | None = None,
        identity: Callable[[dict[str, Any]], Any] = leaf_identity,
    ) -> None:  # fmt: skip
        self.oracle, self.domain = oracle, oracle.domain  # the model asked, and its feature domain
        self.identity = identity  # how an answer is read as a leaf identity
        self.rng = np.random.default_rng(seed)  # random starting points and line-search order
        self.start = start  # the first point (None: a random one)
        self.rebuild = BoxRebuild(self.domain)  # the leaves found so far, as boxes
        self.seen: set[Any] = set()  # the leaf identities seen (found or queued)
        self.queue: list[tuple[np.ndarray, Any, Any]] = []  # (point, identity, label)
        self.exhausted = False  # the oracle's budget ran out before the queue emptied

    def _ask(self, X: np.ndarray) -> list[tuple[Any, Any]] | None:
        preds = self.oracle.ask(X)
        if len(preds) < X.shape[0]:
            self.exhausted = True
            return None
        return [(self.identity(p), p["label"]) for p in preds]

    def _discover(self, x: np.ndarray, ident: Any, label: Any) -> None:
        if ident not in self.seen:
            self.seen.add(ident)
            self.queue.append((x.copy(), ident, label))

    def run(self) -> BoxRebuild:
        x0 = self.start if self.start is not None else self.domain.uniform(self.rng, 1)[0]
        first = self._ask(x0[None, :])
        if first is None:
            return self.rebuild
        self._discover(x0, *first[0])
        while self.queue and not self.exhausted:
            x, ident, label = self.queue.pop(0)
            box = self._leaf(x, ident, label)
            if box is None:
                break
            self.rebuild.leaves.append(box)
        return self.rebuild

    def _leaf(self, x: np.ndarray, ident: Any, label: Any) -> LeafBox | None:
        dom = self.domain
        lo, hi = np.full(dom.d, -np.inf), np.full(dom.d, np.inf)
        allowed: list[set[int]] = [set() for _ in range(dom.d)]
        for j in range(dom.d):
            if dom.categorical[j]:
                others = [c for c in range(len(dom.categories[j])) if c != int(x[j])]
                allowed[j].add(int(x[j]))
                if not others:
                    continue
                probes = np.repeat(x[None, :], len(others), axis=0)
                probes[:, j] = others
                answers = self._ask(probes)  # one request: the category splits of this feature
                if answers is None:
                    return None
                for c, p, (pid, plab) in zip(others, probes, answers, strict=True):
                    if pid == ident:
                        allowed[j].add(c)
                    else:
                        self._discover(p, pid, plab)
            else:
                bounds = self._line_search(x, j, ident)
                if bounds is None:
                    return None
                lo[j], hi[j] = bounds
        return LeafBox(label, lo, hi, allowed)

    def _line_search(self, x: np.ndarray, j: int, ident: Any) -> tuple[float, float] | None:
        """The interval of feature j (others fixed at x) that stays in leaf ``ident``: the
        leaf is a box, so it is one interval. Both domain edges in one request, then a
        binary search toward each edge that left the leaf."""
        dom = self.domain
        ends = np.repeat(x[None, :], 2, axis=0)
        ends[0, j], ends[1, j] = dom.lo[j], dom.hi[j]
        answers = self._ask(ends)
        if answers is None:
            return None
        result = []
        for side, (pid, plab) in zip((0, 1), answers, strict=True):
            if pid == ident:
                result.append(-np.inf if side == 0 else np.inf)  # the leaf reaches the domain edge
                continue
            self._discover(ends[side], pid, plab)
            inside, outside = float(x[j]), float(ends[side, j])
            steps = 0
            while True:
                if dom.integer[j]:
                    if abs(outside - inside) <= 1:
                        break
                    mid = float(np.floor((inside + outside) / 2))
                else:
                    if steps >= CONTINUOUS_STEPS:
                        break
                    mid = (inside + outside) / 2
                steps += 1
                p = x.copy()
                p[j] = mid
                a = self._ask(p[None, :])
                if a is None:
                    return None
                mid_id, mid_label = a[0]
                if mid_id == ident:
                    inside = mid
                else:
                    outside = mid
                    self._discover(p, mid_id, mid_label)
            result.append(inside)
        return float(min(result)), float(max(result))


def run_strategy(
    strategy: str, oracle: Oracle, seed: int = 0, benign_rows: np.ndarray | None = None, start: np.ndarray | None = None
) -> TreeRebuild | BoxRebuild:
    """Run a strategy on an oracle. The adaptive ones are path-finding or sampling on a
    suitable oracle: sybil on a ``SybilOracle``, slow on a ``PacedOracle``."""
    if strategy == "natural":
        if benign_rows is None or benign_rows.shape[0] == 0:
            raise UserError("the natural strategy needs rows to draw from (--dataset)")
        return run_natural(oracle, benign_rows, seed)
    if strategy in ("sybil", "slow"):
        return Pathfinding(oracle, seed, start).run()
    if strategy == "confidence":
        return Pathfinding(oracle, seed, start, identity=confidence_identity).run()
    if strategy == "benign":
        if benign_rows is None or benign_rows.shape[0] == 0:
            raise UserError("the benign strategy needs rows to draw from (--dataset)")
        return run_benign(oracle, benign_rows, seed)
    if strategy == "random":
        return run_random(oracle, seed)
    if strategy == "pathfinding":
        return Pathfinding(oracle, seed, start).run()
    raise UserError(f"unknown strategy {strategy!r} (expected one of {', '.join(STRATEGIES + ADAPTIVE)})")


def run_natural(oracle: Oracle, rows: np.ndarray, seed: int = 0, batch: int = 1) -> TreeRebuild:
    """Rows drawn with replacement from the data distribution (what a benign user sends),
    up to the budget, then a tree fitted on the answers."""
    rng = np.random.default_rng(seed)
    if oracle.budget is None:
        oracle.budget = 10 * rows.shape[0]
    while oracle.remaining() > 0:  # type: ignore[operator]
        if not oracle.ask(rows[rng.integers(0, rows.shape[0], size=min(batch, oracle.remaining()))]):  # type: ignore[type-var]
            break
    return rebuild_from_log(oracle)


def fidelities(rebuilt: TreeRebuild | BoxRebuild, X: np.ndarray, truth: Sequence[Any]) -> tuple[float, float]:
    """(balanced fidelity, plain agreement) of a rebuilt model on X against the owner's labels,
    from one prediction (predicting is what scoring a copy costs)."""
    if X.shape[0] == 0:
        return 0.0, 0.0
    from mlaas_monitor.monitor.infogain import balanced_agreement

    predicted, labels = np.array(rebuilt.predict(X)), np.array([str(t) for t in truth])
    if predicted.shape != labels.shape:
        raise ValueError(f"{predicted.shape[0]} predictions for {labels.shape[0]} labels")
    return balanced_agreement(predicted, labels), float(np.mean(predicted == labels))


def balanced_fidelity(rebuilt: TreeRebuild | BoxRebuild, X: np.ndarray, truth: Sequence[Any]) -> float:
    """True balanced fidelity: the mean over the owner's labels of the share of rows with
    that label the rebuilt model labels alike (a constant copy scores 1/K)."""
    return fidelities(rebuilt, X, truth)[0]


def agreement(rebuilt: TreeRebuild | BoxRebuild, X: np.ndarray, truth: Sequence[Any]) -> float:
    """True fidelity: the share of rows where the rebuilt model agrees with the owner's labels."""
    return fidelities(rebuilt, X, truth)[1]
