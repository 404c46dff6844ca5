"""``analysim monitor-eval``: the extraction monitor against the attack suite, on loopback."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysim.argtypes import positive_int
from analysim.dataset_args import add_dataset_arguments, table_options
from analysim.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "monitor-eval",
        help="train a model, serve it with the extraction monitor, run a benign population and the attackers, "
        "measure each status method against true extraction",
        description="Writes DIR/curves.csv, DIR/summary.json, DIR/table.md and DIR/status_*.png.",
    )
    p.add_argument("--dataset", required=True, help="built-in name (iris, wine, breast_cancer, digits) or a CSV / german.data file")
    p.add_argument("--target", help="target column (default as for 'model train')")
    add_dataset_arguments(p)
    p.add_argument("--strategies", help="comma-separated, from benign, random, pathfinding, colluding, sybil, "
                   "natural, confidence, slow, adaptive, natural_sybil, policies, attribution (default: all)")  # fmt: skip
    p.add_argument("--adaptive-accounts", default="1,4,16",
                   help="comma-separated account counts k for the adaptive attacker (default 1,4,16)")
    p.add_argument("--benign-users", type=positive_int, default=50, help="benign population size (default 50)")
    p.add_argument("--benign-median-queries", type=positive_int, default=40,
                   help="median queries per benign user; volumes are log-normal, sigma 1 (default 40)")  # fmt: skip
    p.add_argument("--accounts", type=positive_int, default=3, help="colluding accounts K (default 3)")
    p.add_argument("--collude-base", choices=("random", "pathfinding"), default="pathfinding")
    p.add_argument("--sybil-queries", type=positive_int, default=100, help="queries per sybil account (default 100)")
    p.add_argument("--adaptive-pool-aware", default="",
                   help="comma-separated k: adaptive runs over k accounts that also know the pool (each probe moved "
                        "by a hair in a continuous feature; default none)")
    p.add_argument("--adaptive-response", choices=("none", "degrade", "refuse"), default="none",
                   help="the pool response (pool_response.action) on the adaptive runs' models (default none)")
    p.add_argument("--attribution-accounts", type=positive_int, default=16,
                   help="attribution: the adaptive coalition's accounts, sending beside --benign-users (default 16)")
    p.add_argument("--natural-sybil-accounts", type=positive_int, default=100,
                   help="natural_sybil: accounts, each sending first_eval - 1 rows of the data (default 100)")
    p.add_argument("--max-leaf-nodes", type=positive_int, default=26, help="tree size (default 26)")
    p.add_argument("--max-depth", type=positive_int)
    p.add_argument("--budget", type=positive_int, default=2000,
                   help="queries for random and natural; cap per benign user (default 2000)")  # fmt: skip
    p.add_argument("--margin", type=float, default=0.1,
                   help="a warning at threshold t is right when the subject's true extent is >= t - margin (default 0.1)")  # fmt: skip
    p.add_argument("--reference-queries", type=positive_int,
                   help="a published path-finding query count to compare with (e.g. 1722 for Tramèr et al.'s German tree)")  # fmt: skip
    p.add_argument("--oracle", choices=("leaf", "confidence"), default="leaf",
                   help="what the policy reveals as leaf identity: leaf ids, or label + confidence (BigML)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar (there is none unless stderr is a terminal)")
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mlaas_monitor.monitor.evaluate import EVAL_STRATEGIES, EvalOptions, format_table, run_eval

    strategies = tuple(s.strip() for s in (args.strategies or ",".join(EVAL_STRATEGIES)).split(",") if s.strip())
    if not strategies:
        raise UserError("--strategies: name at least one strategy")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out} exists and is not a directory")
    adaptive = _account_counts("--adaptive-accounts", args.adaptive_accounts)
    if not adaptive:
        raise UserError("--adaptive-accounts: expected account counts of at least 1")
    pool_aware = _account_counts("--adaptive-pool-aware", args.adaptive_pool_aware)
    opts = EvalOptions(
        dataset=args.dataset, out=out, strategies=strategies, accounts=args.accounts,
        max_leaf_nodes=args.max_leaf_nodes, max_depth=args.max_depth, target=args.target, table=table_options(args),
        seed=args.seed, budget=args.budget, collude_base=args.collude_base, oracle=args.oracle,
        benign_users=args.benign_users, benign_median_queries=args.benign_median_queries, margin=args.margin,
        reference_queries=args.reference_queries, sybil_queries=args.sybil_queries, adaptive_accounts=adaptive,
        natural_sybil_accounts=args.natural_sybil_accounts, adaptive_pool_aware=pool_aware,
        adaptive_response=args.adaptive_response, attribution_accounts=args.attribution_accounts,
    )  # fmt: skip
    progress = not args.no_progress and sys.stderr.isatty()
    summary = run_eval(opts, log=lambda m: print(m, file=sys.stderr, flush=True), progress=progress)
    print(format_table(summary))
    return 0


def _account_counts(flag: str, text: str) -> tuple[int, ...]:
    """A flag's comma-separated account counts (none: empty), each at least 1."""
    try:
        counts = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"{flag}: expected comma-separated whole numbers, got {text!r}") from None
    if counts and min(counts) < 1:
        raise UserError(f"{flag}: expected account counts of at least 1")
    return counts
