"""Room refutations that outlive launches and stops (kueue_preemption's docstring, "Speed").

On a busy cluster most preemption searches end at the room bound (kueue_bounds.SearchBounds.room):
even with every workload the search might take released, the job would not be placed. When whole
GPUs alone refute it, the refutation is a number: the most whole GPUs the job could reach (its
*reach*: on one node, the node with the most free plus released; for a gang, its k nodes'), below
what it asks. Each launch or stop anywhere starts a new pass and so a new search, yet most leave
that number short: the same (queue, request, priority) failed so in the previous pass for 60,107
of the 74,076 searches of the first 20,000 Philly jobs under philly-preemption.yaml.

A *refutation* keeps the reach it found, the workloads it counted as released, and the state's
version. What it counts is wider than what the room bound itself releases: every source's
candidates up to its own cap (until the source no longer borrows), not only the share its cohort
lets a walk take (kueue_bounds.SearchBounds._refuted_per_queue). A cohort's share is not monotone:
when one of its sources stops borrowing and leaves the cohort's merge, another source's later
candidates come into the share. A source's own cap is: it is a prefix of the source's candidate
order, ended by an amount that only the source's own usage sets. The refutation still refutes a
later search of the same key whose flavor-resources needing preemption are among its own, when
every change since (``Changes``) keeps the reach short:

- a stop of a workload it counted, or of one launched since: the GPUs freed were counted already
  (free again, no longer released); of any other: its GPUs are added where it ran. A stop only
  lowers usage: no queue or cohort comes to borrow, so the sources are fewer, and each source's
  cap ends no later in its order (its usage falls by what left it);
- a launch of whole GPUs takes GPUs counted free; if the workload becomes a candidate it is
  released on the GPUs it took, so the count does not grow. A launch in the job's own queue adds
  at most itself (its own candidates are not capped), one in another cohort tree nothing. Any
  other launch raises its queue's usage, so its cap may reach further: unless it is first in
  candidate order (the lowest priority any workload has, admitted last), whose cap is then itself
  followed by the cap as it was; and its charges count in the cohorts above, so a cohort that
  comes to borrow opens its queues as sources: unless no cohort on its path below the root crosses
  into borrowing. A launch that is both adds nothing; any other launch in the job's tree ends the
  refutation, as does a launch of a fractional job (it may take part of a GPU counted free);
- fewer flavor-resources needing preemption only shrink what the walks may take;
- a node going down or up ends every refutation (they live in the engine's lasting memo).

So the reach now is at most the reach then plus, for a job on one node, the most GPUs freed on
one node by stops of workloads not counted; for a gang of k nodes, k times all of them. While that
stays below the request, the search would fail on the nodes again: it is answered without one.
The reference engine (memos that keep nothing) always searches.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from analysim.core.job import JobRun

# A change: a launch (LAUNCH, queue, whether it leaves every refutation's count as it was: it is
# first in candidate order and no cohort crossed into borrowing, whether fractional) or a stop
# (STOP, job id, the version its launch made, its GPUs per node as (node, count) pairs).
LAUNCH: Final = 0
STOP: Final = 1
# The log keeps at least this many changes; it drops the older half past twice as many.
LOG_KEEP: Final = 2048


class Changes:
    """The launches and stops of a partition's workloads, in the order KueueState counts them.

    Invariant: ``entries[i]`` is the change that took KueueState.version from ``base + i`` to
    ``base + i + 1``; ``launched_at`` holds each running workload's version after its launch."""

    def __init__(self, lowest_priority: int) -> None:
        self.lowest_priority = lowest_priority  # the lowest priority any workload can have
        self.base = 0  # the version before entries[0]
        self.entries: list[tuple] = []  # (above)
        self.launched_at: dict[str, int] = {}  # running job id -> the version its launch made
        # The latest admission (time, job seq): a launch after it, at the lowest priority, comes
        # first in candidate order (kueue_state.Running's keys: priority, then newest first).
        self.last_admitted: tuple[float, int] = (-math.inf, -1)

    def launched(self, job: JobRun, q: int, priority: int, now: float, version: int, contained: bool) -> None:
        """``job`` was admitted to queue ``q`` at ``now``, making ``version``; ``contained``: no
        cohort on the queue's path below its root came to borrow by it (KueueState._cohorts_over)."""
        at = (now, job.seq)
        first = priority <= self.lowest_priority and at > self.last_admitted
        if at > self.last_admitted:
            self.last_admitted = at
        self.entries.append((LAUNCH, q, first and contained, job.spec.is_fractional))
        self.launched_at[job.job_id] = version
        self._trim()

    def stopped(self, job: JobRun) -> None:
        """``job`` stopped (its placement is still set)."""
        gpus = tuple((n, len(slots)) for n, slots in job.placed.gpus)
        self.entries.append((STOP, job.job_id, self.launched_at.pop(job.job_id, -1), gpus))
        self._trim()

    def _trim(self) -> None:
        if len(self.entries) > 2 * LOG_KEEP:
            del self.entries[:LOG_KEEP]
            self.base += LOG_KEEP


