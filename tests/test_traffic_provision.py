"""`analysim load`'s accounts against a real monitored gateway on 127.0.0.1: a traffic service
started again (a container restart, a second run) finds its users already there and gives each a
new key, which works while the old one stops working; the group is declared once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from analysim.traffic import Mix, provision, user_names
from mlaas_monitor.monitor.attacks import ApiClient
from mlaas_monitor.monitor.client import local_monitor_extension
from tests.test_gateway_helpers import ADMIN_KEY, Running, credit_model, running_gateway

MIX = Mix(benign=2, attackers=("pathfinding",), colluders=2, group="crew", quota_rows=5000)


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Running]:
    with running_gateway(tmp_path / "store.db", [credit_model()], extensions=[local_monitor_extension()]) as r:
        yield r


def usable(gw: Running, key: str) -> bool:
    status, body = gw.client(key).get("/v1/usage")
    assert status in (200, 401), body
    return status == 200


def test_a_second_provision_rotates_every_existing_account(gw: Running) -> None:
    admin = ApiClient(f"http://127.0.0.1:{gw.port}", ADMIN_KEY)  # the client `analysim load` uses
    first = provision(admin, MIX, "credit")
    names = {u for us in user_names(MIX).values() for u in us}
    assert set(first) == names and all(usable(gw, k) for k in first.values())

    second = provision(admin, MIX, "credit")  # what a restarted traffic service does
    assert set(second) == names
    for name in names:
        assert second[name] != first[name], name
        assert usable(gw, second[name]) and not usable(gw, first[name]), name
    users = {u["user"]: u for u in admin.call("GET", "/v1/admin/users")["users"]}
    assert set(users) == names and all(u["quota_rows"] == 5000 and not u["revoked"] for u in users.values())
    groups = admin.call("GET", "/v1/admin/groups")["groups"]
    assert [(g["name"], sorted(g["members"])) for g in groups] == [("crew", ["crew-0", "crew-1"])]
