"""pkg/scheduler/preemption/preemption_test.go, TestPreemption: one incoming workload for which
the table fixes the flavor assignment (mode Preempt); the cases here have one flavor per
resource, so the flavor AnalySIM's assigner takes is the table's. Memory quotas of the
cohort-three queues (2 bytes, requests of 1) are in Mi: the trace counts memory in MiB, and
scaling every memory quantity alike changes no decision."""

from __future__ import annotations

from tests.kueue_conformance import Case, Workload
from tests.kueue_conformance.build import (
    ANY,
    LOWER,
    LOWER_OR_NEWER_EQUAL,
    NEVER,
    borrow_below,
    cluster_queue,
    cohort,
    cpu,
    flavors,
    quotas,
    unsaid,
    waits,
    wl,
)

SOURCE = "pkg/scheduler/preemption/preemption_test.go"
IN_CQ, RECLAIM, WHILE_BORROWING = "InClusterQueue", "InCohortReclamation", "InCohortReclaimWhileBorrowing"

# TestPreemption's defaultClusterQueues, and its three flavors (alpha and beta are alternatives
# for standalone's memory, so they get nodes of their own).
DEFAULT = flavors("default", "alpha", "beta", racked=("alpha", "beta")) + "".join([
    cluster_queue("standalone", None, [("default", quotas(cpu=("6",)))],
                  [("alpha", quotas(memory=("3Gi",))), ("beta", quotas(memory=("3Gi",)))], within=LOWER),
    cluster_queue("c1", "cohort", [("default", quotas(cpu=("6", "6"), memory=("3Gi", "3Gi")))], within=LOWER, reclaim=LOWER),
    cluster_queue("c2", "cohort", [("default", quotas(cpu=("6", "6"), memory=("3Gi", "3Gi")))], within=NEVER, reclaim=ANY),
    cluster_queue("d1", "cohort-no-limits", [("default", quotas(cpu=("6",), memory=("3Gi",)))], within=LOWER, reclaim=LOWER),
    cluster_queue("d2", "cohort-no-limits", [("default", quotas(cpu=("6",), memory=("3Gi",)))], within=NEVER, reclaim=ANY),
    cluster_queue("l1", "legion", [("default", quotas(cpu=("6", "12"), memory=("3Gi", "6Gi")))], within=LOWER, reclaim=LOWER),
    cluster_queue("preventStarvation", None, [("default", quotas(cpu=("6",)))], within=LOWER_OR_NEWER_EQUAL),
    cluster_queue("a_standard", "with_shared_cq", [("default", quotas(cpu=("1", "12")))], within=NEVER, reclaim=LOWER,
                  borrow=borrow_below(0)),
    cluster_queue("b_standard", "with_shared_cq", [("default", quotas(cpu=("1", "12")))], within=LOWER, reclaim=ANY,
                  borrow=borrow_below(0)),
    cluster_queue("a_best_effort", "with_shared_cq", [("default", quotas(cpu=("1", "12")))], within=NEVER, reclaim=LOWER,
                  borrow=borrow_below(0)),
    cluster_queue("b_best_effort", "with_shared_cq", [("default", quotas(cpu=("0", "13")))], within=NEVER, reclaim=LOWER,
                  borrow=borrow_below(0)),
    cluster_queue("shared", "with_shared_cq", [("default", quotas(cpu=("10",)))]),
    cluster_queue("lend1", "cohort-lend", [("default", quotas(cpu=("6", "", "4")))], within=LOWER, reclaim=LOWER),
    cluster_queue("lend2", "cohort-lend", [("default", quotas(cpu=("6", "", "2")))], within=LOWER, reclaim=LOWER),
    cluster_queue("a", "cohort-three", [("default", quotas(cpu=("2",), memory=("2Mi",)))], within=LOWER, reclaim=ANY),
    cluster_queue("b", "cohort-three", [("default", quotas(cpu=("2",), memory=("2Mi",)))]),
    cluster_queue("c", "cohort-three", [("default", quotas(cpu=("2",), memory=("2Mi",)))]),
])


def case(name: str, running: list[Workload], incoming: Workload, victims: dict[str, str], partition: str = DEFAULT,
         xfail: str | None = None) -> Case:
    return Case(SOURCE, name, partition, tuple(running), (incoming,), victims, xfail)


_LMH = [cpu("low", "standalone", "2", -1), cpu("mid", "standalone", "2"), cpu("high", "standalone", "2", 1)]
_EXHAUSTED = [cpu("a1", "a", "1", -2), cpu("a2", "a", "1", -2), cpu("a3", "a", "1", -1),
              cpu("b1", "b", "1"), cpu("b2", "b", "1"), cpu("b3", "b", "1")]

