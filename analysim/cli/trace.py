"""``analysim trace``: look into a trace file, convert it to the canonical format, or generate one."""

from __future__ import annotations

import argparse
from typing import Any

from analysim.traces import FORMATS, load_trace, write_canonical
from analysim.traces.summary import describe_filtered, format_summary, summarize_file
from analysim.traces.synthetic import generate


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "trace",
        help="inspect, convert or generate job traces",
        description="Inspect a trace file, convert it to AnalySIM's canonical CSV, or generate a "
        "synthetic Philly-like trace. Formats: " + ", ".join(FORMATS) + " (docs/traces.md).",
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    fmt_help = "input format (default: told from the header line)"
    formats = ("auto", *FORMATS)

    info = sub.add_parser("info", help="jobs, time span, GPU counts, durations, VCs of a trace")
    info.add_argument("file", metavar="FILE")
    info.add_argument("--format", default="auto", choices=formats, help=fmt_help)
    info.add_argument("--vcs", type=int, default=20, metavar="N", help="list at most N VCs (default 20)")
    info.set_defaults(func=_info)

    convert = sub.add_parser("convert", help="convert a trace to the canonical CSV format")
    convert.add_argument("file", metavar="FILE")
    convert.add_argument("--format", default="auto", choices=formats, help=fmt_help)
    convert.add_argument("--out", required=True, metavar="OUT", help="canonical CSV to write")
    convert.set_defaults(func=_convert)

    gen = sub.add_parser("generate", help="write a synthetic trace fitted to Microsoft Philly")
    gen.add_argument("--jobs", type=int, default=1000, metavar="N", help="number of jobs (default 1000)")
    gen.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default 0)")
    gen.add_argument(
        "--rate-scale", type=float, default=1.0, metavar="X",
        help="arrival-rate multiplier; 1 offers Philly's load, ~374 busy GPUs (default 1)",
    )  # fmt: skip
    gen.add_argument("--out", required=True, metavar="FILE", help="canonical CSV to write")
    gen.set_defaults(func=_generate)


def _info(args: argparse.Namespace) -> int:
    print(format_summary(summarize_file(args.file, args.format), max_vcs=args.vcs))
    return 0


def _convert(args: argparse.Namespace) -> int:
    trace = load_trace(args.file, args.format)
    write_canonical(trace, args.out)
    print(
        f"wrote {len(trace.jobs):,} jobs to {args.out} (from {trace.format}; filtered out: {describe_filtered(trace.filtered)})"
    )
    return 0


def _generate(args: argparse.Namespace) -> int:
    trace = generate(args.jobs, args.seed, rate_scale=args.rate_scale)
    write_canonical(trace, args.out)
    print(f"wrote {len(trace.jobs):,} synthetic jobs to {args.out}")
    return 0
