"""``analysim monitor-eval``: the extraction monitor against the attack suite, on loopback."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysim.cli.argtypes import positive_int
from analysim.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "monitor-eval",
        help="train a model, serve it with the extraction monitor, run the attacks, record statuses vs queries",
        description="Writes DIR/curves.csv, DIR/status_*.png and DIR/summary.json.",
    )
    p.add_argument("--dataset", required=True, help="built-in name (iris, wine, breast_cancer, digits) or file")
    p.add_argument("--target", help="target column (default as for 'model train')")
    p.add_argument("--strategies", default="benign,random,pathfinding,colluding",
                   help="comma-separated (default benign,random,pathfinding,colluding)")  # fmt: skip
    p.add_argument("--accounts", type=positive_int, default=3, help="colluding accounts K (default 3)")
    p.add_argument("--collude-base", choices=("benign", "random", "pathfinding"), default="pathfinding")
    p.add_argument("--max-leaf-nodes", type=positive_int, default=26, help="default 26 (Tramèr et al.'s German tree)")
    p.add_argument("--max-depth", type=positive_int)
    p.add_argument("--budget", type=positive_int, default=2000, help="queries for random (default 2000)")
    p.add_argument("--oracle", choices=("leaf", "confidence"), default="leaf",
                   help="what the policy reveals as leaf identity: leaf ids, or label + confidence (BigML)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mlaas_monitor.monitor.evaluate import EvalOptions, run_eval

    strategies = tuple(s.strip() for s in args.strategies.split(",") if s.strip())
    if not strategies:
        raise UserError("--strategies: name at least one strategy")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out} exists and is not a directory")
    opts = EvalOptions(
        dataset=args.dataset, out=out, strategies=strategies, accounts=args.accounts,
        max_leaf_nodes=args.max_leaf_nodes, max_depth=args.max_depth, target=args.target, seed=args.seed,
        budget=args.budget, collude_base=args.collude_base, oracle=args.oracle,
    )  # fmt: skip
    summary = run_eval(opts, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(format_table(summary))
    return 0


def format_table(summary: dict) -> str:  # type: ignore[type-arg]
    method = summary["default_method"]
    head = ("strategy", "queries", "q to fid 0.99", "1st warning", f"{method} at warning", "true fid at warning",
            "final " + method, "final IG", "final true fid")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def f(v: object) -> str:
        if v is None:
            return "never"
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    for name, r in summary["strategies"].items():
        lines.append("| " + " | ".join([name, f(r["queries_used"]), f(r["queries_to_fidelity_099"]),
                     f(r["first_warning_query"]), f(r["status_at_warning"]), f(r["true_fidelity_at_warning"]),
                     f(r["final_status"][method]), f(r["final_status"]["ig"]), f(r["final_true_fidelity"])]) + " |")  # fmt: skip
    col = summary["strategies"].get("colluding")
    if col:
        lines.append(f"\ncolluding: group {method} {col['group_status'][method]:.3f}, single user "
                     f"{col['single_user_status'][method]:.3f}, max difference over all methods "
                     f"{col['group_vs_single_max_difference']:.4f}; members: "
                     + ", ".join(f"{m} {s[method]:.3f}" for m, s in col["member_status"].items()))  # fmt: skip
    lines.append("acceptance: " + ", ".join(f"{k}={v}" for k, v in summary["acceptance"].items()))
    return "\n".join(lines)
