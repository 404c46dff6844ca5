"""``analysim attack``: run an extraction strategy against a gateway as a real HTTP client."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from analysim.argtypes import positive_int
from analysim.dataset_args import add_dataset_arguments, table_options
from analysim.errors import UserError

if TYPE_CHECKING:  # the attack suite is imported when the command runs, not when the CLI starts
    import numpy as np

    from mlaas_monitor.monitor.attacks import Domain, Oracle

STRATEGY_CHOICES = ("benign", "random", "pathfinding", "colluding", "sybil", "natural", "confidence", "slow")



def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "attack",
        help="run a model-extraction attack against a gateway (benign, random, pathfinding, colluding, and the "
        "adaptive sybil, natural, confidence, slow)",
        description="Each row sent is one query. With --accounts K the queries are split round-robin, request by "
        "request, across the first K keys (a colluding attack); --strategy colluding is --collude-base over K accounts. "
        "sybil: path-finding where each key sends at most --per-account rows and is then dropped for the next "
        "(no declared group); natural: rows of --dataset drawn at random, a tree fitted on the answers; confidence: "
        "path-finding reading leaves from label + confidence only; slow: path-finding one row per request, "
        "--pause seconds apart.",
    )
    p.add_argument("--gateway", required=True, help="gateway URL, e.g. http://127.0.0.1:8080")
    p.add_argument("--key", action="append", default=[], help="API key (repeat for several accounts)")
    p.add_argument("--keys-file", help="file with one API key per line (added to --key)")
    p.add_argument("--model", required=True, help="model id")
    p.add_argument("--strategy", required=True, choices=STRATEGY_CHOICES)
    p.add_argument("--budget", type=positive_int, help="maximum queries (default: benign each dataset row once, "
                                                    "random 1000, pathfinding until no leaf is left)")  # fmt: skip
    p.add_argument("--accounts", type=positive_int, default=1, help="split the queries across K accounts (default 1)")
    p.add_argument("--collude-base", choices=("benign", "random", "pathfinding"), default="pathfinding",
                   help="the strategy colluders split (default pathfinding)")  # fmt: skip
    p.add_argument("--per-account", type=positive_int, default=100, help="sybil: rows per key (default 100)")
    p.add_argument("--pause", type=float, default=1.0, help="slow: seconds between requests (default 1)")
    p.add_argument("--dataset", help="benign, natural: rows to draw queries from (built-in name or file; the target column is dropped)")
    p.add_argument("--target", help="benign: the dataset's target column (default as for 'model train')")
    add_dataset_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the rebuilt model here (JSON)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mlaas_monitor.monitor.attacks import BoxRebuild, run_strategy

    keys = _keys(args)
    strategy = args.collude_base if args.strategy == "colluding" else args.strategy
    if args.strategy == "colluding" and args.accounts < 2:
        raise UserError("--accounts: a colluding attack needs at least 2 accounts")
    if not 0 <= args.pause <= 3600:
        raise UserError("--pause: expected seconds from 0 to 3600")
    oracle = _oracle(args, keys, strategy)
    rows = _dataset_rows(args, oracle.domain, strategy) if strategy in ("benign", "natural") else None
    try:
        rebuilt = run_strategy(strategy, oracle, args.seed, rows)
    finally:
        oracle.close()
    accounts = len(oracle.clients) if strategy == "sybil" else args.accounts
    result: dict[str, object] = {"strategy": args.strategy, "base": strategy, "accounts": accounts,
                                 "model": args.model, "queries_used": oracle.queries}  # fmt: skip
    if isinstance(rebuilt, BoxRebuild):
        result["leaves_found"] = len(rebuilt.leaves)
    if args.out:
        Path(args.out).write_text(json.dumps(_rebuilt_json(rebuilt, oracle.domain.names)) + "\n")
        result["rebuilt_model"] = args.out
    print(json.dumps(result))
    return 0


def _keys(args: argparse.Namespace) -> list[str]:
    """The API keys given (--key, then --keys-file's lines), at least --accounts of them."""
    keys = list(args.key)
    if args.keys_file:
        try:
            keys += [ln.strip() for ln in Path(args.keys_file).read_text().splitlines() if ln.strip()]
        except OSError as e:
            raise UserError(f"--keys-file: cannot read {args.keys_file}: {e}") from e
    if not keys:
        raise UserError("--key: at least one API key is needed")
    if len(keys) < args.accounts:
        raise UserError(f"--accounts {args.accounts}: only {len(keys)} key(s) given")
    return keys


def _oracle(args: argparse.Namespace, keys: list[str], strategy: str) -> Oracle:
    """The oracle the strategy asks through: round-robin over --accounts keys; the sybil's
    takes the next spare key when an account has sent --per-account rows; the slow one pauses."""
    from mlaas_monitor.monitor.attacks import Oracle, PacedOracle, SybilOracle

    oracle = Oracle.connect(args.gateway, keys[: args.accounts], args.model, args.budget)
    if strategy == "sybil":
        spare = iter(keys[1:])
        return SybilOracle(oracle.clients[0], args.model, oracle.domain, args.budget, args.per_account,
                           lambda: next(spare, None), args.gateway)  # fmt: skip
    if strategy == "slow":
        return PacedOracle(oracle.clients, args.model, oracle.domain, args.budget, args.pause)
    return oracle


def _dataset_rows(args: argparse.Namespace, domain: Domain, strategy: str) -> np.ndarray:
    """The rows the benign and natural strategies draw their queries from, encoded for the model."""
    from mlaas_monitor.datasets import load_dataset

    if not args.dataset:
        raise UserError(f"--dataset: the {strategy} strategy draws its queries from a dataset")
    ds = load_dataset(args.dataset, args.target, table_options(args))
    rows = domain.encode(ds.data)  # type: ignore[arg-type]
    if rows.shape[0] == 0:
        raise UserError(f"--dataset: no row of {args.dataset} fits model {args.model!r}'s schema")
    return rows


def _rebuilt_json(rebuilt: object, names: tuple[str, ...]) -> dict[str, object]:
    from mlaas_monitor.monitor.attacks import BoxRebuild, TreeRebuild

    if isinstance(rebuilt, BoxRebuild):
        def bound(v: float) -> float | None:
            return None if v in (float("inf"), float("-inf")) else v

        return {"kind": "leaf_boxes", "features": list(names), "leaves": [
            {"label": b.label, "lo": [bound(v) for v in b.lo.tolist()], "hi": [bound(v) for v in b.hi.tolist()],
             "categories": [sorted(s) for s in b.allowed]} for b in rebuilt.leaves]}  # fmt: skip
    assert isinstance(rebuilt, TreeRebuild)
    if rebuilt.tree is None:
        return {"kind": "tree", "features": list(names), "tree": None}
    # The tree's class indices name the labels in this order.
    return {"kind": "tree", "features": list(names), "classes": rebuilt.classes, "tree": rebuilt.tree.to_dict()}
