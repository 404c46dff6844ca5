"""The store under the gateway: group commit keeps one transaction per tick and every
charge exact; a store that cannot be written refuses the query with 503 and charges
nothing; reopening keeps users, keys and the ledger."""

from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mlaas_monitor.server import GatewayThread
from mlaas_monitor.service import Gateway, Principal
from mlaas_monitor.store import Store
from tests.test_gateway_helpers import ADMIN_KEY, Client, credit_model, credit_rows


def test_concurrent_queries_are_group_committed_and_charged_exactly(store_db: str) -> None:
    store = Store(store_db, background_checkpoint=True)
    store.add_model(credit_model())
    gw = Gateway(store, ADMIN_KEY)
    with GatewayThread(gw) as t:
        assert t.bound is not None
        port = t.bound.http_port
        key = Client("127.0.0.1", port, ADMIN_KEY).post("/v1/admin/users", {"name": "u"})[1]["api_key"]

        def work(i: int) -> int:
            c = Client("127.0.0.1", port, key)
            total = 0
            for j in range(40):
                n = 1 + (i + j) % 5
                status, body = c.post("/v1/models/credit/predict", {"rows": credit_rows()[:n]})
                assert status == 200
                total += len(body["predictions"])
            return total

        with ThreadPoolExecutor(8) as pool:
            answered = sum(pool.map(work, range(8)))
        batches = gw.metrics.commit_batch.collect()[0].samples
    count = next(s.value for s in batches if s.name.endswith("_count"))
    total = next(s.value for s in batches if s.name.endswith("_sum"))
    assert total == 320  # every query committed exactly once
    assert count < total  # ...and some shared a transaction
    assert store.ledger_totals() == (320, answered, answered * 1000)
    store.close()


def test_unwritable_store_answers_503_and_charges_nothing(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = Store(db, busy_timeout=0.2)
    store.add_model(credit_model())
    with GatewayThread(Gateway(store, ADMIN_KEY)) as t:
        assert t.bound is not None
        admin = Client("127.0.0.1", t.bound.http_port, ADMIN_KEY)
        user = Client("127.0.0.1", t.bound.http_port, admin.post("/v1/admin/users", {"name": "u"})[1]["api_key"])
        # Another process holds the write lock (as a long writer would).
        other = sqlite3.connect(db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            status, body = user.post("/v1/models/credit/predict", {"rows": credit_rows()[:3]})
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert (status, body["error"]["code"]) == (503, "store_unavailable")
        assert user.get("/v1/usage")[1]["rows"] == 0
        status, body = user.post("/v1/models/credit/predict", {"rows": credit_rows()[:3]})
        assert status == 200 and body["query_id"] == 1
        assert user.get("/v1/usage")[1]["rows"] == 3
    store.close()


def test_reopened_store_keeps_users_keys_and_ledger(store_db: str) -> None:
    db = store_db
    store = Store(db)
    store.add_model(credit_model())
    with GatewayThread(Gateway(store, ADMIN_KEY)) as t:
        assert t.bound is not None
        admin = Client("127.0.0.1", t.bound.http_port, ADMIN_KEY)
        key = admin.post("/v1/admin/users", {"name": "u", "quota_rows": 10})[1]["api_key"]
        assert Client("127.0.0.1", t.bound.http_port, key).post("/v1/models/credit/predict", {"rows": credit_rows()[:7]})[0] == 200
    store.close()
    store = Store(db)
    with GatewayThread(Gateway(store, ADMIN_KEY)) as t:
        assert t.bound is not None
        user = Client("127.0.0.1", t.bound.http_port, key)
        assert user.get("/v1/usage")[1]["rows"] == 7
        # The quota counts rows answered before the restart.
        assert user.post("/v1/models/credit/predict", {"rows": credit_rows()[:4]})[0] == 429
        assert user.post("/v1/models/credit/predict", {"rows": credit_rows()[:3]})[0] == 200
    store.close()


def test_a_second_writer_on_the_store_does_not_lose_or_merge_queries(store_db: str) -> None:
    """Two connections (two gateways' stores) appending in turn get fresh, consecutive ids."""
    import time

    import numpy as np

    from mlaas_monitor.store_records import QueryRecord

    def record(store: Store) -> int:
        x = np.zeros((1, 5))
        r = QueryRecord(time.time(), "u", "credit", x, np.zeros(1, np.int64), None, None, 10)
        return store.record_queries([r])[0]

    a, b = Store(store_db), Store(store_db)
    assert record(b) == 1
    assert record(a) == 2
    assert record(b) == 3
    assert record(a) == 4
    assert a.ledger_totals() == (4, 4, 40)
    a.close()
    b.close()


def test_a_refresh_between_a_commit_and_its_request_counts_the_rows_once(store_db: str) -> None:
    """The gateway refreshes every user's rows used from the store (other replicas charge
    too). A refresh that runs after a query's commit reached the store but before the
    request resumed must not count that query's rows twice: the store already has them."""
    import asyncio

    store = Store(store_db)
    store.add_model(credit_model())
    gw = Gateway(store, ADMIN_KEY)
    gw.create_user({"name": "u"})
    principal = Principal("u")
    rows = credit_rows()[:3]

    async def interleaved() -> None:
        loop = asyncio.get_running_loop()
        for i in range(3):
            task = asyncio.create_task(gw.predict(principal, "credit", rows[: i + 1]))
            await asyncio.sleep(0)  # the request runs up to its commit; the commit is queued
            loop.call_soon(gw.refresh)  # after the commit, before the request resumes
            await task

    asyncio.run(interleaved())
    by_name = {u["user"]: u["rows_used"] for u in gw.list_users()}
    assert by_name["u"] == store.rows_by_user()["u"] == 1 + 2 + 3
    store.close()


def test_a_user_reloaded_while_its_query_is_in_flight_keeps_one_count(store_db: str) -> None:
    """A user's row changed elsewhere (another replica, an admin) is reloaded while one of its
    queries is being committed: that query must still count once, and its reservation end,
    or the user is held below its quota from then on."""
    import asyncio

    store = Store(store_db)
    store.add_model(credit_model())
    gw = Gateway(store, ADMIN_KEY)
    gw.create_user({"name": "u", "quota_rows": 10})
    rows = credit_rows()[:5]

    async def interleaved() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(gw.predict(Principal("u"), "credit", rows[:1]))
        await asyncio.sleep(0)  # the query is reserved and its commit queued
        Store(store_db).update_user("u", quota_rows=6)  # changed elsewhere: the config moves on
        loop.call_soon(gw.refresh)
        await task
        await gw.predict(Principal("u"), "credit", rows)  # 1 + 5 = the new quota of 6, exactly

    asyncio.run(interleaved())
    assert {u["user"]: u["rows_used"] for u in gw.list_users()}["u"] == store.rows_by_user()["u"] == 6
    store.close()
