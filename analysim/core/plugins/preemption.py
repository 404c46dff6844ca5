"""Post-filter plugins: when a job cannot be placed, which running jobs to evict for it."""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

from analysim.core.job import JobRun, JobSpec

if TYPE_CHECKING:
    from analysim.core.engine import Engine


class PriorityPreemption:
    """Evict running jobs that the queue ranks strictly below the waiting job, least important
    (then most recently started) first, as few as possible.

    The running jobs come ranked from the engine (``Engine.ranked_running``, once per pass and
    running set), so the candidates are a bisected suffix rather than a re-ranking per waiting
    job; a waiting job identical to one that found no victims in the same state is not retried.

    With VC quotas, only jobs of the waiting job's own VC, and only if the VC then stays within its
    quota: across tenants GPUs change hands by quota reclaim alone. (Otherwise the two rules undo
    each other: a job evicts a VC-mate to run on borrowed GPUs, is reclaimed, and the mate
    reclaims back.)
    """

    name = "priority"

    def victims(self, job: JobRun, ctx: Engine) -> list[JobRun] | None:
        q = ctx.policy.queue
        if not getattr(q, "preemptive", False):
            return None
        spec = job.spec
        mine = q.preempt_rank(job, ctx)
        same_vc_only = ctx.quota_of(spec.vc) is not None
        ranks, ranked = ctx.ranked_running(spec.vc if same_vc_only else None)
        first = bisect_right(ranks, mine)  # ranked[first:]: the running jobs ranked below this one
        if first == len(ranked):
            return None
        # Everything the answer depends on besides the running jobs (fixed for the cache's life).
        sig = (spec.vc, spec.gpu_models, spec.num_gpus, spec.gpu_milli, spec.cpu_milli, spec.memory_mib,
               spec.is_fractional, spec.gpu_demand, mine)
        failed = ctx.preemption_failed()
        if sig in failed:
            return None
        static = ctx.static_mask(spec)
        candidates = [r for r in reversed(ranked[first:]) if any(static[n] for n in r.placement.nodes)]
        victims = None
        if candidates and not (same_vc_only and self._over_quota(spec, candidates, ctx)):
            victims = ctx.victims_that_fit(job, candidates)
            if victims and same_vc_only and self._over_quota(spec, victims, ctx):
                victims = None
        if not victims:
            failed.add(sig)
        return victims

    @staticmethod
    def _over_quota(spec: JobSpec, evicted: list[JobRun], ctx: Engine) -> bool:
        """Whether the job's VC would still run over its quota with ``evicted`` gone. Asked first
        of every candidate: if evicting them all does not bring the VC within quota, no prefix does
        (the partial sums, in the same order, only grow), and the trials are skipped."""
        after = ctx.state.vc_used.get(spec.vc, 0.0) - sum(v.spec.gpu_demand for v in evicted)
        return after + spec.gpu_demand > ctx.quota_of(spec.vc) + 1e-9


class QuotaReclaim:
    """A VC within its quota takes back GPUs from VCs running over theirs, newest jobs first.

    Only from VCs over quota, for a job that keeps its own VC within quota: GPUs always move from
    borrowers to owners, so reclaims cannot undo each other."""

    name = "reclaim"

    def victims(self, job: JobRun, ctx: Engine) -> list[JobRun] | None:
        if ctx.quota_of(job.spec.vc) is None or not ctx.within_quota(job):
            return None
        static = ctx.static_mask(job.spec)
        lenders = [vc for vc in ctx.running_by_vc if vc != job.spec.vc and ctx.vc_over_quota(vc)]
        loans = [r for vc in lenders for r in ctx.running_by_vc[vc].values()
                 if any(static[n] for n in r.placement.nodes)]
        if not loans:
            return None
        loans.sort(key=lambda r: (r.last_start_s, r.seq), reverse=True)
        return ctx.victims_that_fit(job, loans)
