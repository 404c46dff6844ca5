"""``monitor-eval``'s strategies other than the adaptive attacker: the benign population, each
attacker of the suite, the natural sybil and the response policies, each driven through the
gateway and read back from the monitor."""

from __future__ import annotations

from typing import Any

import numpy as np

from analysim.errors import UserError
from mlaas_monitor.monitor.attacks import (
    ApiClient,
    BoxRebuild,
    Oracle,
    PacedOracle,
    Pathfinding,
    SybilOracle,
    TreeRebuild,
    box_copies,
    confidence_identity,
    run_natural,
    run_random,
)
from mlaas_monitor.monitor.config import METHODS
from mlaas_monitor.monitor.curves import SubjectCurve, analyse_curve
from mlaas_monitor.monitor.eval_report import format_policies
from mlaas_monitor.monitor.eval_run import (
    GROUP,
    MODEL_ID,
    NATURAL_SYBIL_MODEL,
    PATHFINDING_BASED,
    PATHFINDING_BUDGET,
    POLICY_ATTACKERS,
    POLICY_IDENTITY,
    RESPONSE_POLICIES,
    SLOW_PAUSE_S,
    EvalRun,
    benign_population,
    draw_rows,
    interleaved,
    pool_view,
    reporting,
    settle,
)
from mlaas_monitor.monitor.infogain import extent
from mlaas_monitor.monitor.linkage import LINK_PREFIX
from mlaas_monitor.monitor.truth import FidelityTracker, best_copy


def run_benign(run: EvalRun, seed: int) -> dict[str, Any]:
    """A population of users sending rows of the data distribution (the training rows, not
    the held-out S), each its own log-normal volume, interleaved in a random order."""
    rng = np.random.default_rng(seed)
    names, vols, oracles, picks = benign_population(run, rng, "benign", MODEL_ID)
    n_users = len(names)
    order = interleaved(rng, vols)
    pos = np.zeros(n_users, dtype=int)
    for u in order.tolist():
        oracles[u].ask(picks[u][pos[u] : pos[u] + 1])
        pos[u] += 1
    settle(run.admin, names, int(vols.sum()))
    for name, o in zip(names, oracles, strict=True):
        hist = run.history(name)
        X = np.concatenate(o.log_X)
        truth = []
        for p in hist["history"]:
            n = p["n_queries"]
            copies = [TreeRebuild(X[:n], o.log_labels[:n]), *box_copies(o.domain, X[:n], o.log_labels[:n], o.log_ident[:n])]
            truth.append((n, best_copy(copies, run.held_X, run.truth)[0]))
        run.add_curve("benign", name, hist, truth, aligned=truth)
        o.close()
    return {"accounts": n_users, "queries_used": int(vols.sum()),
            "volumes": {"median": float(np.median(vols)), "max": int(vols.max()), "min": int(vols.min())},
            "pools": pool_view(run.admin)}  # fmt: skip


def run_natural_sybil(run: EvalRun, seed: int, k: int) -> dict[str, Any]:
    """``natural_sybil_accounts`` accounts, each sending first_eval - 1 distinct rows of the
    data (too few for any to be evaluated), on a model copy of their own. The truth is the
    best copy of all their answers pooled offline; beside it what the monitor says: the
    highest account status, auto:young, auto:pool and the model's exposure."""
    opts, admin = run.opts, run.admin
    config = admin.call("GET", f"/v1/admin/monitor/{NATURAL_SYBIL_MODEL}/config")
    per = max(1, config["first_eval"] - 1)
    rng = np.random.default_rng(seed)
    names = [f"nsybil-{i + 1:03d}" for i in range(opts.natural_sybil_accounts)]
    rows = run.train_X[draw_rows(rng, run.train_X.shape[0], per * len(names))]
    X, labels, ident = [], [], []
    domain = None
    for i, name in enumerate(names):
        o = Oracle.connect(run.url, [run.new_key(name)], NATURAL_SYBIL_MODEL, per)
        o.ask(rows[i * per : (i + 1) * per])
        X.append(np.concatenate(o.log_X))
        labels += o.log_labels
        ident += o.log_ident
        domain = o.domain
        o.close()
    sent = per * len(names)
    view = settle(admin, names, sent, model_id=NATURAL_SYBIL_MODEL, force=False)  # the accounts as the schedule left them
    settle(admin, names, sent, model_id=NATURAL_SYBIL_MODEL)  # then the pools at the final count
    allX = np.concatenate(X)
    copies = [TreeRebuild(allX, labels), *box_copies(domain, allX, labels, ident)]
    pooled = extent(best_copy(copies, run.held_X, run.truth)[0], k)
    users = [u for u in view["users"] if u["subject"] in set(names)]
    return {"accounts": len(names), "queries_used": sent, "rows_per_account": per,
            "pooled_extent_offline": pooled,
            "max_account_status": max((u["status"]["best_copy"] for u in users), default=0.0),
            "accounts_evaluated": sum(1 for u in users if u["evaluated_at"]),
            "pools": pool_view(admin, NATURAL_SYBIL_MODEL)}  # fmt: skip


