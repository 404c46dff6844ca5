"""What every ``monitor-eval`` strategy shares: the options, the run's context (the gateway's
address, the owner's client, the held-out rows and their truth, the curves recorded so far)
and the calls that read the monitor through the owner's API."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from analysim.errors import UserError
from mlaas_monitor.datasets import TableOptions
from mlaas_monitor.model import Policy
from mlaas_monitor.monitor.attacks import ApiClient, Oracle, rounding_identity
from mlaas_monitor.monitor.config import METHODS
from mlaas_monitor.monitor.curves import SubjectCurve
from mlaas_monitor.monitor.truth import FidelityTracker

ATTACKERS = ("random", "pathfinding", "colluding", "sybil", "natural", "confidence", "slow")
# adaptive: path-finding that knows the monitor and stays under its threshold over k
# accounts (adaptive.py), once per k in --adaptive-accounts; reported in a table of its own.
# policies: the same tree served under each response policy of RESPONSE_POLICIES (output
# post-processing as a defence), attacked by path-finding and natural sampling.
# natural_sybil: k accounts each sending fewer than first_eval rows of the data (none is ever
# evaluated alone), on a model copy of its own; what they hold pooled offline, against what
# the monitor's pools (auto:young, auto:pool) and the exposure say.
# attribution: an adaptive coalition and a benign population on one model at once, with the
# pool response on; whose accounts the monitor acted on (attribution.py).
EVAL_STRATEGIES = ("benign", *ATTACKERS, "adaptive", "natural_sybil", "policies", "attribution")
RESPONSE_POLICIES = {
    "leaf ids + confidence (2 decimals)": Policy(reveal_leaf=True, price_micros=0),
    "confidence, 2 decimals (BigML)": Policy(price_micros=0),
    "confidence, 1 decimal": Policy(confidence_decimals=1, price_micros=0),
    "label only": Policy(reveal_confidence=False, price_micros=0),
    # Appended, so that the rows above keep their seeds (seed + 10 * index).
    "top-2 confidences (2 decimals)": Policy(top_k=2, price_micros=0),
    "noise on confidences (sd 0.05, 2 decimals)": Policy(confidence_noise=0.05, noise_seed=1, price_micros=0),
}
# How the attackers read leaf identities under a policy (default: the leaf id, else label and
# confidence as revealed). Under noise, read as they are, every answer is a new leaf and
# path-finding never finishes one; the attacker rounds the noise away to one decimal.
POLICY_IDENTITY = {"noise on confidences (sd 0.05, 2 decimals)": rounding_identity(1)}
POLICY_ATTACKERS = ("pathfinding", "natural")
MODEL_ID = "target"
GROUP = "colluders"
PATHFINDING_BUDGET = 20000  # path-finding's query cap (it stops earlier, when its queue is empty)
SLOW_PAUSE_S = 0.001  # seconds the slow attacker waits between requests
ADAPTIVE_SAFETY = 0.1  # an adaptive account retires this far below the threshold
# The attackers that run path-finding (each over its own kind of oracle).
PATHFINDING_BASED = ("pathfinding", "colluding", "sybil", "confidence", "slow")


@dataclass(frozen=True)
class EvalOptions:
    """What one ``monitor-eval`` run does: each field is a flag of the command (same name)."""

    dataset: str  # a built-in name or a CSV / german.data file
    out: Path  # the output directory
    strategies: tuple[str, ...] = EVAL_STRATEGIES  # run in this order, each from EVAL_STRATEGIES
    accounts: int = 3  # colluding accounts K (>= 2)
    max_leaf_nodes: int | None = 26  # the tree's size (None: unbounded)
    max_depth: int | None = None  # the tree's depth (None: unbounded)
    target: str | None = None  # the target column (None: as for 'model train')
    table: TableOptions = field(default_factory=TableOptions)  # how the table is read
    seed: int = 0  # the tree's seed; strategy i starts from seed + 1000 * (i + 1)
    budget: int = 2000  # random and natural; pathfinding runs until its queue is empty
    collude_base: str = "pathfinding"  # what the colluding accounts run together: pathfinding or random
    oracle: str = "leaf"  # leaf: the policy reveals leaf ids; confidence: label + confidence only
    benign_users: int = 50  # the benign population's accounts
    benign_median_queries: int = 40  # per-user volumes: log-normal around this, sigma 1
    margin: float = 0.1  # a warning at threshold t is right when the subject's extent is >= t - margin, in [0, 1)
    reference_queries: int | None = None  # a published path-finding count to compare with
    sybil_queries: int = 100  # per sybil account
    adaptive_accounts: tuple[int, ...] = (1, 4, 16)  # one adaptive run per account count k
    natural_sybil_accounts: int = 100  # accounts of the natural sybil, each first_eval - 1 rows
    # adaptive runs that also know the pool: each probe moved by a hair in a continuous feature
    adaptive_pool_aware: tuple[int, ...] = ()
    adaptive_response: str = "none"  # the pool response (labels only: degrade; refuse) on the adaptive runs' models
    attribution_accounts: int = 16  # the coalition's accounts in the attribution experiment


# The natural sybil's model copy: its pools hold the sybil's rows alone.
NATURAL_SYBIL_MODEL = f"{MODEL_ID}-ns"


@dataclass
class EvalRun:
    """One ``monitor-eval`` run as every strategy sees it: where to send, what to score
    copies on, and what has been recorded so far."""

    url: str  # the gateway's base URL, on loopback
    admin: ApiClient  # the owner's client (admin key): accounts, groups, the monitor's views
    opts: EvalOptions  # the run's options
    held_X: np.ndarray  # (m, d) the held-out rows every copy is scored on
    truth: list[str]  # (m,) the model's labels of held_X
    train_X: np.ndarray  # (n, d) the training rows: what benign users and natural sampling send
    rows: list[tuple[str, str, int, str, float]] = field(default_factory=list)  # curves.csv's rows, in order
    curves: list[SubjectCurve] = field(default_factory=list)  # every subject's curve, in recording order
    on_queries: Callable[[str, int], None] | None = None  # progress: (strategy, queries sent so far)
    _users: int = 0  # accounts opened so far (names the unnamed ones)

    def new_key(self, name: str | None = None) -> str:
        self._users += 1
        name = name or f"acct-{self._users}"
        return str(self.admin.call("POST", "/v1/admin/users", {"name": name})["api_key"])

    def history(self, subject: str, model_id: str = MODEL_ID) -> dict[str, Any]:
        return self.admin.call("GET", f"/v1/admin/monitor/{model_id}/subjects/{subject}")  # type: ignore[no-any-return]

    def add_curve(self, strategy: str, subject: str, hist: dict[str, Any], truth: list[tuple[int, float]],
                  raw: list[tuple[int, float]] | None = None,
                  aligned: list[tuple[int, float]] | None = None) -> SubjectCurve:  # fmt: skip
        pts = [(p["n_queries"], {m: float(p.get(m, 0.0)) for m in METHODS}) for p in hist["history"]]
        c = SubjectCurve(strategy, subject, pts, truth, aligned)
        for n, v in c.aligned or []:
            self.rows.append((strategy, subject, n, "balanced_fidelity_at_status", v))
        for n, v in c.pointwise or []:
            self.rows.append((strategy, subject, n, "balanced_fidelity_at_status_pointwise", v))
        self.curves.append(c)
        for n, st in pts:
            for m, v in st.items():
                self.rows.append((strategy, subject, n, m, v))
        for n, v in c.truth:
            self.rows.append((strategy, subject, n, "balanced_fidelity", v))
        for n, v in raw or []:
            self.rows.append((strategy, subject, n, "true_fidelity", v))
        return c


def settle(admin: ApiClient, names: list[str], sent: int, timeout: float = 120.0, model_id: str = MODEL_ID,
            force: bool = True) -> dict[str, Any]:  # fmt: skip
    """Wait (polling, with a deadline) until the monitor has folded in every query these
    accounts sent, then have it evaluate every subject at the final count (``force``; else
    the view as the monitor's own schedule left it)."""
    deadline = time.monotonic() + timeout
    want = set(names)
    while True:
        view = admin.call("GET", f"/v1/admin/monitor/{model_id}")
        if sum(u["n_queries"] for u in view["users"] if u["subject"] in want) >= sent:
            if not force:
                return view  # type: ignore[no-any-return]
            break
        if time.monotonic() > deadline:
            raise UserError("the monitor did not catch up with the queries sent")
        time.sleep(0.02)
    return admin.call("POST", f"/v1/admin/monitor/{model_id}/evaluate", {})  # type: ignore[no-any-return]


def benign_population(run: EvalRun, rng: np.random.Generator, prefix: str,
                      model_id: str) -> tuple[list[str], np.ndarray, list[Oracle], list[np.ndarray]]:  # fmt: skip
    """``benign_users`` accounts of ``model_id``: (names, per-user volumes, one oracle each,
    the rows each will send). Volumes are log-normal around ``benign_median_queries``; rows
    are distinct per user (with replacement only beyond the training set's size): people
    rarely ask the same question twice."""
    opts = run.opts
    vols, picks = benign_draws(opts, run.train_X, rng)
    names = [f"{prefix}-{i + 1:03d}" for i in range(opts.benign_users)]
    oracles = [Oracle.connect(run.url, [run.new_key(n)], model_id, int(v)) for n, v in zip(names, vols, strict=True)]
    return names, vols, oracles, picks


def benign_draws(opts: EvalOptions, train_X: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, list[np.ndarray]]:
    """The benign population's per-user volumes (log-normal around ``benign_median_queries``,
    sigma 1, within [5, budget]) and the rows each user will send."""
    vols = np.clip(np.round(rng.lognormal(math.log(opts.benign_median_queries), 1.0, opts.benign_users)), 5,
                   opts.budget).astype(int)  # fmt: skip
    return vols, [train_X[draw_rows(rng, train_X.shape[0], int(v))] for v in vols]


def interleaved(rng: np.random.Generator, vols: np.ndarray) -> np.ndarray:
    """The benign users' queries in a random order: per query the index of its user."""
    return rng.permutation(np.repeat(np.arange(vols.shape[0]), vols))


def pool_view(admin: ApiClient, model_id: str = MODEL_ID) -> dict[str, Any]:
    """The model's pooled subjects (pool.py) as they stand: per subject its rows, best_copy
    and whether it was warned; and the model's exposure."""
    view = admin.call("GET", f"/v1/admin/monitor/{model_id}")
    out: dict[str, Any] = {p["subject"]: {"n_queries": p["n_queries"], "best_copy": p["status"]["best_copy"],
                                          "warned": "best_copy" in p["warned"]} for p in view["pools"]}  # fmt: skip
    out["exposure"] = view["exposure"]
    return out


def draw_rows(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """k row indices of n: distinct while k <= n, then each index once more per further pass."""
    return np.concatenate([rng.permutation(n) for _ in range(-(-k // n))])[:k]


def reporting(tracker: FidelityTracker, strategy: str, report: Callable[[str, int], None]) -> Callable[[Oracle], None]:
    """An oracle's request hook that records the truth and reports the queries sent (progress)."""

    def on_request(oracle: Oracle) -> None:
        tracker(oracle)
        report(strategy, oracle.queries)

    return on_request


def chained(first: Callable[[Oracle], None], then: Callable[[Oracle], None]) -> Callable[[Oracle], None]:
    """An oracle's request hook that calls ``first`` and then ``then``."""

    def on_request(oracle: Oracle) -> None:
        first(oracle)
        then(oracle)

    return on_request


def adaptive_model(accounts: int, pool_aware: bool = False) -> str:
    """The model copy an adaptive run over ``accounts`` accounts attacks."""
    return f"{MODEL_ID}-a{accounts}{'p' if pool_aware else ''}"
