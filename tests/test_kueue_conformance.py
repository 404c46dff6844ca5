"""Kueue's own unit-test tables (tests/kueue_conformance, Kueue's commit pinned there) replayed
through ``analysim simulate``: each case's victims, their reasons and the incoming workloads'
admissions with their flavors, read from the run's output files."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.kueue_conformance import Case, fair, hierarchical, preemption
from tests.kueue_conformance.harness import observe, simulate

CASES: list[Case] = [*preemption.CASES, *hierarchical.CASES, *fair.CASES]


def _param(case: Case):
    marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
    return pytest.param(case, id=case.id, marks=marks)


def test_every_case_is_named_once():
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_kueue_table_case(case: Case, tmp_path):
    outcome = observe(case, simulate(case, tmp_path))
    for w in case.running:  # the table's admitted state, reproduced
        assert outcome.admitted.get(w.name) == w.flavors, f"running {w.name}: admitted {outcome.admitted.get(w.name)}"
    queue = {w.name: w.queue for w in case.running + case.incoming}
    assert sorted(outcome.victims) == sorted(case.victims)
    assert outcome.reasons == Counter((queue[v], r) for v, r in case.victims.items())
    for w in case.incoming:
        if w.flavors is not None:
            assert outcome.admitted.get(w.name, {}) == w.flavors, f"incoming {w.name}"
