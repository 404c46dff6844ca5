"""The status with a stated meaning (``best_copy``): the extent of the best copy a subject
can build from exactly what it was answered. Checked against the attack suite's own copies
(built independently, from the HTTP answers, by attacks.py) on a real gateway's answers, and
Quiring et al.'s closeness to the boundary on the same streams."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mlaas_monitor.datasets import load_dataset
from mlaas_monitor.model import Model
from mlaas_monitor.monitor.attacks import Oracle, Pathfinding, TreeRebuild, balanced_fidelity, box_copies
from mlaas_monitor.monitor.boundary import BOUNDARY_ALARM, BoundaryState
from mlaas_monitor.monitor.core import ModelMonitor
from mlaas_monitor.monitor.infogain import extent
from mlaas_monitor.training import encode_dataset, holdout_split
from tests.test_attack_strategies import LEAF, wine_model
from tests.test_gateway_helpers import credit_model, running_gateway


@pytest.fixture(scope="module", params=["wine", "credit"])
def pathfinding_log(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Model, Oracle]:
    # wine: continuous features only; credit: categorical, whole-valued and continuous ones.
    model = replace(wine_model() if request.param == "wine" else credit_model(), policy=LEAF)
    with running_gateway(tmp_path_factory.mktemp("status") / "s.db", [model], policies={model.id: LEAF}) as r:
        oracle = Oracle.connect(f"http://127.0.0.1:{r.port}", [r.new_key("pf")], model.id, None)
        Pathfinding(oracle, seed=3).run()
        oracle.close()
    return model, oracle


def monitor_status(model: Model, X: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    mon = ModelMonitor(model)
    s = mon.ingest("u", X, labels, 1)
    mon.evaluate(s, None, 0.0, refit=True)
    return s.status


def test_best_copy_is_the_attackers_best_copy_all_along(pathfinding_log: tuple[Model, Oracle]) -> None:
    model, oracle = pathfinding_log
    X = np.concatenate(oracle.log_X)
    index = {str(c): i for i, c in enumerate(model.classes)}
    y = np.array([index[str(v)] for v in oracle.log_labels])
    S = model.validation_X
    truth = [str(model.classes[i]) for i in model.answer(S).labels.tolist()]
    k = len(model.classes)
    for n in (30, X.shape[0] // 4, X.shape[0] // 2, X.shape[0]):
        copies = [TreeRebuild(X[:n], oracle.log_labels[:n]),
                  *box_copies(oracle.domain, X[:n], oracle.log_labels[:n], oracle.log_ident[:n])]  # fmt: skip
        best = max(extent(balanced_fidelity(c, S, truth), k) for c in copies if c is not None)
        assert monitor_status(model, X[:n], y[:n])["best_copy"] == pytest.approx(best, abs=1e-9), n
    # Path-finding ends with every leaf's box: the copy is exact, and the status says so.
    assert monitor_status(model, X, y)["best_copy"] == pytest.approx(1.0)


def test_labels_only_leave_the_tree_copy(pathfinding_log: tuple[Model, Oracle]) -> None:
    model, oracle = pathfinding_log
    X = np.concatenate(oracle.log_X)
    y = model.answer(X).labels
    hidden = replace(model, policy=replace(LEAF, reveal_leaf=False, reveal_confidence=False))
    st = monitor_status(hidden, X, y)
    assert st["best_copy"] == pytest.approx(st["fidelity"])  # no leaf identity: no box copy


def test_boundary_closeness_separates_line_searches_from_data_rows(pathfinding_log: tuple[Model, Oracle]) -> None:
    model, oracle = pathfinding_log
    if model.id != "wine":
        pytest.skip("the detector was designed on continuous features (docs/monitor.md)")
    mon = ModelMonitor(model)
    probes, natural = BoundaryState(), BoundaryState()
    mon.boundary.fold(probes, np.concatenate(oracle.log_X))
    _, X_all, _, y_all = encode_dataset(load_dataset("wine"))
    mon.boundary.fold(natural, holdout_split(X_all, y_all, 0)[0])  # the training rows: what customers send
    assert mon.boundary.status(probes) > BOUNDARY_ALARM > mon.boundary.status(natural)
    assert probes.done == oracle.queries and probes.counts is not None and probes.counts.sum() == oracle.queries

