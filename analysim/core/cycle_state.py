"""What lives for one scheduling pass (Kubernetes' CycleState), and the queues a job waits in.

A pass creates a CycleState, its orders and visits read and add to it, and it is dropped at the
pass's end (the hints a pass leaves for the next are analysim.core.hints'). Nothing here outlives
a pass, so nothing here needs an invalidation rule: free GPUs only shrink during a pass that only
launches, and a stop (preemption, migration) clears what a stop can undo (``forget_failures``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from analysim.core.hints import FailureChecks
from analysim.core.job import JobRun, JobSpec

if TYPE_CHECKING:
    from analysim.core.framework import Handle
    from analysim.core.sorted_keys import NextKeys


class CycleState:
    """One pass's state. Invariants: ``failed[sig]`` is a request of that signature that failed
    in this pass, with no smaller one failed, and ``failed_exact`` the (signature, request) of
    every gang and job waiting for quota that failed in it (both cleared by a successful eviction
    or move; ``failed_exact`` also by a launch under a preempting partition);
    ``blocked`` holds every queue scope whose head failed in this pass, with its reservation
    under EASY backfilling; ``hold`` is no later than any failure memo or backfill answer the
    pass relied on."""

    def __init__(self, world: int, can_preempt: bool, can_migrate: bool, quotas_matter: bool,
                 checks: FailureChecks | None) -> None:
        self.world = world  # World.running at the pass's start
        self.can_preempt = can_preempt  # a failed placement may evict (post-filters)
        self.can_migrate = can_migrate  # or move running jobs (rebalance)
        self.only_capacity = not (can_preempt or can_migrate)  # launches only: free GPUs only shrink
        # Whether a failure's signature names its VC: where quotas or dedicated nodes make VCs
        # differ in what they can get (see failure_vc).
        self.quotas_matter = quotas_matter
        self.checks = checks  # the sure-failure hints (None: some plugin has none, or shortcuts off)
        # scope -> (shadow time, spare GPUs then) under EASY, else None: the queues blocked so far.
        self.blocked: dict[str | None, tuple[float, float] | None] = {}
        self.failed: dict[tuple, tuple[int, int, int, int]] = {}  # signature -> smallest failed request
        # (signature, request) of the gangs and jobs waiting for quota that failed: only the same
        # request of the same signature fails with them (gate.py)
        self.failed_exact: set[tuple] = set()
        self.hold = math.inf  # until when this pass's answers hold (see unschedulable.QuietPass)
        self.by_shape = False  # the pass reads the per-shape order (see unschedulable.IdleHint)
        self.ffmax = 0  # the most whole GPUs free on one node, as of the last launch
        # EASY's answers within the pass (backfill.py), by what they read: the lists do not change
        # during a pass, so an answer stands for later asks before it.
        self.backfill_walks: dict[tuple, tuple[tuple, tuple | None]] = {}
        self.next_answers: dict[tuple, tuple[tuple, tuple | None]] = {}  # what -> (asked after, first key found)
        self.wide_merges: dict[tuple[str, int], NextKeys] = {}  # (VC, GPUs) -> the merge of its lists that wide
        self.gated = Gated()  # what the gate found of the last job it let through
        self.over = False  # the pass ends at the job it is visiting (its evictions are being written)

    def forget_failures(self) -> None:
        """A stop (an eviction or a move) in the pass: what failed before it may fit now."""
        self.failed.clear()
        self.failed_exact.clear()

    def held_until(self, until: float) -> None:
        """The pass relied on an answer that holds until ``until``."""
        if until < self.hold:
            self.hold = until


def no_smaller(req: tuple, than: tuple) -> bool:
    """Whether a request (GPUs, GPU share, CPU, memory) asks for at least as much as ``than`` of
    each: where ``than`` failed, so does it."""
    return req[0] >= than[0] and req[1] >= than[1] and req[2] >= than[2] and req[3] >= than[3]


def note_failure(failed: dict, sig: tuple, req: tuple) -> None:
    """Remember the smallest request of each signature that failed: kept when no smaller one
    failed before."""
    worse = failed.get(sig)
    if worse is None or no_smaller(worse, req):
        failed[sig] = req


def failure_vc(h: Handle, vc: str, quotas_matter: bool) -> str | None:
    """The VC a failed request's signature names: its own where quotas or dedicated nodes make VCs
    differ in what they can get, None where all share the pool."""
    return vc if quotas_matter or vc in h.dedicated else None


def failure_sig(h: Handle, spec: JobSpec, quotas_matter: bool) -> tuple:
    """A job's failure signature: what, besides its request, decides whether it can fit."""
    return (spec.gpu_models, failure_vc(h, spec.vc, quotas_matter), spec.is_fractional)


