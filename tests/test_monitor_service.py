"""The monitor inside a real gateway (127.0.0.1, ephemeral ports): admin API and its auth,
bad input, Prometheus text, groups, and enforcement over REST and gRPC."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from analysim._protos.v1 import prediction_pb2 as pb
from analysim._protos.v1 import prediction_pb2_grpc as pb_grpc
from analysim.rpc_status import refusal_of
from mlaas_monitor.model import Policy
from mlaas_monitor.monitor.client import local_monitor_extension
from mlaas_monitor.monitor.config import EXTENT_METHODS
from mlaas_monitor.monitor.core import ModelMonitor
from mlaas_monitor.monitor.pool import EXTRACTING_SHARE, REPEATED
from mlaas_monitor.server import GatewayThread
from mlaas_monitor.service import Gateway
from mlaas_monitor.store import Store
from tests.test_gateway_helpers import ADMIN_KEY, Client, credit_model, credit_rows, wait_until

_names = itertools.count()


class Env:
    def __init__(self, t: GatewayThread, store: Store) -> None:
        assert t.bound is not None
        self.t, self.store, self.port = t, store, t.bound.http_port
        self.admin = Client("127.0.0.1", self.port, ADMIN_KEY)

    def user(self, prefix: str = "u") -> tuple[str, Client]:
        name = f"{prefix}{next(_names)}"
        status, body = self.admin.post("/v1/admin/users", {"name": name})
        assert status == 200, body
        return name, Client("127.0.0.1", self.port, body["api_key"])

    def settle(self, name: str, n: int) -> dict[str, Any]:
        """Poll the admin API until the monitor has folded in ``n`` of the user's rows."""

        def seen() -> Any:
            status, body = self.admin.get(f"/v1/admin/monitor/credit/users/{name}")
            return body if status == 200 and body["n_queries"] >= n else None

        return wait_until(seen, what=f"the monitor to see {n} rows of {name}")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    db = tmp_path_factory.mktemp("monitor") / "store.db"
    store = Store(db)
    store.add_model(credit_model())
    store.set_policy("credit", Policy(reveal_leaf=True))
    with GatewayThread(Gateway(store, ADMIN_KEY), extensions=[local_monitor_extension()]) as t:
        yield Env(t, store)
    store.close()


