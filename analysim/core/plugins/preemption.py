"""Post-filter plugins: when a job cannot be placed, which running jobs to evict for it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from analysim.core.job import JobRun

if TYPE_CHECKING:
    from analysim.core.engine import Engine


class PriorityPreemption:
    """Evict running jobs that the queue ranks strictly below the waiting job, least important
    (then most recently started) first, as few as possible."""

    name = "priority"

    def victims(self, job: JobRun, ctx: Engine) -> list[JobRun] | None:
        q = ctx.policy.queue
        if not getattr(q, "preemptive", False):
            return None
        mine = q.preempt_rank(job, ctx)
        static = ctx.static_mask(job.spec)
        ranked = []
        for r in ctx.running.values():
            p = q.preempt_rank(r, ctx)
            if p > mine and any(static[n] for n in r.placement.nodes):
                ranked.append((p, r.last_start_s, r.seq, r))
        if not ranked:
            return None
        ranked.sort(key=lambda t: (t[0], t[1], t[2]), reverse=True)
        return ctx.victims_that_fit(job, [t[3] for t in ranked])


class QuotaReclaim:
    """A VC within its quota takes back GPUs that other VCs borrowed, newest loans first."""

    name = "reclaim"

    def victims(self, job: JobRun, ctx: Engine) -> list[JobRun] | None:
        if ctx.quota_of(job.spec.vc) is None or not ctx.within_quota(job):
            return None
        static = ctx.static_mask(job.spec)
        loans = [r for r in ctx.running.values()
                 if r.spec.vc != job.spec.vc and ctx.is_borrowed(r) and any(static[n] for n in r.placement.nodes)]
        if not loans:
            return None
        loans.sort(key=lambda r: (r.last_start_s, r.seq), reverse=True)
        return ctx.victims_that_fit(job, loans)
