"""Output post-processing as a defence, end to end: the gateway applies top-k confidences
and noise on confidences over REST and gRPC (and an idempotent replay repeats them), the
store keeps them (a version-3 store is migrated), and the monitor reads what each policy lets
a subject tell apart. Also the status's own rules that the policies exercise: path-finding's
boxes where leaves share an identity (the star copy), a running maximum (a copy built once
stays built), and the first evaluation at ``first_eval`` queries."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest

from analysim._protos.v1 import prediction_pb2 as pb
from analysim._protos.v1 import prediction_pb2_grpc as pb_grpc
from mlaas_monitor.datasets import load_dataset
from mlaas_monitor.model import Answer, Model, Policy
from mlaas_monitor.monitor.attacks import (
    Domain,
    Oracle,
    Pathfinding,
    TreeRebuild,
    balanced_fidelity,
    box_copies,
    confidence_identity,
    star_boxes_from_log,
)
from mlaas_monitor.monitor.config import MonitorConfig
from mlaas_monitor.monitor.core import ModelMonitor
from mlaas_monitor.monitor.curves import SubjectCurve, running_max
from mlaas_monitor.monitor.infogain import extent
from mlaas_monitor.store import Store
from mlaas_monitor.store_schema import SCHEMA_VERSION
from mlaas_monitor.training import encode_dataset, holdout_split
from tests.test_attack_strategies import wine_model
from tests.test_gateway_helpers import Running, iris_model, running_gateway

TOP2 = Policy(top_k=2, confidence_decimals=3)
NOISY = Policy(confidence_noise=0.05, noise_seed=11, confidence_decimals=4, top_k=3)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    db = tmp_path_factory.mktemp("policies") / "s.db"
    models = [iris_model(), replace(iris_model("noisy"))]
    with running_gateway(db, models, policies={"iris": TOP2, "noisy": NOISY}) as r:
        yield r


def iris_rows(n: int) -> list[list[float]]:
    return iris_model().validation_X[:n].tolist()


def test_top_k_over_rest_grpc_and_a_replay(gw: Running) -> None:
    c = gw.new_user("topk")
    status, body = c.post("/v1/models/iris/predict", {"rows": iris_rows(12)})
    assert status == 200
    model = iris_model()
    P = model.tree.value[model.answer(model.validation_X[:12]).leaves]
    for p, probs in zip(body["predictions"], P, strict=True):
        assert len(p["top"]) == 2 and p["top"][0] == {"label": p["label"], "confidence": p["confidence"]}
        # The second most probable class and its probability, rounded as the policy says.
        second = int(np.argsort(-probs, kind="stable")[1])
        assert p["top"][1] == {"label": model.classes[second], "confidence": round(float(probs[second]), 3)}
    with grpc.insecure_channel(gw.thread.grpc_target) as ch:
        rows = [pb.Row(values=[pb.Value(number=v) for v in r]) for r in iris_rows(12)]
        resp = pb_grpc.PredictionServiceStub(ch).Predict(pb.PredictRequest(model_id="iris", rows=rows),
                                                         metadata=(("authorization", f"Bearer {c.key}"),))  # fmt: skip
    assert [[(t.label, t.confidence) for t in p.top] for p in resp.predictions] == [
        [(str(t["label"]), t["confidence"]) for t in p["top"]] for p in body["predictions"]]  # fmt: skip
    # A retry with the same Idempotency-Key is answered from the log, ranked list included.
    first = c.post("/v1/models/iris/predict", {"rows": iris_rows(3)}, headers={"Idempotency-Key": "k-1"})[1]
    again = c.post("/v1/models/iris/predict", {"rows": iris_rows(3)}, headers={"Idempotency-Key": "k-1"})[1]
    assert again == first and "top" in again["predictions"][0]


def test_noise_over_rest_is_per_row_and_logged_as_told(gw: Running) -> None:
    c = gw.new_user("noise")
    rows = iris_rows(30)
    a = c.post("/v1/models/noisy/predict", {"rows": rows})[1]["predictions"]
    b = c.post("/v1/models/noisy/predict", {"rows": rows[::-1]})[1]["predictions"][::-1]
    assert a == b  # the same row, the same answer, whatever the batch
    model = iris_model()
    leaves = model.answer(model.validation_X[:30]).leaves
    by_leaf: dict[int, set[float]] = {}
    for lf, p in zip(leaves.tolist(), a, strict=True):
        by_leaf.setdefault(lf, set()).add(p["confidence"])
        assert p["label"] in model.classes and 0 <= p["confidence"] <= 1
        assert abs(sum(t["confidence"] for t in p["top"]) - 1) <= 3 * 0.5e-4  # all three classes, 4 decimals
    assert any(len(v) > 1 for v in by_leaf.values())  # a leaf's rows are told different confidences
    # The query log holds what the user was told: what the monitor folds is that.
    events = gw.store.events_after(0, "noisy")
    told = [e for e in events if e.user == "noise"]
    np.testing.assert_array_equal(told[0].confidences, [p["confidence"] for p in a])


def test_the_policy_survives_a_restart_and_a_version_3_store_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    s = Store(db)
    s.add_model(replace(iris_model(), policy=NOISY))
    s.close()
    s = Store(db)
    assert s.policies()["iris"] == NOISY and s.load_model("iris").policy == NOISY  # type: ignore[union-attr]
    s.close()
    con = sqlite3.connect(db)  # back to version 3's layout: no post-processing columns
    for col in ("top_k", "confidence_noise", "noise_seed"):
        con.execute(f"ALTER TABLE models DROP COLUMN {col}")
    con.execute("UPDATE meta SET value='3' WHERE key='schema_version'")
    con.commit()
    con.close()
    s = Store(db)
    p = s.policies()["iris"]
    assert (p.top_k, p.confidence_noise, p.noise_seed) == (1, 0.0, 0)  # as before the migration: no post-processing
    s.set_policy("iris", TOP2)
    assert s.load_model("iris").policy == TOP2  # type: ignore[union-attr]
    s.close()
    con = sqlite3.connect(db)
    assert con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    con.close()


def test_the_monitor_reads_what_each_policy_tells_apart() -> None:
    model = wine_model()  # three classes: a top-2 list tells more than the label's confidence
    one = ModelMonitor(replace(model, policy=Policy(confidence_decimals=1)))
    two = ModelMonitor(replace(model, policy=Policy(confidence_decimals=1, top_k=2)))
    leaf = ModelMonitor(replace(model, policy=Policy(reveal_leaf=True)))
    assert one.identities is not None and two.identities is not None and leaf.identities is not None
    assert one.identities.n_groups <= two.identities.n_groups <= leaf.identities.n_groups == model.tree.n_leaves
    # Exactly what the answers distinguish: leaves told the same (label, top-2 list) share an identity.
    nodes = two.regions.leaf_nodes
    served = replace(model, policy=Policy(confidence_decimals=1, top_k=2))
    labels, conf = served.node_answers
    told = [confidence_identity(p) for p in served.render(Answer(labels[nodes], conf[nodes], nodes))]
    index: dict[object, int] = {}
    expect = [index.setdefault(t, len(index)) for t in told]
    np.testing.assert_array_equal(two.identities.group, expect)
    # Noise without leaf ids: no identity finer than the label; the copy is the tree refit.
    assert ModelMonitor(replace(model, policy=Policy(confidence_noise=0.05))).identities is None
    assert ModelMonitor(replace(model, policy=Policy(confidence_noise=0.05, reveal_leaf=True))).identities is not None


@pytest.fixture(scope="module")
def merged_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Model, Oracle]:
    """Path-finding on a tree whose leaves share (label, 1-decimal confidence), from a start
    whose log has copies that get worse as boxes are added (wine, seed 0)."""
    model = replace(wine_model(), policy=Policy(confidence_decimals=1))
    labels, conf = model.node_answers
    leaves = np.flatnonzero(model.tree.left < 0)
    keys = {(int(labels[n]), round(float(conf[n]), 1)) for n in leaves}
    assert len(keys) < leaves.shape[0]  # identities merge leaves: the case the star copy is for
    with running_gateway(tmp_path_factory.mktemp("merged") / "s.db", [model], policies={model.id: model.policy}) as r:
        oracle = Oracle.connect(f"http://127.0.0.1:{r.port}", [r.new_key("pf")], model.id, None)
        Pathfinding(oracle, seed=0).run()
        oracle.close()
    return model, oracle


def test_star_copy_is_path_findings_boxes_where_leaves_share_an_identity(merged_log: tuple[Model, Oracle]) -> None:
    model, oracle = merged_log
    X = np.concatenate(oracle.log_X)
    index = {str(c): i for i, c in enumerate(model.classes)}
    y = np.array([index[str(v)] for v in oracle.log_labels])
    S = model.validation_X
    truth = [str(model.classes[i]) for i in model.answer(S).labels.tolist()]
    k = len(model.classes)
    for n in (30, X.shape[0] // 3, 2 * X.shape[0] // 3, X.shape[0]):
        # Fresh each time (no running maximum): the status at n equals the best of the
        # attacker's own copies from exactly the first n answers, the star boxes included.
        mon = ModelMonitor(model)
        s = mon.ingest("u", X[:n], y[:n], 1)
        mon.evaluate(s, None, 0.0, refit=True)
        copies = [TreeRebuild(X[:n], oracle.log_labels[:n]),
                  *box_copies(oracle.domain, X[:n], oracle.log_labels[:n], oracle.log_ident[:n])]  # fmt: skip
        best = max(extent(balanced_fidelity(c, S, truth), k) for c in copies if c is not None)
        assert s.status["best_copy"] == pytest.approx(best, abs=1e-9), n
    star = star_boxes_from_log(oracle.domain, X, oracle.log_labels, oracle.log_ident)
    assert star is not None and len(star.leaves) == len(set(oracle.log_ident))


def test_best_copy_is_a_running_maximum_and_first_evaluated_at_first_eval(merged_log: tuple[Model, Oracle]) -> None:
    model, oracle = merged_log
    mon = ModelMonitor(model, MonitorConfig())
    fresh = ModelMonitor(model, MonitorConfig())
    index = {str(c): i for i, c in enumerate(model.classes)}
    hist: list[tuple[int, float, float]] = []
    sent = 0
    for X, labels in zip(oracle.log_X, _chunks(oracle), strict=True):
        y = np.array([index[str(v)] for v in labels])
        sent += X.shape[0]
        mon.ingest("u", X, y, sent)
        evs, _ = mon.evaluate_due({"u"}, {}, 0.0)
        for e in (e for e in evs if e.subject == "u"):  # (the pools are evaluated too)
            # The copy from exactly these answers, with nothing remembered.
            f = fresh.user(f"at-{e.n_queries}")
            fresh.ingest(f.name, np.concatenate(oracle.log_X)[: e.n_queries], np.array(
                [index[str(v)] for v in oracle.log_labels[: e.n_queries]]), 1)  # fmt: skip
            fresh.evaluate(f, None, 0.0, refit=True)
            hist.append((e.n_queries, e.status["best_copy"], f.status["best_copy"]))
    # first at first_eval, then at min_refit (and between, when an answer shows a new leaf)
    assert hist[0][0] == 10 and 25 in {n for n, _, _ in hist}
    values = [v for _, v, _ in hist]
    assert values == sorted(values)  # never down
    best = 0.0
    for _, v, now in hist:
        best = max(best, now)
        assert v == pytest.approx(best, abs=1e-9)  # the best of the copies so far, no more
    assert any(now < v - 1e-9 for _, v, now in hist), "the log should show a copy that got worse"


def _chunks(oracle: Oracle) -> list[list[object]]:
    out, i = [], 0
    for X in oracle.log_X:
        out.append(oracle.log_labels[i : i + X.shape[0]])
        i += X.shape[0]
    return out


def test_truth_is_the_best_copy_so_far() -> None:
    assert running_max([(1, 0.2), (2, 0.5), (3, 0.4), (4, 0.6)]) == [(1, 0.2), (2, 0.5), (3, 0.5), (4, 0.6)]
    c = SubjectCurve("s", "u", [], [(5, 0.9), (15, 0.7)], aligned=[(10, 0.3), (20, 0.2)])
    # At the status points, over the status points only; the attack's own curve, over its own.
    assert (c.aligned, c.truth, c.pointwise) == ([(10, 0.3), (20, 0.3)], [(5, 0.9), (15, 0.9)], [(10, 0.3), (20, 0.2)])


def test_star_boxes_are_scored_on_the_rows_as_sent() -> None:
    # Customer rows (wine's training rows) share values with S: box edges rounded to float32
    # (T_u's copy of the queries) would miss them and score another copy than the attacker's.
    model = replace(wine_model(), policy=Policy(reveal_leaf=True))
    _, X_all, _, y_all = encode_dataset(load_dataset("wine"))
    train = holdout_split(X_all, y_all, 0)[0]
    dom = Domain.from_public(model.public()["features"])
    S = model.validation_X
    truth = [str(model.classes[i]) for i in model.answer(S).labels.tolist()]
    rng = np.random.default_rng(3)
    for _ in range(5):
        X = train[rng.permutation(train.shape[0])[:10]]
        ans = model.answer(X)
        labels = [model.classes[i] for i in ans.labels.tolist()]
        mon = ModelMonitor(model)
        s = mon.ingest("u", X, ans.labels, 1)
        mon.evaluate(s, None, 0.0, refit=True)
        copies = [TreeRebuild(X, labels), *box_copies(dom, X, labels, [("leaf", int(v)) for v in ans.leaves])]
        best = max(extent(balanced_fidelity(c, S, truth), 3) for c in copies if c is not None)
        assert s.status["best_copy"] == pytest.approx(best, abs=1e-9)