class Refutation:
    """A room bound's refutation of a search, and what the changes since it have added to the reach
    (module docstring). It is replayed forward: each check reads only the changes since the last.

    Invariant: ``freed`` holds the GPUs that stops of workloads launched before ``version`` and
    not in ``counted`` freed, per node, over the changes up to ``seen``; no launch up to ``seen``
    ends it (``seen`` -1: one did)."""

    __slots__ = ("counted", "freed", "gang", "need", "requested", "seen", "tops", "total", "version", "within")

    def __init__(self, gang: int, requested: int, need: frozenset, counted: set[str], within: list[int],
                 tops: list[int] | None, total: int, version: int) -> None:
        self.gang = gang  # the fewest nodes the job spans (1: one node)
        self.requested = requested  # the whole GPUs it asks for (more than it could reach)
        self.need = need  # the flavor-resources that needed preemption
        self.counted = counted  # the workloads counted as released (job ids)
        # Each node's whole GPUs free plus those counted released there: a job on one node reached
        # none with enough; a gang too few on its ``gang`` nodes with the most, or in all.
        self.within = within
        # The nodes with the most in ``within``, the most first, beyond ``gang`` of them so that
        # stops on a few do not exhaust it (None: with relaxed locality only the total bounds a gang).
        self.tops = tops
        self.total = total  # the sum of ``within`` over the nodes that are up
        self.version = version  # KueueState.version when it was found
        self.seen = version  # the version the changes have been replayed to
        self.freed: dict[int, int] = {}  # node -> GPUs freed there since by stops not counted (above)


def still_refutes(r: Refutation, need: frozenset, changes: Changes, version: int, q: int,
                  root: list[int]) -> bool:
    """Whether the refutation ``r`` of a search for a job of queue ``q`` holds for its search now
    (``version``: the state's), by the changes since (module docstring); replays them into ``r``."""
    if not need <= r.need or r.seen < changes.base:
        return False
    tree, freed = root[q], r.freed
    for e in changes.entries[r.seen - changes.base:version - changes.base]:
        if e[0] == LAUNCH:
            if e[3] or not e[2] and e[1] != q and root[e[1]] == tree:
                r.seen = -1  # (fractional, or it may make others reclaimable: ended)
                return False
        elif e[2] <= r.version and e[1] not in r.counted:
            for n, k in e[3]:
                freed[n] = freed.get(n, 0) + k
    r.seen = version
    if not freed:
        return True
    within = r.within
    if r.gang <= 1:
        return all(within[n] + k < r.requested for n, k in freed.items())
    if r.total + sum(freed.values()) < r.requested:
        return True
    return r.tops is not None and _most_on(r, freed) < r.requested


def _most_on(r: Refutation, freed: dict[int, int]) -> int:
    """The most whole GPUs a gang's ``r.gang`` nodes could reach now, the stops since added; a
    figure past any request when ``r.tops`` runs out."""
    assert r.tops is not None
    k = r.gang
    most = [r.within[n] + d for n, d in freed.items()]
    rest = 0
    for n in r.tops:
        if n not in freed:
            most.append(r.within[n])
            rest += 1
            if rest == k:
                break
    else:
        return r.requested
    most.sort(reverse=True)
    return sum(most[:k])
