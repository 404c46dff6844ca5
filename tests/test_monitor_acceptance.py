"""The issue's acceptance checks as integration tests: ``monitor-eval`` trains a tree,
serves it on loopback with the monitor, runs the attacks over HTTP and writes its outputs.
Always on a small tree (scikit-learn's wine); on German credit when ../shared is there."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from analysim.cli import main as cli_main
from tests.test_gateway_helpers import GERMAN, needs_shared

SUMMARY_KEYS = {"queries_used", "queries_to_fidelity_099", "first_warning_query", "status_at_warning",
                "true_fidelity_at_warning"}  # fmt: skip


def check_outputs(out: Path, strategies: list[str]) -> dict:  # type: ignore[type-arg]
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["strategies"]) == strategies
    for r in summary["strategies"].values():
        assert set(r) >= SUMMARY_KEYS
    with (out / "curves.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["strategy"] for r in rows} == set(strategies)
    assert {"ig", "coverage_volume", "coverage_mass", "fidelity", "true_fidelity"} <= {r["metric"] for r in rows}
    assert (out / "status_vs_queries.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for s in strategies:
        assert (out / f"status_{s}.png").stat().st_size > 1000
    return summary


def assert_acceptance(summary: dict) -> None:  # type: ignore[type-arg]
    st = summary["strategies"]
    pf, col = st["pathfinding"], st["colluding"]
    assert pf["leaves_found"] == summary["model"]["leaves"]
    assert pf["queries_to_fidelity_099"] is not None and pf["final_true_fidelity"] >= 0.99
    for r in (pf, col):  # the monitor warns before the attacker's true fidelity reaches 0.9
        assert r["first_warning_query"] is not None
        f90 = r["queries_to_fidelity_090"]
        assert f90 is None or r["first_warning_query"] < f90
        assert r["status_at_warning"] >= summary["warning_threshold"]
    # K colluders' group status equals, within 0.02, that of one user sending all their queries
    for m, v in col["single_user_status"].items():
        assert abs(col["group_status"][m] - v) <= 0.02
    # ... while no single member looks like an extractor by the default method
    method = summary["default_method"]
    assert all(s[method] < col["group_status"][method] for s in col["member_status"].values())


def test_monitor_eval_on_a_small_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "eval"
    code = cli_main(["monitor-eval", "--dataset", "wine", "--max-leaf-nodes", "12", "--strategies",
                     "random,pathfinding,colluding", "--accounts", "3", "--budget", "300", "--out", str(out)])  # fmt: skip
    assert code == 0
    table = capsys.readouterr().out
    assert "| pathfinding |" in table and "acceptance:" in table
    summary = check_outputs(out, ["random", "pathfinding", "colluding"])
    assert summary["model"]["leaves"] >= 5  # wine grows 7 pure leaves under this cap
    assert_acceptance(summary)
    assert all(summary["acceptance"].values()), summary["acceptance"]


@needs_shared
@pytest.mark.shared
def test_monitor_eval_on_german_credit(tmp_path: Path) -> None:
    out = tmp_path / "german"
    assert cli_main(["monitor-eval", "--dataset", str(GERMAN), "--out", str(out)]) == 0
    summary = check_outputs(out, ["benign", "random", "pathfinding", "colluding"])
    assert 20 <= summary["model"]["leaves"] <= 40
    assert_acceptance(summary)
    # the same order of queries as Tramèr et al. (1,722 for 26 leaves)
    q = summary["strategies"]["pathfinding"]["queries_to_fidelity_099"]
    assert q <= 2 * 1722, q
    assert all(summary["acceptance"].values()), summary["acceptance"]


def test_monitor_eval_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["monitor-eval", "--dataset", "nosuch", "--out", str(tmp_path / "x")]) == 2
    assert cli_main(["monitor-eval", "--dataset", "wine", "--strategies", "magic", "--out", str(tmp_path)]) == 2
    assert cli_main(["monitor-eval", "--dataset", "wine", "--accounts", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and "nosuch" in err[0] and "magic" in err[1] and "--accounts" in err[2]