def is_gang(h: Handle, spec: JobSpec) -> bool:
    """Whether the job may span nodes (wider than the smallest node, and no node open to it holds
    it): a gang may fit where a smaller request failed, so gangs are always tried."""
    return spec.num_gpus > h.state.smallest_node_gpus and not h.one_node(spec)


def request_of(spec: JobSpec) -> tuple[int, int, int, int]:
    """What a job asks for, as failures are compared: (GPUs, GPU share, CPU, memory)."""
    return (spec.num_gpus, spec.gpu_milli, spec.cpu_milli, spec.memory_mib)


def no_smaller_than_failed(failed: dict, sig: tuple, req: tuple) -> bool:
    """Whether a request of this signature is no smaller than one that failed in the pass: then
    it fails too, unless it is a gang (the caller's to tell)."""
    worse = failed.get(sig)
    return worse is not None and no_smaller(req, worse)


def fails_as_worse(h: Handle, job: JobRun, failed: dict, quotas_matter: bool) -> bool:
    """Whether the pass takes a job with no admission as failed without an attempt (the gate's
    ``UNFIT`` for it, as EASY's order asks before the pass gates it)."""
    spec = job.spec
    return no_smaller_than_failed(failed, failure_sig(h, spec, quotas_matter), request_of(spec)) and not is_gang(h, spec)


class Gated:
    """What the gate found of the job it let through, for its attempt (one per pass, rewritten by
    each job the gate lets through: the attempt reads it before the next job is gated)."""

    # A plain class with its own __init__, not a dataclass: one is made per pass, and a
    # dataclass's generated __init__ runs as interpreted Python even in the compiled core.
    __slots__ = ("sig", "req", "gang", "exact", "nodes")

    def __init__(self) -> None:
        self.sig: tuple = ()  # its failure signature, with the flavors its admission assigned
        self.req: tuple[int, int, int, int] = (0, 0, 0, 0)  # its request (request_of)
        self.gang = False  # whether it may span nodes
        self.exact = False  # whether its failure fails only the same request (a gang, or waiting for quota)
        self.nodes: np.ndarray | None = None  # the nodes its admission gave it (None: every node open to it)


# Per-VC FIFO: a blocking queue is one queue per VC guarantee, plus the shared pool's (None).

def queue_scopes(h: Handle, job: JobRun) -> tuple[str | None, ...]:
    """The FIFO queues a pending job waits in, now: its own VC's, for a VC with a guarantee
    (dedicated nodes or a quota), and the shared pool's (None) when it draws on GPUs no one
    guarantees to it: a VC without quota (or no VCs at all), or a job that would borrow."""
    spec = job.spec
    vc = spec.vc
    if vc in h.dedicated:
        return (vc,)
    if h.quota_of(vc) is None:
        return (None,)
    return (vc,) if h.within_quota_of(vc, spec.gpu_demand) else (vc, None)


def scopes_blocked_by(h: Handle, vc: str) -> tuple[str | None, ...]:
    """The queues a job of ``vc`` that cannot be placed blocks: its own, and in the shared pool also
    the shared queue, even when it is within its quota (a job that would borrow takes the free GPUs
    a guaranteed head is waiting for). The first is the queue its every job waits in."""
    if vc in h.dedicated:
        return (vc,)
    if h.quota_of(vc) is None:
        return (None,)
    return (vc, None)
