"""Three of Kueue's decisions that depend on the cohort tree, each on a small case computed by hand
and replayed through the engine: reclaim by hierarchical advantage (relative to the lowest common
ancestor of preemptor and victim), heads ordered by borrowing level, and flavor choice when
preemption is needed (whenCanPreempt and preference)."""

from __future__ import annotations

import pytest

from analysim.core.cluster import ClusterSpec
from analysim.core.engine import Engine
from analysim.core.partition import GPU
from analysim.core.plugins.kueue import KueueState
from analysim.core.plugins.kueue_flavors import Heights, borrowing_level
from tests.test_kueue import (
    FLAVOR,
    TWO_FLAVORS,
    _cohort_doc,
    _gpu_groups,
    _gpu_job,
    _nodes,
    _queue_docs,
    _read,
)
from tests.test_kueue_preemption import PRIORITIES, _preempted
from tests.test_kueue_preemption import _run as _run_on

# Two 8-GPU nodes, one flavor.
ONE_FLAVOR_NODES = _nodes((2, "V100", 8, 16))


def _run(cluster: ClusterSpec, part, jobs, until: float | None = None) -> Engine:
    return _run_on(part, jobs, until, cluster)


def _gpus(nominal: int, **limits: int) -> str:
    return _gpu_groups({"default-flavor": {"nominalQuota": nominal, **limits}})


def _policy(**policies: object) -> str:
    return "\n  preemption: {" + ", ".join(f"{k}: {v}" for k, v in policies.items()) + "}"


# --- reclaim by hierarchical advantage ----------------------------------------------------------

# root (no quota)
# |- team (cohort, 6 GPUs)
# |  `- a (nominal 0, reclaimWithinCohort: Any)
# `- b (nominal 0): borrows all of team's 6 through root
HIERARCHY = (FLAVOR + _cohort_doc("root", " {}") + _cohort_doc("team", "\n  parent: root" + _gpus(6))
             + _queue_docs("b", "root", _gpus(0)))


def _hierarchy(tmp_path, a_extra: str) -> object:
    part, _ = _read(tmp_path, HIERARCHY + PRIORITIES + _queue_docs("a", "team", _gpus(0) + a_extra), ONE_FLAVOR_NODES)
    return part


B_THREE = [_gpu_job(f"b{i}", "b", 2, submit=float(i), duration=1000, qos="normal") for i in range(3)]


def test_a_queue_of_nominal_zero_reclaims_its_cohort_s_quota_by_hierarchical_advantage(tmp_path):
    # b runs b0, b1, b2 (2 GPUs each: 6, all of team's quota, borrowed through root). At t=10 a
    # (nominal 0) asks for 4. It is not under its own nominal quota (0 < 0 is false), so without the
    # hierarchy it could not reclaim. Up the path: a's own quota 0 < 0 + 4, left 4 - 0 = 4; team's
    # subtree quota 6 >= its usage 0 + 4: the request fits in team, a subtree below the lowest
    # common ancestor (root) of a and b, so a has the advantage over b's workloads, whose queue is
    # over its nominal quota (6 > 0). Attempt with borrowing (borrowWithinCohort Never, a not under
    # nominal): b2 then b1 (most recent first): root's available 6 - 2 = 4 >= 4: fits. Both are
    # InCohortReclamation.
    part = _hierarchy(tmp_path, _policy(reclaimWithinCohort="Any"))
    e = _run(ONE_FLAVOR_NODES, part, B_THREE + [_gpu_job("a-job", "a", 4, submit=10, qos="normal")], until=20)
    assert sorted(_preempted(e)) == [(10.0, "b1", "InCohortReclamation", "a"), (10.0, "b2", "InCohortReclamation", "a")]
    assert e.jobs["a-job"].first_start_s == 10.0


def test_the_hierarchical_advantage_labels_a_reclaim_while_borrowing_as_reclamation(tmp_path):
    # The same, a with borrowWithinCohort LowerPriority and a higher priority than b's: a borrows
    # (from team, 0 < 4) while it reclaims, but the advantage makes the victims InCohortReclamation,
    # not InCohortReclaimWhileBorrowing (a candidate over which the preemptor has the advantage is
    # classified before borrowWithinCohort is looked at).
    part = _hierarchy(tmp_path, _policy(reclaimWithinCohort="Any", borrowWithinCohort="{policy: LowerPriority}"))
    e = _run(ONE_FLAVOR_NODES, part, B_THREE + [_gpu_job("a-job", "a", 4, submit=10, qos="high")], until=20)
    assert {r for _, _, r, _ in _preempted(e)} == {"InCohortReclamation"}
    assert len(_preempted(e)) == 2


