"""`analysim load`'s accounts against a real monitored gateway on 127.0.0.1: a traffic service
started again (a container restart, a second run) finds its users already there and gives each a
new key, which works while the old one stops working; the group is declared once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from analysim.errors import UserError
from analysim.traffic import Mix, provision, user_names
from mlaas_monitor.model import Policy
from mlaas_monitor.monitor.attacks import ApiClient
from mlaas_monitor.monitor.client import local_monitor_extension
from mlaas_monitor.server import GatewayThread
from mlaas_monitor.service import Gateway
from mlaas_monitor.store import Store
from tests.test_gateway_helpers import ADMIN_KEY, credit_model

MIX = Mix(benign=2, attackers=("pathfinding",), colluders=2, group="crew", quota_rows=5000)


@pytest.fixture
def gateway_url(tmp_path) -> Iterator[str]:  # noqa: ANN001 — pytest's tmp_path
    store = Store(tmp_path / "store.db")
    store.add_model(credit_model())
    store.set_policy("credit", Policy(reveal_leaf=True))
    with GatewayThread(Gateway(store, ADMIN_KEY), extensions=[local_monitor_extension()]) as t:
        assert t.bound is not None
        yield f"http://127.0.0.1:{t.bound.http_port}"
    store.close()


def usable(url: str, key: str) -> bool:
    try:
        ApiClient(url, key).call("GET", "/v1/usage")
    except UserError as e:
        assert "answered 401" in str(e), e
        return False
    return True


def test_a_second_provision_rotates_every_existing_account(gateway_url: str) -> None:
    admin = ApiClient(gateway_url, ADMIN_KEY)
    first = provision(admin, MIX, "credit")
    names = {u for us in user_names(MIX).values() for u in us}
    assert set(first) == names and all(usable(gateway_url, k) for k in first.values())

    second = provision(admin, MIX, "credit")  # what a restarted traffic service does
    assert set(second) == names
    for name in names:
        assert second[name] != first[name], name
        assert usable(gateway_url, second[name]) and not usable(gateway_url, first[name]), name
    users = {u["user"]: u for u in admin.call("GET", "/v1/admin/users")["users"]}
    assert set(users) == names and all(u["quota_rows"] == 5000 and not u["revoked"] for u in users.values())
    groups = admin.call("GET", "/v1/admin/groups")["groups"]
    assert [(g["name"], sorted(g["members"])) for g in groups] == [("crew", ["crew-0", "crew-1"])]
