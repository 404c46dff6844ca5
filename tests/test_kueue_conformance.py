"""Kueue's own unit-test tables (tests/kueue_conformance, Kueue's commit pinned there) replayed
through ``analysim simulate``: each case's victims, their reasons and the incoming workloads'
admissions with their flavors, read from the run's output files."""

from __future__ import annotations

import pytest

from tests.kueue_conformance import ARRIVAL_S, Case, fair, hierarchical, preemption, scheduler
from tests.kueue_conformance.harness import observe, simulate

CASES: list[Case] = [*preemption.CASES, *hierarchical.CASES, *fair.CASES, *scheduler.CASES]


def _param(case: Case):
    marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
    return pytest.param(case, id=case.id, marks=marks)


def test_every_case_is_named_once():
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_kueue_table_case(case: Case, tmp_path):
    outcome = observe(simulate(case, tmp_path))
    for i, w in enumerate(case.running):  # the table's admitted state, reproduced
        assert outcome.admitted.get(w.name) == (float(i), w.flavors), f"running {w.name}"
    early = {v: e for v, e in outcome.evicted.items() if e[0] < ARRIVAL_S}
    assert not early, f"evicted before the incoming workloads arrive: {early}"
    (preemptor,) = {(w.name, w.queue) for w in case.incoming} if len(case.incoming) == 1 else {None}
    got = {v: (reason, (by, by_queue)) for v, (t, reason, by, by_queue) in outcome.evicted.items() if t == ARRIVAL_S}
    if preemptor is None:  # several incoming workloads: the victims and reasons, whoever evicted them
        got = {v: (reason, None) for v, (reason, _) in got.items()}
    assert got == {v: (reason, preemptor) for v, reason in case.victims.items()}
    for w in case.incoming:
        if w.flavors is not None:
            at, flavors = outcome.admitted.get(w.name, (None, {}))
            assert (flavors if at == ARRIVAL_S else {}) == w.flavors, f"incoming {w.name} admitted at {at}"
