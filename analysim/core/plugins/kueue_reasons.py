"""Why a pending workload is not admitted now, as Kueue would say it: the one place that answers
(the events file's pending rows, ``analysim explain``, the live scheduler's Explain). It reads the
admission's own arithmetic (KueueState.assign, QuotaTree.available) and never redoes it.

Codes, checked in this order:

- ``strict_fifo``: its ClusterQueue is StrictFIFO and another workload is its head;
- under the control-plane model, when its quota fits: ``inadmissible`` (it was tried and its quota
  did not fit, and it waits in its ClusterQueue's inadmissible pool until a release in its cohort
  tree requeues it) or ``waiting_for_cycle`` (it has not been offered to a scheduling cycle since
  its quota fits: one head per ClusterQueue per cycle, cycles ``cycle_s`` apart); one tried whose
  nodes had no room is ``no_node_room``;
- ``no_node_room``: its quota fits (a flavor per resource), but no node of those flavors has room;
- ``preemption_forbidden``: it could fit only by preempting (a lower-priority workload of its own
  ClusterQueue runs, or another ClusterQueue of its cohort borrows), and its ClusterQueue's
  preemption policies are all Never;
- ``borrowing_limit``: some flavor's cohort has the quota, but its borrowingLimit stops it;
- ``cohort_exhausted``: it would have to borrow, and its cohort has not enough left;
- ``no_flavor_quota``: no flavor has the quota, and it has no cohort to borrow from.

Between flavors the one closest to fitting names the code (borrowing_limit, then
cohort_exhausted, then no_flavor_quota); the sentence lists every flavor, as Kueue's does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analysim.core.job import GPU_MILLI, JobRun
from analysim.core.partition import CPU, GPU, requests_of

if TYPE_CHECKING:
    from analysim.core.plugins.kueue import KueueQueue
    from analysim.core.plugins.kueue_state import KueueState

STRICT_FIFO_BLOCKED = "strict_fifo"
INADMISSIBLE = "inadmissible"
WAITING_FOR_CYCLE = "waiting_for_cycle"
NO_NODE_ROOM = "no_node_room"
PREEMPTION_FORBIDDEN = "preemption_forbidden"
BORROWING_LIMIT = "borrowing_limit"
COHORT_EXHAUSTED = "cohort_exhausted"
NO_FLAVOR_QUOTA = "no_flavor_quota"
# Codes of a flavor that does not fit, the one closest to fitting first.
_CLOSEST_FIRST = (BORROWING_LIMIT, COHORT_EXHAUSTED, NO_FLAVOR_QUOTA)


def amount_text(amount: int, resource: str) -> str:
    """A quantity in a resource's base unit as Kueue writes it: GPUs whole, CPU in millicores."""
    if resource == GPU:
        gpus = amount / GPU_MILLI
        return str(int(gpus)) if gpus == int(gpus) else repr(gpus)
    if resource == CPU:
        return f"{amount}m"
    return str(amount)


def pending_reason(state: KueueState, queue: KueueQueue | None, job: JobRun) -> tuple[str, str]:
    """Why ``job``, pending, is not admitted now: (code, sentence)."""
    q = state.queue(job)
    node = state.partition.nodes[q]
    cq = node.name
    behind = _behind_strict_head(queue, q, job, cq)
    if behind is not None:
        return behind
    got = state.assign(job)
    if got is not None:
        flavors = ", ".join(sorted({f for (f, _), _ in got[1]}))
        paced = _paced_reason(queue, job, cq, flavors)
        if paced is not None:
            return paced
        share = "" if job.spec.gpu_milli == GPU_MILLI else f" of {job.spec.gpu_milli / GPU_MILLI:g}"
        return NO_NODE_ROOM, (f"ClusterQueue {cq} has the quota (flavor {flavors}), but no node of it has room "
                              f"for {job.spec.num_gpus} GPUs{share} now")
    if not node.preemption.enabled and _could_preempt(state, q, job):
        return PREEMPTION_FORBIDDEN, (f"could fit only by preempting, and ClusterQueue {cq}'s preemption policies "
                                      "(withinClusterQueue, reclaimWithinCohort, borrowWithinCohort) are Never")
    requests = requests_of(job.spec)
    for group in node.groups:
        wanted = [(r, requests[r]) for r in group.resources if r in requests]
        misses = [_miss(state, q, f, wanted) for f in group.flavors]
        if wanted and all(m is not None for m in misses):
            codes = [m[0] for m in misses if m is not None]
            code = next((c for c in _CLOSEST_FIRST if c in codes), NO_FLAVOR_QUOTA)
            return code, "couldn't assign flavors to pod set main: " + "; ".join(m[1] for m in misses if m is not None)
    # Every group has a flavor with the quota now, yet Kueue's choice is another one that needs
    # preemption (whenCanPreempt MayStopSearch, or PreemptionOverBorrowing): its victims were
    # found on the quota, and the nodes of its flavors would still have no room.
    choice = state.choose(job, state.oracle)
    flavors = ", ".join(choice.flavors) if choice is not None else "?"
    return NO_NODE_ROOM, (f"ClusterQueue {cq} would admit it on flavor {flavors} by preempting, but no node of "
                          f"it would have room for {job.spec.num_gpus} GPUs")


