"""``monitor-eval``'s attribution experiment: whom the pool response acts on under mixed traffic.

An adaptive coalition (path-finding over k accounts that knows the monitor, adaptive.py)
and a benign population send to the same model at the same time: after each of the
coalition's requests, benign rows up to as many as the coalition has sent, the rest once it
is done. Benign users arrive spread over the whole stream (each one's first row at a
uniform point of it), so that some sign up while the pool's warning stands. Once the
coalition is done, it moves to a fresh account while the warning stands (its *late*
account: path-finding from a new random point, each request of probes after natural rows,
LATE_DILUTION per probe, so that its pooled share stays under the extracting rule's),
what the new-account rule is for. The model's pool response degrades (labels only) while
the pool's warning stands.

Counted: every account the monitor's action log names with an action other than none,
split into the coalition's and the benign population's, with the reason of each benign
account's first action; and, from the other side of the wire, the benign accounts that were
told labels only (an answer without confidence or leaf id), which the log must include;
the late account's probes answered in full before its first labels-only answer, and the
reason it was first acted on.
The goal: at least 90 % of the degraded accounts the attacker's, at most 2 % of
the benign accounts degraded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mlaas_monitor.monitor.adaptive import AccountOracle
from mlaas_monitor.monitor.attacks import ApiClient, Domain, Oracle, Pathfinding
from mlaas_monitor.monitor.core import POOL_REASONS
from mlaas_monitor.monitor.eval_adaptive import run_adaptive
from mlaas_monitor.monitor.eval_report import cell
from mlaas_monitor.monitor.eval_run import EvalRun, benign_population, draw_rows, settle

# Per setting of the pool response's new-account rule, the model copy it runs on.
ATTRIBUTION_MODELS = {True: "target-attr", False: "target-attr-no-new"}
GOAL_ATTACKER_SHARE = 0.9  # of the accounts acted on, at least this share the attacker's
GOAL_BENIGN_SHARE = 0.02  # of the benign accounts, at most this share acted on
LATE_PROBES = 1000  # path-finding rows the coalition's late account sends at most: enough to outlast the monitor's lag
# Natural rows (of the training set) the late account sends before each probe: its pooled
# share, 1 / (1 + LATE_DILUTION), stays under the extracting rule's (pool.py EXTRACTING_SHARE).
LATE_DILUTION = 5


@dataclass
class MixedTraffic:
    """The benign population's rows in their sending order, sent as the coalition goes."""

    oracles: list[Oracle]  # one per benign account
    picks: list[np.ndarray]  # per account the rows it sends, in order
    order: list[int]  # the account of each benign row, in sending order
    sent: int = 0  # benign rows sent so far
    pos: list[int] = field(default_factory=list)  # per account, rows sent so far

    def __post_init__(self) -> None:
        self.pos = [0] * len(self.oracles)

    def keep_up(self, attacker: Oracle) -> None:
        """Send benign rows until as many as the coalition's have gone."""
        self.send(min(len(self.order), attacker.queries))

    def send(self, upto: int) -> None:
        while self.sent < upto:
            u = self.order[self.sent]
            self.oracles[u].ask(self.picks[u][self.pos[u] : self.pos[u] + 1])
            self.pos[u] += 1
            self.sent += 1


def arrival_order(rng: np.random.Generator, vols: np.ndarray) -> list[int]:
    """The account of each row in sending order: each account starts at a uniform point of
    the stream and spreads its rows uniformly over the rest of it."""
    start = rng.uniform(0.0, 1.0, vols.size)
    owner = np.repeat(np.arange(vols.size), vols)
    at = start[owner] + (1.0 - start[owner]) * rng.uniform(0.0, 1.0, owner.size)
    at[np.r_[0, np.cumsum(vols)[:-1]]] = start  # each account's first row at its arrival
    return owner[np.argsort(at, kind="stable")].tolist()


def run_attribution(run: EvalRun, seed: int, k: int) -> dict[str, Any]:
    """The experiment twice, with the pool response's new-account rule and without it (same
    seed: the same benign rows and arrivals, the same coalition), each on a model copy of
    its own (ATTRIBUTION_MODELS): the rows of the Attribution table."""
    rows = [_mixed(run, seed, k, new_accounts, model_id) for new_accounts, model_id in ATTRIBUTION_MODELS.items()]
    return {"accounts": sum(r["attacker_accounts"] + r["benign_accounts"] for r in rows),
            "queries_used": sum(r["attacker_queries"] + r["late_queries"] + r["benign_rows"] for r in rows),
            "runs": rows, "table": format_attribution(rows)}  # fmt: skip


