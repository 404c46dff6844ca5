"""pkg/scheduler/scheduler_test.go, TestSchedule: one scheduling cycle over pending workloads, the
flavor assigner choosing their flavors. Each case here has only the ClusterQueues its workloads
use (TestSchedule's others, with tainted flavors and namespace selectors, decide nothing in
them; a job reaches its ClusterQueue through the LocalQueue of its name). Flavors that are
alternatives get nodes of their own. The table's preemptor is left pending for the cycle (its
victims are still terminating); here it is admitted at its arrival, on the flavor it preempted in.
``gpu`` (an extended resource in the table) is nvidia.com/gpu here."""

from __future__ import annotations

from tests.kueue_conformance import (
    NO_RESERVATION,
    Case,
    Workload,
)
from tests.kueue_conformance.build import (
    ANY,
    BORROW_LOWER,
    LOWER,
    cluster_queue,
    cohort,
    cpu,
    filler,
    flavors,
    quotas,
    waits,
    wl,
)

SOURCE = "pkg/scheduler/scheduler_test.go"
IN_CQ, RECLAIM = "InClusterQueue", "InCohortReclamation"
TWO = flavors("on-demand", "spot", racked=("on-demand", "spot"))


def fungibility(**fields: str) -> str:
    return "\n  flavorFungibility: {" + ", ".join(f"{k}: {v}" for k, v in fields.items()) + "}"


def case(name: str, partition: str, running: list[Workload], incoming: list[Workload], victims: dict[str, str],
         xfail: str | None = None) -> Case:
    return Case(SOURCE, name, partition, tuple(running), tuple(incoming), victims, xfail)


# TestSchedule's sales (no cohort, StrictFIFO) and eng-alpha / eng-beta (cohort eng, StrictFIFO;
# eng-beta's model-a group of example.com/gpu left out: no workload here asks for it).
STRICT = "\n  queueingStrategy: StrictFIFO"
SALES = flavors("default") + cluster_queue("sales", None, [("default", quotas(cpu=("50",)))], extra=STRICT)
ENG = TWO + cluster_queue("eng-alpha", "eng", [("on-demand", quotas(cpu=("50", "50"))), ("spot", quotas(cpu=("100", "0")))],
                          extra=STRICT) + cluster_queue(
    "eng-beta", "eng", [("on-demand", quotas(cpu=("50", "10"))), ("spot", quotas(cpu=("0", "100")))], within=LOWER,
    reclaim=ANY, extra=STRICT)
# other-alpha and other-beta of the three preemption-flavor rows: 10 GPUs each flavor for alpha.
OTHER = TWO + cluster_queue("other-alpha", "other", [("on-demand", quotas(gpu=("10",))), ("spot", quotas(gpu=("10",)))],
                            within=LOWER, reclaim=LOWER)


def other_beta(preempts: bool) -> str:
    return cluster_queue("other-beta", "other", [("on-demand", quotas(gpu=("0",))), ("spot", quotas(gpu=("0",)))],
                         **({"within": LOWER, "reclaim": LOWER} if preempts else {}))


def lender_borrower(lending: str) -> str:
    """The hierarchical lending rows: cq-lender (10 CPUs, this lendingLimit) and cq-borrower (5,
    borrowingLimit 10) in Cohort child under root."""
    return (flavors("on-demand") + cohort("root") + cohort("child", "root")
            + cluster_queue("cq-lender", "child", [("on-demand", quotas(cpu=("10", "", lending)))])
            + cluster_queue("cq-borrower", "child", [("on-demand", quotas(cpu=("5", "10")))]))


def a_and_b(reclaim: str) -> str:
    """The "capacity blocked" rows: ClusterQueueA (2 GPUs, this reclaim policy) and ClusterQueueB
    (none) in cohort root."""
    return (flavors("on-demand") + cluster_queue("ClusterQueueA", "root", [("on-demand", quotas(gpu=("2",)))], reclaim=reclaim)
            + cluster_queue("ClusterQueueB", "root", [("on-demand", quotas(gpu=("0",)))]))


A_AND_B_RUNNING = [wl("a1-admitted", "ClusterQueueA", flavor="on-demand", gpu="1")]


