"""The monitor's evaluation goals (docs/monitor.md, "Evaluation") as integration tests:
``monitor-eval`` trains a tree, serves it on loopback with the monitor, sends a benign
population and the attackers over HTTP, and measures each status method against the truth
(balanced fidelity). On a small tree (scikit-learn's wine) always; on German credit and
Adult when ../shared is there, with few benign users and a small tree so that the tests
stay cheap (the full evaluation is in docs/monitor.md)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from analysim.cli import main as cli_main
from mlaas_monitor.monitor.curves import SubjectCurve, analyse_curve
from mlaas_monitor.monitor.infogain import extent
from tests.polling import scaled
from tests.procs import started
from tests.shared import shared_marks
from tests.test_gateway_helpers import ADULT, GERMAN


def check_outputs(out: Path, strategies: list[str]) -> dict:  # type: ignore[type-arg]
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["strategies"]) == strategies
    assert "tramer" not in json.dumps(summary).lower()  # no dataset-specific constants
    with (out / "curves.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["strategy"] for r in rows} == set(strategies) - {"adaptive"}  # adaptive: a table of its own
    assert {"ig", "coverage_volume", "coverage_mass", "fidelity", "combined", "best_copy", "prada", "ood", "boundary",
            "balanced_fidelity", "balanced_fidelity_at_status"} <= {r["metric"] for r in rows}
    assert (out / "status_vs_queries.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for s in strategies:
        if s != "adaptive":  # a table of its own, no curve
            assert (out / f"status_{s}.png").stat().st_size > 1000
    table = (out / "table.md").read_text()
    assert "| strategy | method |" in table and "| strategy | curves | calibration error |" in table
    assert not (out / "store.db.monitor-lock").exists()  # the monitor's lock is no output
    return summary


def assert_acceptance(summary: dict) -> None:  # type: ignore[type-arg]
    st, acc = summary["strategies"], summary["acceptance"]
    if "pathfinding" in st:
        assert acc["pathfinding_found_every_leaf"]
    # The default method's warnings are right: the subject held the model (beyond the margin)
    assert acc["default_method_precision_at_least_095"], acc["default_method_warning_precision"]
    for s in st:  # ... and a warning comes before the attacker's balanced fidelity reaches 0.9
        if s != "benign":
            assert acc[f"{s}_warned_before_bf_090"], s
    if "benign" in st:
        assert acc["prada_silent_on_benign"] and st["benign"]["evaluation"]["ood_alarms"] == 0
    for s in ("pathfinding", "sybil"):
        if s in st:
            assert st[s]["evaluation"]["prada_alarms"] == 1, s
    if "random" in st:  # PRADA cannot see uniform queries (docs/monitor.md); the OOD signal does
        assert st["random"]["evaluation"]["ood_alarms"] == 1
    if "sybil" in st:
        assert acc["sybil_grouped_automatically"]
        sy = st["sybil"]
        assert sy["accounts_grouped"] == sy["accounts"] >= 2


def test_monitor_eval_on_a_small_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "eval"
    code = cli_main(["monitor-eval", "--dataset", "wine", "--max-leaf-nodes", "12", "--strategies",
                     "benign,random,pathfinding,colluding,sybil,adaptive", "--benign-users", "6", "--accounts", "3",
                     "--budget", "300", "--sybil-queries", "20", "--adaptive-accounts", "1,3", "--out", str(out)])  # fmt: skip
    assert code == 0
    table = capsys.readouterr().out
    assert "| pathfinding | combined |" in table and "acceptance:" in table and "None" not in table
    summary = check_outputs(out, ["benign", "random", "pathfinding", "colluding", "sybil", "adaptive"])
    # The adaptive attacker: one row per k, each knowing the threshold; one account alone
    # retires before it holds the model, and what it holds when first warned is reported.
    ad = summary["strategies"]["adaptive"]["runs"]
    assert [r["accounts"] for r in ad] == [1, 3] and "| 3 |" in table
    assert ad[0]["accounts_retired"] == 1 and ad[0]["final_extent"] < 1.0
    assert all(r["warned_at"] is None or r["extent_at_warning"] is not None for r in ad)
    assert summary["model"]["leaves"] >= 5  # wine grows 7 pure leaves under this cap
    col = summary["strategies"]["colluding"]
    assert all(s["coverage_mass"] < col["group_status"]["coverage_mass"] for s in col["member_status"].values())
    assert summary["strategies"]["sybil"]["grouped_as"] is not None
    assert summary["strategies"]["benign"]["evaluation"]["prada_alarms"] == 0


@pytest.mark.parametrize("dataset", [pytest.param(d, marks=shared_marks(d), id=d.stem) for d in (GERMAN, ADULT)])
def test_monitor_eval_on_german_and_adult(tmp_path: Path, dataset: Path) -> None:
    out = tmp_path / dataset.stem
    # The default tree size (the defaults were calibrated on it), a smaller population.
    strategies = STRATEGIES[dataset.stem]
    assert cli_main(["monitor-eval", "--dataset", str(dataset), "--benign-users", "12", "--strategies", ",".join(strategies),
                     "--budget", "600", "--reference-queries", "1722", "--out", str(out)]) == 0  # fmt: skip
    summary = check_outputs(out, list(strategies))
    assert_acceptance(summary)
    if "pathfinding" in strategies:
        assert summary["acceptance"]["pathfinding_within_10x_reference"]


# Adult's held-out set is 8,141 rows (every refit, and the truth at every status point, is
# scored on it): there, no path-finding (German runs it, and the sybil attack) to keep the
# test short; the full evaluation in docs/monitor.md runs every strategy on Adult.
STRATEGIES = {"german": ("benign", "random", "pathfinding", "sybil", "natural"),
              "adult": ("benign", "random", "natural")}  # fmt: skip


def test_calibration_metrics_by_hand() -> None:
    # Two classes: balanced fidelity 0.5 is a constant copy (extent 0), 1.0 an exact one.
    assert extent(0.5, 2) == 0.0 and extent(1.0, 2) == 1.0 and extent(0.75, 2) == 0.5 and extent(0.4, 2) == 0.0
    status = [(25, {"ig": 0.1, "coverage_volume": 0.2, "coverage_mass": 0.3, "fidelity": 0.2, "combined": 0.3, "prada": 0.0, "ood": 0.0}),
              (50, {"ig": 0.6, "coverage_volume": 0.6, "coverage_mass": 0.6, "fidelity": 0.2, "combined": 0.6, "prada": 0.5, "ood": 0.9})]  # fmt: skip
    truth = [(10, 0.6), (40, 0.7), (80, 0.95)]  # extents 0.2, 0.4, 0.9
    r = analyse_curve(SubjectCurve("x", "u", status, truth), dict.fromkeys(status[0][1], 0.5), margin=0.1, k=2, delta=0.8)
    cm = r["methods"]["coverage_mass"]
    assert cm["first_warning"] == 50 and cm["extent_at_warning"] == pytest.approx(0.4)
    assert cm["warning_right"] is True  # 0.4 >= 0.5 - 0.1
    assert cm["lead"] == 80 - 50 and r["queries_to_bf_090"] == 80
    assert cm["calibration_error"] == pytest.approx((abs(0.3 - 0.2) + abs(0.6 - 0.4)) / 2)
    assert r["methods"]["fidelity"]["first_warning"] is None and r["methods"]["fidelity"]["lead"] is None
    assert r["prada_alarm_at"] == 50 and r["ood_alarm_at"] == 50
    assert cm["max_below_truth"] == pytest.approx(0.0)  # 0.3 >= 0.2, 0.6 >= 0.4
    assert r["methods"]["fidelity"]["max_below_truth"] == pytest.approx(0.2)  # 0.2 against 0.4 at 50
    # With the truth computed at the status points themselves, that truth is read instead.
    aligned = analyse_curve(SubjectCurve("x", "u", status, truth, aligned=[(25, 0.75), (50, 0.8)]),
                            dict.fromkeys(status[0][1], 0.5), margin=0.1, k=2, delta=0.8)  # fmt: skip
    assert aligned["methods"]["coverage_mass"]["calibration_error"] == pytest.approx((0.2 + 0.0) / 2)
    assert aligned["methods"]["ig"]["max_below_truth"] == pytest.approx(0.4)  # 0.1 against 0.5 at 25
    strict = analyse_curve(SubjectCurve("x", "u", status, truth), dict.fromkeys(status[0][1], 0.5), margin=0.05, k=2, delta=0.8)
    assert strict["methods"]["coverage_mass"]["warning_right"] is False


def test_monitor_eval_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["monitor-eval", "--dataset", "nosuch", "--out", str(tmp_path / "x")]) == 2
    assert cli_main(["monitor-eval", "--dataset", "wine", "--strategies", "magic", "--out", str(tmp_path)]) == 2
    assert cli_main(["monitor-eval", "--dataset", "wine", "--accounts", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and "nosuch" in err[0] and "magic" in err[1] and "--accounts" in err[2]


def _run_on_a_terminal(args: list[str]) -> str:
    """Run ``analysim`` with its stderr on a real pseudo-terminal; what the terminal got."""
    import fcntl
    import os
    import struct
    import subprocess
    import sys
    import termios

    master, slave = os.openpty()
    # A terminal of 100 columns (a fresh pseudo-terminal has none, and tqdm draws nothing on it).
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    try:
        proc = started(subprocess.Popen([sys.executable, "-m", "analysim", *args], stdout=subprocess.DEVNULL, stderr=slave,
                                        stdin=subprocess.DEVNULL))  # fmt: skip
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        assert proc.wait(timeout=scaled(300)) == 0
    finally:
        os.close(master)
    return b"".join(chunks).decode(errors="replace")


def test_monitor_eval_shows_progress_on_a_terminal_unless_told_not_to(tmp_path: Path) -> None:
    args = ["monitor-eval", "--dataset", "wine", "--max-leaf-nodes", "4", "--strategies", "random", "--budget", "30"]
    shown = _run_on_a_terminal([*args, "--out", str(tmp_path / "a")])
    assert "strategy" in shown and "\r" in shown  # a tqdm bar: unit "strategy", redrawn in place
    quiet = _run_on_a_terminal([*args, "--no-progress", "--out", str(tmp_path / "b")])
    assert "strategy" not in quiet and "random: 30 queries" in quiet  # the per-strategy lines stay


def test_natural_sybil_is_pooled_offline_and_by_the_young_accounts_pool(tmp_path: Path) -> None:
    """Accounts too short to be evaluated alone: none is, and auto:young (every row of an
    account before its first evaluation) holds what they hold pooled offline, or more (the
    monitor's copies include the offline ones: the same rows, the same reconstructions)."""
    out = tmp_path / "eval"
    assert cli_main(["monitor-eval", "--dataset", "iris", "--strategies", "natural_sybil", "--natural-sybil-accounts", "12",
                     "--no-progress", "--out", str(out)]) == 0  # fmt: skip
    ns = json.loads((out / "summary.json").read_text())["strategies"]["natural_sybil"]
    assert ns["accounts"] == 12 and ns["rows_per_account"] == 9 and ns["queries_used"] == 108
    assert ns["accounts_evaluated"] == 0 and ns["max_account_status"] == 0.0
    assert ns["pools"]["auto:young"]["n_queries"] == 108 and ns["pools"]["auto:model"]["n_queries"] == 108
    assert ns["pools"]["auto:young"]["best_copy"] >= ns["pooled_extent_offline"] - 0.05 > 0.0
    assert "natural_sybil: 12 accounts x 9 rows" in (out / "table.md").read_text()
