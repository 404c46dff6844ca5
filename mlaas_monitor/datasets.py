"""Tabular datasets for training the served trees: scikit-learn's bundled toy sets, generic
CSV files with a header, and the two files in ../shared/datasets (German credit without a
header, Adult with spaces after commas and ``?`` for missing values).

Parsing is pure (text in, columns out); only ``load_dataset`` touches the filesystem, and
nothing is ever downloaded.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysim.errors import InputFileError, UserError

BUILTIN = ("iris", "wine", "breast_cancer", "digits")

# From ../shared/datasets/README.md: german.data is space-separated with no header.
GERMAN_COLUMNS = (
    "status", "duration", "credit_history", "purpose", "credit_amount", "savings",
    "present_employment", "installment_rate", "status_sex", "other_debtors",
    "present_residence_since", "property", "age", "installment_plans", "housing",
    "number_of_existing_credits", "job", "number_of_people_liable_for", "telephone",
    "foreign_worker", "credit",
)  # fmt: skip
DEFAULT_TARGETS = {"german.data": "credit", "adult.csv": "income"}


@dataclass(frozen=True)
class RawDataset:
    """Columns as text (files) or numbers (built-ins), and the target labels."""

    name: str
    columns: list[str]
    data: list[list[str]] | np.ndarray  # rows
    target: list[str] | np.ndarray
    target_name: str


def parse_table(text: str, path: str, header: list[str] | None, delimiter: str | None) -> tuple[list[str], list[list[str]]]:
    """Split a text table into (header, rows); values stripped; blank lines skipped.

    ``delimiter=None`` splits on runs of whitespace (german.data).
    """
    lines = text.splitlines()
    rows: list[tuple[int, list[str]]] = []
    if delimiter is None:
        rows = [(n, ln.split()) for n, ln in enumerate(lines, 1) if ln.strip()]
    else:
        reader = csv.reader(io.StringIO(text), delimiter=delimiter, skipinitialspace=True)
        rows = [(reader.line_num, [v.strip() for v in r]) for r in reader if any(v.strip() for v in r)]
    if header is None:
        if not rows:
            raise InputFileError(path, None, None, "empty file: expected a header line")
        header = rows[0][1]
        rows = rows[1:]
    if len(set(header)) != len(header):
        raise InputFileError(path, 1, None, "duplicate column names in the header")
    for line, r in rows:
        if len(r) != len(header):
            raise InputFileError(path, line, None, f"expected {len(header)} values, got {len(r)}")
    if not rows:
        raise InputFileError(path, None, None, "no data rows")
    return header, [r for _, r in rows]


def split_target(name: str, header: list[str], rows: list[list[str]], target: str | None, path: str) -> RawDataset:
    target = target or DEFAULT_TARGETS.get(name) or header[-1]
    if target not in header:
        raise InputFileError(path, None, target, f"no such column; columns are {', '.join(header)}")
    t = header.index(target)
    cols = [c for i, c in enumerate(header) if i != t]
    data = [[v for i, v in enumerate(r) if i != t] for r in rows]
    labels = [r[t] for r in rows]
    for n, (r, lab) in enumerate(zip(rows, labels, strict=True), 2):
        if lab in ("", "?"):
            raise InputFileError(path, n, target, f"missing target value in row {r!r}")
    return RawDataset(name, cols, data, labels, target)


def load_builtin(name: str) -> RawDataset:
    from sklearn import datasets  # bundled with scikit-learn: nothing is downloaded

    loader = getattr(datasets, f"load_{name}")
    bunch = loader()
    names = [str(n) for n in getattr(bunch, "feature_names", [f"x{i}" for i in range(bunch.data.shape[1])])]
    return RawDataset(name, names, np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target), "target")


def load_dataset(spec: str, target: str | None = None) -> RawDataset:
    """``spec`` is a built-in name or a path to a CSV (header) or german.data file."""
    if spec in BUILTIN:
        if target not in (None, "target"):
            raise UserError(f"built-in dataset {spec!r} has a fixed target; drop --target")
        return load_builtin(spec)
    path = Path(spec)
    if not path.is_file():
        raise UserError(f"dataset {spec!r} is neither a built-in ({', '.join(BUILTIN)}) nor a readable file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read dataset {spec}: {e}") from e
    if path.name == "german.data":
        header, rows = parse_table(text, spec, list(GERMAN_COLUMNS), None)
    else:
        header, rows = parse_table(text, spec, None, ",")
    return split_target(path.name, header, rows, target, spec)
