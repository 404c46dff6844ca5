"""pkg/scheduler/preemption/preemption_fair_test.go, TestFairPreemptions: preemption under fair
sharing (a Configuration with fairSharing on; the row's strategies, Kueue's default without).
The table gives every admitted workload the same admission time and its name as UID, so Kueue
takes equal-priority candidates by name; here they are submitted in reverse name order, so the
most recently admitted (AnalySIM's first candidate) is the first by name."""

from __future__ import annotations

from tests.kueue_conformance import FAIR_ALMOST_LCA, FAIR_SKIPS_QUEUE, Case, Workload
from tests.kueue_conformance.build import (
    ANY,
    LOWER,
    borrow_below,
    cluster_queue,
    cohort,
    cpu,
    filler,
    flavors,
    quotas,
    waits,
)
from tests.kueue_yaml import fair_sharing_config

SOURCE = "pkg/scheduler/preemption/preemption_fair_test.go"
IN_CQ, RECLAIM, FAIR = "InClusterQueue", "InCohortReclamation", "InCohortFairSharing"


def weight(w: str | None) -> str:
    return f"\n  fairSharing: {{weight: {w}}}" if w is not None else ""


def cq(name: str, parent: str | None, nominal: str, *, w: str | None = None, within: str | None = None,
       reclaim: str | None = None, borrow: str | None = None) -> str:
    return cluster_queue(name, parent, [("default", quotas(cpu=(nominal,)))], within=within, reclaim=reclaim,
                         borrow=borrow, extra=weight(w))


def co(name: str, parent: str | None = None, nominal: str | None = None, w: str | None = None) -> str:
    return cohort(name, parent, *([[("default", quotas(cpu=(nominal,)))]] if nominal else []), extra=weight(w))


# TestFairPreemptions' baseCQs: a, b, c with 3 CPUs each and preemptible with none, in cohort all.
BASE = "".join(cq(n, "all", "3", within=LOWER, reclaim=ANY, borrow=borrow_below(-3)) for n in "abc") + cq(
    "preemptible", "all", "0")


def units(queue: str, *names: str, priority: int = 0) -> list[Workload]:
    return [cpu(n, queue, "1", priority) for n in names]


def case(name: str, running: list[Workload], incoming: Workload, victims: dict[str, str], queues: str = BASE,
         strategies: tuple[str, ...] = (), xfail: str | None = None, flavor_docs: str | None = None,
         in_order: bool = False) -> Case:
    """A row; its running workloads admitted in reverse name order (Kueue's tie-break among equal
    creation times), or in the order given when the admitted state needs it (``in_order``)."""
    partition = (flavor_docs or flavors("default")) + fair_sharing_config(*strategies) + queues
    ordered = list(running) if in_order else sorted(running, key=lambda w: w.name, reverse=True)
    return Case(SOURCE, name, partition, tuple(ordered), (incoming,), victims, xfail)


A3, B5 = units("a", "a1", "a2", "a3"), units("b", "b1", "b2", "b3", "b4", "b5")
B6 = units("b", "b1", "b2", "b3", "b4", "b5", "b6")
LOW_BIG = [cpu("a1", "a", "3"), cpu("b_low", "b", "5", 0), cpu("b_high", "b", "1", 1)]
WEIGHTED = lambda wa=None, wb=None: (cq("a", "all", "3", w=wa, within=LOWER, reclaim=ANY)  # noqa: E731
                                     + cq("b", "all", "3", w=wb, within=LOWER, reclaim=ANY))

