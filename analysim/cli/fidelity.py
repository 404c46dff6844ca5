"""``analysim fidelity``: a replay's admission waits against the ones the traced cluster recorded
(analysim.fidelity)."""

from __future__ import annotations

import argparse
from pathlib import Path

from analysim.errors import UserError
from analysim.fidelity import not_compared, plot, score, table
from analysim.report import have_matplotlib, write_json

HELP = "a replay's admission waits against those the traced cluster recorded"
DESCRIPTION = ("Score RUN_DIR (analysim simulate --out of a trace with recorded admissions, e.g. from "
               "`analysim trace convert --format kueue-workloads`): per ClusterQueue and overall, simulated vs "
               "recorded admission wait (mean, p50, p95), the share admitted within 1 and 10 minutes, and the "
               "Kolmogorov-Smirnov distance between the two. Writes fidelity.json (or --out) and fidelity.png beside "
               "it. docs/kueue.md, 'A real cluster'.")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fidelity", help=HELP, description=DESCRIPTION)
    p.add_argument("run", type=Path, metavar="RUN_DIR", help="the run's output folder")
    p.add_argument("--out", type=Path, metavar="FILE", help="the JSON report (default RUN_DIR/fidelity.json)")
    p.add_argument("--no-plot", action="store_true", help="no fidelity.png")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    report = score(args.run)
    out = args.out if args.out is not None else args.run / "fidelity.json"
    print(table(report))
    for line in not_compared(report):
        print(line)
    partial = out.with_name(out.name + ".partial")  # (replaced whole: a reader never sees half of it)
    try:
        write_json(report, partial)
        partial.replace(out)
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise UserError(f"--out {out}: cannot write: {e.strerror}") from None
    written = [out]
    if not args.no_plot and have_matplotlib():
        written.append(plot(args.run, out.with_suffix(".png")))
    print("wrote " + ", ".join(map(str, written)))
    return 0