CASES = [
    case("preempt lowest priority", _LMH, cpu("in", "standalone", "2", 1), {"low": IN_CQ}),
    case("preempt multiple", _LMH, cpu("in", "standalone", "3", 1), {"low": IN_CQ, "mid": IN_CQ}),
    case("no preemption for low priority", [cpu("low", "standalone", "3", -1), cpu("mid", "standalone", "3")],
         waits(cpu("in", "standalone", "1", -1)), {}),
    case("not enough low priority workloads", [cpu("low", "standalone", "3", -1), cpu("mid", "standalone", "3")],
         waits(cpu("in", "standalone", "4")), {}),
    case("some free quota, preempt low priority",
         [cpu("low", "standalone", "1", -1), cpu("mid", "standalone", "1"), cpu("high", "standalone", "3", 1)],
         cpu("in", "standalone", "2", 1), {"low": IN_CQ}),
    case("minimal set excludes low priority",
         [cpu("low", "standalone", "1", -1), cpu("mid", "standalone", "2"), cpu("high", "standalone", "3", 1)],
         cpu("in", "standalone", "2", 1), {"mid": IN_CQ}),
    case("reclaim quota from borrower", [cpu("c1-low", "c1", "3", -1), cpu("c2-mid", "c2", "3"), cpu("c2-high", "c2", "6", 1)],
         cpu("in", "c1", "3", 1), {"c2-mid": RECLAIM}),
    # (A trace's request of 0 is no request: the admission names no flavor for memory, where the
    # table's assignment has default, mode Fit.)
    case("reclaim quota if workload requests 0 resources for a resource at nominal quota",
         [wl("c1-low", "c1", -1, cpu="3", memory="3Gi"), cpu("c2-mid", "c2", "3"), cpu("c2-high", "c2", "6", 1)],
         Workload("in", "c1", {"cpu": "3", "memory": "0"}, 1, {"cpu": "default"}), {"c2-mid": RECLAIM}),
    # c1 holds 4 of its 6, c2 4: the incoming 4 fits by borrowing 2 (the table asks only for targets).
    case("no workloads borrowing", [cpu("c1-high", "c1", "4", 1), cpu("c2-low-1", "c2", "4", -1)],
         unsaid(cpu("in", "c1", "4", 1)), {}),
    case("not enough workloads borrowing",
         [cpu("c1-high", "c1", "4", 1), cpu("c2-low-1", "c2", "4", -1), cpu("c2-low-2", "c2", "4", -1)],
         waits(cpu("in", "c1", "4", 1)), {}),
    case("preempting locally and borrowing other resources in cohort, without cohort candidates",
         [cpu("c1-low", "c1", "4", -1), cpu("c2-low-1", "c2", "4", -1), cpu("c2-high-2", "c2", "4", 1)],
         wl("in", "c1", 1, cpu="4", memory="5Gi"), {"c1-low": IN_CQ}),
    case("preempting locally and borrowing same resource in cohort",
         [cpu("c1-med", "c1", "4"), cpu("c1-low", "c1", "4", -1), cpu("c2-low-1", "c2", "4", -1)],
         cpu("in", "c1", "4", 1), {"c1-low": IN_CQ}),
    case("preempting locally and borrowing same resource in cohort; no borrowing limit in the cohort",
         [cpu("d1-med", "d1", "4"), cpu("d1-low", "d1", "4", -1), cpu("d2-low-1", "d2", "4", -1)],
         cpu("in", "d1", "4", 1), {"d1-low": IN_CQ}),
    case("preempting locally and borrowing other resources in cohort, with cohort candidates",
         [cpu("c1-med", "c1", "4"), cpu("c2-low-1", "c2", "5", -1), cpu("c2-low-2", "c2", "1", -1),
          cpu("c2-low-3", "c2", "1", -1)],
         wl("in", "c1", 1, cpu="2", memory="5Gi"), {"c1-med": IN_CQ}),
    case("preempting locally and not borrowing same resource in 1-queue cohort",
         [cpu("l1-med", "l1", "4"), cpu("l1-low", "l1", "2", -1)], cpu("in", "l1", "4", 1), {"l1-med": IN_CQ}),
    case("do not reclaim borrowed quota from same priority for withinCohort=ReclaimFromLowerPriority",
         [cpu("c1", "c1", "2"), cpu("c2-1", "c2", "4"), cpu("c2-2", "c2", "4")], waits(cpu("in", "c1", "4")), {}),
    case("reclaim borrowed quota from same priority for withinCohort=ReclaimFromAny",
         [cpu("c1-1", "c1", "4"), cpu("c1-2", "c1", "4", 1), cpu("c2", "c2", "2")], cpu("in", "c2", "4"),
         {"c1-1": RECLAIM}),
    case("preempt from all ClusterQueues in cohort",
         [cpu("c1-low", "c1", "3", -1), cpu("c1-mid", "c1", "2"), cpu("c2-low", "c2", "3", -1), cpu("c2-mid", "c2", "4")],
         cpu("in", "c1", "4"), {"c1-low": IN_CQ, "c2-low": RECLAIM}),
    # c2 holds 3 of its 6 and c1 nothing: the incoming 4 fits by borrowing 1.
    case("can't preempt workloads in ClusterQueue for withinClusterQueue=Never", [cpu("c2-low", "c2", "3", -1)],
         unsaid(cpu("in", "c2", "4", 1)), {}),
    case("use BorrowWithinCohort; allow preempting a lower-priority workload from another ClusterQueue while borrowing",
         [cpu("a_best_effort_low", "a_best_effort", "10", -1), cpu("b_best_effort_low", "b_best_effort", "1", -1)],
         cpu("in", "a_standard", "10"), {"a_best_effort_low": WHILE_BORROWING}),
    case("use BorrowWithinCohort; don't allow preempting a lower-priority workload with priority above "
         "MaxPriorityThreshold, if borrowing is required even after the preemption",
         [cpu("b_standard", "b_standard", "10", 1)], waits(cpu("in", "a_standard", "10", 2)), {}),
    case("use BorrowWithinCohort; allow preempting a lower-priority workload with priority above MaxPriorityThreshold, "
         "if borrowing is not required after the preemption",
         [cpu("b_standard", "b_standard", "13", 1)], cpu("in", "a_standard", "1", 2), {"b_standard": RECLAIM}),
    case("use BorrowWithinCohort; don't allow for preemption of lower-priority workload from the same ClusterQueue",
         [cpu("a_standard", "a_standard", "13", 1)], waits(cpu("in", "a_standard", "1", 2)), {}),
    case("use BorrowWithinCohort; only preempt from CQ if no workloads below threshold and already above nominal",
         [cpu("a_standard_1", "a_standard", "10", 1), cpu("a_standard_2", "a_standard", "1", 1),
          cpu("b_standard_1", "b_standard", "1", 1), cpu("b_standard_2", "b_standard", "1", 2)],
         cpu("in", "b_standard", "1", 3), {"b_standard_1": IN_CQ}),
    case("use BorrowWithinCohort; preempt from CQ and from other CQs with workloads below threshold",
         [cpu("b_standard_high", "b_standard", "10", 2), cpu("b_standard_mid", "b_standard", "1", 1),
          cpu("a_best_effort_low", "a_best_effort", "1", -1), cpu("a_best_effort_lower", "a_best_effort", "1", -2)],
         cpu("in", "b_standard", "2", 2), {"a_best_effort_lower": WHILE_BORROWING, "b_standard_mid": IN_CQ}),
    case("reclaim quota from lender",
         [cpu("lend1-low", "lend1", "3", -1), cpu("lend2-mid", "lend2", "3"), cpu("lend2-high", "lend2", "4", 1)],
         cpu("in", "lend1", "3", 1), {"lend2-mid": RECLAIM}),
    case("preempt from all ClusterQueues in cohort-lend",
         [cpu("lend1-low", "lend1", "3", -1), cpu("lend1-mid", "lend1", "2"), cpu("lend2-low", "lend2", "3", -1),
          cpu("lend2-mid", "lend2", "4")],
         cpu("in", "lend1", "4"), {"lend1-low": IN_CQ, "lend2-low": RECLAIM}),
    # lend1 may hold at most its 6 and the 2 lend2 lends: 9 never fits (AnalySIM filters it as
    # larger_than_queue_quota; Kueue keeps it pending).
    case("cannot preempt from other ClusterQueues if exceeds requestable quota including lending limit",
         [cpu("lend2-low", "lend2", "10", -1)], waits(cpu("in", "lend1", "9")), {}),
    case("preemptions from cq when target queue is exhausted for the single requested resource",
         _EXHAUSTED, cpu("in", "a", "2"), {"a1": IN_CQ, "a2": IN_CQ}),
    case("preemptions from cq when target queue is exhausted for two requested resources",
         [wl(w.name, w.queue, w.priority, cpu="1", memory="1Mi") for w in _EXHAUSTED],
         wl("in", "a", cpu="2", memory="2Mi"), {"a1": IN_CQ, "a2": IN_CQ}),
    case("preemptions from cq when target queue is exhausted for one requested resource, but not the other",
         _EXHAUSTED, wl("in", "a", cpu="2", memory="2Mi"), {"a1": IN_CQ, "a2": IN_CQ}),
    case("allow preemption from other cluster queues if target cq is not exhausted for the requested resource",
         [cpu("a1", "a", "1", -1), cpu("b1", "b", "1"), cpu("b2", "b", "1"), cpu("b3", "b", "1"), cpu("b4", "b", "1"),
          cpu("b5", "b", "1", -1)],
         cpu("in", "a", "2"), {"a1": IN_CQ, "b5": RECLAIM}),
    case("long range preemption", [cpu("to-be-preempted", "cq-right", "5")], cpu("in", "cq-left", "8"),
         {"to-be-preempted": RECLAIM},
         partition=flavors("default") + cohort("root") + cohort("cohort-left", "root") + cohort("cohort-right", "root")
         + cluster_queue("cq-left", "cohort-left", [("default", quotas(cpu=("10",)))], reclaim=ANY)
         + cluster_queue("cq-right", "cohort-right", [("default", quotas(cpu=("0",)))])),
]