CASES = [
    case("reclaim nominal from user using the most", A3 + B5 + units("c", "c1"), cpu("c_incoming", "c", "1"),
         {"b1": RECLAIM}),
    case("can reclaim from queue using less, if taking the latest workload from user using the most isn't enough",
         [cpu("a1", "a", "3"), cpu("a2", "a", "1"), cpu("b1", "b", "2"), cpu("b2", "b", "3")],
         cpu("c_incoming", "c", "3"), {"a1": RECLAIM}),
    case("reclaim borrowable quota from user using the most", A3 + B5 + units("c", "c1"), cpu("a_incoming", "a", "1"),
         {"b1": FAIR}),
    case("preempt one from each CQ borrowing",
         [cpu("a1", "a", "0.5"), cpu("a2", "a", "0.5"), cpu("a3", "a", "3"), cpu("b1", "b", "0.5"), cpu("b2", "b", "0.5"),
          cpu("b3", "b", "3")],
         cpu("c_incoming", "c", "2"), {"a1": RECLAIM, "b1": RECLAIM}),
    case("can't preempt when everyone under nominal", A3 + units("b", "b1", "b2", "b3") + units("c", "c1", "c2", "c3"),
         waits(cpu("c_incoming", "c", "1")), {}),
    case("can't preempt when it would switch the imbalance", A3 + B5, waits(cpu("a_incoming", "a", "2")), {}),
    case("can preempt lower priority workloads from same CQ",
         units("a", "a1_low", "a2_low", priority=-1) + units("a", "a3", "a4") + B5, cpu("a_incoming", "a", "2"),
         {"a1_low": IN_CQ, "a2_low": IN_CQ}),
    case("can preempt a combination of same CQ and highest user",
         units("a", "a_low", priority=-1) + units("a", "a2", "a3") + B6, cpu("a_incoming", "a", "2"),
         {"a_low": IN_CQ, "b1": FAIR}),
    case("preempt huge workload if there is no other option, as long as the target CQ gets a lower share",
         [cpu("b1", "b", "9")], cpu("a_incoming", "a", "2"), {"b1": RECLAIM}),
    case("can't preempt huge workload if the incoming is also huge", [cpu("a1", "a", "2"), cpu("b1", "b", "7")],
         waits(cpu("a_incoming", "a", "5")), {}),
    case("can't preempt 2 smaller workloads if the incoming is huge",
         [cpu("b1", "b", "2"), cpu("b2", "b", "2"), cpu("b3", "b", "3")], waits(cpu("a_incoming", "a", "6")), {}),
    case("preempt from target and others even if over nominal",
         [cpu("a1_low", "a", "2", -1), cpu("a2_low", "a", "1", -1), cpu("b1", "b", "3"), cpu("b2", "b", "3")],
         cpu("a_incoming", "a", "4"), {"a1_low": IN_CQ, "b1": FAIR}),
    case("prefer to preempt workloads that don't make the target CQ have the biggest share",
         [cpu("b1", "b", "2"), cpu("b2", "b", "1"), cpu("b3", "b", "2"), cpu("c1", "c", "1")],
         cpu("a_incoming", "a", "3.5"), {"b2": FAIR}, xfail=FAIR_SKIPS_QUEUE),
    case("preempt from different cluster queues if the end result has a smaller max share",
         [cpu("b1", "b", "2"), cpu("b2", "b", "2.5"), cpu("c1", "c", "2"), cpu("c2", "c", "2.5")],
         cpu("a_incoming", "a", "3.5"), {"b1": FAIR, "c1": FAIR}),
    case("scenario above does not flap", [cpu("a1", "a", "3.5"), cpu("b2", "b", "2.5"), cpu("c2", "c", "2.5")],
         waits(cpu("b_incoming", "b", "2")), {}),
    case("cannot preempt if it would make the candidate CQ go under nominal after preempting one element",
         [cpu("b1", "b", "3"), cpu("b2", "b", "3"), cpu("c1", "c", "3")], waits(cpu("a_incoming", "a", "4")), {}),
    case("workloads under priority threshold not capriciously preempted",
         A3 + units("b", "b1", "b2", "b3") + units("preemptible", "preemptible1", "preemptible2", "preemptible3",
                                                   priority=-3),
         waits(cpu("a_incoming", "a", "2")), {}),
    case("preempt lower priority first, even if big", LOW_BIG, cpu("a_incoming", "a", "1"), {"b_low": FAIR},
         strategies=("LessThanInitialShare",)),
    case("preempt workload that doesn't transfer the imbalance, even if high priority", LOW_BIG,
         cpu("a_incoming", "a", "1"), {"b_high": FAIR}, strategies=("LessThanOrEqualToFinalShare",), xfail=FAIR_SKIPS_QUEUE),
    case("CQ with higher weight can preempt more", A3 + B6, cpu("a_incoming", "a", "2"), {"b1": FAIR, "b2": FAIR},
         queues=WEIGHTED("2") + cq("c", "all", "3", within=LOWER, reclaim=ANY)),
    case("can preempt anything borrowing from CQ with 0 weight", A3 + B6, cpu("a_incoming", "a", "3"),
         {"b1": FAIR, "b2": FAIR, "b3": FAIR}, queues=WEIGHTED(None, "0") + cq("c", "all", "3", within=LOWER, reclaim=ANY)),
    case("can't preempt nominal from CQ with 0 weight", A3 + units("b", "b1", "b2", "b3"),
         waits(cpu("a_incoming", "a", "1")), {}, queues=WEIGHTED(None, "0")),
    case("can't preempt nominal from Cohort with 0 weight", [cpu("right-1", "right-cq", "1")],
         waits(cpu("left-1", "left-cq", "1")), {},
         queues=co("right-cohort", "root", "1", "0") + cq("left-cq", "root", "0", reclaim=ANY)
         + cq("right-cq", "right-cohort", "0", w="0", reclaim=ANY)),
    case("can preempt within cluster queue when no cohort", units("a", "a1"), cpu("a_incoming", "a", "1", 1000),
         {"a1": IN_CQ}, queues=cq("a", None, "1", within=LOWER)),
    case("hierarchical preemption",
         [cpu(f"{q}{i}", q, "1", i) for q in "bcde" for i in range(1, 6)], cpu("unit", "a", "5"),
         {"b1": FAIR, "b2": FAIR, "c1": FAIR, "c2": FAIR, "e1": FAIR},
         queues=co("ROOT", None, "5") + co("LEFT", "ROOT", "5", "2") + co("RIGHT", "ROOT", "5")
         + cq("a", "LEFT", "1", w="2", reclaim=ANY) + cq("b", "LEFT", "1") + cq("c", "ROOT", "1") + cq("d", "RIGHT", "1")
         + cq("e", "RIGHT", "1", w="0.99"), xfail=FAIR_ALMOST_LCA),
    case("borrowing cq in non-borrowing cohort is protected",
         units("a", "a1", "a2", "a3", priority=-1) + units("b", "b1", priority=-1), cpu("unit", "a", "5"),
         {"a1": IN_CQ, "a2": IN_CQ, "a3": IN_CQ},
         queues=co("ROOT") + co("RIGHT", "ROOT", "1", "0.1") + cq("a", "ROOT", "5", w="10", reclaim=ANY, within=LOWER)
         + cq("b", "RIGHT", "0", w="0.1")),
    case("forced to preempt within clusterqueue because borrowing workload too important",
         units("a", "a1", "a2", "a3", priority=-1) + [cpu("b1", "b", "4", 100)], cpu("unit", "a", "4"),
         {"a1": IN_CQ, "a2": IN_CQ, "a3": IN_CQ},
         queues=co("ROOT") + co("RIGHT", "ROOT", "3", "0.1") + cq("a", "ROOT", "5", w="10", reclaim=LOWER, within=LOWER)
         + cq("b", "RIGHT", "0", w="0.1")),
    case("deep preemption", units("b", "b1"), cpu("a1", "a", "1"), {"b1": FAIR},
         queues=co("ROOT") + co("A", "ROOT", w="1.01") + co("AA", "A") + co("AAA", "AA") + co("B", "ROOT", w="0.99")
         + co("BB", "B") + co("BBB", "BB") + co("C", "ROOT") + co("CC", "C") + co("CCC", "CC") + co("CCCC", "CCC", "1")
         + cq("a", "AAA", "0", reclaim=ANY) + cq("b", "BBB", "0"), xfail=FAIR_ALMOST_LCA),
    case("cq with zero weight can reclaim nominal quota", units("b", "b1"), cpu("a1", "a", "1"), {"b1": RECLAIM},
         queues=cq("a", "ROOT", "1", w="0.0", reclaim=ANY) + cq("b", "ROOT", "0", w="1.0")),
    case("cohort with zero weight can reclaim nominal quota", units("b", "b1"), cpu("a1", "a", "1"), {"b1": FAIR},
         queues=co("A", "ROOT", "1", "0.0") + cq("a", "A", "0", w="0.0", reclaim=ANY) + cq("b", "ROOT", "0", w="1.0"), xfail=FAIR_ALMOST_LCA),
    case("nominal first: workload fitting within nominal can preempt despite high aggregate DRS",
         # (the filler holds a's premium while the cheap ones are admitted: with premium free they
         # would take it, and with it full of b's loan a would reclaim it, MayStopSearch)
         [filler("filler", "a", 5.5, cpu=("3", "premium"))]
         + [cpu(f"a_cheap{i}", "a", "1", flavor="cheap") for i in range(1, 6)]
         + [cpu("a_prem1", "a", "1", flavor="premium"), cpu("a_prem2", "a", "1", flavor="premium"),
            cpu("b_prem1", "b", "1", flavor="premium")],
         cpu("a_incoming", "a", "1", flavor="premium"), {"b_prem1": RECLAIM}, in_order=True,
         flavor_docs=flavors("premium", "cheap", racked=("premium", "cheap")),
         queues=cluster_queue("a", "all", [("premium", quotas(cpu=("3",))), ("cheap", quotas(cpu=("0",)))], reclaim=ANY,
                              extra="\n  flavorFungibility: {whenCanBorrow: MayStopSearch, whenCanPreempt: MayStopSearch}")
         + cluster_queue("b", "all", [("premium", quotas(cpu=("0",))), ("cheap", quotas(cpu=("6",)))])),
    case("zero weight borrowing preemptor can preempt from a borrowing CQ which also has zero weight",
         units("b", "b1", "b2", "b3"), cpu("a_incoming", "a", "2"), {"b1": FAIR},
         queues=co("all", None, "3") + cq("a", "all", "1", w="0", reclaim=ANY) + cq("b", "all", "0", w="0")),
    case("non-zero weight borrowing preemptor preempts from a borrowing CQ",
         units("b", "b1", "b2", "b3"), cpu("a_incoming", "a", "2"), {"b1": FAIR},
         queues=co("all", None, "3") + cq("a", "all", "1", w="1", reclaim=ANY) + cq("b", "all", "0", w="1")),
]
