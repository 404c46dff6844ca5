"""PoolLedger's bookkeeping of accounts (mlaas_monitor.monitor.pool), as invariants."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mlaas_monitor.monitor.pool import PoolLedger

ACCOUNTS = [f"u{i}" for i in range(12)]
# A model's log as the ledger sees it: an account's rows arrive, auto:pool takes rows of some
# accounts, auto:pool is warned.
STEP = st.one_of(
    st.tuples(st.just("arrived"), st.sampled_from(ACCOUNTS), st.integers(1, 5)),
    st.tuples(st.just("pooled"), st.lists(st.sampled_from(ACCOUNTS), max_size=3)),
    st.tuples(st.just("warned")),
)


@given(st.lists(STEP, max_size=60))
def test_new_pooled_since_warning_are_the_pooled_accounts_first_seen_since_in_that_order(steps: list[tuple]) -> None:
    ledger = PoolLedger()
    for step in steps:
        if step[0] == "arrived":
            ledger.arrived(step[1], step[2])
        elif step[0] == "pooled":
            ledger.pool_took([u for u in step[1] if u in ledger.first_seen])  # (only rows that arrived)
        else:
            ledger.warned()
        got = ledger.new_pooled_since_warning()
        if ledger.warned_at is None:
            assert got == []
            continue
        # Every account seen since the warning whose row auto:pool took, in the order first seen.
        want = [u for u, first in ledger.first_seen.items() if first >= ledger.warned_at and ledger.pooled_by[u]]
        assert got == want
