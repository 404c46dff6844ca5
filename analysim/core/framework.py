"""The scheduling framework: a cycle of named extension points, after Kubernetes'.

For each pending job, in the order QueueSort gives:

    admit (quota)  ->  filter (feasible nodes)  ->  score (rank nodes)  ->  reserve + bind
                                 \\ nothing fits: post-filter (preempt victims) or migrate (defragment)

plus a periodic ``rebalance`` hook. A Policy is a composition of small plugins; the engine owns all
state changes, plugins only look at the engine through the ``Handle`` and answer.

Optional plugin interfaces (Kubernetes' EnqueueExtensions and the like): ``FailureHints`` and
``PerRequestHints`` for post-filters and rebalance, ``QueueTraits`` for the queue's flags. The engine
checks each once, when it starts (hints.failure_checks, hints.answer_per_request, QueueTraits.of),
never by name in a pass. (By attribute, not isinstance: the compiled core cannot make a Protocol
runtime-checkable.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol, cast

import numpy as np
from mypy_extensions import mypyc_attr

from analysim.core.cluster import ClusterSpec, ClusterState
from analysim.core.job import JobRun, JobSpec

if TYPE_CHECKING:
    from analysim.core.control_plane import ControlPlane
    from analysim.core.fragmentation import FragmentationIndex
    from analysim.core.records import EngineConfig


@mypyc_attr(allow_interpreted_subclasses=True)
class Handle:
    """What a plugin may read of the engine and ask of it: the narrow interface every plugin gets
    as ``ctx`` (Kubernetes' framework.Handle). The engine is the one implementation.

    A class, not a typing.Protocol: the compiled core (mypyc) calls through a class natively and
    through a Protocol as generic Python attribute lookups, on the paths every attempt takes."""

    now: float  # virtual seconds
    state: ClusterState  # the nodes and their free GPUs, CPU and memory (read only)
    spec: ClusterSpec  # the cluster's topology and VCs
    config: EngineConfig  # the run's mechanism knobs (preemption, overheads, ...)
    policy: Policy  # the plugins of the run
    traits: QueueTraits  # the queue's flags, read once (QueueTraits.of)
    rng: np.random.Generator  # the run's one random stream (seeded by EngineConfig.seed)
    running: dict[str, JobRun]  # job id -> running job
    running_by_vc: dict[str, dict[str, JobRun]]  # VC -> job id -> running job
    gpus_of_vc: dict[str, np.ndarray]  # VC -> GPUs its running jobs hold on each node (read only)
    dedicated: set[str]  # the VCs with nodes of their own (their jobs run only there, others never)
    # Whether plugins may answer from bounds and memos (off: the reference engine, which the
    # tests compare the shortcuts against)
    shortcuts: bool

    # The nodes open to a job (kept until a node goes down or up).
    def static_key(self, spec: JobSpec) -> tuple:
        """What ``static_mask`` reads of a job: jobs with the same key may use the same nodes."""
        raise NotImplementedError

    def static_mask(self, spec: JobSpec) -> np.ndarray:
        """Nodes the job may ever use right now: up, of an allowed GPU model, open to its VC."""
        raise NotImplementedError

    def open_nodes(self, spec: JobSpec) -> list[bool]:
        """static_mask as a list (for loops over running jobs' nodes)."""
        raise NotImplementedError

    def open_to_every_node(self, spec: JobSpec) -> bool:
        """Whether static_mask is all True."""
        raise NotImplementedError

    def one_node(self, spec: JobSpec) -> bool:
        """Whether the job must fit on one node: some node open to it (up) has enough GPUs."""
        raise NotImplementedError

    def gang_size(self, spec: JobSpec) -> int:
        """placement.gang_size over the nodes open to the job."""
        raise NotImplementedError

    # Quotas.
    def quota_of(self, vc: str) -> float | None:
        """GPUs guaranteed to a VC; None when it has none (no VCs, or dedicated nodes)."""
        raise NotImplementedError

    def within_quota(self, job: JobRun) -> bool:
        """Whether the job keeps its VC within its quota if it runs now."""
        raise NotImplementedError

    def within_quota_of(self, vc: str, demand: float) -> bool:
        """Whether a job of ``vc`` asking for ``demand`` GPUs keeps its VC within its quota now."""
        raise NotImplementedError

    def vc_over_quota(self, vc: str) -> bool:
        """Whether the VC holds more GPUs than its quota (it borrows, and can be reclaimed from)."""
        raise NotImplementedError

    # Jobs.
    def expected_end(self, job: JobRun) -> float:
        """When a running job ends if nothing happens to it (inf for a job not running)."""
        raise NotImplementedError

    def remaining_now(self, job: JobRun) -> float:
        """Work left at ``now``, for a running job counting the progress of its current segment."""
        raise NotImplementedError

    def attained_now(self, job: JobRun) -> float:
        """GPU-seconds the job has run, counting its current segment."""
        raise NotImplementedError

    def head_of_line(self) -> JobRun | None:
        """The pending job the queue would look at first."""
        raise NotImplementedError

    def ranked_running(self, vc: str | None) -> tuple[list[tuple], list[JobRun]]:
        """The running jobs of ``vc`` (every running job for None), ascending by (preemption rank,
        last start, seq), with their ranks alongside for bisecting (analysim.core.ranked)."""
        raise NotImplementedError

    def ranks_hold_until(self, vc: str | None) -> float:
        """A time before which no preemption rank of ``vc``'s running jobs can move."""
        raise NotImplementedError

    def fragmentation_index(self) -> FragmentationIndex:
        """FGD's per-node expected fragmentation, brought up to date with the allocation."""
        raise NotImplementedError

    # Memos (analysim.core.memos): each plugin keys its entries with its own name.
    def plugin_memo(self) -> dict:
        """Lives while the pass and the running jobs stay the same."""
        raise NotImplementedError

    def vc_memo(self, vc: str) -> dict:
        """Lives while ``vc``'s running jobs and the nodes stay the same."""
        raise NotImplementedError

    def lasting_memo(self) -> dict:
        """Lives while the nodes stay the same; entries say themselves how long they hold."""
        raise NotImplementedError

    def stopped_demand(self, vc: str) -> float:
        """The GPUs (gpu_demand) of every stop of a job of ``vc`` so far: ended, evicted or moved."""
        raise NotImplementedError

    # Requests.
    def set_timer(self, at: float, job: JobRun | None = None, tag: str = "") -> None:
        """Re-examine ``job`` (re-key it if pending) and run a pass at ``at``."""
        raise NotImplementedError

    def rekey(self, job: JobRun) -> None:
        """The job's queue key changed while it was pending."""
        raise NotImplementedError



class QueueSort(Protocol):
    """Orders the pending queue, and ranks jobs against each other for preemption."""

    name: ClassVar[str]
    # Strict order: a job that cannot be placed for lack of capacity blocks those behind it.
    blocking: ClassVar[bool]
    # The key may change while a job waits for reasons other than the plugin's own timers:
    # the queue is re-sorted on every pass.
    dynamic: ClassVar[bool]
    # The optional flags below (absent: False) are read once, into QueueTraits.
    # preemptive: ranks running jobs below waiting ones, so a post-filter may evict them.
    # per_vc_order: order() gets ``pending`` per VC (a dict VC -> iterator of its jobs in key order;
    #   with heads_ranked_by_state and the shortcuts on, a PassStreams, which makes them when asked).
    # heads_ranked_by_state: order() ranks a VC's next job by the job itself against state that
    #   changes within a pass, read when it comes up (Kueue: would it borrow?), so each VC's
    #   iterator gives every pending job: one left out for want of room would bring the job behind
    #   it up, and rank it, early. (Fair share ranks the VC, whichever job is next: not needed.)
    # ranks_follow_keys: a waiting job's preempt_rank never orders before that of a job ahead of it.
    # running_ranks_only_rise: a running job's preempt_rank never moves later while it runs.
    # per_job_rank_times: running ranks change one job at a time, at preempt_rank_until.

    def key(self, job: JobRun, ctx: Handle) -> tuple:
        """Sort key of a pending job; lower runs first. Must not change while the job waits,
        unless ``dynamic`` or the plugin calls ``ctx.rekey(job)``. Every key of a queue has the
        same length (the engine's merges compare keys laid out flat, field by field)."""

    def priority(self, job: JobRun, ctx: Handle) -> tuple:
        """Comparable across pending and running jobs; lower is more important. Preemption only
        ever evicts jobs whose priority is strictly greater than the preemptor's."""

    def preempt_rank(self, job: JobRun, ctx: Handle) -> tuple:
        """What preemption compares (by default the priority): a waiting job may evict a running
        one ranked strictly lower."""

    def preempt_ranks(self, running: list[JobRun], ctx: Handle) -> list[tuple]:
        """preempt_rank of each running job, in one go (the engine ranks a VC's running jobs once
        per pass that looks for victims)."""

    def preempt_ranks_hold_until(self, running: list[JobRun], ctx: Handle) -> float:
        """A time before which none of these running jobs' preempt_rank can change while they keep
        running (``ctx.now``: it may change at once); the engine does not rank them again before."""

    def preempt_rank_until(self, job: JobRun, ctx: Handle) -> float:
        """The same for one running job. Read only under ``per_job_rank_times``: the
        engine then ranks again only the jobs whose time has come."""

    def order(self, pending: Iterable[JobRun], ctx: Handle) -> Iterator[JobRun]:
        """The order of one scheduling pass. May be lazy and consult ``ctx`` as jobs get placed."""

    def on_event(self, kind: str, job: JobRun, ctx: Handle) -> None:
        """Hook: 'arrival', 'launch', 'stop', 'complete'. Lets a plugin keep its own state."""


class Score(Protocol):
    """Ranks the feasible nodes for a job; the binder takes the best."""

    name: ClassVar[str]

    def score(self, job: JobRun, nodes: np.ndarray, ctx: Handle) -> np.ndarray:
        """Scores for ``nodes`` (indexes), higher is better. Ties go to the lowest node index."""

    def choose(self, job: JobRun, feasible: np.ndarray, ctx: Handle) -> tuple[int, tuple[int, ...]] | None:
        """Optional: a single-node placement (node, GPU slots) chosen directly. Return None to let
        the binder use ``score``. Plugins that judge whole placements (FGD) implement this."""


class PostFilter(Protocol):
    """Runs when nothing fits: picks running jobs whose eviction would let the job run."""

    name: ClassVar[str]

    def victims(self, job: JobRun, ctx: Handle) -> list[JobRun] | None:
        ...

    def holds_until(self, job: JobRun, ctx: Handle) -> float:
        """A time before which the answer for ``job`` (waiting, with the same key) stays the same
        while the running jobs and the nodes do (``ctx.now``: it may change at once). The engine
        does not ask again, for a job whose attempt failed, before then."""


# What an Admission's answer names for a job it attempts on no nodes, only so that a post-filter may
# preempt for it (its quota does not fit now): the failure signature of such an attempt ends with it.
# (The shape order does not leave out a VC's later shapes on such a failure: a per-VC stream whose
# shapes were all left out ends, and a preemption later in the pass that frees its queue's quota
# would not bring them back; measured on Philly's first 12,000 jobs, the schedule changed. What
# leaves them out instead is the queue's merge, which knows when it would take them: PassStream.)
QUOTA_WAIT = ("#quota",)


class Admission(Protocol):
    """Quota admission before placement (Kueue's quota check; absent: the cluster's VC quotas).

    ``admit`` answers for a pending job the pass is about to attempt: not now (None: the job is
    passed over and waits), or the flavors it is assigned and the nodes they give it (within
    ``ctx.static_mask``). The job is placed on those nodes or not at all (a gang, all or nothing);
    the engine tells the plugin of every launch and stop, so that it keeps the usage. Its answer
    may read only the running jobs (their usage) and the job: the engine's failure memo keys an
    attempt's failure on the running jobs, and the pass's failure signatures carry the flavors."""

    name: ClassVar[str]

    def admit(self, job: JobRun, ctx: Handle) -> tuple[tuple, np.ndarray] | None:
        ...

    def on_launch(self, job: JobRun, ctx: Handle) -> None:
        """The job now holds what its last ``admit`` assigned (or, moved or resumed, what it held)."""

    def on_stop(self, job: JobRun, ctx: Handle) -> None:
        """The job holds nothing any more."""


class Rebalance(Protocol):
    """Moves running jobs: on a blocked job (``unblock``) and periodically (``rebalance``)."""

    name: ClassVar[str]

    def unblock(self, job: JobRun, ctx: Handle) -> list[tuple[JobRun, int, tuple[int, ...]]] | None:
        """Moves (job, destination node, GPU slots) that would let ``job`` fit on one node."""

    def rebalance(self, ctx: Handle) -> list[tuple[JobRun, int, tuple[int, ...]]]:
        ...

    def holds_until(self, job: JobRun, ctx: Handle) -> float:
        """As PostFilter.holds_until, for ``unblock``."""


class FailureHints(Protocol):
    """Optional, for post-filters and rebalance: a sure-failure hint (analysim.core.hints)."""

    # Whether finds_none_until reads nothing of the running jobs but those of the job's VC: the
    # answer then stands across other VCs' launches and stops, and is not asked again before one
    # of its own VC.
    finds_none_by_vc: ClassVar[bool]

    def finds_none_until(self, job: JobRun, ctx: Handle) -> float:
        """A time before which the plugin surely finds nothing for ``job`` while the running jobs
        and the nodes stay the same, known without a search (e.g. the job would take its VC over
        its quota); ``ctx.now`` or earlier when only a search can tell. A job that does not fit on
        the free GPUs by count, and for which every plugin its attempt would ask says so, is passed
        over without an attempt: most waiting jobs on a busy cluster are such, and are asked again
        after every stop. The gate asks it too of a job an Admission attempts on no nodes (its
        quota does not fit: QUOTA_WAIT), whatever the free GPUs, and fails the job when every
        plugin says so (hints.finds_none_now): its answer there must then be the same for every
        job of one VC, request and priority, which a pass reads of the first of a run of them
        (pass_streams)."""


class PerRequestHints(Protocol):
    """Optional, for post-filters and rebalance (absent: the plugin does not answer per request)."""

    def answers_per_request(self, ctx: Handle) -> bool:
        """Whether, at one time with the same running jobs and nodes, the plugin finds nothing for
        every waiting job of a VC and request (JobSpec.request) that the queue orders after one of
        them it found nothing for (and ``holds_until`` holds for them as long): then, once a gang
        of a VC and request has failed in a pass, the engine passes over that VC's later gangs of
        the request until something changes, instead of asking for each."""


class EvictionReasons(Protocol):
    """Optional, for post-filters: why a victim it chose is evicted, as (reason, for whom) — Kueue's
    reason and the preempting ClusterQueue — recorded with the eviction (Decision.reason, .by)."""

    def reason_of(self, victim: JobRun) -> tuple[str, str]: ...


class PassStream:
    """A stream a ``per_vc_order`` queue whose heads are ranked by state (QueueSort.heads_ranked_by_state;
    Kueue's) makes of some VCs' pending jobs with the shortcuts on (PassStreams): an iterator of their
    jobs in key order, the reference engine's, that also lets the queue leave out jobs whose visits
    change nothing (analysim.core.pass_streams). Keys are (the queue's key, seq).

    A class, not a Protocol, for the compiled core (see Handle)."""

    # Whether every job ``no_op`` found a no-op was refused by the gate (its quota's answer, which
    # stands until the quota's usage changes) or no longer pending, none failed for what this pass
    # learned (a request that failed before it in the pass).
    only_refused: bool = True

    def __iter__(self) -> PassStream:
        return self

    def __next__(self) -> JobRun:
        raise NotImplementedError

    def no_op(self, job: JobRun) -> bool:
        """Whether the pass's visit of ``job``, one this stream gave, would change nothing now."""
        raise NotImplementedError

    def drain(self, also: Callable[[JobRun], bool]) -> JobRun | None:
        """Leave out the next jobs while each is a no-op and ``also`` holds for it (the queue's
        own condition, per VC and request); give the first that is not (None: none is left)."""
        raise NotImplementedError

    def seek_after(self, key: tuple) -> None:
        """Start again from the first key past ``key`` (to give again jobs a drain left out)."""
        raise NotImplementedError

    def leave_out(self, requests: set[tuple]) -> None:
        """Give no job whose request (JobSpec.request) is one of these from now on."""
        raise NotImplementedError


class PassStreams:
    """What such a queue's order() is given in place of a mapping of VC -> iterator: the VCs with
    pending jobs, and one PassStream of any of them, made when asked. A queue may leave a VC out of
    its merge unread (KueueQueue's inadmissible pool): a pass over a thousand ClusterQueues, most of
    whose waiting queues are left out, then makes no stream for them.

    A class, not a Protocol, for the compiled core (see Handle)."""

    def vcs(self) -> list[str]:
        """The VCs with pending jobs (each VC once)."""
        raise NotImplementedError

    def stream(self, vcs: list[str]) -> PassStream:
        """One stream of the pending jobs of these VCs, merged in key order (unread)."""
        raise NotImplementedError

    def world(self) -> int:
        """The version of what a visit's failure reads, now: the running jobs and the nodes
        (memos.World.running). A job found failing at one fails again while it stands, until
        ``holds()``, and while the job is not queued again."""
        raise NotImplementedError

    def holds(self) -> float:
        """Until when the failures the pass has found so far hold at their version (a failure
        that outlives no instant, like a job evicted now, holds until now)."""
        raise NotImplementedError


@dataclass(frozen=True)
class QueueTraits:
    """A queue's optional flags (what each means: QueueSort's comments), read once when the
    engine starts; each False unless the queue class sets it."""

    preemptive: bool = False  # it ranks running jobs below waiting ones
    per_vc_order: bool = False  # order() takes the pending jobs per VC
    ranks_follow_keys: bool = False  # a waiting job never ranks before one ahead of it
    running_ranks_only_rise: bool = False  # a running job's rank never moves later
    per_job_rank_times: bool = False  # running ranks change one job at a time
    heads_ranked_by_state: bool = False  # a VC's next job is ranked against the state of that moment

    @staticmethod
    def of(queue: QueueSort) -> QueueTraits:
        return QueueTraits(**{f: bool(getattr(queue, f, False)) for f in (
            "preemptive", "per_vc_order", "ranks_follow_keys", "running_ranks_only_rise", "per_job_rank_times",
            "heads_ranked_by_state")})


@dataclass
class Policy:
    """The plugins of one run, one per extension point (post-filters: any number, tried in order)."""

    name: str  # what --policy called it
    queue: QueueSort  # the QueueSort point: the order pending jobs are tried in
    score: Score  # the Score point: which feasible nodes a job goes to
    post_filters: list[PostFilter] = field(default_factory=list)  # preemption, when nothing fits
    rebalance: Rebalance | None = None  # the Rebalance point: which running jobs to move (None: none)
    backfill: bool = False  # EASY backfilling behind a blocked head (blocking queues only)
    admission: Admission | None = None  # quota admission (None: the cluster's VC quotas)
    control: ControlPlane | None = None  # the control plane pacing the passes (None: a pass per change)

    def may_preempt(self, preemption: bool) -> bool:
        """Whether a run may preempt: with post-filters, when EngineConfig.preemption is on, or
        under an admission (a partition), whose policy carries post-filters only when it preempts."""
        return bool(self.post_filters) and (preemption or self.admission is not None)

    def eviction_reasons(self) -> dict[str, Callable[[JobRun], tuple[str, str]]]:
        """Per post-filter name, its optional ``reason_of(victim)``: why it evicts a victim it chose
        (a reason and the queue it made room for: Kueue's), recorded with the eviction."""
        return {pf.name: cast(EvictionReasons, pf).reason_of for pf in self.post_filters if hasattr(pf, "reason_of")}

    def describe(self) -> str:
        parts = [f"queue={self.queue.name}", f"score={self.score.name}"]
        if self.backfill:
            parts.append("backfill=easy")
        if self.post_filters:
            parts.append("post-filter=" + "+".join(p.name for p in self.post_filters))
        if self.rebalance:
            parts.append(f"rebalance={self.rebalance.name}")
        if self.admission:
            parts.append(f"admission={self.admission.name}")
        return ", ".join(parts)