def three_borrowers() -> str:
    """The same-cycle borrowing rows: cq1, cq2, cq3 in cohort co, each 10 of r1 and r2 with a
    borrowing limit of 10, reclaiming with Any. The table's extended resources r1 and r2 are cpu
    and memory here (r2 in Gi)."""
    return flavors("default") + "".join(
        cluster_queue(q, "co", [("default", quotas(cpu=("10", "10"), memory=("10Gi", "10Gi")))], reclaim=ANY)
        for q in ("cq1", "cq2", "cq3"))


def preference(name: str, kind: str) -> str:
    """The PreemptionOverBorrowing / BorrowingOverPreemption rows' ClusterQueue and lender."""
    return TWO + cluster_queue(f"{name}-cq", f"{name}-cohort", [("on-demand", quotas(cpu=("5", "0"))), ("spot", quotas(cpu=("0", "5")))],
                               within=LOWER, extra=fungibility(whenCanBorrow="TryNextFlavor", whenCanPreempt="TryNextFlavor",
                                                               preference=kind)) + cluster_queue(
        f"{name}-lender", f"{name}-cohort", [("on-demand", quotas(cpu=("0",))), ("spot", quotas(cpu=("5",)))])


CASES = [
    case("use second flavor when the first has no preemption candidates; WhenCanPreempt: MayStopSearch",
         TWO + cluster_queue("other-alpha", None, [("on-demand", quotas(cpu=("50",))), ("spot", quotas(cpu=("100",)))],
                             within=LOWER, extra=fungibility(whenCanPreempt="MayStopSearch")),
         [cpu("admitted", "other-alpha", "50", flavor="on-demand")], [cpu("new", "other-alpha", "20", flavor="spot")], {}),
    case("single clusterQueue full", SALES, [cpu("assigned", "sales", "40")], [waits(cpu("new", "sales", "11"))], {}),
    case("admit in different cohorts", SALES + ENG,
         [], [cpu("new-sales", "sales", "1"), cpu("new-eng", "eng-alpha", "51", flavor="on-demand")], {}),
    case("admit in same cohort with no borrowing", ENG, [],
         [cpu("new-alpha", "eng-alpha", "40", flavor="on-demand"), cpu("new-beta", "eng-beta", "40", flavor="on-demand")], {}),
    case("not enough resources to borrow, fallback to next flavor; WhenCanPreempt: TryNextFlavor", ENG,
         [cpu("existing", "eng-beta", "45", flavor="on-demand")], [cpu("new", "eng-alpha", "60", flavor="spot")], {}),
    # a1 holds on-demand, b1 borrows alpha's spot (a filler holds alpha's on-demand meanwhile).
    # On-demand needs a1 preempted (priority), spot b1 reclaimed: Kueue prefers the reclaim.
    case("prefer reclamation over cq priority based preemption", OTHER + other_beta(True),
         [wl("a1", "other-alpha", 50, "on-demand", gpu="5"), filler("filler", "other-alpha", 2.5, gpu=("5", "on-demand")),
          wl("b1", "other-beta", 50, "spot", gpu="5")],
         [wl("preemptor", "other-alpha", 100, "spot", gpu="6")], {"b1": RECLAIM}),
    case("prefer first preemption flavor when second flavor requires both reclaim and cq priority preemption",
         OTHER + other_beta(False),
         [wl("a1", "other-alpha", 50, "on-demand", gpu="5"), filler("filler", "other-alpha", 3.5, gpu=("5", "on-demand")),
          wl("a2", "other-alpha", 50, "spot", gpu="5"), wl("b1", "other-beta", 50, "spot", gpu="5")],
         [wl("preemptor", "other-alpha", 100, "on-demand", gpu="6")], {"a1": IN_CQ}),
    case("prefer first preemption flavor when second flavor also requires cq preemption", OTHER + other_beta(False),
         [wl("a1", "other-alpha", 50, "on-demand", gpu="6"), filler("filler", "other-alpha", 3.5, gpu=("4", "on-demand")),
          wl("a2", "other-alpha", 50, "spot", gpu="5"), wl("b1", "other-beta", 9001, "spot", gpu="5")],
         [wl("preemptor", "other-alpha", 100, "on-demand", gpu="5")], {"a1": IN_CQ}),
    # The table's Cohort "guaranteed" is "guaranteed-cohort" here: AnalySIM's reader refuses a
    # Cohort with a ClusterQueue's name (Kueue keeps the two kinds' names apart).
    case("in a hierarchical cohort, workload borrowing less is scheduled first",
         flavors("default") + cohort("root") + cohort("guaranteed-cohort", "root", [("default", quotas(cpu=("4",)))])
         + cluster_queue("guaranteed", "guaranteed-cohort", [("default", quotas(cpu=("0",)))])
         + cluster_queue("best-effort", "root", [("default", quotas(cpu=("0",)))]),
         [], [cpu("guaranteed", "guaranteed", "4"), waits(cpu("best-effort", "best-effort", "4", 3))], {}),
    case("don't assign flavor if there are no candidates for preemption",
         TWO + cluster_queue("cq1", "cohort", [("on-demand", quotas(cpu=("0", "1"))), ("spot", quotas(cpu=("0", "1")))],
                             within=LOWER, reclaim=ANY, borrow=BORROW_LOWER,
                             extra=fungibility(whenCanPreempt="MayStopSearch", whenCanBorrow="MayStopSearch"))
         + cluster_queue("cq2", "cohort", [("on-demand", quotas(cpu=("1",))), ("spot", quotas(cpu=("1",)))]),
         [cpu("admitted", "cq2", "1", flavor="on-demand")], [cpu("new", "cq1", "1", 100, flavor="spot")], {}),
    case("admit to second flavor when first needs preemption; WhenCanPreempt: TryNextFlavor",
         TWO + cluster_queue("preempt-attempts-cq", None, [("on-demand", quotas(cpu=("1",))), ("spot", quotas(cpu=("1",)))],
                             within=LOWER, extra=fungibility(whenCanPreempt="TryNextFlavor")),
         [cpu("blocker", "preempt-attempts-cq", "1", 50, flavor="on-demand")],
         [cpu("test-wl", "preempt-attempts-cq", "1", 100, flavor="spot")], {}),
    case("PreemptionOverBorrowing preference: preempt in first flavor instead of borrowing in second",
         preference("pob", "PreemptionOverBorrowing"), [cpu("low-pob", "pob-cq", "5", -1, flavor="on-demand")],
         [cpu("high-pob", "pob-cq", "5", flavor="on-demand")], {"low-pob": IN_CQ}),
    case("BorrowingOverPreemption preference: borrow in second flavor instead of preempting in first",
         preference("bop", "BorrowingOverPreemption"), [cpu("low-bop", "bop-cq", "5", -1, flavor="on-demand")],
         [cpu("high-bop", "bop-cq", "5", flavor="spot")], {}),
    # eng-beta's user-spot borrows spot while a filler holds the 10 on-demand eng-beta may borrow.
    case("can borrow if needs reclaim from cohort in different flavor", ENG,
         [cpu("user-on-demand", "eng-beta", "50", flavor="on-demand"),
          filler("filler", "eng-beta", 2.5, cpu=("10", "on-demand")), cpu("user-spot", "eng-beta", "1", flavor="spot")],
         [waits(cpu("can-reclaim", "eng-alpha", "100")), cpu("needs-to-borrow", "eng-beta", "1", flavor="on-demand")], {}),
    case("workload exceeds lending limit when borrow in cohort",
         flavors("default") + cluster_queue("lend-a", "lend", [("default", quotas(cpu=("3", "", "2")))])
         + cluster_queue("lend-b", "lend", [("default", quotas(cpu=("2", "", "2")))]),
         [cpu("a", "lend-b", "2")], [waits(cpu("b", "lend-b", "3"))], {}),
    case("hierarchical cohort respects lending limit when borrowing", lender_borrower("3"),
         [cpu("wl-existing", "cq-borrower", "5", flavor="on-demand")], [waits(cpu("wl-pending", "cq-borrower", "4"))], {}),
    case("hierarchical cohort allows borrowing up to lending limit", lender_borrower("5"),
         [cpu("wl-existing", "cq-borrower", "5", flavor="on-demand")],
         [cpu("wl-borrowing", "cq-borrower", "5", flavor="on-demand")], {}),
    case("preempt workloads in ClusterQueue and cohort", ENG,
         [cpu("borrower", "eng-alpha", "60", flavor="on-demand"), cpu("use-all-spot", "eng-alpha", "100", flavor="spot"),
          cpu("low-1", "eng-beta", "30", -1, flavor="on-demand"), cpu("low-2", "eng-beta", "10", -2, flavor="on-demand")],
         [cpu("preemptor", "eng-beta", "20", flavor="on-demand")], {"borrower": RECLAIM, "low-2": IN_CQ}),
    case("A workload is only eligible to do preemptions if it fits fully within nominal quota",
         flavors("on-demand") + cluster_queue("other-alpha", "other", [("on-demand", quotas(cpu=("2",)))], within=LOWER,
                                              reclaim=ANY)
         + cluster_queue("other-beta", "other", [("on-demand", quotas(cpu=("2",)))]),
         [cpu("a1", "other-alpha", "1", -1, flavor="on-demand"), cpu("b1", "other-beta", "1", -1, flavor="on-demand")],
         [waits(cpu("incoming", "other-alpha", "3", 1))], {}),
    # WL1 is created before WL2 (listed first, it is first in the trace at the same time).
    case("workload requiring reclaimation prioritized over wl in another full cq",
         flavors("on-demand") + cluster_queue("CQ1", "other", [("on-demand", quotas(gpu=("10",)))])
         + cluster_queue("CQ2", "other", [("on-demand", quotas(gpu=("10",)))], reclaim=ANY)
         + cluster_queue("CQ3", "other", [("on-demand", quotas(gpu=("0",)))]),
         [wl("Admitted-Workload-1", "CQ1", flavor="on-demand", gpu="5"),
          wl("Admitted-Workload-3", "CQ3", 1, flavor="on-demand", gpu="5"),
          wl("Admitted-Workload-2", "CQ3", 0, flavor="on-demand", gpu="5")],
         [waits(wl("WL1", "CQ1", gpu="10")), wl("WL2", "CQ2", flavor="on-demand", gpu="10")],
         {"Admitted-Workload-2": RECLAIM}),
    case("capacity not blocked when lending clusterqueue can reclaim (ReclaimWithinCohort=Any)", a_and_b(ANY),
         A_AND_B_RUNNING, [waits(wl("a2-pending", "ClusterQueueA", gpu="2")),
                           wl("b1-pending", "ClusterQueueB", flavor="on-demand", gpu="1")], {}),
    case("capacity blocked when lending clusterqueue not guaranteed to reclaim (ReclaimWithinCohort=LowerPriority)",
         a_and_b(LOWER), A_AND_B_RUNNING,
         [waits(wl("a2-pending", "ClusterQueueA", gpu="2")), waits(wl("b1-pending", "ClusterQueueB", gpu="1"))], {},
         xfail=NO_RESERVATION),
    case("capacity blocked when lending clusterqueue not guaranteed to reclaim (ReclaimWithinCohort=Never)",
         a_and_b("Never"), A_AND_B_RUNNING,
         [waits(wl("a2-pending", "ClusterQueueA", gpu="2")), waits(wl("b1-pending", "ClusterQueueB", gpu="1"))], {},
         xfail=NO_RESERVATION),
    # The table's two preemptors are both named "preemptor" (in two namespaces).
    case("multiple preemptions without borrowing",
         flavors("default") + "".join(cluster_queue(q, "other", [("default", quotas(cpu=("2",)))], within=LOWER)
                                      for q in ("other-alpha", "other-beta")),
         [cpu("a1", "other-alpha", "2"), cpu("b1", "other-beta", "2")],
         [cpu("preemptor-alpha", "other-alpha", "2", 100), cpu("preemptor-beta", "other-beta", "2", 100)],
         {"a1": IN_CQ, "b1": IN_CQ}),
    # (the table's example.com/gpu of 0 is no request in a trace)
    case("admit workload with zero-quantity request for resource not in ClusterQueue", SALES, [],
         [cpu("zero-resource-wl", "sales", "1")], {}),
    # a is created before b (first in the trace at the same time).
    case("preemption while borrowing, workload waiting for preemption should not block a borrowing workload in another CQ",
         flavors("default") + cluster_queue("cq_shared", "preemption-while-borrowing", [("default", quotas(cpu=("4", "0")))])
         + cluster_queue("cq_a", "preemption-while-borrowing", [("default", quotas(cpu=("0", "3")))],
                         reclaim=LOWER, borrow=BORROW_LOWER)
         + cluster_queue("cq_b", "preemption-while-borrowing", [("default", quotas(cpu=("0",)))],
                         reclaim=LOWER, borrow=BORROW_LOWER),
         [cpu("admitted_a", "cq_a", "2")], [waits(cpu("a", "cq_a", "3")), cpu("b", "cq_b", "1")], {}),
    case("minimal preemptions when target queue is exhausted",
         flavors("on-demand") + cluster_queue("other-alpha", "other", [("on-demand", quotas(cpu=("2",)))], within=LOWER,
                                              reclaim=ANY)
         + "".join(cluster_queue(q, "other", [("on-demand", quotas(cpu=("2",)))]) for q in ("other-beta", "other-gamma")),
         [cpu("a1", "other-alpha", "1", -2, flavor="on-demand"), cpu("a2", "other-alpha", "1", -2, flavor="on-demand"),
          cpu("a3", "other-alpha", "1", -1, flavor="on-demand")]
         + [cpu(f"b{i}", "other-beta", "1", flavor="on-demand") for i in (1, 2, 3)],
         [cpu("incoming", "other-alpha", "2", flavor="on-demand")], {"a1": IN_CQ, "a2": IN_CQ}),
    # Both preemptors need the resource bank's one CPU: the second (priority 99) preempts nothing
    # and waits.
    case("multiple preemptions skip preemption when shared limited resource",
         flavors("default") + "".join(cluster_queue(q, "other", [("default", quotas(cpu=("2",)))], within=LOWER,
                                                    borrow=BORROW_LOWER) for q in ("other-alpha", "other-beta"))
         + cluster_queue("resource-bank", "other", [("default", quotas(cpu=("1",)))]),
         [cpu("a1", "other-alpha", "2"), cpu("b1", "other-beta", "2")],
         [cpu("preemptor", "other-alpha", "3", 100), waits(cpu("pretending-preemptor", "other-beta", "3", 99))],
         {"a1": IN_CQ}),
    # (the table's example.com/gpu of 0 is no request in a trace)
    case("preempt when workload requests zero of a resource not defined in ClusterQueue",
         flavors("default") + cluster_queue("preempt-zero-gpu-cq", None, [("default", quotas(cpu=("4",)))], within=LOWER),
         [cpu("low-priority", "preempt-zero-gpu-cq", "4", -1)], [cpu("preemptor", "preempt-zero-gpu-cq", "2")],
         {"low-priority": IN_CQ}),
    case("PreemptionOverBorrowing preference: select fitting second flavor over first flavor with no preemption candidates",
         TWO + cohort("nopc-root", None, [("on-demand", quotas(cpu=("0",))), ("spot", quotas(cpu=("5",)))])
         + cohort("nopc-mid", "nopc-root")
         + cluster_queue("nopc-cq", "nopc-mid", [("on-demand", quotas(cpu=("5", "0"))), ("spot", quotas(cpu=("0",)))],
                         within=LOWER, extra=fungibility(whenCanBorrow="TryNextFlavor", whenCanPreempt="TryNextFlavor",
                                                         preference="PreemptionOverBorrowing"))
         + cluster_queue("nopc-sibling", "nopc-mid", [("on-demand", quotas(cpu=("5",))), ("spot", quotas(cpu=("0",)))]),
         [cpu("admitted-nopc", "nopc-cq", "5", flavor="on-demand")], [cpu("pending-nopc", "nopc-cq", "5", flavor="spot")], {}),
    # (the table's two workloads are both named "new", in two namespaces)
    case("can borrow if cohort was assigned and will not result in overadmission", ENG, [],
         [cpu("new-alpha", "eng-alpha", "45", flavor="on-demand"), cpu("new-beta", "eng-beta", "55", flavor="on-demand")],
         {}),
    case("two workloads can borrow different resources from the same flavor in the same cycle", three_borrowers(), [],
         [cpu("wl1", "cq1", "16", -1), wl("wl2", "cq2", -2, memory="16Gi")], {}),
    case("two workloads can borrow the same resources from the same flavor in the same cycle if fits in the cohort quota",
         three_borrowers(), [], [cpu("wl1", "cq1", "16", -1), cpu("wl2", "cq2", "14", -2)], {}),
    case("only one workload can borrow one resources from the same flavor in the same cycle if cohort quota cannot fit",
         three_borrowers(), [], [cpu("wl1", "cq1", "16", -1), waits(cpu("wl2", "cq2", "16", -2))], {}),
    case("multiple preemptions preemption possible after earlier workload fits",
         flavors("default") + cluster_queue("other-alpha", "other", [("default", quotas(cpu=("1",)))], within=LOWER)
         + cluster_queue("other-beta", "other", [("default", quotas(cpu=("2",)))], within=LOWER),
         [cpu("b1", "other-beta", "2")], [cpu("fit", "other-alpha", "1", 100), cpu("preemptor", "other-beta", "2", 99)],
         {"b1": IN_CQ}),
]
