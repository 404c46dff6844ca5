"""The scheduling framework: a cycle of named extension points, after Kubernetes'.

For each pending job, in the order QueueSort gives:

    admit (quota)  ->  filter (feasible nodes)  ->  score (rank nodes)  ->  reserve + bind
                                 \\ nothing fits: post-filter (preempt victims) or migrate (defragment)

plus a periodic ``rebalance`` hook. A Policy is a composition of small plugins; the engine owns all
state changes, plugins only look at the context and answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from analysim.core.job import JobRun

if TYPE_CHECKING:
    from analysim.core.engine import Engine


class QueueSort(Protocol):
    """Orders the pending queue, and ranks jobs against each other for preemption."""

    name: ClassVar[str]
    # Strict order: a job that cannot be placed for lack of capacity blocks those behind it.
    blocking: ClassVar[bool]
    # The key may change while a job waits for reasons other than the plugin's own timers:
    # the queue is re-sorted on every pass.
    dynamic: ClassVar[bool]

    def key(self, job: JobRun, ctx: Engine) -> tuple:
        """Sort key of a pending job; lower runs first. Must not change while the job waits,
        unless ``dynamic`` or the plugin calls ``ctx.rekey(job)``. Every key of a queue has the
        same length (the engine's merges compare keys laid out flat, field by field)."""

    def priority(self, job: JobRun, ctx: Engine) -> tuple:
        """Comparable across pending and running jobs; lower is more important. Preemption only
        ever evicts jobs whose priority is strictly greater than the preemptor's."""

    def preempt_rank(self, job: JobRun, ctx: Engine) -> tuple:
        """What preemption compares (by default the priority): a waiting job may evict a running
        one ranked strictly lower."""

    def preempt_ranks(self, running: list[JobRun], ctx: Engine) -> list[tuple]:
        """preempt_rank of each running job, in one go (the engine ranks a VC's running jobs once
        per pass that looks for victims)."""

    def preempt_ranks_hold_until(self, running: list[JobRun], ctx: Engine) -> float:
        """A time before which none of these running jobs' preempt_rank can change while they keep
        running (``ctx.now``: it may change at once); the engine does not rank them again before."""

    def preempt_rank_until(self, job: JobRun, ctx: Engine) -> float:
        """The same for one running job. Read only when the queue's ``per_job_rank_times`` is True
        (its running jobs' ranks change one job at a time, at times known ahead): the engine then
        ranks again only the jobs whose time has come."""

    def order(self, pending: Iterable[JobRun], ctx: Engine) -> Iterator[JobRun]:
        """The order of one scheduling pass. May be lazy and consult ``ctx`` as jobs get placed."""

    def on_event(self, kind: str, job: JobRun, ctx: Engine) -> None:
        """Hook: 'arrival', 'launch', 'stop', 'complete'. Lets a plugin keep its own state."""


class Score(Protocol):
    """Ranks the feasible nodes for a job; the binder takes the best."""

    name: ClassVar[str]

    def score(self, job: JobRun, nodes: np.ndarray, ctx: Engine) -> np.ndarray:
        """Scores for ``nodes`` (indexes), higher is better. Ties go to the lowest node index."""

    def choose(self, job: JobRun, feasible: np.ndarray, ctx: Engine) -> tuple[int, tuple[int, ...]] | None:
        """Optional: a single-node placement (node, GPU slots) chosen directly. Return None to let
        the binder use ``score``. Plugins that judge whole placements (FGD) implement this."""


class PostFilter(Protocol):
    """Runs when nothing fits: picks running jobs whose eviction would let the job run."""

    name: ClassVar[str]

    def victims(self, job: JobRun, ctx: Engine) -> list[JobRun] | None:
        ...

    def holds_until(self, job: JobRun, ctx: Engine) -> float:
        """A time before which the answer for ``job`` (waiting, with the same key) stays the same
        while the running jobs and the nodes do (``ctx.now``: it may change at once). The engine
        does not ask again, for a job whose attempt failed, before then."""

    def answers_per_request(self, ctx: Engine) -> bool:
        """Optional (absent: False). Whether, at one time with the same running jobs and nodes,
        ``victims`` finds none for every waiting job of a VC and request (JobSpec.request) that
        the queue orders after one of them it found none for (and ``holds_until`` holds for them
        as long): then, once a gang of a VC and request has failed in a pass, the engine passes
        over that VC's later gangs of the request until something changes, instead of asking
        for each (a pass tries every waiting gang)."""

    def finds_none_until(self, job: JobRun, ctx: Engine) -> float:
        """Optional (absent: the engine always asks ``victims``). A time before which ``victims``
        surely finds none for ``job`` while the running jobs and the nodes stay the same, known
        without a search (e.g. the job would take its VC over its quota); ``ctx.now`` or earlier
        when only a search can tell. A job that does not fit on the free GPUs by count, and for
        which every plugin its attempt would ask says so, is passed over without an attempt:
        most waiting jobs on a busy cluster are such, and are asked again after every stop.
        With ``finds_none_by_vc`` (optional class attribute, absent: False), the answer reads
        nothing of the running jobs but those of the job's VC, and stands across other VCs'
        launches and stops: the engine does not ask again before one of its own VC."""


class Rebalance(Protocol):
    """Moves running jobs: on a blocked job (``unblock``) and periodically (``rebalance``)."""

    name: ClassVar[str]

    def unblock(self, job: JobRun, ctx: Engine) -> list[tuple[JobRun, int, tuple[int, ...]]] | None:
        """Moves (job, destination node, GPU slots) that would let ``job`` fit on one node."""

    def rebalance(self, ctx: Engine) -> list[tuple[JobRun, int, tuple[int, ...]]]:
        ...

    def holds_until(self, job: JobRun, ctx: Engine) -> float:
        """As PostFilter.holds_until, for ``unblock``."""

    def answers_per_request(self, ctx: Engine) -> bool:
        """As PostFilter.answers_per_request, for ``unblock`` and ``holds_until``."""

    def finds_none_until(self, job: JobRun, ctx: Engine) -> float:
        """Optional: as PostFilter.finds_none_until, for ``unblock``."""


@dataclass
class Policy:
    name: str
    queue: QueueSort
    score: Score
    post_filters: list[PostFilter] = field(default_factory=list)
    rebalance: Rebalance | None = None
    backfill: bool = False  # EASY backfilling behind a blocked head (blocking queues only)

    def describe(self) -> str:
        parts = [f"queue={self.queue.name}", f"score={self.score.name}"]
        if self.backfill:
            parts.append("backfill=easy")
        if self.post_filters:
            parts.append("post-filter=" + "+".join(p.name for p in self.post_filters))
        if self.rebalance:
            parts.append(f"rebalance={self.rebalance.name}")
        return ", ".join(parts)