def test_without_the_advantage_a_borrowing_queue_does_not_reclaim(tmp_path):
    # a-job (6) at t=10: a's quota 0 < 0 + 6, left 6; team's subtree 6 >= 0 + 6: the advantage over
    # b; b2, b1, b0 are evicted (root's available 0 -> 2 -> 4 -> 6 >= 6; none can be given back).
    # a-more (2) at t=11: a holds 6; a's quota 0 < 6 + 2, left 2; team's 6 < 6 + 2, left 2; root's 6
    # < 6 + 2: no subtree fits it, no advantage; and no queue is over its nominal quota but a (b
    # holds nothing): no candidate. It waits.
    part = _hierarchy(tmp_path, _policy(reclaimWithinCohort="Any"))
    e = _run(ONE_FLAVOR_NODES, part, B_THREE + [_gpu_job("a-job", "a", 6, submit=10, qos="normal"),
                                                _gpu_job("a-more", "a", 2, submit=11, qos="normal")], until=20)
    assert sorted(v for _, v, _, _ in _preempted(e)) == ["b0", "b1", "b2"]
    assert e.jobs["a-job"].first_start_s == 10.0 and e.jobs["a-more"].first_start_s is None


# --- heads ordered by borrowing level --------------------------------------------------------------

# root (no quota)
# |- near (cohort, 4 GPUs)
# |  `- x (nominal 0)
# `- r (nominal 0)
# Heights: x and r 0 (ClusterQueues), near 1 (a cohort of ClusterQueues), root 2 (a cohort with a
# child cohort).
LEVELS = (FLAVOR + PRIORITIES + _cohort_doc("root", " {}") + _cohort_doc("near", "\n  parent: root" + _gpus(4))
          + _queue_docs("x", "near", _gpus(0)) + _queue_docs("r", "root", _gpus(0)))


def test_borrowing_levels_are_the_heights_of_the_lowest_subtree_that_fits(tmp_path):
    part, _ = _read(tmp_path, LEVELS, ONE_FLAVOR_NODES)
    st = KueueState(part, [n.name for n in ONE_FLAVOR_NODES.nodes])
    heights = Heights(st.tree)
    idx = st.tree.index
    assert [heights.of[idx[n]] for n in ("root", "near", "x", "r")] == [2, 1, 0, 0]
    fr = ("default-flavor", GPU)
    # x asks 4 (milli-GPUs 4000): x's nominal 0 < 4, left 4; near's subtree 4 >= 0 + 4: near, level 1,
    # below the root. r asks 4: left 4; root's subtree (near lends its 4) 4 >= 0 + 4: root, level 2.
    assert borrowing_level(st.tree, heights, idx["x"], fr, 4000) == (1, True)
    assert borrowing_level(st.tree, heights, idx["r"], fr, 4000) == (2, False)


def test_heads_borrowing_nearer_go_before_higher_priority_borrowing_from_the_root(tmp_path):
    # At t=0 x's low-priority job and r's high-priority job, 4 GPUs each, only 4 to be had. Both
    # borrow; x's at level 1 (from near), r's at level 2 (from root): Kueue takes x's first, before
    # priority, and r's job waits for it (100 s).
    part, _ = _read(tmp_path, LEVELS, ONE_FLAVOR_NODES)
    e = _run(ONE_FLAVOR_NODES, part, [_gpu_job("r-high", "r", 4, qos="high"), _gpu_job("x-low", "x", 4, qos="low")])
    assert (e.jobs["x-low"].first_start_s, e.jobs["r-high"].first_start_s) == (0.0, 100.0)


# --- flavor choice when preemption is needed --------------------------------------------------------

# q: flavors a100 then v100, 8 GPUs of each; withinClusterQueue LowerPriority, reclaimWithinCohort Any.
# lender: 0 of each, in q's cohort: it borrows q's unused quota.
# n0: A100 (8 GPUs), n1: V100 (8 GPUs).
FLAVOR_NODES = _nodes((1, "A100", 8, 16), (1, "V100", 8, 16))