def run_attack(run: EvalRun, strategy: str, seed: int) -> dict[str, Any]:
    """One attacker of the suite, its curve against the monitor's status for its subject (the
    account; the colluders' group; the sybil's automatic link group)."""
    opts, admin = run.opts, run.admin
    base = opts.collude_base if strategy == "colluding" else strategy
    names = [f"colluder-{i + 1}" for i in range(opts.accounts)] if strategy == "colluding" else [strategy]
    oracle = _attack_oracle(run, strategy, base, names)
    tracker = FidelityTracker(run.held_X, run.truth)
    oracle.on_request = tracker if run.on_queries is None else reporting(tracker, strategy, run.on_queries)
    rebuilt = _extract(run, strategy, base, oracle, tracker, seed)
    tracker.finish(oracle, rebuilt)
    if strategy == "sybil":  # every account it opened
        names = [strategy] + [f"sybil-{i}" for i in range(2, len(oracle.clients) + 1)]
    settle(admin, names, oracle.queries)
    res: dict[str, Any] = {"accounts": len(names), "queries_used": oracle.queries,
                           "final_balanced_fidelity": tracker.curve[-1][1], "final_true_fidelity": tracker.raw[-1][1]}  # fmt: skip
    if isinstance(rebuilt, BoxRebuild):
        res["leaves_found"] = len(rebuilt.leaves)
    if strategy == "colluding":
        subject = f"group:{GROUP}"
    elif strategy == "sybil":
        subject = _sybil_facts(run, names, res)
    else:
        subject = names[0]
    hist = run.history(subject)
    res["subject"] = subject
    aligned = tracker.truth_at(oracle, [p["n_queries"] for p in hist["history"]])
    run.add_curve(strategy, subject, hist, tracker.curve, tracker.raw, aligned)
    if strategy == "colluding":
        res["member_status"] = hist.get("member_status", {})
        res["group_status"] = hist["status"]
    oracle.close()
    return res


def _attack_oracle(run: EvalRun, strategy: str, base: str, names: list[str]) -> Oracle:
    """The attacker's accounts (the colluders declared as a group) and the oracle it asks
    through: the sybil opens accounts as it goes, the slow attacker paces its requests."""
    keys = [run.new_key(n) for n in names]
    if strategy == "colluding":
        run.admin.call("POST", "/v1/admin/groups", {"name": GROUP, "members": names})
    budget = run.opts.budget if base in ("random", "natural") else PATHFINDING_BUDGET
    first = Oracle.connect(run.url, keys, MODEL_ID, budget)
    if strategy == "sybil":
        sybil: SybilOracle | None = None

        def open_account() -> str:
            assert sybil is not None
            return run.new_key(f"sybil-{len(sybil.clients) + 1}")

        sybil = SybilOracle(first.clients[0], MODEL_ID, first.domain, budget, run.opts.sybil_queries, open_account, run.url)
        return sybil
    if strategy == "slow":
        return PacedOracle(first.clients, MODEL_ID, first.domain, budget, SLOW_PAUSE_S)
    return first


def _extract(run: EvalRun, strategy: str, base: str, oracle: Oracle, tracker: FidelityTracker, seed: int) -> Any:
    """Run the attack to its end; what it rebuilt (path-finding's boxes, or a fitted tree)."""
    if base in PATHFINDING_BASED:
        ident = confidence_identity if strategy == "confidence" else None
        pf = Pathfinding(oracle, seed, identity=ident) if ident else Pathfinding(oracle, seed)
        tracker.box = pf.rebuild
        return pf.run()
    if base == "random":
        return run_random(oracle, seed)
    if base == "natural":
        return run_natural(oracle, run.train_X, seed)
    raise UserError(f"--collude-base: unknown strategy {base!r}")