ADMIN_ROUTES = [
    ("GET", "/v1/admin/monitor"), ("GET", "/v1/admin/monitor/credit"), ("GET", "/v1/admin/monitor/credit/config"),
    ("PUT", "/v1/admin/monitor/credit/config"), ("POST", "/v1/admin/monitor/credit/evaluate"),
    ("GET", "/v1/admin/monitor/credit/users/x"), ("GET", "/v1/admin/monitor/credit/groups/x"),
    ("GET", "/v1/admin/monitor/credit/subjects/x"), ("GET", "/v1/admin/warnings"), ("GET", "/v1/admin/groups"),
    ("POST", "/v1/admin/groups"), ("GET", "/v1/admin/groups/x"), ("DELETE", "/v1/admin/groups/x"),
    ("GET", "/v1/admin/monitor/credit/actions"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path"), ADMIN_ROUTES)
def test_every_monitor_route_needs_the_admin_key(env: Env, method: str, path: str) -> None:
    _, user = env.user()
    anon = Client("127.0.0.1", env.port)
    assert anon.request(method, path, {})[0] == 401
    assert Client("127.0.0.1", env.port, "ak_wrong").request(method, path, {})[0] == 401
    status, body = user.request(method, path, {})
    assert status == 403 and body["error"]["code"] == "forbidden"


def test_status_history_and_metrics_agree(env: Env) -> None:
    name, user = env.user()
    rows = credit_rows()
    for i in range(0, 120, 3):
        assert user.post("/v1/models/credit/predict", {"rows": rows[i : i + 3]})[0] == 200
    view = env.settle(name, 120)
    hist = view["history"]
    assert [p["n_queries"] for p in hist] == sorted(p["n_queries"] for p in hist) and hist[0]["n_queries"] == 12
    # then at >= min_refit (25) and on the schedule; between, when an answer shows a new leaf
    assert {27, 54, 81} <= {p["n_queries"] for p in hist}
    assert all(0.0 <= p[m] <= 1.0 for p in hist for m in ("ig", "coverage_volume", "coverage_mass", "fidelity"))
    assert hist[-1]["n_queries"] == view["evaluated_at"]
    status, text = env.admin.get("/metrics")
    assert status == 200
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    gauge = {(s.labels["subject"], s.labels["method"]): s.value for s in fams["analysim_extraction_status"].samples}
    for method, v in view["status"].items():
        assert gauge[(name, method)] == pytest.approx(v)
    hist_count = [s for s in fams["analysim_monitor_update_duration_seconds"].samples if s.name.endswith("_count")]
    assert hist_count and hist_count[0].value >= 1
    assert "analysim_extraction_warnings" in fams


def test_pools_and_exposure_are_listed_and_exported(env: Env) -> None:
    """The subjects pooled by what the rows are (auto:pool, auto:young) and the model's
    exposure: in the admin view, the status gauge and the exposure gauge, alike."""
    name, user = env.user("pool")
    rows = credit_rows()
    # A line search along the amount from the first row: each probe one feature from it.
    probes = [[a, *rows[0][1:]] for a in (151, 301, 451, 601, 751, 901) if a != rows[0][0]]
    assert user.post("/v1/models/credit/predict", {"rows": rows[:30] + probes})[0] == 200
    env.settle(name, 36)
    status, view = env.admin.post("/v1/admin/monitor/credit/evaluate", {})
    assert status == 200, view
    pools = {p["subject"]: p for p in view["pools"]}
    assert set(pools) == {"auto:pool", "auto:young", "auto:model"}
    # The probes one feature from the first row that are also far from S or in a margin join.
    mon = ModelMonitor(credit_model())
    X = credit_model().schema.encode_rows(probes)
    unusual = int((mon.ood.far(X) | mon.boundary.close(X)[1]).sum())
    assert unusual >= 1 and pools["auto:pool"]["n_queries"] >= unusual
    assert pools["auto:model"]["n_queries"] == view["total_queries"]
    assert view["exposure"] == pools["auto:model"]["status"]["best_copy"]
    status, text = env.admin.get("/metrics")
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    exposure = {s.labels["model"]: s.value for s in fams["analysim_extraction_exposure_ratio"].samples}
    assert exposure["credit"] == pytest.approx(view["exposure"])
    gauge = {(s.labels["subject"], s.labels["method"]): s.value for s in fams["analysim_extraction_status"].samples}
    assert gauge[("auto:pool", "best_copy")] == pytest.approx(pools["auto:pool"]["status"]["best_copy"])
    assert ("auto:model", "best_copy") not in gauge  # reported as exposure, not as a subject's status (no alert)


def test_groups_merge_members_and_equal_one_user(env: Env) -> None:
    rows = credit_rows()
    (a, ca), (b, cb), (solo, cs) = env.user("ga"), env.user("gb"), env.user("gs")
    for i in range(0, 90, 3):
        batch = rows[i : i + 3]
        assert (ca if (i // 3) % 2 else cb).post("/v1/models/credit/predict", {"rows": batch})[0] == 200
        assert cs.post("/v1/models/credit/predict", {"rows": batch})[0] == 200
    env.settle(a, 45), env.settle(b, 45), env.settle(solo, 90)
    gname = f"g{next(_names)}"
    status, body = env.admin.post("/v1/admin/groups", {"name": gname, "members": [a, b]})
    assert status == 200 and body == {"name": gname, "members": sorted([a, b])}
    env.admin.post("/v1/admin/monitor/credit/evaluate", {})
    group = env.admin.get(f"/v1/admin/monitor/credit/groups/{gname}")[1]
    single = env.admin.get(f"/v1/admin/monitor/credit/users/{solo}")[1]
    assert group["n_queries"] == 90
    for m in EXTENT_METHODS:  # intent (prada, ood) is the most attack-like member's, not the pool's
        assert group["status"][m] == pytest.approx(single["status"][m], abs=1e-12)
    assert set(group["member_status"]) == {a, b}
    assert any(g["name"] == gname for g in env.admin.get("/v1/admin/groups")[1]["groups"])
    assert env.admin.get(f"/v1/admin/groups/{gname}")[1]["models"]["credit"]["n_queries"] == 90
    assert env.admin.request("DELETE", f"/v1/admin/groups/{gname}")[0] == 200
    assert env.admin.get(f"/v1/admin/groups/{gname}")[0] == 404


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"members": ["x"]}, 400, "name"),
        ({"name": "bad name", "members": ["x"]}, 400, "name"),
        ({"name": "g-bad", "members": []}, 400, "members"),
        ({"name": "g-bad", "members": "x"}, 400, "members"),
        ({"name": "g-bad", "members": ["nobody-at-all"]}, 400, "members[0]"),
        ({"name": "g-bad", "members": ["x"], "extra": 1}, 400, "extra"),
        ([1], 400, "body"),
    ],
)
def test_bad_group_bodies_name_the_field(env: Env, body: Any, status: int, field: str) -> None:
    got, err = env.admin.post("/v1/admin/groups", body)
    assert got == status and err["error"]["field"] == field, err


