"""Shorthands the case tables are written with: a ClusterQueue or Cohort from Kueue's test
wrappers' arguments (``Resource(name, nominal, borrowingLimit, lendingLimit)``), and workloads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tests.kueue_conformance import Workload
from tests.kueue_yaml import cohort_doc, flavor_doc, preemption, queue_docs, resource_groups

# Kueue's policy names, as its Go constants are spelled in the tables.
NEVER, LOWER, LOWER_OR_NEWER_EQUAL, ANY = "Never", "LowerPriority", "LowerOrNewerEqualPriority", "Any"

def resource(name: str) -> str:
    """A resource's Kubernetes name from its keyword here (``gpu`` for nvidia.com/gpu)."""
    return "nvidia.com/gpu" if name == "gpu" else name


# A resource's quota as the Go wrapper takes it: nominal, then optionally borrowingLimit and
# lendingLimit ("" for none).
Resource = tuple[str, ...]


def quotas(**resources: Resource) -> dict[str, dict[str, str]]:
    """resource -> (nominal, borrowingLimit, lendingLimit) as Kueue's fields; ``memory=("3Gi",)``."""
    out = {}
    for name, fields in resources.items():
        q = {"nominalQuota": fields[0]}
        for key, value in zip(("borrowingLimit", "lendingLimit"), fields[1:], strict=False):
            if value != "":
                q[key] = value
        out[resource(name)] = q
    return out


def groups(*flavor_lists: Sequence[tuple[str, Mapping[str, dict]]]) -> str:
    """Resource groups, each a list of (flavor, quotas(...)); a group covers its flavors' resources."""
    return resource_groups([(list(dict.fromkeys(r for _, q in fl for r in q)), fl) for fl in flavor_lists])


# borrowWithinCohort: LowerPriority, without a threshold.
BORROW_LOWER = "{policy: LowerPriority}"


def borrow_below(threshold: int) -> str:
    """borrowWithinCohort: LowerPriority with this maxPriorityThreshold."""
    return f"{{policy: LowerPriority, maxPriorityThreshold: {threshold}}}"


def cluster_queue(name: str, cohort: str | None, *flavor_lists, within: str | None = None, reclaim: str | None = None,
                  borrow: str | None = None, extra: str = "") -> str:
    """A ClusterQueue (and its LocalQueue): resource groups as ``groups``, and preemption policies
    (``borrow``: borrowWithinCohort, BORROW_LOWER or borrow_below(threshold))."""
    policies: dict[str, object] = {}
    if within:
        policies["withinClusterQueue"] = within
    if reclaim:
        policies["reclaimWithinCohort"] = reclaim
    if borrow:
        policies["borrowWithinCohort"] = borrow
    return queue_docs(name, cohort, (preemption(**policies) if policies else "") + extra + groups(*flavor_lists))


def cohort(name: str, parent: str | None = None, *flavor_lists, extra: str = "") -> str:
    """A Cohort, with its parent and its own quotas."""
    return cohort_doc(name, (f"\n  parent: {parent}" if parent else "") + extra
                      + (groups(*flavor_lists) if flavor_lists else ""))


def flavors(*names: str, racked: Sequence[str] = ()) -> str:
    """ResourceFlavors: those in ``racked`` on nodes of their own (a rack of their name), the
    others on every node."""
    return "".join(flavor_doc(n, {"analysim.io/rack": n} if n in racked else None) for n in names)


def cpu(name: str, queue: str, amount: str, priority: int = 0, flavor: str = "default") -> Workload:
    """A workload asking for CPU only, on ``flavor``."""
    return Workload(name, queue, {"cpu": amount}, priority, {"cpu": flavor})


def filler(name: str, queue: str, ends_s: float, **requests_on_flavor: tuple[str, str]) -> Workload:
    """A workload that holds ``resource=(amount, flavor)`` from its submission until ``ends_s``
    (Workload.ends_s)."""
    return Workload(name, queue, {resource(r): a for r, (a, _) in requests_on_flavor.items()}, 0,
                    {resource(r): f for r, (_, f) in requests_on_flavor.items()}, ends_s)


def wl(name: str, queue: str, priority: int = 0, flavor: str = "default", **requests: str) -> Workload:
    """A workload asking for these resources (``memory="2Gi"``), all on ``flavor``."""
    return Workload(name, queue, {resource(r): a for r, a in requests.items()}, priority,
                    {resource(r): flavor for r in requests})


def waits(w: Workload) -> Workload:
    """The incoming workload expected not to be admitted at its arrival."""
    return Workload(w.name, w.queue, w.requests, w.priority, {})


def unsaid(w: Workload) -> Workload:
    """The incoming workload whose admission the table does not decide (not checked)."""
    return Workload(w.name, w.queue, w.requests, w.priority, None)
