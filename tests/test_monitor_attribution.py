"""``monitor-eval``'s attribution experiment: an adaptive coalition and a benign population on
one model at once, the pool response on; the accounts the monitor acted on, split by side,
recounted here from the monitor's own action log in the run's SQLite store."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from analysim.cli import main as cli_main
from mlaas_monitor.monitor.attribution import (
    ATTRIBUTION_MODELS,
    LATE_DILUTION,
    LATE_PROBES,
    arrival_order,
    count,
    rule_of,
)


def test_attribution_on_a_small_tree_matches_the_action_log(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    assert cli_main(["monitor-eval", "--dataset", "wine", "--max-leaf-nodes", "12", "--strategies", "attribution",
                     "--attribution-accounts", "3", "--benign-users", "10", "--no-progress", "--out", str(out)]) == 0  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    rows = summary["attribution"]
    assert [(r["model"], r["new_accounts"]) for r in rows] == [(m, on) for on, m in ATTRIBUTION_MODELS.items()]
    table = (out / "table.md").read_text()
    assert "Attribution (an adaptive coalition" in table
    for row, tag in zip(rows, ("", "n"), strict=True):
        assert row["attacker_accounts"] == 3 + 1 and row["benign_accounts"] == 10 and row["response"] == "degrade"
        with sqlite3.connect(out / "store.db") as db:
            acted = {u for (u,) in db.execute("SELECT DISTINCT user FROM monitor_actions WHERE model=? AND action != 'none'",
                                              (row["model"],))}  # fmt: skip
            benign_rows = db.execute("SELECT SUM(n_rows) FROM query_log WHERE model=? AND \"user\" LIKE ?",
                                     (row["model"], f"mixed{tag}-%")).fetchone()[0]  # fmt: skip
        attacker = {u for u in acted if u.startswith(f"coalition{tag}3-")}  # the late account's too
        benign = {u for u in acted if u.startswith(f"mixed{tag}-")}
        assert attacker | benign == acted  # nobody else sent to this model
        assert row["acted_on_attacker"] == len(attacker) >= 1  # the pool warned and the response acted on the coalition
        assert row["acted_on_benign"] == len(benign) and row["benign_acted_on"] == sorted(benign)
        assert row["benign_share"] == pytest.approx(len(benign) / 10)
        assert row["attacker_share"] == pytest.approx(len(attacker) / len(acted))
        assert sum(row["benign_reasons"].values()) == len(benign)
        assert row["benign_told_labels_only"] <= len(benign)
        assert benign_rows == row["benign_rows"]  # every benign row was sent, none lost
        assert f"| 3 | {'on' if row['new_accounts'] else 'off'} | {row['attacker_queries']} | 10 (" in table
    # Customers signing up while the warning stands are not acted on for being new, with the
    # rule or without it; the coalition's late account, signed up then, is, once its rows
    # join the pool (its probes diluted under the extracting rule's share: without the new-
    # account rule, by another rule if at all).
    on, off = rows
    assert on["late_during_warning"] and on["late_queries"] > 0
    # (The evaluation that pools its first rows may also rank it among the top contributors,
    # whose reason the response gives first: either way the pool response acted on it.)
    assert on["late_acted_on_as"] is not None
    assert on["late_acted_on_as"].startswith(("new account whose rows join auto:pool", "auto:pool contributor"))
    assert on["late_probes_in_full"] <= on["late_probes"] <= LATE_PROBES  # how many got through: the monitor's lag
    assert on["late_queries"] == (1 + LATE_DILUTION) * on["late_probes"]
    assert off["late_acted_on_as"] is None or not off["late_acted_on_as"].startswith("new account")
    # Acted on by the decision that first sees its rows pooled, the reason counting them (all
    # logged by then). Without the rule, if at all, once it ranks among the contributors: that
    # can be the same decision, and where the monitor's decisions fall in the log depends on
    # its pace against the sender's, so the two runs are not compared in rows.
    assert 0 < on["late_acted_on_after"] <= on["late_queries"]
    if share := re.search(r"\((\d+) of its (\d+) rows pooled\)", on["late_acted_on_as"]):
        assert 1 <= int(share[1]) <= int(share[2]) <= on["late_acted_on_after"]
    for row in rows:
        assert "new account" not in row["benign_reasons"]
    assert "| 3 | on |" in table and f"| {rule_of(on['late_acted_on_as'])} |" in table


def test_count_splits_by_side_and_checks_what_the_clients_saw() -> None:
    actions = [{"user": "a-1", "action": "degrade", "reason": "auto:pool contributor #1: ..."},
               {"user": "a-1", "action": "none", "reason": "lifted"},
               {"user": "b-1", "action": "none", "reason": "lifted"},
               {"user": "b-2", "action": "degrade", "reason": "new account while auto:pool's warning stands"},
               {"user": "b-2", "action": "degrade", "reason": "auto:pool contributor #2: ..."}]  # fmt: skip
    r = count(actions, ["a-1", "a-2"], ["b-1", "b-2", "b-3", "b-4"], {"b-2"})
    assert (r["acted_on_attacker"], r["acted_on_benign"]) == (1, 1)
    assert r["attacker_share"] == 0.5 and r["benign_share"] == 0.25
    assert r["benign_reasons"] == {"new account": 1}  # its first action's reason
    with pytest.raises(ValueError, match="neither side"):
        count([{"user": "c-1", "action": "refuse", "reason": "x"}], ["a-1"], ["b-1"], set())
    with pytest.raises(ValueError, match="without a logged action"):
        count(actions, ["a-1"], ["b-1", "b-2"], {"b-1"})


def test_benign_accounts_arrive_over_the_whole_stream() -> None:
    vols = np.array([5, 40, 12, 7, 30] * 20)
    order = arrival_order(np.random.default_rng(0), vols)
    assert np.bincount(order).tolist() == vols.tolist()
    first = [order.index(u) for u in range(vols.size)]
    assert min(first) < 0.1 * len(order) and max(first) > 0.8 * len(order)