def test_bad_input_elsewhere(env: Env) -> None:
    assert env.admin.request("POST", "/v1/admin/groups", raw=b"{nope")[1]["error"]["field"] == "body"
    status, err = env.admin.request("PUT", "/v1/admin/monitor/credit/config", {"thresholds": {"ig": 3}})
    assert status == 400 and err["error"]["field"] == "thresholds.ig"
    status, err = env.admin.get("/v1/admin/monitor/nosuch")
    assert status == 404 and err["error"]["field"] == "model_id"
    status, err = env.admin.get("/v1/admin/monitor/credit/users/nosuch")
    assert status == 404 and err["error"]["field"] == "subject"
    assert env.admin.get("/v1/admin/warnings?model=nosuch")[0] == 404
    name, _ = env.user()
    assert env.admin.post("/v1/admin/groups", {"name": "dup", "members": [name]})[0] == 200
    assert env.admin.post("/v1/admin/groups", {"name": "dup", "members": [name]})[1]["error"]["code"] == "group_exists"


def test_warning_events_are_listed_and_counted(env: Env) -> None:
    name, user = env.user()
    rows = credit_rows()
    for i in range(0, 200, 5):
        user.post("/v1/models/credit/predict", {"rows": rows[i : i + 5]})
    env.settle(name, 200)
    warnings = env.admin.get(f"/v1/admin/warnings?model=credit&subject={name}")[1]["warnings"]
    assert warnings, "200 real rows of a 12-leaf tree should cover half of S's mass"
    assert all(w["status"] >= w["threshold"] for w in warnings)
    assert len({w["method"] for w in warnings}) == len(warnings)  # once per method
    fams = {f.name: f for f in text_string_to_metric_families(env.admin.get("/metrics")[1])}
    total = sum(s.value for s in fams["analysim_extraction_warnings"].samples if s.name.endswith("_total"))
    assert total >= len(warnings)


