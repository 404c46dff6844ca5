"""pkg/scheduler/preemption/preemption_hierarchical_test.go, TestHierarchicalPreemptions: cohort
trees with quota on the Cohorts and ClusterQueues of nominal 0 (a ClusterQueue the table gives
no quota, or no resource group at all, has the resource at 0 here: AnalySIM needs a
ClusterQueue to name a flavor and resource to use it). One flavor, ``default``."""

from __future__ import annotations

from tests.kueue_conformance import Case, Workload
from tests.kueue_conformance.build import (
    ANY,
    LOWER,
    borrow_below,
    cluster_queue,
    cohort,
    cpu,
    flavors,
    quotas,
    waits,
    wl,
)

SOURCE = "pkg/scheduler/preemption/preemption_hierarchical_test.go"
IN_CQ, RECLAIM, WHILE_BORROWING = "InClusterQueue", "InCohortReclamation", "InCohortReclaimWhileBorrowing"


def q(name: str, parent: str, nominal: str = "0", *, reclaim: str = ANY, borrow: str | None = None,
      memory: str | None = None, lending: str = "") -> str:
    """A ClusterQueue of the table: withinClusterQueue LowerPriority and this reclaim policy."""
    res = {"cpu": (nominal, "", lending)} | ({"memory": (memory,)} if memory is not None else {})
    return cluster_queue(name, parent, [("default", quotas(**res))], within=LOWER, reclaim=reclaim,
                         borrow=borrow)


def tree(*cohorts: tuple[str, str | None, str | None], memory: dict[str, str] | None = None) -> str:
    """The default flavor and Cohorts (name, parent, its own CPU quota)."""
    memory = memory or {}
    return flavors("default") + "".join(
        cohort(n, p, *([[("default", quotas(cpu=(c,), **({"memory": (memory[n],)} if n in memory else {})))]]
                       if c else [])) for n, p, c in cohorts)


R_C2 = tree(("r", None, None), ("c", "r", "2"))


def case(name: str, partition: str, running: list[Workload], incoming: Workload, victims: dict[str, str],
         xfail: str | None = None) -> Case:
    return Case(SOURCE, name, partition, tuple(running), (incoming,), victims, xfail)


