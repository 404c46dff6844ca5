"""pkg/scheduler/scheduler_test.go, TestSchedule: one scheduling cycle over pending workloads, the
flavor assigner choosing their flavors. Each case here has only the ClusterQueues its workloads
use (TestSchedule's others, with tainted flavors and namespace selectors, decide nothing in
them; a job reaches its ClusterQueue through the LocalQueue of its name). Flavors that are
alternatives get nodes of their own. The table's preemptor is left pending for the cycle (its
victims are still terminating); here it is admitted at its arrival, on the flavor it preempted in.
``gpu`` (an extended resource in the table) is nvidia.com/gpu here."""

from __future__ import annotations

from tests.kueue_conformance import BORROWING_LEVEL, FLAVOR_SCORING, Case, Workload
from tests.kueue_conformance.build import (
    ANY,
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
from tests.kueue_yaml import preemption

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
         [wl("preemptor", "other-alpha", 100, "spot", gpu="6")], {"b1": RECLAIM}, xfail=FLAVOR_SCORING),
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
         [], [cpu("guaranteed", "guaranteed", "4"), waits(cpu("best-effort", "best-effort", "4", 3))], {},
         xfail=BORROWING_LEVEL),
    case("don't assign flavor if there are no candidates for preemption",
         TWO + cluster_queue("cq1", "cohort", [("on-demand", quotas(cpu=("0", "1"))), ("spot", quotas(cpu=("0", "1")))],
                             extra=preemption(withinClusterQueue=LOWER, reclaimWithinCohort=ANY,
                                              borrowWithinCohort="{policy: LowerPriority}")
                             + fungibility(whenCanPreempt="MayStopSearch", whenCanBorrow="MayStopSearch"))
         + cluster_queue("cq2", "cohort", [("on-demand", quotas(cpu=("1",))), ("spot", quotas(cpu=("1",)))]),
         [cpu("admitted", "cq2", "1", flavor="on-demand")], [cpu("new", "cq1", "1", 100, flavor="spot")], {}),
    case("admit to second flavor when first needs preemption; WhenCanPreempt: TryNextFlavor",
         TWO + cluster_queue("preempt-attempts-cq", None, [("on-demand", quotas(cpu=("1",))), ("spot", quotas(cpu=("1",)))],
                             within=LOWER, extra=fungibility(whenCanPreempt="TryNextFlavor")),
         [cpu("blocker", "preempt-attempts-cq", "1", 50, flavor="on-demand")],
         [cpu("test-wl", "preempt-attempts-cq", "1", 100, flavor="spot")], {}),
    case("PreemptionOverBorrowing preference: preempt in first flavor instead of borrowing in second",
         preference("pob", "PreemptionOverBorrowing"), [cpu("low-pob", "pob-cq", "5", -1, flavor="on-demand")],
         [cpu("high-pob", "pob-cq", "5", flavor="on-demand")], {"low-pob": IN_CQ}, xfail=FLAVOR_SCORING),
    case("BorrowingOverPreemption preference: borrow in second flavor instead of preempting in first",
         preference("bop", "BorrowingOverPreemption"), [cpu("low-bop", "bop-cq", "5", -1, flavor="on-demand")],
         [cpu("high-bop", "bop-cq", "5", flavor="spot")], {}),
]