def test_enforcement_refuse_and_degrade_on_rest_and_grpc(env: Env) -> None:
    rows = credit_rows()
    try:
        # intent off: these are rows of the data (not attack-like); this test is about the mechanism
        cfg = {"enforcement": {"action": "degrade", "method": "coverage_mass", "threshold": 0.3, "intent": False}}
        assert env.admin.request("PUT", "/v1/admin/monitor/credit/config", cfg)[0] == 200
        name, user = env.user()
        first: dict[str, Any] = {}
        for i in range(0, 150, 5):
            status, body = user.post("/v1/models/credit/predict", {"rows": rows[i : i + 5]})
            assert status == 200
            first = first or body
        assert "leaf" in first["predictions"][0]  # a fresh account (status 0) is answered in full
        env.settle(name, 150)

        def degraded() -> dict[str, Any] | None:  # once the monitor's decision has reached the gateway
            status, body = user.post("/v1/models/credit/predict", {"rows": rows[:2]})
            assert status == 200
            return body if set(body["predictions"][0]) == {"label"} else None  # degraded: label only

        body = wait_until(degraded, what="the gateway to degrade the user")
        # The log (and so the monitor and a replay) holds what the user was told, not more.
        logged = env.store.events_after(body["query_id"] - 1, "credit", 1)[0]
        assert logged.seq == body["query_id"] and logged.confidences is None and logged.leaves is None
        with grpc.insecure_channel(env.t.grpc_target) as ch:
            stub = pb_grpc.PredictionServiceStub(ch)
            rowpb = [pb.Row(values=[pb.Value(text=v) if isinstance(v, str) else pb.Value(number=v) for v in rows[0]])]
            resp = stub.Predict(pb.PredictRequest(model_id="credit", rows=rowpb),
                                metadata=(("authorization", f"Bearer {user.key}"),))  # fmt: skip
            assert not resp.predictions[0].HasField("confidence") and not resp.predictions[0].HasField("leaf")
            cfg["enforcement"]["action"] = "refuse"
            env.admin.request("PUT", "/v1/admin/monitor/credit/config", cfg)
            wait_until(lambda: user.post("/v1/models/credit/predict", {"rows": rows[:2]})[0] == 403,
                       what="the gateway to refuse the user")  # fmt: skip
            before = env.admin.get(f"/v1/usage?user={name}")[1]["rows"]
            status, err = user.post("/v1/models/credit/predict", {"rows": rows[:2]})
            assert status == 403 and err["error"]["code"] == "extraction_refused"
            with pytest.raises(grpc.RpcError) as e:
                stub.Predict(pb.PredictRequest(model_id="credit", rows=rowpb), metadata=(("authorization", f"Bearer {user.key}"),))
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert refusal_of(e.value)["code"] == "extraction_refused"
            assert env.admin.get(f"/v1/usage?user={name}")[1]["rows"] == before  # refused: never charged
        # a fresh user is served in full
        _, fresh = env.user()
        status, body = fresh.post("/v1/models/credit/predict", {"rows": rows[:1]})
        assert status == 200 and "confidence" in body["predictions"][0] and "leaf" in body["predictions"][0]
    finally:
        env.admin.request("PUT", "/v1/admin/monitor/credit/config", {"enforcement": {"action": "none"}})


def test_store_tables_are_ours(tmp_path: Path, env: Env) -> None:
    import sqlite3

    db = sqlite3.connect(env.store.path)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    db.close()
    assert {"monitor_subjects", "monitor_history", "monitor_warnings", "monitor_groups", "monitor_checkpoint"} <= tables


@pytest.mark.parametrize("name", ["bob\n", "bob\r\n", "\nbob"])
def test_user_and_group_names_with_a_newline_are_refused(env: Env, name: str) -> None:
    for path, body in (("/v1/admin/users", {"name": name}), ("/v1/admin/groups", {"name": name, "members": ["x"]})):
        status, answer = env.admin.post(path, body)
        assert (status, answer["error"]["field"]) == (400, "name"), (path, answer)


