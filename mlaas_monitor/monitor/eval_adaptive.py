"""``monitor-eval``'s adaptive attacker: path-finding over k accounts that knows the monitor
(adaptive.py), each run on a model copy of its own, and what it held when first warned."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from mlaas_monitor.monitor.adaptive import AccountOracle, AdaptivePathfinding, Checkpoint
from mlaas_monitor.monitor.attacks import ApiClient, Oracle
from mlaas_monitor.monitor.curves import value_at
from mlaas_monitor.monitor.eval_report import format_adaptive
from mlaas_monitor.monitor.eval_run import (
    ADAPTIVE_SAFETY,
    PATHFINDING_BUDGET,
    EvalRun,
    adaptive_model,
    chained,
    pool_view,
    reporting,
    settle,
)
from mlaas_monitor.monitor.infogain import extent
from mlaas_monitor.monitor.pool import POOL
from mlaas_monitor.monitor.truth import FidelityTracker


def run_adaptive_all(run: EvalRun, seed: int, k: int) -> dict[str, Any]:
    """One adaptive run per k of --adaptive-accounts, then per k of --adaptive-pool-aware."""
    rows = [run_adaptive(run, accounts, seed + accounts, k) for accounts in run.opts.adaptive_accounts]
    rows += [run_adaptive(run, accounts, seed + accounts, k, pool_aware=True) for accounts in run.opts.adaptive_pool_aware]
    return {"accounts": sum(r["accounts"] for r in rows), "queries_used": sum(r["queries_used"] for r in rows),
            "runs": rows, "table": format_adaptive(rows, ADAPTIVE_SAFETY)}  # fmt: skip


class CoalitionWatch:
    """What the monitor says about one coalition's accounts, as the coalition itself may look
    it up (it knows the monitor): its accounts, the groups holding any of them, and the pool."""

    def __init__(self, admin: ApiClient, model_id: str, names: list[str], config: dict[str, Any],
                 oracle: AccountOracle) -> None:  # fmt: skip
        self.admin = admin  # the owner's client, which reads the monitor's view
        self.model_id = model_id  # the model copy the coalition attacks
        self.names = names  # the coalition's account names, in the oracle's account order
        self.config = config  # the model's monitor config (as the admin API renders it)
        self.method = config["default_method"]  # the status the coalition stays under
        self.oracle = oracle  # the coalition's oracle: rows sent per account

    def subjects(self) -> list[dict[str, Any]]:
        """The coalition's accounts, the groups with a member of it, and auto:pool."""
        mine = set(self.names)
        view = self.admin.call("GET", f"/v1/admin/monitor/{self.model_id}")
        return [u for u in view["users"] if u["subject"] in mine] + [
            g for g in view["groups"] if mine.intersection(g.get("members", []))] + [
            p for p in view["pools"] if p["subject"] == POOL]  # fmt: skip

    def intent(self, status: dict[str, float]) -> bool:
        """An intent alarm on this status (PRADA's or the out-of-distribution share's)."""
        c = self.config
        return status.get("prada", 0.0) >= 1.0 - c["prada_delta"] or status.get("ood", 0.0) >= c["ood_alarm"]

    def caught_up(self) -> list[dict[str, Any]]:
        """The subjects, once the monitor has folded every row the coalition sent (or after a
        minute: what it says by then)."""
        want = {n: self.oracle.sent[i] for i, n in enumerate(self.names)}
        deadline = time.monotonic() + 60
        while True:
            subs = self.subjects()
            got = {u["subject"]: u["n_queries"] for u in subs}
            if all(got.get(n, 0) >= c for n, c in want.items()) or time.monotonic() > deadline:
                return subs
            time.sleep(0.01)

    def look(self, account: int) -> Checkpoint:
        """What the monitor says once it has folded every row this account sent."""
        subs = self.caught_up()
        name = self.names[account]
        own = [x for x in subs if x["subject"] == name or name in x.get("members", [])]
        accts = [x for x in subs if x["subject"] != POOL]
        enf = self.config["enforcement"]
        enforced = any(x["status"][enf["method"]] >= enf["threshold"] and (not enf["intent"] or self.intent(x["status"]))
                       for x in accts)  # fmt: skip
        return Checkpoint(self.oracle.queries, max((x["status"][self.method] for x in own), default=0.0),
                          any(x.get("warned") for x in accts), enforced,
                          any(x["subject"] == POOL and self.method in x.get("warned", []) for x in subs))  # fmt: skip

    def first_warnings(self) -> tuple[int | None, int | None]:
        """When the first warning about the coalition came (one of its accounts or groups;
        the pool): the seq each warning names, as the attacker's row count then (not the next
        look, which comes once per leaf explored)."""
        found = [w for w in self.admin.call("GET", f"/v1/admin/warnings?model={self.model_id}")["warnings"]
                 if w["method"] == self.method]  # fmt: skip
        mine = set(self.names)
        groups = {g["subject"] for g in self.subjects() if g.get("members")}

        def at(ws: list[dict[str, Any]]) -> int | None:
            return min((self.oracle.rows_by(w["seq"]) for w in ws), default=None)

        return (at([w for w in found if w["subject"] in mine or w["subject"] in groups]),
                at([w for w in found if w["subject"] == POOL]))  # fmt: skip