def _flavor_case(tmp_path, fungibility: str) -> object:
    def queue(name: str, nominal: int, extra: str) -> str:
        groups = _gpu_groups({"a100": {"nominalQuota": nominal}, "v100": {"nominalQuota": nominal}})
        return _queue_docs(name, "c", extra + groups)
    q_extra = _policy(withinClusterQueue="LowerPriority", reclaimWithinCohort="Any") + fungibility
    part, _ = _read(tmp_path, TWO_FLAVORS + PRIORITIES + queue("q", 8, q_extra) + queue("lender", 0, ""), FLAVOR_NODES)
    return part


# q-low fills a100 (8 of q's 8); lender's job takes v100 (8, all borrowed from q). At t=10 q asks 8
# at high priority. a100: 8 > 0 available; q's nominal 8 >= 8, so the oracle is asked: evicting
# q-low (own, lower) makes room: PREEMPT, level 0. v100: the same: lender is over its nominal 0,
# evicting its job makes room: RECLAIM, level 0.
FLAVOR_JOBS = [_gpu_job("q-low", "q", 8, qos="low", duration=1000), _gpu_job("lent", "lender", 8, submit=1, duration=1000),
               _gpu_job("q-high", "q", 8, submit=10, qos="high", duration=100)]


@pytest.mark.parametrize(("fungibility", "victim", "reason", "node"), [
    # whenCanPreempt TryNextFlavor (the default): a100 needs preemption, try v100; neither stops
    # the search; the best: RECLAIM over PREEMPT at the same level: v100, the lender's job.
    ("", "lent", "InCohortReclamation", 1),
    # MayStopSearch: a100 needs preemption with victims: the search stops there.
    ("\n  flavorFungibility: {whenCanPreempt: MayStopSearch}", "q-low", "InClusterQueue", 0),
])
def test_the_flavor_that_reclaims_wins_over_the_one_that_preempts_its_own(tmp_path, fungibility, victim, reason, node):
    e = _run(FLAVOR_NODES, _flavor_case(tmp_path, fungibility), FLAVOR_JOBS, until=20)
    assert _preempted(e) == [(10.0, victim, reason, "q")]
    assert e.jobs["q-high"].first_start_s == 10.0 and e.jobs["q-high"].placed.nodes == (node,)


def test_preemption_over_borrowing_takes_a_reclaim_within_nominal_before_a_borrowing_fit(tmp_path):
    # q: a100 4, v100 8; lender: v100 0 then a100 8 (its flavor order). lender's job (8) borrows all
    # of q's v100 (lender's v100 nominal 0: level 1, whenCanBorrow MayStopSearch stops there).
    # q asks 8 at t=10: a100 fits by borrowing lender's idle a100 (4 + 8 available >= 8; level 1,
    # from cohort c); v100 needs preemption: within q's nominal 8 (advantage), lender over its
    # nominal 0: RECLAIM, level 0 once lender's job is gone. Both whenCan* are TryNextFlavor (a
    # preference needs them), so the search looks at both flavors:
    # BorrowingOverPreemption (default): FIT beats RECLAIM: a100, nothing evicted;
    # PreemptionOverBorrowing: level 0 beats level 1: v100, lender's job evicted.
    cluster = _nodes((2, "A100", 8, 16), (1, "V100", 8, 16))  # n0, n1: A100; n2: V100

    def case(preference: str) -> Engine:
        ff = "\n  flavorFungibility: {whenCanBorrow: TryNextFlavor, whenCanPreempt: TryNextFlavor" + preference + "}"
        q = _queue_docs("q", "c", _policy(reclaimWithinCohort="Any") + ff
                        + _gpu_groups({"a100": {"nominalQuota": 4}, "v100": {"nominalQuota": 8}}))
        lender = _queue_docs("lender", "c", _gpu_groups({"v100": {"nominalQuota": 0}, "a100": {"nominalQuota": 8}}))
        part, _ = _read(tmp_path, TWO_FLAVORS + q + lender, cluster)
        return _run(cluster, part, [_gpu_job("lent", "lender", 8, duration=1000),
                                    _gpu_job("q-job", "q", 8, submit=10, duration=100)], until=20)

    first = case("")
    assert first.jobs["lent"].placed.nodes == (2,)
    assert _preempted(first) == [] and first.jobs["q-job"].placed.nodes[0] in (0, 1)
    second = case(", preference: PreemptionOverBorrowing")
    assert _preempted(second) == [(10.0, "lent", "InCohortReclamation", "q")]
    assert second.jobs["q-job"].placed.nodes == (2,)
