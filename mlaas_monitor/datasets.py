"""Tabular datasets for training the served trees: scikit-learn's bundled toy sets, generic
CSV files with a header, and the two files in ../shared/datasets (German credit without a
header, Adult with spaces after commas and ``?`` for missing values).

Parsing is pure (text in, columns out); only ``load_dataset`` touches the filesystem, and
nothing is ever downloaded.
"""

from __future__ import annotations

import csv
import io
import re
from collections import Counter
from dataclasses import dataclass, field
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
# Values that mean "missing" in the files users bring (adult.csv uses '?').
MISSING = frozenset({"", "?", "NA", "N/A", "NaN", "nan", "null", "NULL"})
MISSING_POLICIES = ("error", "drop", "impute")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class TableOptions:
    """How to read a file users bring: which columns to drop, what to do with missing
    values (``error``: a missing target is an error and a missing feature value is a
    category of its own; ``drop``: rows with any missing value go; ``impute``: rows with a
    missing target go, a missing feature value becomes its column's median or most
    frequent value), and which columns to read as numbers out of text ("89 OR OLDER")."""

    drop_columns: tuple[str, ...] = ()  # columns left out (never the target)
    missing: str = "error"  # one of MISSING_POLICIES
    numeric: tuple[str, ...] = ()  # columns read as the first number in each value


@dataclass(frozen=True)
class RawDataset:
    """Columns as text (files) or numbers (built-ins), and the target labels."""

    name: str  # the built-in's name, or the file's
    columns: list[str]  # the feature columns' names, in order
    data: list[list[str]] | np.ndarray  # rows
    target: list[str] | np.ndarray  # one label per row
    target_name: str  # the target column's name
    notes: tuple[str, ...] = field(default=())  # what was dropped or imputed, for the user


def parse_table(text: str, path: str, header: list[str] | None, delimiter: str | None) -> tuple[list[str], list[list[str]]]:
    """Split a text table into (header, rows); values stripped; blank lines skipped.

    ``delimiter=None`` splits on runs of whitespace (german.data).
    """
    header, rows, _ = parse_table_lines(text, path, header, delimiter)
    return header, rows


def parse_table_lines(
    text: str, path: str, header: list[str] | None, delimiter: str | None
) -> tuple[list[str], list[list[str]], list[int]]:
    """``parse_table``, with each row's line number in the file."""
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
    return header, [r for _, r in rows], [n for n, _ in rows]