def run_adaptive(run: EvalRun, accounts: int, seed: int, k: int, pool_aware: bool = False, model_id: str | None = None,
                 prefix: str = "adaptive", between: Callable[[Oracle], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """Path-finding over ``accounts`` accounts that knows the monitor (adaptive.py), on a
    copy of the model of its own (so that the model's pool holds its rows alone; or
    ``model_id``). The fidelity it holds when it is first warned (one of its accounts or
    groups; the pool), when the enforcement rule would first act on it, and at the end: how
    much can be stolen unseen. ``between``: called after each of its requests (other
    traffic sent meanwhile: attribution.py)."""
    admin, opts = run.admin, run.opts
    model_id = model_id or adaptive_model(accounts, pool_aware)
    if opts.adaptive_response != "none":
        admin.call("PUT", f"/v1/admin/monitor/{model_id}/config", {"pool_response": {"action": opts.adaptive_response}})
    config = admin.call("GET", f"/v1/admin/monitor/{model_id}/config")
    threshold = config["thresholds"][config["default_method"]]
    names = [f"{prefix}{accounts}{'p' if pool_aware else ''}-{i + 1}" for i in range(accounts)]
    oracle = _coalition_oracle(run, names, model_id)
    tracker = FidelityTracker(run.held_X, run.truth)
    oracle.on_request = tracker if run.on_queries is None else reporting(tracker, f"{prefix} k={accounts}", run.on_queries)
    if between is not None:
        oracle.on_request = chained(oracle.on_request, between)
    watch = CoalitionWatch(admin, model_id, names, config, oracle)
    pf = AdaptivePathfinding(oracle, seed, threshold, ADAPTIVE_SAFETY, watch.look, pool_aware=pool_aware)
    tracker.box = pf.rebuild
    rebuilt = pf.run()
    tracker.finish(oracle, rebuilt)
    settle(admin, names, oracle.queries, model_id=model_id)
    said = _what_the_monitor_said(watch, [*pf.result.checkpoints, watch.look(0)], _extent_at(tracker, k))
    oracle.close()
    pools = pool_view(admin, model_id)
    acted = {a["user"] for a in admin.call("GET", f"/v1/admin/monitor/{model_id}/actions")["actions"] if a["action"] != "none"}
    return {
        "accounts": accounts, "pool_aware": pool_aware, "queries_used": oracle.queries, "leaves_found": len(rebuilt.leaves),
        "accounts_retired": len(pf.result.retired),
        "groups": said["groups"], "max_subject_status": said["max_subject_status"],
        "warned_at": said["warned_at"], "extent_at_warning": said["extent_at_warning"],
        "enforced_at": said["enforced_at"], "extent_at_enforcement": said["extent_at_enforcement"],
        "final_extent": extent(tracker.curve[-1][1], k), "final_balanced_fidelity": tracker.curve[-1][1],
        "method": watch.method, "threshold": threshold,
        "pool_warned_at": said["pool_warned_at"], "extent_at_pool_warning": said["extent_at_pool_warning"],
        "first_coalition_warning_extent": said["first_coalition_warning_extent"],
        "pools": pools, "response": config["pool_response"]["action"], "accounts_acted_on": len(acted),
        "accounts_acted_on_attacker": len(acted & set(names)), "account_names": names,
    }  # fmt: skip


def _what_the_monitor_said(watch: CoalitionWatch, checkpoints: list[Checkpoint],
                           ext: Callable[[int | None], float | None]) -> dict[str, Any]:  # fmt: skip
    """After the attack: the groups formed, the highest status, and when (and at what extent
    of the attacker's copy) the coalition, the pool and the enforcement rule first caught it."""
    warned_at, pool_at = watch.first_warnings()
    enforced_at = next((c.queries for c in checkpoints if c.enforced), None)
    subs = [x for x in watch.subjects() if x["subject"] != POOL]
    first_coalition = [x for x in (ext(warned_at), ext(pool_at)) if x is not None]
    return {"groups": sorted(g["subject"] for g in subs if g.get("members")),
            "max_subject_status": max((x["status"][watch.method] for x in subs), default=0.0),
            "warned_at": warned_at, "extent_at_warning": ext(warned_at),
            "enforced_at": enforced_at, "extent_at_enforcement": ext(enforced_at),
            "pool_warned_at": pool_at, "extent_at_pool_warning": ext(pool_at),
            "first_coalition_warning_extent": min(first_coalition, default=None)}  # fmt: skip


def _coalition_oracle(run: EvalRun, names: list[str], model_id: str) -> AccountOracle:
    """An account per name, and one oracle over them all (the first account reads the domain)."""
    keys = [run.new_key(n) for n in names]
    first = Oracle.connect(run.url, keys[:1], model_id, PATHFINDING_BUDGET)
    oracle = AccountOracle([ApiClient(run.url, key) for key in keys], model_id, first.domain, PATHFINDING_BUDGET)
    first.close()
    return oracle


def _extent_at(tracker: FidelityTracker, k: int) -> Callable[[int | None], float | None]:
    """The extent the attacker held after q queries (a constant copy's before its first
    point; None for no q: the event never came)."""
    return lambda q: None if q is None else extent(value_at(tracker.curve, q) or 1.0 / k, k)
