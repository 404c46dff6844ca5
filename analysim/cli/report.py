"""``analysim report DIR``: the HTML report of a sweep folder (one file, figures embedded)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write a sweep's HTML report",
        description="Write one static HTML file for a sweep folder (from analysim sweep): the summary table "
                    "with the best cell per metric highlighted, JCT CDFs per policy, utilization and "
                    "fragmentation over time, preemptions/migrations against JCT gain, per-VC fairness.",
    )
    p.add_argument("dir", type=Path, metavar="DIR", help="the sweep's --out folder")
    p.add_argument("--out", type=Path, help="HTML file to write (default: DIR/report.html)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from analysim.report import can_plot
    from analysim.sweep.report import render

    out = args.out or args.dir / "report.html"
    page = render(args.dir)
    can_plot()  # without matplotlib, a note on stderr: the tables are written, the figures skipped
    out.write_text(page)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB): open it in a browser")
    return 0