def _sybil_facts(run: EvalRun, names: list[str], res: dict[str, Any]) -> str:
    """The sybil's subject (the automatic link group holding most of its accounts, else its
    first account), and into ``res`` what each account alone looked like to the monitor."""
    admin = run.admin
    subject = linked_subject(admin, names) or names[0]
    res["grouped_as"] = subject if subject.startswith(LINK_PREFIX) else None
    res["accounts_grouped"] = len(run.history(subject).get("members", [])) if res["grouped_as"] else 0
    config = admin.call("GET", f"/v1/admin/monitor/{MODEL_ID}/config")
    member = [run.history(n)["status"] for n in names]
    res["max_account_status"] = max(x[config["default_method"]] for x in member)
    # Per warning method: the highest status any single account reached, and whether
    # every account stayed under that method's threshold (what the sybil is after).
    res["accounts_under_threshold"] = {m: max(x[m] for x in member) < t for m, t in config["thresholds"].items()}
    res["max_account_status_by_method"] = {m: max(x[m] for x in member) for m in config["thresholds"]}
    res["per_account_queries"] = run.opts.sybil_queries
    return subject


def run_policies(run: EvalRun, seed: int, k: int, thresholds: dict[str, float], delta: float) -> dict[str, Any]:
    """Each response policy as a defence: what path-finding and natural sampling extract
    from the same tree served under it, and what the monitor's status says about them."""
    rows = []
    method = run.admin.call("GET", f"/v1/admin/monitor/{MODEL_ID}/config")["default_method"]
    for i, (label, _) in enumerate(RESPONSE_POLICIES.items()):
        model_id = f"{MODEL_ID}-p{i}"
        for j, strategy in enumerate(POLICY_ATTACKERS):
            name = f"policy{i}-{strategy}"
            budget = run.opts.budget if strategy == "natural" else PATHFINDING_BUDGET
            oracle = Oracle.connect(run.url, [run.new_key(name)], model_id, budget)
            oracle.identity = POLICY_IDENTITY.get(label, oracle.identity)
            tracker = FidelityTracker(run.held_X, run.truth)
            oracle.on_request = tracker
            if strategy == "pathfinding":
                pf = Pathfinding(oracle, seed + 10 * i + j, identity=oracle.identity)
                tracker.box = pf.rebuild
                rebuilt: Any = pf.run()
            else:
                rebuilt = run_natural(oracle, run.train_X, seed + 10 * i + j)
            tracker.finish(oracle, rebuilt)
            settle(run.admin, [name], oracle.queries, model_id=model_id)
            hist = run.history(name, model_id)
            pts = [(p["n_queries"], {m: float(p.get(m, 0.0)) for m in METHODS}) for p in hist["history"]]
            c = SubjectCurve(f"policy:{label}", name, pts, tracker.curve, tracker.truth_at(oracle, [n for n, _ in pts]))
            r = analyse_curve(c, thresholds, run.opts.margin, k, delta)
            m = r["methods"][method]
            rows.append({"policy": label, "strategy": strategy, "queries": oracle.queries,
                         "leaves_found": len(rebuilt.leaves) if isinstance(rebuilt, BoxRebuild) else None,
                         "final_extent": extent(tracker.curve[-1][1], k), "final_status": m["final_status"],
                         "calibration_error": m["calibration_error"], "max_below_truth": m["max_below_truth"],
                         "first_warning": m["first_warning"], "queries_to_bf_090": r["queries_to_bf_090"]})  # fmt: skip
            oracle.close()
    return {"accounts": len(rows), "queries_used": sum(r["queries"] for r in rows), "runs": rows,
            "table": format_policies(rows, method)}  # fmt: skip


def linked_subject(admin: ApiClient, names: list[str]) -> str | None:
    """The automatic link group holding the most of these accounts, if any."""
    groups = admin.call("GET", f"/v1/admin/monitor/{MODEL_ID}")["groups"]
    best = max(((len(set(g.get("members", [])) & set(names)), g["subject"]) for g in groups
                if g["subject"].startswith(LINK_PREFIX)), default=(0, None))  # fmt: skip
    return best[1] if best[0] else None
