"""The gate: what a pass does with a pending job before any attempt to place it.

One function, ``gate``, read by the pass's visit (cycle._visit) and by the streams that leave out
runs of jobs whose visits would change nothing (pass_streams.no_op). Its result is one of four
codes, after the Kubernetes framework's status codes:

| code | Kubernetes | the job | the pass |
|---|---|---|---|
| ``PROCEED`` | Success | may fit | attempts it (after EASY's reservations, under backfilling) |
| ``WAIT`` | Wait | was evicted at this instant | passes over it, blocking its queues as a failure would, and holds its answers to now (Engine.preempt) |
| ``UNFIT`` | Unschedulable | cannot fit now, known without an attempt: no node has its whole GPUs free (a pass that only launches), or a request no smaller (under a partition, a gang's or a job's waiting for quota: the same request), with the same signature, failed in this pass, or it waits for quota and every post-filter's sure-failure hint says it finds nothing (hints.finds_none_now) | fails it (blocking its queues), with nothing new to note |
| ``REFUSED`` | UnschedulableAndUnresolvable | is refused by quota: its VC's, with borrowing off, or the partition's admission | passes over it without blocking other tenants |

For ``PROCEED`` the gate leaves in the cycle state what the attempt reads (``CycleState.gated``):
the job's failure signature (with the flavors its admission assigned), its request, whether it is a
gang, and the nodes its admission gave it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from analysim.core.cycle_state import CycleState, failure_sig, is_gang, no_smaller_than_failed, request_of
from analysim.core.framework import QUOTA_WAIT
from analysim.core.hints import finds_none_now
from analysim.core.job import JobRun

if TYPE_CHECKING:
    from analysim.core.scheduler import Scheduler

PROCEED: Final = 0
WAIT: Final = 1
UNFIT: Final = 2
REFUSED: Final = 3


def gate(s: Scheduler, c: CycleState, job: JobRun) -> int:
    """The gate's code for a pending job now (module docstring)."""
    spec = job.spec
    g = spec.num_gpus
    h = s.handle
    if s.queue.pool.evicted_now(job, h.now):
        return WAIT
    if (c.only_capacity and 0 < g <= s.gmax and g > c.ffmax and not spec.is_fractional
            and (g <= h.state.smallest_node_gpus or h.one_node(spec))):
        return UNFIT  # no node has that many whole GPUs free
    if not h.spec.allow_borrowing and not h.within_quota(job):
        return REFUSED  # over its VC's quota
    sig = failure_sig(h, spec, c.quotas_matter)
    nodes = None
    waits_for_quota = False
    if s.admission is not None:
        admitted = s.admission.admit(job, h)
        if admitted is None:
            return REFUSED  # not admitted by the partition's quotas now
        sig = (*sig, admitted[0])  # (the flavors assigned: which nodes the job may use)
        nodes = admitted[1]
        waits_for_quota = admitted[0][:1] == QUOTA_WAIT
    # A request at least as big as one that failed, with the same signature, fails too: passing
    # over it keeps a pass over a long queue cheap when the cluster is full. Only the same request
    # for a gang, which over k nodes may fit where a smaller request failed (9 GPUs over two 8-GPU
    # nodes with 7 free each, where 8 on one node did not), and for a job waiting for quota, whose
    # search for victims is not monotone in its request (a larger one may be given another flavor).
    req = request_of(spec)
    gang = is_gang(h, spec)
    exact = gang or waits_for_quota
    if s.admission is not None:
        # (The reference engine makes the attempt instead, and so checks this rule.)
        if s.shortcuts and ((sig, req) in c.failed_exact if exact else no_smaller_than_failed(c.failed, sig, req)):
            return UNFIT
        if waits_for_quota and c.checks is not None and finds_none_now(h, c.checks, job):
            # (Its attempt, on no nodes, fails unless a post-filter finds victims, and each says it
            # surely finds none: most waiting jobs of a queue that may reclaim, on a busy cluster.)
            return UNFIT
    elif not gang and no_smaller_than_failed(c.failed, sig, req):
        # (Without a partition the reference engine applies it too: for a blocking queue the
        # failure's blocking of the job's queues, before any backfill check, is the policy's. A
        # gang's failure is read by the attempt, in a pass that only launches: cycle._attempt.)
        return UNFIT
    gated = c.gated
    gated.sig, gated.req, gated.gang, gated.exact, gated.nodes = sig, req, gang, exact, nodes
    return PROCEED
