"""Kueue's fair sharing (Configuration ``fairSharing.enable: true``): the share of a ClusterQueue or
cohort, admission ordered by it, and preemption by it (Kueue's documentation, "Fair Sharing").

**Share** (Kueue's dominant resource share): kueue_share.Shares.

**Admission order.** Across ClusterQueues, the heads are taken by the share their queue would have
with the workload admitted, lowest first, then by priority and creation (in place of "those that
fit within nominal quota first"; KueueQueue reads ``share_with``).

**Preemption.** The candidates are those of classic preemption (kueue_preemption), each queue's in
Kueue's candidate order. Until the job fits: the queue holding candidates with the highest share
is the target; a candidate of the preemptor's own queue is evicted (InClusterQueue); another
queue's next candidate is evicted (InCohortFairSharing) when the strategy allows, else that queue
is left alone for the rest of this strategy:

- LessThanOrEqualToFinalShare: the preemptor's share with the job admitted is at most the
  target's share without the candidate;
- LessThanInitialShare: the preemptor's share with the job admitted is below the target's share
  before the eviction.

When the preemptor's queue stays within its nominal quota in the flavor-resources needing
preemption with the job admitted, another queue's candidates are evicted whatever the strategy, for
InCohortReclamation (Kueue's FairSharingPreemptWithinNominal, on by default since 0.17).

The strategies are tried in order, the next only if the job does not fit after the previous; then
the targets the job does not need are spared (fill back), as in classic preemption. The job may
borrow (fair sharing decides how much), and only queues that borrow are targets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analysim.core.partition import LESS_THAN_INITIAL_SHARE, LESS_THAN_OR_EQUAL_TO_FINAL_SHARE
from analysim.core.plugins.kueue_state import IN_CLUSTER_QUEUE, IN_COHORT_FAIR_SHARING, IN_COHORT_RECLAMATION

if TYPE_CHECKING:
    from analysim.core.job import JobRun
    from analysim.core.plugins.kueue_share import Shares
    from analysim.core.plugins.kueue_trial import Trial

Charges = tuple[tuple[tuple[str, str], int], ...]


def allows(strategy: str, preemptor_share: float, target_before: float, target_after: float) -> bool:
    """Whether a fair-sharing strategy lets the preemptor's queue evict from the target's."""
    if strategy == LESS_THAN_OR_EQUAL_TO_FINAL_SHARE:
        return preemptor_share <= target_after
    if strategy == LESS_THAN_INITIAL_SHARE:
        return preemptor_share < target_before
    raise ValueError(f"unknown fair-sharing strategy {strategy!r}")


def fair_targets(fit: Trial, shares: Shares, job: JobRun, q: int, charges: Charges,
                 by_queue: dict[int, list[JobRun]], strategies: tuple[str, ...],
                 within_nominal: bool) -> list[tuple[JobRun, str]] | None:
    """The fair-sharing preemption's targets with their reasons (module docstring), or None.
    ``fit`` is the search's trial (kueue_trial.Trial: evicts on the quota tree, undone at the
    end, and tells whether the job fits); ``by_queue`` each queue's candidates in candidate order;
    ``within_nominal``: the preemptor's queue stays within nominal quota with the job."""
    targets: list[tuple[JobRun, str]] = []
    left = {c: list(vs) for c, vs in by_queue.items() if vs}
    found = False
    try:
        for strategy in strategies:
            open_queues = set(left)
            while open_queues and not found:
                c = max(open_queues, key=lambda k: (shares.share(k), -k))
                if c != q and not fit.still_borrows(c):
                    open_queues.discard(c)  # (no longer borrows: not a target)
                    continue
                v = left[c][0]
                if c == q:
                    reason = IN_CLUSTER_QUEUE
                elif within_nominal:
                    reason = IN_COHORT_RECLAMATION
                else:
                    before = shares.share(c)
                    fit.release(v)
                    after = shares.share(c)
                    fit.restore(v)
                    if not allows(strategy, shares.share(q, charges), before, after):
                        open_queues.discard(c)
                        continue
                    reason = IN_COHORT_FAIR_SHARING
                left[c].pop(0)
                if not left[c]:
                    del left[c]
                    open_queues.discard(c)
                fit.release(v)
                targets.append((v, reason))
                found = fit.fits_now([t for t, _ in targets])
            if found:
                break
        if not found:
            return None
        return fit.fill_back(targets, True)
    finally:
        for t, _ in targets:
            fit.restore(t)