def _is_number(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def check_repeated_header(path: str, header: list[str], rows: list[list[str]], lines: list[int]) -> None:
    """Refuse a table whose data holds a header row: a copy of the header anywhere, or a
    second header line under the first (as survey exports write: "Response,Response,...").
    Taken as data, its values would become an extra class and extra categories.

    The first data row is a second header when none of its values occurs in another row of
    its column, and some column that is numeric in every other row is not numeric in it."""
    for r, line in zip(rows, lines, strict=True):
        if r == header:
            raise InputFileError(path, line, None, "repeats the header row; remove it (only one header line is read)")
    if len(rows) < 3:
        return
    first, rest = rows[0], rows[1:]
    seen = [Counter(r[j] for r in rest) for j in range(len(header))]
    if any(v not in MISSING and seen[j][v] for j, v in enumerate(first)):
        return
    for j, v in enumerate(first):
        if v not in MISSING and not _is_number(v) and _numeric_column([r[j] for r in rest]):
            shown = ", ".join(repr(x) for x in first[:4]) + (", ..." if len(first) > 4 else "")
            raise InputFileError(
                path, lines[0], header[j],
                f"looks like a second header row ({shown}): its values occur in no other row and this column is "
                f"numeric everywhere else; remove the line (only one header line is read)",
            )  # fmt: skip


def _numeric_column(values: list[str]) -> bool:
    """Some value present, and every present one a number."""
    present = [v for v in values if v not in MISSING]
    return bool(present) and all(_is_number(v) for v in present)


def prepare_table(
    path: str, header: list[str], rows: list[list[str]], lines: list[int], target: str, opts: TableOptions
) -> tuple[list[str], list[list[str]], list[str]]:
    """Apply ``opts`` to a parsed table (the target column is kept); returns header, rows
    and notes saying what was dropped, parsed or imputed."""
    _check_options(path, header, target, opts)
    notes: list[str] = []
    keep = [j for j, c in enumerate(header) if c not in opts.drop_columns]
    header = [header[j] for j in keep]
    rows = [[r[j] for j in keep] for r in rows]
    if opts.drop_columns:
        notes.append(f"dropped columns {', '.join(opts.drop_columns)}")
    for c in opts.numeric:
        _read_numbers(path, rows, lines, header.index(c), c)
        notes.append(f"read numbers out of column {c}")
    t = header.index(target)
    if opts.missing == "error":
        for r, line in zip(rows, lines, strict=True):
            if r[t] in MISSING:
                raise InputFileError(path, line, target, "missing target value (use --dropna or --impute to drop such rows)")
        return header, rows, notes
    rows = _drop_or_impute(header, rows, t, opts.missing, notes)
    if not rows:
        raise InputFileError(path, None, None, "no rows left after dropping those with missing values")
    return header, rows, notes


def _drop_or_impute(header: list[str], rows: list[list[str]], t: int, missing: str, notes: list[str]) -> list[list[str]]:
    """The rows under the ``drop`` or ``impute`` policy (target column t); what was done into
    ``notes``."""
    before = len(rows)
    if missing == "drop":
        rows = [r for r in rows if not any(v in MISSING for v in r)]
        notes.append(f"dropped {before - len(rows)} of {before} rows with a missing value")
        return rows
    rows = [r for r in rows if r[t] not in MISSING]
    if len(rows) < before:
        notes.append(f"dropped {before - len(rows)} of {before} rows with a missing target")
    notes += _impute(header, rows, t)
    return rows


def _check_options(path: str, header: list[str], target: str, opts: TableOptions) -> None:
    """The options name a known missing-value policy and columns the table has (the target
    not among those dropped)."""
    if opts.missing not in MISSING_POLICIES:
        raise UserError(f"missing values: expected one of {', '.join(MISSING_POLICIES)}, not {opts.missing!r}")
    for flag, names in (("--drop-columns", opts.drop_columns), ("--numeric", opts.numeric)):
        for c in names:
            if c not in header:
                raise InputFileError(path, None, c, f"{flag}: no such column; columns are {', '.join(header)}")
    if target in opts.drop_columns:
        raise UserError(f"--drop-columns: {target!r} is the target column")


def _read_numbers(path: str, rows: list[list[str]], lines: list[int], j: int, c: str) -> None:
    """Column j (named c) as the first number in each value, in place; missing values stay."""
    for r, line in zip(rows, lines, strict=True):
        if r[j] in MISSING:
            continue
        m = _NUMBER.search(r[j])
        if m is None:
            raise InputFileError(path, line, c, f"--numeric: no number in {r[j][:40]!r}")
        r[j] = m.group(0)


def _impute(header: list[str], rows: list[list[str]], t: int) -> list[str]:
    """Each feature column's missing values as its median (numbers) or most frequent value,
    in place; a note per column filled."""
    notes = []
    for j, c in enumerate(header):
        if j == t:
            continue
        present = [r[j] for r in rows if r[j] not in MISSING]
        holes = len(rows) - len(present)
        if not holes or not present:
            continue
        value = _fill_value(present)
        for r in rows:
            if r[j] in MISSING:
                r[j] = value
        notes.append(f"imputed {holes} missing value(s) of {c} with {value}")
    return notes


def _fill_value(present: list[str]) -> str:
    """What a column's missing values become: the median of its numbers (whole when they all
    are), else its most frequent value (the first in order on a tie)."""
    if not all(_is_number(v) for v in present):
        return min(Counter(present).items(), key=lambda kv: (-kv[1], kv[0]))[0]
    nums = np.array([float(v) for v in present])
    fill = float(np.median(nums))
    if np.all(nums == np.round(nums)):
        fill = float(np.round(fill))
    return repr(int(fill)) if fill.is_integer() else repr(fill)


def default_target(name: str, header: list[str], target: str | None, path: str) -> str:
    target = target or DEFAULT_TARGETS.get(name) or header[-1]
    if target not in header:
        raise InputFileError(path, None, target, f"no such column; columns are {', '.join(header)}")
    return target


def split_target(name: str, header: list[str], rows: list[list[str]], target: str | None, path: str) -> RawDataset:
    target = default_target(name, header, target, path)
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


def load_dataset(spec: str, target: str | None = None, options: TableOptions | None = None) -> RawDataset:
    """``spec`` is a built-in name or a path to a CSV (header) or german.data file."""
    opts = options or TableOptions()
    if spec in BUILTIN:
        if target not in (None, "target"):
            raise UserError(f"built-in dataset {spec!r} has a fixed target; drop --target")
        if opts != TableOptions():
            raise UserError(f"built-in dataset {spec!r} is complete and numeric; --drop-columns, --dropna, --impute "
                            "and --numeric apply to files")  # fmt: skip
        return load_builtin(spec)
    path = Path(spec)
    if not path.is_file():
        raise UserError(f"dataset {spec!r} is neither a built-in ({', '.join(BUILTIN)}) nor a readable file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read dataset {spec}: {e}") from e
    if path.name == "german.data":
        header, rows, lines = parse_table_lines(text, spec, list(GERMAN_COLUMNS), None)
    else:
        header, rows, lines = parse_table_lines(text, spec, None, ",")
    check_repeated_header(spec, header, rows, lines)
    target = default_target(path.name, header, target, spec)
    header, rows, notes = prepare_table(spec, header, rows, lines, target, opts)
    ds = split_target(path.name, header, rows, target, spec)
    return RawDataset(ds.name, ds.columns, ds.data, ds.target, ds.target_name, tuple(notes))
