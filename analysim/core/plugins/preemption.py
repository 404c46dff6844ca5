"""Post-filter plugins: when a job cannot be placed, which running jobs to evict for it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from analysim.core.job import JobRun

if TYPE_CHECKING:
    from analysim.core.engine import Engine


class PriorityPreemption:
    """Evict running jobs that the queue ranks strictly below the waiting job, least important
    (then most recently started) first, as few as possible.

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
        mine = q.preempt_rank(job, ctx)
        static = ctx.static_mask(job.spec)
        same_vc_only = ctx.quota_of(job.spec.vc) is not None
        ranked = []
        pool = ctx.running_by_vc.get(job.spec.vc, {}) if same_vc_only else ctx.running
        for r in pool.values():
            p = q.preempt_rank(r, ctx)
            if p > mine and any(static[n] for n in r.placement.nodes):
                ranked.append((p, r.last_start_s, r.seq, r))
        if not ranked:
            return None
        ranked.sort(key=lambda t: (t[0], t[1], t[2]), reverse=True)
        victims = ctx.victims_that_fit(job, [t[3] for t in ranked])
        if victims and same_vc_only:
            after = ctx.state.vc_used.get(job.spec.vc, 0.0) - sum(v.spec.gpu_demand for v in victims)
            if after + job.spec.gpu_demand > ctx.quota_of(job.spec.vc) + 1e-9:
                return None
        return victims


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