def test_pool_response_degrades_the_coalition_and_lists_why(tmp_path: Path) -> None:
    """Through a real gateway and its monitor: accounts that share line searches make
    auto:pool warn; with the pool response on, its top contributor and a fresh account that
    keeps probing are answered with labels only, and the admin API lists each action with its reason."""
    from tests.test_monitor_pool import line_searches

    store = Store(tmp_path / "store.db")
    model = credit_model()
    store.add_model(model)
    store.set_policy("credit", Policy(reveal_leaf=True))

    def raw(X: Any) -> list[list[Any]]:
        return [[f.categories[int(v)] if f.categories else float(v) for f, v in zip(model.schema.features, x, strict=True)]
                for x in X]  # fmt: skip

    with GatewayThread(Gateway(store, ADMIN_KEY), extensions=[local_monitor_extension()]) as t:
        env = Env(t, store)
        cfg = {"pool_response": {"action": "degrade", "top": 1, "hold": 100_000}}
        assert env.admin.request("PUT", "/v1/admin/monitor/credit/config", cfg)[0] == 200
        (a, ca), (b, cb) = env.user("ring"), env.user("ring")
        probes = line_searches(model, 30)
        for i, X in enumerate(probes):
            assert (ca if i % 4 else cb).post("/v1/models/credit/predict", {"rows": raw(X)})[0] == 200
        env.settle(a, 6 * 22)
        view = env.admin.post("/v1/admin/monitor/credit/evaluate", {})[1]
        pool = next(p for p in view["pools"] if p["subject"] == "auto:pool")
        assert pool["warned"] == ["best_copy"] and view["pool_standing"]
        top = view["attribution"][0]["account"]
        assert {x["account"] for x in view["attribution"]} == {a, b}
        # Signs up during the warning and probes among customer-like rows: three probes one
        # feature apart, in a margin of the tree, the fewest that join the pool from one account
        # (pool.REPEATED), after 13 rows of the data, so that its pooled share (3 of 16) stays
        # under what the extracting rule asks of an established account (EXTRACTING_SHARE).
        fresh, cf = env.user("fresh")
        assert REPEATED / (13 + REPEATED) < EXTRACTING_SHARE
        assert cf.post("/v1/models/credit/predict", {"rows": credit_rows()[100:113]})[0] == 200
        assert cf.post("/v1/models/credit/predict", {"rows": raw(line_searches(model, 33)[32][:REPEATED])})[0] == 200

        def degraded(client: Client) -> bool:
            status, body = client.post("/v1/models/credit/predict", {"rows": raw(probes[0][:1])})
            assert status == 200
            return set(body["predictions"][0]) == {"label"}

        wait_until(lambda: degraded(ca if top == a else cb), what="the top contributor to be degraded")
        wait_until(lambda: degraded(cf), what="a fresh account to be degraded")
        actions = env.admin.get("/v1/admin/monitor/credit/actions")[1]
        taken = {x["user"] for x in actions["actions"] if x["action"] == "degrade" and x["reason"]}
        why = {x["user"]: x["reason"] for x in actions["current"]}
        assert taken >= {a, b, fresh}
        assert why[top].startswith("auto:pool contributor #1") and why[fresh].startswith("new account")
        assert why[b if top == a else a].startswith("extracting account")  # most of its rows joined the pool
        assert {x["user"] for x in actions["current"]} >= {top, fresh}
        fams = {f.name: f for f in text_string_to_metric_families(env.admin.get("/metrics")[1])}
        taken = {(s.labels["action"], s.labels["rule"]): s.value for s in fams["analysim_monitor_actions"].samples
                 if s.name.endswith("_total")}  # fmt: skip
        assert taken[("degrade", "pool")] >= 2
        falls = {s.labels["account"] for s in fams["analysim_extraction_attribution_ratio"].samples}
        assert falls == {a, b}
    store.close()


def test_the_gateways_monitor_runs_the_gateways_code_whatever_the_directory(tmp_path: Path, monkeypatch) -> None:
    """The monitor child is ``python -m mlaas_monitor.monitor``: started from a directory that
    holds another mlaas_monitor (another checkout, an old copy), it still runs this one, on the
    store given by a path relative to that directory."""
    decoy = tmp_path / "mlaas_monitor" / "monitor"
    decoy.mkdir(parents=True)
    (tmp_path / "mlaas_monitor" / "__init__.py").write_text("")
    (decoy / "__init__.py").write_text("")
    (decoy / "__main__.py").write_text("raise SystemExit(3)  # not the monitor\n")
    store = Store(tmp_path / "store.db")
    store.add_model(credit_model())
    monkeypatch.chdir(tmp_path)
    relative = Store("store.db")  # the gateway's store, named relative to its directory
    with GatewayThread(Gateway(relative, ADMIN_KEY), extensions=[local_monitor_extension()]) as t:
        env = Env(t, relative)
        (name, client) = env.user("cwd")
        assert client.post("/v1/models/credit/predict", {"rows": credit_rows()[:12]})[0] == 200
        env.settle(name, 12)
    relative.close()
    store.close()