CASES = [
    case("preempt with hierarchical advantage", R_C2 + q("q", "c") + q("q_borrowing", "r"),
         [cpu("admitted2", "q_borrowing", "2")], cpu("in", "q", "2"), {"admitted2": RECLAIM}),
    case("avoid queues within nominal quota", R_C2 + q("q_nominal", "r", "2") + q("q", "c") + q("q_borrowing", "r"),
         [cpu("admitted1", "q_nominal", "2", -10), cpu("admitted2", "q_borrowing", "2")], cpu("in", "q", "2"),
         {"admitted2": RECLAIM}),
    case("preempt multiple with hierarchical advantage", R_C2 + q("q", "c") + q("q_borrowing", "r"),
         [cpu("admitted1", "q_borrowing", "1", 1), cpu("admitted2", "q_borrowing", "1", 2)], cpu("in", "q", "2"),
         {"admitted1": RECLAIM, "admitted2": RECLAIM}),
    # admitted_preemptible asks for 1 CPU and the table's admission charges it 2, putting the
    # cohort at 4 of its 3: here it holds its request, 1 (the cohort full at 3); the incoming 2
    # needs both lower candidates either way.
    case("preempt in cohort and own CQ",
         tree(("r", None, None), ("c", "r", "3")) + q("q", "c", borrow=borrow_below(0)) + q("q_same_cohort", "c"),
         [cpu("admitted_not_preemptible", "q_same_cohort", "1", 1), cpu("admitted_preemptible", "q_same_cohort", "1"),
          cpu("admitted_own_queue", "q", "1", -1)],
         cpu("in", "q", "2", 1), {"admitted_own_queue": IN_CQ, "admitted_preemptible": WHILE_BORROWING}),
    case("prefer to preempt hierarchical candidate", R_C2 + q("q", "c") + q("q_borrowing", "r"),
         [cpu("admitted_borrowing", "q_borrowing", "1", 1), cpu("admitted_same_queue", "q", "1", -2)],
         cpu("in", "q", "1"), {"admitted_borrowing": RECLAIM}),
    case("forced to preempt priority candidate",
         R_C2 + q("q", "c", borrow=borrow_below(0)) + q("q_nominal", "r", "2") + q("q_same_cohort", "c"),
         [cpu("admitted_nominal", "q_nominal", "2", -10), cpu("admitted_same_cohort", "q_same_cohort", "2", -1)],
         cpu("in", "q", "2"), {"admitted_same_cohort": WHILE_BORROWING}),
    case("incoming workload fits in CQ nominal quota",
         R_C2 + q("q", "c", "4") + q("q_borrowing", "r") + q("q_same_cohort", "c"),
         [cpu("admitted_borrowing", "q_borrowing", "3", 10), cpu("admitted_same_cohort", "q_same_cohort", "3", 10)],
         cpu("in", "q", "4"), {"admitted_borrowing": RECLAIM, "admitted_same_cohort": RECLAIM}),
    case("preempt hierarchical and priority candidates",
         tree(("r", None, "1"), ("c", "r", "4")) + q("q", "c", reclaim=LOWER, borrow=borrow_below(0))
         + q("q_borrowing", "r") + q("q_same_cohort", "c"),
         [cpu("admitted_borrowing", "q_borrowing", "2", -1), cpu("admitted_same_cohort_preemptible", "q_same_cohort", "1", -1),
          cpu("admitted_borrowing_not_preemptible", "q_borrowing", "2", 1)],
         cpu("in", "q", "3"), {"admitted_borrowing": RECLAIM, "admitted_same_cohort_preemptible": WHILE_BORROWING},),
    case("preempt hierarchical candidates and inside CQ",
         tree(("r", None, "1"), ("c", "r", "4")) + q("q", "c", reclaim=LOWER, borrow=borrow_below(0))
         + q("q_borrowing", "r") + q("q_same_cohort", "c"),
         [cpu("admitted_borrowing", "q_borrowing", "2", -1), cpu("admitted_same_queue_preemptible", "q", "1", -1),
          cpu("admitted_borrowing_not_preemptible", "q_borrowing", "2", 1)],
         cpu("in", "q", "3"), {"admitted_borrowing": RECLAIM, "admitted_same_queue_preemptible": IN_CQ}),
    case("reclaim nominal quota from lowest priority workload, excluding non-borrowing",
         tree(("r", None, None), ("c", "r", "3")) + q("q", "c") + q("q_borrowing", "r") + q("q_nominal", "r", "2"),
         [cpu("admitted_borrowing_prio_8", "q_borrowing", "1", 8), cpu("admitted_borrowing_prio_9", "q_borrowing", "1", 9),
          cpu("admitted_borrowing_prio_10", "q_borrowing", "1", 9), cpu("admitted_nominal", "q_nominal", "2", -2)],
         cpu("in", "q", "1"), {"admitted_borrowing_prio_8": RECLAIM}),
    case("infeasible preemption all available workloads in pruned subtrees",
         tree(("r", None, None), ("c", "r", "2"), ("c_other", "r", "2")) + q("q_other", "c_other") + q("q", "c")
         + q("q_same_cohort", "c"),
         [cpu("admitted_other_1", "q_other", "1", -10), cpu("admitted_other_2", "q_other", "1", -10),
          cpu("admitted_same_cohort", "q_same_cohort", "2")],
         waits(cpu("in", "q", "2")), {}),
    case("hiearchical preemption with multiple resources",
         tree(("r", None, "3"), ("c", "r", "4"), memory={"c": "4Gi"}) + q("q", "c", memory="0")
         + q("q_borrowing", "r", memory="0") + q("q_same_cohort", "c", memory="0"),
         [wl("admitted_borrowing", "q_borrowing", cpu="3", memory="1Gi"),
          wl("admitted_same_cohort", "q_same_cohort", -2, cpu="1", memory="3Gi")],
         wl("in", "q", -2, cpu="2", memory="1Gi"), {"admitted_borrowing": RECLAIM}),
    case("respect lending limits", R_C2 + q("q", "c", "3", lending="2") + q("q_borrowing", "r"),
         [cpu("admitted_borrowing", "q_borrowing", "4")], cpu("in", "q", "5", -2), {"admitted_borrowing": RECLAIM},),
    case("reclaim in complex hierarchy",
         tree(("r", None, None), ("c11", "r", "4"), ("c12", "r", "4"), ("c21", "c11", "4"), ("c22", "c11", "4"),
              ("c23", "c11", "4"), ("c31", "c21", "4"), ("c32", "c21", "4"))
         + q("q1", "c12") + q("q2", "c23") + q("q3", "c22") + q("q4", "c32") + q("q5", "c31"),
         [cpu("admitted_borrowing_1", "q1", "4", -6), cpu("admitted_borrowing_2", "q1", "4", -5),
          cpu("admitted_borrowing_3", "q2", "4", -9), cpu("admitted_borrowing_4", "q2", "4", -10),
          cpu("admitted_borrowing_5", "q3", "4", -4), cpu("admitted_borrowing_6", "q3", "3", -3),
          cpu("admitted_borrowing_7", "q4", "2", 4), cpu("admitted_borrowing_8", "q4", "3", 2)],
         cpu("in", "q5", "7", -2), {"admitted_borrowing_1": RECLAIM, "admitted_borrowing_4": RECLAIM}),
]