def _mixed(run: EvalRun, seed: int, k: int, new_accounts: bool, model_id: str) -> dict[str, Any]:
    opts, admin = run.opts, run.admin
    response = "degrade"  # a benign account told labels only still gets answers (refused, it would stop)
    admin.call("PUT", f"/v1/admin/monitor/{model_id}/config",
               {"pool_response": {"action": response, "new_accounts": new_accounts}})  # fmt: skip
    rng = np.random.default_rng(seed)
    tag = "" if new_accounts else "n"  # account names are global: one set per run
    names, vols, oracles, picks = benign_population(run, rng, f"mixed{tag}", model_id)
    traffic = MixedTraffic(oracles, picks, arrival_order(rng, vols))
    prefix = f"coalition{tag}"
    attack = run_adaptive(run, opts.attribution_accounts, seed, k, model_id=model_id, prefix=prefix,
                          between=traffic.keep_up)  # fmt: skip
    late_name = f"{prefix}{opts.attribution_accounts}-late"
    late = _late_account(run, model_id, late_name, seed)
    traffic.send(len(traffic.order))
    settle(admin, names, int(vols.sum()), model_id=model_id)
    told_labels_only = {n for n, o in zip(names, oracles, strict=True) if any(i is None for i in o.log_ident)}
    for o in oracles:
        o.close()
    actions = admin.call("GET", f"/v1/admin/monitor/{model_id}/actions")["actions"]
    row = count(actions, [*attack["account_names"], late_name], names, told_labels_only)
    first = next((a for a in actions if a["user"] == late_name and a["action"] != "none"), None)
    rows_by = late.pop("rows_by")
    late["late_acted_on_as"] = None if first is None else first["reason"]
    late["late_acted_on_after"] = None if first is None else rows_by(first["seq"])  # its rows logged by the decision
    row.update({"model": model_id, "accounts": opts.attribution_accounts, "benign_rows": int(vols.sum()),
                "response": response, "new_accounts": new_accounts, "attacker_queries": attack["queries_used"],
                "pool_warned_at": attack["pool_warned_at"], "extent_at_pool_warning": attack["extent_at_pool_warning"],
                "final_extent": attack["final_extent"], **late})  # fmt: skip
    return row


class DilutedOracle(AccountOracle):
    """One account whose probes each go after natural rows (LATE_DILUTION per probe); only
    the probes are in the oracle's log and budget, every request in ``answered``."""

    def __init__(self, client: ApiClient, model_id: str, domain: Domain, rows: np.ndarray, rng: np.random.Generator,
                 budget: int) -> None:  # fmt: skip
        super().__init__([client], model_id, domain, budget)
        self.rows = rows  # (n, d) the rows the natural ones are drawn from (the training set)
        self.rng = rng  # which rows are drawn

    def _send(self, X: np.ndarray) -> list[dict[str, Any]]:
        for x in self.rows[draw_rows(self.rng, self.rows.shape[0], LATE_DILUTION * X.shape[0])]:
            super()._send(x[None, :])
        return super()._send(X)


def _late_account(run: EvalRun, model_id: str, name: str, seed: int) -> dict[str, Any]:
    """The coalition moves to an account opened now: path-finding from a new random point,
    LATE_PROBES rows at most, diluted (DilutedOracle). Whether the pool's warning stood when
    it signed up, its rows, the probes answered in full (leaf id or confidence) before its
    first labels-only answer, and (``rows_by``) how many rows it had sent by a given log row."""
    standing = bool(run.admin.call("GET", f"/v1/admin/monitor/{model_id}")["pool_standing"])
    first = Oracle.connect(run.url, [run.new_key(name)], model_id, None)
    probes = DilutedOracle(first.clients[0], model_id, first.domain, run.train_X, np.random.default_rng(seed), LATE_PROBES)
    Pathfinding(probes, seed + 1).run()
    probes.close()
    full = next((i for i, ident in enumerate(probes.log_ident) if ident is None), len(probes.log_ident))
    return {"late_during_warning": standing, "late_queries": sum(probes.sent), "late_probes": probes.queries,
            "late_probes_in_full": full, "rows_by": probes.rows_by}  # fmt: skip


