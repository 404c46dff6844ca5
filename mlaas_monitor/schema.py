"""A model's input schema, and the encoding of raw client rows into the tree's numbers.

Numeric features pass through; a categorical feature is encoded as the index of its value
in the model's stored category list (sorted at training time). Clients always send raw
values, so the encoding travels with the model. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

NUMERIC = "numeric"
CATEGORICAL = "categorical"
# Values are compared as float32 (as scikit-learn does); beyond this they would become inf.
FLOAT32_MAX = float(np.finfo(np.float32).max)
_NUMBER_TYPES = frozenset((int, float))
FAST_PATH_MIN_ROWS = 8  # below this, the row-by-row loop is cheaper


class RowError(ValueError):
    """A client row that cannot be encoded: names the field and the problem."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        # The field's name (column or request key), and what is wrong with its value
        self.field, self.problem = field, problem


@dataclass(frozen=True)
class Feature:
    name: str  # the column's name
    kind: str  # "numeric" or "categorical"
    min: float = 0.0  # training-data range of the numeric value (or of the category index)
    max: float = 0.0  # (>= min)
    integer: bool = False  # every training value was a whole number
    categories: tuple[str, ...] = ()  # categorical: the category names, index order (empty for numeric)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "type": self.kind}
        if self.kind == CATEGORICAL:
            d["categories"] = list(self.categories)
        else:
            d.update(min=self.min, max=self.max, integer=self.integer)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Feature:
        if d["type"] == CATEGORICAL:
            cats = tuple(str(c) for c in d["categories"])
            return cls(d["name"], CATEGORICAL, 0.0, float(len(cats) - 1), True, cats)
        if d["type"] != NUMERIC:
            raise ValueError(f"unknown feature type {d['type']!r}")
        return cls(d["name"], NUMERIC, float(d["min"]), float(d["max"]), bool(d.get("integer", False)))


