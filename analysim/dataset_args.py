"""Arguments shared by the commands that read a dataset file (model train, monitor-eval,
attack): which columns to drop, what to do with missing values, which to parse as numbers."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlaas_monitor.datasets import TableOptions


def add_dataset_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("dataset file")
    g.add_argument("--drop-columns", default="", metavar="COL,COL", help="comma-separated columns to ignore (e.g. an ID)")
    missing = g.add_mutually_exclusive_group()
    missing.add_argument("--dropna", action="store_true",
                         help="drop rows with a missing value ('', '?', NA, N/A, NaN, null)")  # fmt: skip
    missing.add_argument("--impute", action="store_true",
                         help="drop rows with a missing target; fill a missing feature value with its column's "
                              "median (numbers) or most frequent value")  # fmt: skip
    g.add_argument("--numeric", action="append", default=[], metavar="COL",
                   help="read column COL as numbers taken out of its text ('89 OR OLDER' -> 89); repeat for more")  # fmt: skip


def table_options(args: argparse.Namespace) -> TableOptions:
    from mlaas_monitor.datasets import TableOptions

    drop = tuple(c.strip() for c in args.drop_columns.split(",") if c.strip())
    missing = "drop" if args.dropna else "impute" if args.impute else "error"
    return TableOptions(drop_columns=drop, missing=missing, numeric=tuple(args.numeric))
