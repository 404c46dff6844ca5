"""The attack suite as real HTTP clients of a real gateway: pathfinding (Tramèr et al.,
Algorithm 1) extracts every leaf exactly, colluding splits the same queries over K
accounts, budgets hold, and ``analysim attack`` works end to end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from analysim.cli import main as cli_main
from mlaas_monitor.datasets import load_dataset
from mlaas_monitor.model import Model, Policy
from mlaas_monitor.monitor.attacks import Domain, Oracle, Pathfinding, agreement, run_benign, run_random
from mlaas_monitor.training import train_model
from mlaas_monitor.tree import Tree
from tests.test_gateway_helpers import Running, credit_csv, credit_model, running_gateway

LEAF = Policy(reveal_leaf=True)
CONF = Policy(reveal_confidence=True, confidence_decimals=6)


def wine_model() -> Model:
    return train_model(load_dataset("wine"), "wine", max_leaf_nodes=8, seed=0)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    db = tmp_path_factory.mktemp("attack") / "store.db"
    with running_gateway(db, [credit_model(), wine_model()], policies={"credit": LEAF, "wine": LEAF}) as r:
        yield r


def owner_truth(model: Model, X: np.ndarray) -> list[str]:
    return [str(model.classes[i]) for i in model.answer(X).labels.tolist()]


def domain_points(model: Model, n: int, seed: int) -> np.ndarray:
    info = model.public()
    return Domain.from_public(info["features"]).uniform(np.random.default_rng(seed), n)


@pytest.mark.parametrize("model", [credit_model(), wine_model()], ids=["credit-mixed", "wine-continuous"])
def test_pathfinding_extracts_every_leaf(gw: Running, model: Model) -> None:
    oracle = Oracle.connect(f"http://127.0.0.1:{gw.port}", [gw.new_key(f"pf-{model.id}")], model.id, None)
    rebuilt = Pathfinding(oracle, seed=1).run()
    assert len(rebuilt.leaves) == model.tree.n_leaves
    # Exact on the held-out rows and on fresh points anywhere in the domain.
    assert agreement(rebuilt, model.validation_X, owner_truth(model, model.validation_X)) == 1.0
    pts = domain_points(model, 500, 2)
    assert agreement(rebuilt, pts, owner_truth(model, pts)) >= 0.99
    assert oracle.queries == gw.gw.store.usage(f"pf-{model.id}")[0][2]


def test_pathfinding_with_confidences_as_leaf_identities(tmp_path: Path) -> None:
    # BigML-style: no leaf ids, label + confidence only; distinct per leaf on this tree.
    model = train_model(load_dataset("iris"), "iris", max_depth=3, seed=0)
    labels, conf = model.node_answers
    idents = {(int(labels[i]), round(float(conf[i]), 6)) for i in model.tree.leaves}
    assert len(idents) == model.tree.n_leaves, "the test needs distinct confidences per leaf"
    with running_gateway(tmp_path / "s.db", [model], policies={"iris": CONF}) as r:
        oracle = Oracle.connect(f"http://127.0.0.1:{r.port}", [r.new_key("bigml")], "iris", None)
        rebuilt = Pathfinding(oracle, seed=0).run()
    assert len(rebuilt.leaves) == model.tree.n_leaves
    assert agreement(rebuilt, model.validation_X, owner_truth(model, model.validation_X)) == 1.0


def test_colluding_pathfinding_splits_the_same_queries(gw: Running) -> None:
    url = f"http://127.0.0.1:{gw.port}"
    solo = Oracle.connect(url, [gw.new_key("solo-wine")], "wine", None)
    Pathfinding(solo, seed=5).run()
    names = [f"col-wine-{i}" for i in range(3)]
    ring = Oracle.connect(url, [gw.new_key(n) for n in names], "wine", None)
    rebuilt = Pathfinding(ring, seed=5).run()
    assert ring.queries == solo.queries
    assert np.array_equal(np.concatenate(ring.log_X), np.concatenate(solo.log_X))
    rows = [gw.gw.store.usage(n)[0][2] for n in names]
    assert sum(rows) == ring.queries and min(rows) > 0
    assert len(rebuilt.leaves) == wine_model().tree.n_leaves


def test_budgets_hold_for_benign_and_random(gw: Running) -> None:
    url = f"http://127.0.0.1:{gw.port}"
    m = credit_model()
    o = Oracle.connect(url, [gw.new_key("rand")], "credit", 57)
    t = run_random(o, seed=0)
    assert o.queries == 57 == gw.gw.store.usage("rand")[0][2]
    assert len(t.labels) == 57
    o = Oracle.connect(url, [gw.new_key("benign")], "credit", None)
    run_benign(o, m.validation_X, seed=0)
    assert o.queries == m.validation_X.shape[0]  # each held-out row once
    o = Oracle.connect(url, [gw.new_key("pf-budget")], "credit", 20)
    Pathfinding(o).run()
    assert o.queries == 20


def test_attack_cli(gw: Running, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{gw.port}"
    keys = [gw.new_key(f"cli-{i}") for i in range(2)]
    out = tmp_path / "rebuilt.json"
    argv = ["attack", "--gateway", url, "--model", "credit", "--strategy", "colluding", "--accounts", "2",
            "--key", keys[0], "--key", keys[1], "--out", str(out)]  # fmt: skip
    assert cli_main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["leaves_found"] == credit_model().tree.n_leaves and result["accounts"] == 2
    assert json.loads(out.read_text())["kind"] == "leaf_boxes"
    tree_out = tmp_path / "tree.json"
    assert cli_main(["attack", "--gateway", url, "--model", "credit", "--strategy", "benign", "--key", keys[0],
                     "--dataset", str(credit_csv()), "--budget", "30", "--out", str(tree_out)]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["queries_used"] == 30
    # A strategy that fits a tree on its answers writes that tree, its classes naming its class indices.
    written = json.loads(tree_out.read_text())
    copy = Tree.from_dict(written["tree"], len(written["features"]))
    assert written["kind"] == "tree" and set(written["classes"]) <= {str(c) for c in credit_model().classes}
    assert copy.value.shape[1] <= len(written["classes"])


def test_attack_cli_adaptive_strategies(gw: Running, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{gw.port}"
    base = ["attack", "--gateway", url, "--model", "credit"]
    # sybil: each key sends at most --per-account rows, then the next takes over
    keys = [gw.new_key(f"sy-{i}") for i in range(40)]
    argv = [*base, "--strategy", "sybil", "--per-account", "15", *(x for k in keys for x in ("--key", k))]
    assert cli_main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["leaves_found"] == credit_model().tree.n_leaves
    assert result["accounts"] == -(-result["queries_used"] // 15)
    used = {u["user"]: u["rows_used"] for u in gw.admin.get("/v1/admin/users")[1]["users"]}
    assert max(used[f"sy-{i}"] for i in range(40)) <= 15
    # confidence: leaves read from label + confidence; slow: one row per request
    for strategy, extra in (("confidence", []), ("slow", ["--pause", "0"]), ("natural", ["--dataset", str(credit_csv())])):
        assert cli_main([*base, "--strategy", strategy, "--key", gw.new_key(f"ad-{strategy}"), "--budget", "60", *extra]) == 0
        assert json.loads(capsys.readouterr().out)["queries_used"] <= 60


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--key", "ak_wrong", "--strategy", "random"], "401"),
        (["--strategy", "random"], "--key"),
        (["--key", "k", "--strategy", "colluding"], "--accounts"),
        (["--key", "k", "--strategy", "random", "--accounts", "3"], "--accounts 3"),
        (["--strategy", "benign", "--key", "KEY"], "--dataset"),
    ],
)
def test_attack_cli_errors_are_one_line(
    gw: Running, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    extra = [gw.new_key(f"e{abs(hash(tuple(extra)))}") if v == "KEY" else v for v in extra]
    code = cli_main(["attack", "--gateway", f"http://127.0.0.1:{gw.port}", "--model", "credit", *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err
