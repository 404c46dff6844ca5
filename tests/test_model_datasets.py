"""Loading the training data: built-ins, generic CSV, and the two shared files with their
quirks; training keeps a held-out validation set; errors name the file and line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analysim.errors import InputFileError, UserError
from mlaas_monitor.datasets import GERMAN_COLUMNS, load_dataset
from mlaas_monitor.model import Model
from mlaas_monitor.schema import CATEGORICAL, NUMERIC
from mlaas_monitor.store import Store
from mlaas_monitor.training import encode_dataset, train_model
from tests.shared import needs_shared
from tests.test_gateway_helpers import ADULT, GERMAN, credit_csv


@pytest.mark.parametrize(("name", "n_features", "n_classes"), [("iris", 4, 3), ("wine", 13, 3), ("breast_cancer", 30, 2), ("digits", 64, 10)])
def test_builtins(name: str, n_features: int, n_classes: int) -> None:
    m = train_model(load_dataset(name), name, max_depth=3)
    assert len(m.schema) == n_features and len(m.classes) == n_classes
    assert all(f.kind == NUMERIC for f in m.schema.features)


def test_csv_with_header_infers_types_and_holds_out_a_quarter() -> None:
    ds = load_dataset(str(credit_csv()))
    schema, X, classes, y = encode_dataset(ds)
    assert [(f.name, f.kind) for f in schema.features] == [
        ("amount", NUMERIC), ("purpose", CATEGORICAL), ("age", NUMERIC), ("housing", CATEGORICAL)
    ]  # fmt: skip
    assert classes == ("bad", "good")
    m = train_model(ds, "c", seed=3)
    assert m.card["training_rows"] == 180 and m.card["validation_rows"] == 60
    assert m.validation_X.shape == (60, 4)
    # The card's accuracy is the model's accuracy on its own held-out set.
    assert m.card["validation_accuracy"] == pytest.approx(np.mean(m.answer(m.validation_X).labels == m.validation_y), abs=1e-6)
    # Deterministic for a seed.
    again = train_model(ds, "c", seed=3)
    assert again.tree.to_dict() == m.tree.to_dict()
    np.testing.assert_array_equal(again.validation_X, m.validation_X)


@needs_shared(GERMAN)
def test_german_data_uses_the_readme_column_names() -> None:
    ds = load_dataset(str(GERMAN))
    assert ds.columns == list(GERMAN_COLUMNS[:-1]) and ds.target_name == "credit"
    m = train_model(ds, "german", max_leaf_nodes=26)
    assert len(ds.data) == 1000 and m.classes == (1, 2) and m.tree.n_leaves == 26
    kinds = {f.name: f.kind for f in m.schema.features}
    assert kinds["status"] == CATEGORICAL and kinds["duration"] == NUMERIC and kinds["purpose"] == CATEGORICAL
    assert next(f for f in m.schema.features if f.name == "status").categories == ("A11", "A12", "A13", "A14")


@needs_shared(ADULT)
def test_adult_csv_strips_spaces_and_keeps_missing_as_a_category() -> None:
    ds = load_dataset(str(ADULT))
    assert len(ds.data) == 32561 and ds.target_name == "income"
    assert ds.columns[1] == "Workclass" and ds.data[0][1] == "State-gov"
    m = train_model(ds, "adult", max_leaf_nodes=30)
    assert m.classes == ("<=50K", ">50K")
    workclass = next(f for f in m.schema.features if f.name == "Workclass")
    assert "?" in workclass.categories and all(c == c.strip() for c in workclass.categories)
    assert m.card["validation_accuracy"] > 0.8


def test_stored_model_loads_back_without_code_and_predicts_the_same(tmp_path: Path) -> None:
    m = train_model(load_dataset(str(credit_csv())), "c", max_leaf_nodes=8)
    store = Store(tmp_path / "s.db")
    store.add_model(m)
    with pytest.raises(UserError, match="already exists"):
        store.add_model(m)
    loaded = store.load_model("c")
    store.close()
    assert isinstance(loaded, Model) and loaded.public() == m.public()
    np.testing.assert_array_equal(loaded.answer(m.validation_X).leaves, m.answer(m.validation_X).leaves)
    np.testing.assert_array_equal(loaded.validation_y, m.validation_y)
    # What is stored is plain JSON text: nothing to unpickle.
    import sqlite3

    spec = sqlite3.connect(tmp_path / "s.db").execute("SELECT spec FROM models").fetchone()[0]
    assert isinstance(spec, str) and spec.startswith("{")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("a,b\n1,2\n3\n", r"line 3: expected 2 values, got 1"),
        ("a,a\n1,2\n", r"duplicate column"),
        ("", r"empty file"),
        ("a,b\n", r"no data rows"),
        ("a,b\n1,x\n2,?\n", r"line 3, column 'b': missing target"),
    ],
)
def test_bad_files_name_the_file_and_line(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(InputFileError, match=match):
        load_dataset(str(path))


def test_unknown_dataset_and_target(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="neither a built-in"):
        load_dataset("no-such-thing")
    with pytest.raises(UserError, match="no such column"):
        load_dataset(str(credit_csv()), target="nope")
    with pytest.raises(UserError, match="fixed target"):
        load_dataset("iris", target="x")


SURVEY = (
    "Respondent ID,Age group,Score,Answer\n"
    ",Response,Response,Response\n"
    + "".join(f"{1000 + i},{'89 OR OLDER' if i % 7 == 0 else str(20 + i % 60)},{i % 10},{'yes' if i % 3 else 'no'}\n"
              for i in range(40))
)  # fmt: skip


def test_a_second_header_row_is_refused_by_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "survey.csv"
    path.write_text(SURVEY)
    with pytest.raises(InputFileError, match=r"survey.csv, line 2, column 'Score': looks like a second header row"):
        load_dataset(str(path), target="Answer")
    path.write_text("a,b,c\n1,x,p\n2,y,q\na,b,c\n3,x,p\n")
    with pytest.raises(InputFileError, match=r"line 4: repeats the header row"):
        load_dataset(str(path))


def test_the_cli_refuses_the_survey_file_in_one_line(tmp_path: Path) -> None:
    from analysim.cli import main as cli_main

    path = tmp_path / "survey.csv"
    path.write_text(SURVEY)
    assert cli_main(["model", "train", "--db", str(tmp_path / "s.db"), "--dataset", str(path), "--name", "s"]) == 2


def test_drop_columns_numeric_and_missing_values(tmp_path: Path) -> None:
    from mlaas_monitor.datasets import TableOptions

    path = tmp_path / "survey.csv"
    path.write_text(SURVEY.replace(",Response,Response,Response\n", "").replace("1003,23,3,no", "1003,,3,"))
    with pytest.raises(InputFileError, match=r"line 5, column 'Answer': missing target value \(use --dropna or --impute"):
        load_dataset(str(path), target="Answer")
    opts = TableOptions(drop_columns=("Respondent ID",), missing="drop", numeric=("Age group",))
    ds = load_dataset(str(path), target="Answer", options=opts)
    assert ds.columns == ["Age group", "Score"] and len(ds.data) == 39
    schema = encode_dataset(ds)[0]
    age = schema.features[0]
    assert age.kind == NUMERIC and age.max == 89  # "89 OR OLDER" read as 89, not a 72nd category
    imputed = load_dataset(str(path), target="Answer", options=TableOptions(missing="impute", numeric=("Age group",)))
    assert len(imputed.data) == 39 and any("missing target" in n for n in imputed.notes)
    path.write_text(SURVEY.replace(",Response,Response,Response\n", "").replace("1003,23,3,no", "1003,,3,no"))
    imputed = load_dataset(str(path), target="Answer", options=TableOptions(missing="impute", numeric=("Age group",)))
    assert len(imputed.data) == 40 and imputed.data[3][1] != "" and any("imputed 1" in n for n in imputed.notes)
    with pytest.raises(InputFileError, match=r"--numeric: no such column"):
        load_dataset(str(path), target="Answer", options=TableOptions(numeric=("nope",)))
    with pytest.raises(InputFileError, match=r"line 2, column 'Answer': --numeric: no number in 'no'"):
        load_dataset(str(path), target="Score", options=TableOptions(numeric=("Answer",)))


def test_a_value_beyond_float32_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "huge.csv"
    path.write_text("x,y\n" + "".join(f"{v},{'a' if i % 2 else 'b'}\n" for i, v in enumerate([1, 2, 1e300, 4, 5, 6])))
    with pytest.raises(UserError, match=r"column 'x', data row 3: 1e\+300 is beyond float32"):
        train_model(load_dataset(str(path)), "h")