@dataclass(frozen=True, eq=False)
class Schema:
    features: tuple[Feature, ...]  # the model's features, in column order
    _index: dict[str, int] = field(init=False, repr=False)  # feature name -> column index
    # Per column: category name -> index (None: numeric)
    _codes: tuple[dict[str, int] | None, ...] = field(init=False, repr=False)
    _numeric_idx: list[int] = field(init=False, repr=False)  # the numeric columns' indices
    _categorical_idx: list[int] = field(init=False, repr=False)  # the categorical columns' indices
    # Packed row (numeric values, then categorical) -> row in column order
    _packed_order: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        names = [f.name for f in self.features]
        if len(set(names)) != len(names):
            raise ValueError("duplicate feature names")
        object.__setattr__(self, "_index", {n: i for i, n in enumerate(names)})
        codes = tuple(
            {c: i for i, c in enumerate(f.categories)} if f.kind == CATEGORICAL else None for f in self.features
        )
        object.__setattr__(self, "_codes", codes)
        object.__setattr__(self, "_numeric_idx", [i for i, c in enumerate(codes) if c is None])
        object.__setattr__(self, "_categorical_idx", [i for i, c in enumerate(codes) if c is not None])
        # Packed rows list numeric values, then categorical ones: where each feature sits.
        where = {i: k for k, i in enumerate(self._numeric_idx + self._categorical_idx)}
        object.__setattr__(self, "_packed_order", itemgetter(*(where[i] for i in range(len(codes)))))

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.features]

    def __len__(self) -> int:
        return len(self.features)

    def to_list(self) -> list[dict[str, Any]]:
        return [f.to_dict() for f in self.features]

    @classmethod
    def from_list(cls, items: list[dict[str, Any]]) -> Schema:
        return cls(tuple(Feature.from_dict(d) for d in items))

    def encode_rows(self, rows: Any, field_name: str = "rows") -> np.ndarray:
        """Encode a list of rows (lists in feature order, or objects keyed by name).

        Returns a float64 matrix (n_rows, n_features); raises RowError naming the first bad
        field. This is the per-query hot path, hence the plain loops over prebuilt tables.
        """
        if type(rows) is not list:
            raise RowError(field_name, f"expected a list of rows, got {_json_type(rows)}")
        if not rows:
            raise RowError(field_name, "expected at least one row")
        fast = self._encode_columns(rows)
        if fast is not None:
            return fast
        # Slow path: row by row, to name the first bad field precisely.
        nf = len(self.features)
        codes = self._codes
        out = np.empty((len(rows), nf), dtype=np.float64)
        for r, row in enumerate(rows):
            t = type(row)
            if t is list:
                if len(row) != nf:
                    raise RowError(f"{field_name}[{r}]", f"expected {nf} values, got {len(row)}")
                values: Sequence[Any] = row
            elif t is dict:
                values = self._from_mapping(row, f"{field_name}[{r}]")
            else:
                raise RowError(f"{field_name}[{r}]", f"expected a list or an object, got {_json_type(row)}")
            enc = out[r]
            for i in range(nf):
                v = values[i]
                table = codes[i]
                tv = type(v)
                if table is None:
                    if tv is float:
                        if not (-FLOAT32_MAX <= v <= FLOAT32_MAX):  # also false for NaN
                            raise RowError(self._where(field_name, r, i), _bad_number(v))
                        enc[i] = v
                    elif tv is int:
                        if not -FLOAT32_MAX <= v <= FLOAT32_MAX:
                            raise RowError(self._where(field_name, r, i), "number out of range")
                        enc[i] = v
                    else:
                        raise RowError(self._where(field_name, r, i), f"expected a number, got {_json_type(v)}")
                else:
                    if tv is not str:
                        raise RowError(
                            self._where(field_name, r, i), f"expected a category (string), got {_json_type(v)}"
                        )
                    code = table.get(v)
                    if code is None:
                        raise RowError(self._where(field_name, r, i), f"unknown category {_clip(v)!r}")
                    enc[i] = code
        return out

    def _encode_columns(self, rows: list[Any]) -> np.ndarray | None:
        """Column-at-a-time encoding of positional rows, with C-level map/set/np.array.

        Returns None whenever anything is off (named rows, a bad value); the row-by-row
        path then finds and reports the problem.
        """
        nf = len(self.features)
        if len(rows) < FAST_PATH_MIN_ROWS or set(map(type, rows)) != {list} or set(map(len, rows)) != {nf}:
            return None
        cols = list(zip(*rows, strict=True))
        out = np.empty((len(rows), nf), dtype=np.float64)
        num = self._numeric_idx
        if num:
            numeric = [cols[i] for i in num]
            if not set(map(type, chain.from_iterable(numeric))) <= _NUMBER_TYPES:
                return None
            try:
                out[:, num] = np.array(numeric, dtype=np.float64).T
            except OverflowError:  # an int beyond float64
                return None
            if not np.all(np.abs(out[:, num]) <= FLOAT32_MAX):  # also rejects NaN and infinities
                return None
        cat = self._categorical_idx
        if cat:
            codes = self._codes
            try:
                # Tables are keyed by str, so a number or null misses (KeyError) and a list
                # or object is unhashable (TypeError).
                out[:, cat] = np.array(
                    [list(map(codes[i].__getitem__, cols[i])) for i in cat], dtype=np.float64  # type: ignore[union-attr]
                ).T
            except (KeyError, TypeError):
                return None
        return out

    def encode_packed(self, n_rows: int, numbers: Sequence[float], categories: Sequence[str]) -> np.ndarray:
        """Encode the packed form: row-major numeric values and categorical values, each
        in feature order. Errors name the row and feature, as for ``encode_rows``."""
        num, cat = self._numeric_idx, self._categorical_idx
        if n_rows < 1:
            raise RowError("packed.n_rows", "expected at least one row")
        for name, values, width in (("packed.numbers", numbers, len(num)), ("packed.categories", categories, len(cat))):
            if len(values) != n_rows * width:
                raise RowError(name, f"expected {n_rows} x {width} = {n_rows * width} values, got {len(values)}")
        if n_rows < FAST_PATH_MIN_ROWS:
            # A few rows: back to positional rows and the row encoder, which costs less than
            # the numpy calls below and names a bad value the same way.
            wn, wc = len(num), len(cat)
            order = self._packed_order
            return self.encode_rows(
                [list(order(list(numbers[r * wn : (r + 1) * wn]) + list(categories[r * wc : (r + 1) * wc])))
                 for r in range(n_rows)]
            )  # fmt: skip
        out = np.empty((n_rows, len(self.features)), dtype=np.float64)
        if num:
            nums = np.asarray(numbers, dtype=np.float64).reshape(n_rows, len(num))
            bad = ~(np.abs(nums) <= FLOAT32_MAX)  # NaN compares false
            if bad.any():
                r, j = np.argwhere(bad)[0]
                raise RowError(self._where("rows", int(r), num[j]), _bad_number(float(nums[r, j])))
            out[:, num] = nums
        if cat:
            w = len(cat)
            getters = [self._codes[i].__getitem__ for i in cat]  # type: ignore[union-attr]
            try:
                # Per column a C-level map over a strided slice, streamed into one array.
                flat = chain.from_iterable([map(get, categories[j::w]) for j, get in enumerate(getters)])
                out[:, cat] = np.fromiter(flat, dtype=np.float64, count=n_rows * w).reshape(w, n_rows).T
            except (KeyError, TypeError):  # unknown (or unhashable) category: find the first
                k = next(k for k, v in enumerate(categories) if type(v) is not str or v not in self._codes[cat[k % w]])  # type: ignore[operator]
                raise RowError(self._where("rows", k // w, cat[k % w]), f"unknown category {_clip(str(categories[k]))!r}") from None
        return out

    def _where(self, field_name: str, r: int, i: int) -> str:
        return f"{field_name}[{r}].{self.features[i].name}"

    def _from_mapping(self, row: dict[str, Any], where: str) -> list[Any]:
        index = self._index
        for key in row:
            if key not in index:
                raise RowError(f"{where}.{_clip(str(key))}", "unknown feature")
        values = []
        for f in self.features:
            if f.name not in row:
                raise RowError(f"{where}.{f.name}", "missing feature")
            values.append(row[f.name])
        return values


def _bad_number(v: float) -> str:
    if math.isnan(v):
        return "NaN is not allowed"
    if math.isinf(v):
        return "infinity is not allowed"
    return "number out of range"


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int | float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def _clip(s: str, n: int = 40) -> str:
    return s if len(s) <= n else s[:n] + "…"


def infer_feature(name: str, column: Sequence[str]) -> tuple[Feature, np.ndarray]:
    """Type one raw text column: numeric when every value parses as a finite number.

    Returns the feature and the column encoded as float64.
    """
    try:
        nums = np.array([float(v) for v in column], dtype=np.float64)
        if np.all(np.isfinite(nums)):
            integer = bool(np.all(nums == np.round(nums)))
            return Feature(name, NUMERIC, float(nums.min()), float(nums.max()), integer), nums
    except ValueError:
        pass
    cats = tuple(sorted({str(v) for v in column}))
    table = {c: i for i, c in enumerate(cats)}
    enc = np.array([table[str(v)] for v in column], dtype=np.float64)
    return Feature(name, CATEGORICAL, 0.0, float(len(cats) - 1), True, cats), enc


def numeric_feature(name: str, column: np.ndarray) -> Feature:
    col = np.asarray(column, dtype=np.float64)
    return Feature(name, NUMERIC, float(col.min()), float(col.max()), bool(np.all(col == np.round(col))))