def _behind_strict_head(queue: KueueQueue | None, q: int, job: JobRun, cq: str) -> tuple[str, str] | None:
    """Why a workload of a StrictFIFO ClusterQueue waits when another is its head (None: not so)."""
    if queue is None or not queue.strict[q]:
        return None
    head = queue.head(q)
    if head is None or head is job:
        return None
    return STRICT_FIFO_BLOCKED, (f"waiting behind the head of StrictFIFO ClusterQueue {cq}, "
                                 f"workload {head.job_id}, which is not admitted")


def _paced_reason(queue: KueueQueue | None, job: JobRun, cq: str, flavors: str) -> tuple[str, str] | None:
    """Under the control-plane model, why a workload whose quota fits waits (None: it was tried
    and its nodes had no room, or there is no model)."""
    if queue is None or queue.control is None:
        return None
    pool = queue.pool_of(job)
    if pool == "quota":
        return INADMISSIBLE, (f"ClusterQueue {cq} has the quota now (flavor {flavors}), but the workload is in its "
                              "inadmissible pool until a release in its cohort requeues it")
    if pool is None:
        return WAITING_FOR_CYCLE, (f"ClusterQueue {cq} has the quota (flavor {flavors}); waiting for a scheduling "
                                   f"cycle to take it (one head per ClusterQueue per cycle, cycles at least "
                                   f"{queue.control.config.cycle_s:g} s apart)")
    return None


def _miss(state: KueueState, q: int, f: str, wanted: list[tuple[str, int]]) -> tuple[str, str] | None:
    """Why flavor ``f`` cannot give queue ``q`` the wanted amounts now (code, words), or None if it can."""
    tree = state.tree
    for r, amount in wanted:
        fr = (f, r)
        if fr not in tree.quota[q]:
            return NO_FLAVOR_QUOTA, f"flavor {f} has no quota for {r}"
        left = tree.available(q, fr)
        if left >= amount:
            continue
        p = tree.parent[q]
        if p >= 0 and tree.available(q, fr, limited=False) >= amount:
            return BORROWING_LIMIT, f"borrowing limit for {r} in flavor {f} exceeded"
        where = f" (cohort {state.partition.nodes[p].name} exhausted)" if p >= 0 else ""
        return (COHORT_EXHAUSTED if p >= 0 else NO_FLAVOR_QUOTA,
                f"insufficient unused quota for {r} in flavor {f}, {amount_text(amount - max(0, left), r)} more needed{where}")
    return None


def _could_preempt(state: KueueState, q: int, job: JobRun) -> bool:
    """Whether Kueue would have something to preempt for ``job`` if its policies allowed: a
    lower-priority workload of its own ClusterQueue runs, or another ClusterQueue under the same
    cohort uses more than its nominal quota."""
    running = state.running.by_queue[q]
    if running and running[0][0] < state.priority_of(job):
        return True
    tree = state.tree
    p = tree.parent[q]
    return p >= 0 and any(tree.borrowing(c, fr) > 0 for c in tree.children[p] if c != q for fr in tree.usage[c])
