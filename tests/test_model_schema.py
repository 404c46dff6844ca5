"""Encoding client rows: the column fast path and the row path agree, and every bad value
is refused with the field that holds it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlaas_monitor.schema import (
    CATEGORICAL,
    FAST_PATH_MIN_ROWS,
    NUMERIC,
    Feature,
    RowError,
    Schema,
    infer_feature,
)

SCHEMA = Schema(
    (
        Feature("x", NUMERIC, 0, 10),
        Feature("colour", CATEGORICAL, 0, 2, True, ("blue", "green", "red")),
        Feature("y", NUMERIC, -1, 1),
    )
)

valid_row = st.tuples(
    st.floats(-1e30, 1e30) | st.integers(-(10**9), 10**9),
    st.sampled_from(["blue", "green", "red"]),
    st.floats(-1e30, 1e30) | st.integers(-(10**9), 10**9),
).map(list)
bad_value = st.one_of(
    st.none(),
    st.booleans(),
    st.just(float("nan")),
    st.just(float("inf")),
    st.just(1e300),
    st.just(10**400),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)


def slow(rows: list[Any]) -> np.ndarray:
    # Named rows always take the row-by-row path.
    return SCHEMA.encode_rows([dict(zip(SCHEMA.names, r, strict=True)) for r in rows])


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(valid_row, min_size=1, max_size=3 * FAST_PATH_MIN_ROWS))
def test_fast_and_row_paths_agree_on_valid_rows(rows: list[list[Any]]) -> None:
    fast = SCHEMA.encode_rows(rows)
    np.testing.assert_array_equal(fast, slow(rows))
    assert fast[:, 1].tolist() == [["blue", "green", "red"].index(r[1]) for r in rows]


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(valid_row, min_size=1, max_size=3 * FAST_PATH_MIN_ROWS),
    where=st.tuples(st.integers(0, 10**6), st.integers(0, 2)),
    value=bad_value,
)
def test_a_bad_value_anywhere_is_refused_naming_its_field(rows: list[list[Any]], where: tuple[int, int], value: Any) -> None:
    r, c = where[0] % len(rows), where[1]
    rows[r][c] = value
    if c == 1 and value in ("blue", "green", "red"):
        return  # text() drew a valid category
    if c != 1 and type(value) in (int, float) and -3.4e38 <= value <= 3.4e38:  # False for NaN
        return
    for form in (rows, [dict(zip(SCHEMA.names, row, strict=True)) for row in rows]):
        with pytest.raises(RowError) as exc:
            SCHEMA.encode_rows(form)
        # The first bad field: rows before r are valid.
        assert exc.value.field == f"rows[{r}].{SCHEMA.names[c]}"


@pytest.mark.parametrize(
    ("rows", "field", "problem"),
    [
        ([], "rows", "expected at least one row"),
        ({"x": 1}, "rows", "expected a list of rows, got object"),
        ([[1, "red"]], "rows[0]", "expected 3 values, got 2"),
        ([[1, "red", 2], "x"], "rows[1]", "expected a list or an object, got string"),
        ([{"x": 1, "colour": "red"}], "rows[0].y", "missing feature"),
        ([{"x": 1, "colour": "red", "y": 2, "z": 0}], "rows[0].z", "unknown feature"),
        ([[1, "purple", 2]], "rows[0].colour", "unknown category 'purple'"),
        ([[1, 1, 2]], "rows[0].colour", "expected a category (string), got number"),
        ([[float("nan"), "red", 2]], "rows[0].x", "NaN is not allowed"),
        ([[1, "red", -float("inf")]], "rows[0].y", "infinity is not allowed"),
        ([[True, "red", 2]], "rows[0].x", "expected a number, got boolean"),
    ],
)
def test_error_messages(rows: Any, field: str, problem: str) -> None:
    with pytest.raises(RowError) as exc:
        SCHEMA.encode_rows(rows)
    assert (exc.value.field, exc.value.problem) == (field, problem)


def test_infer_feature_types_columns() -> None:
    f, enc = infer_feature("n", ["1", "2.5", "-3"])
    assert (f.kind, f.min, f.max, f.integer) == (NUMERIC, -3.0, 2.5, False)
    f, enc = infer_feature("c", ["b", "a", "?", "b"])
    assert (f.kind, f.categories, enc.tolist()) == (CATEGORICAL, ("?", "a", "b"), [2.0, 1.0, 0.0, 2.0])
    f, _ = infer_feature("inf", ["1", "inf"])
    assert f.kind == CATEGORICAL
    assert Schema.from_list(SCHEMA.to_list()).to_list() == SCHEMA.to_list()