def count(actions: list[dict[str, Any]], attacker: list[str], benign: list[str], told_labels_only: set[str]) -> dict[str, Any]:
    """The accounts acted on (an action other than none in the log), split by whose they are;
    per benign account acted on, the reason of its first action."""
    acted: dict[str, str] = {}
    for a in actions:
        if a["action"] != "none":
            acted.setdefault(a["user"], a["reason"])
    mine, theirs = set(attacker), set(benign)
    unknown = set(acted) - mine - theirs
    if unknown:
        raise ValueError(f"actions on accounts of neither side: {sorted(unknown)}")
    if not told_labels_only <= set(acted):
        raise ValueError(f"benign accounts told labels only without a logged action: {sorted(told_labels_only - set(acted))}")
    by_attacker = sorted(set(acted) & mine)
    by_benign = sorted(set(acted) & theirs)
    reasons: dict[str, int] = {}
    for u in by_benign:
        cause = rule_of(acted[u])
        reasons[cause] = reasons.get(cause, 0) + 1
    n = len(by_attacker) + len(by_benign)
    return {"attacker_accounts": len(mine), "benign_accounts": len(theirs),
            "acted_on_attacker": len(by_attacker), "acted_on_benign": len(by_benign),
            "benign_told_labels_only": len(told_labels_only),
            "attacker_share": None if n == 0 else len(by_attacker) / n,
            "benign_share": len(by_benign) / max(1, len(theirs)),
            "benign_reasons": reasons, "benign_acted_on": by_benign}  # fmt: skip


def rule_of(reason: str) -> str:
    """Which rule an action's reason names: one of POOL_REASONS (the pool response's), else the
    per-subject enforcement rule."""
    return next((c for c in POOL_REASONS if reason.startswith(c)), "per-subject rule")


def goals_met(row: dict[str, Any]) -> dict[str, bool]:
    share = row["attacker_share"]
    return {"attacker_share_ok": share is not None and share >= GOAL_ATTACKER_SHARE,
            "benign_share_ok": row["benign_share"] <= GOAL_BENIGN_SHARE}  # fmt: skip


def format_attribution(rows: list[dict[str, Any]]) -> list[str]:
    out = [f"Attribution (an adaptive coalition and a benign population on one model at once, pool response "
           f"{rows[0]['response']}): goals >= {GOAL_ATTACKER_SHARE:.0%} of the accounts acted on the attacker's, "
           f"<= {GOAL_BENIGN_SHARE:.0%} of the benign accounts acted on", "",
           "| coalition k | new-account rule | its queries | benign accounts (rows) | pool warned at | extent then | extent at the end | "
           "accounts acted on: attacker's / benign | attacker share | benign share | benign told labels only | "
           "benign by reason | late account: probes answered in full (of sent; rows in all) | late account acted on as | "
           "after its rows |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---:|"]  # fmt: skip
    for r in rows:
        g = goals_met(r)
        reasons = ", ".join(f"{c} {n}" for c, n in sorted(r["benign_reasons"].items())) or "–"
        out.append(f"| {r['accounts']} | {'on' if r['new_accounts'] else 'off'} | {r['attacker_queries']} | {r['benign_accounts']} ({r['benign_rows']}) | "
                   f"{cell(r['pool_warned_at'])} | {cell(r['extent_at_pool_warning'])} | {cell(r['final_extent'])} | "
                   f"{r['acted_on_attacker']} / {r['acted_on_benign']} | {cell(r['attacker_share'])}"
                   f"{'' if g['attacker_share_ok'] else ' (**miss**)'} | {cell(r['benign_share'])}"
                   f"{'' if g['benign_share_ok'] else ' (**miss**)'} | {r['benign_told_labels_only']} | {reasons} | "
                   f"{r['late_probes_in_full']} ({r['late_probes']}; {r['late_queries']})"
                   f"{'' if r['late_during_warning'] else ', no warning standing'} | "
                   f"{'–' if r['late_acted_on_as'] is None else rule_of(r['late_acted_on_as'])} | "
                   f"{cell(r['late_acted_on_after'])} |")  # fmt: skip
    return out
