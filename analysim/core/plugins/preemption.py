"""Post-filter plugins: when a job cannot be placed, which running jobs to evict for it."""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import TYPE_CHECKING, ClassVar, cast

import numpy as np

from analysim.core import victims as victims_mod
from analysim.core.job import JobRun, JobSpec
from analysim.core.victims import ByNode

if TYPE_CHECKING:
    from analysim.core.framework import Handle


class PriorityPreemption:
    """Evict running jobs that the queue ranks strictly below the waiting job, least important
    (then most recently started) first, as few as possible.

    The running jobs come ranked from the engine (``Handle.ranked_running``, once per pass and
    running set), so the candidates are a bisected suffix rather than a re-ranking per waiting
    job; a waiting job that a search for a job of its shape and VC shows to find no victims
    (the same rank, or for most failures any rank at least as low) is not searched for.

    With VC quotas, only jobs of the waiting job's own VC, and only if the VC then stays within its
    quota: across tenants GPUs change hands by quota reclaim alone. (Otherwise the two rules undo
    each other: a job evicts a VC-mate to run on borrowed GPUs, is reclaimed, and the mate
    reclaims back.)
    """

    name: ClassVar[str] = "priority"
    finds_none_by_vc: ClassVar[bool] = True  # (with quotas it searches only the VC: see finds_none_until)

    def victims(self, job: JobRun, ctx: Handle) -> list[JobRun] | None:
        if not ctx.traits.preemptive:
            return None
        spec = job.spec
        mine = ctx.policy.queue.preempt_rank(job, ctx)
        # Everything the answer depends on besides the rank and the running jobs (fixed for the
        # memo's life).
        shape = (self.name, spec.vc, spec.request)
        memo = ctx.plugin_memo()
        known = memo.get(shape)
        if known is None:
            known = memo[shape] = _Failures()
        if known.hopeless_from is not None and mine >= known.hopeless_from or mine in known.ranks:
            return None
        same_vc_only = ctx.quota_of(spec.vc) is not None
        if same_vc_only and self._vc_none_until(shape, mine, ctx) > ctx.now:
            known.fail_from(mine, lasting=True)
            return None
        candidates = self._ranked_below(spec, mine, same_vc_only, ctx)
        if candidates is None:
            known.fail_from(mine, lasting=True)  # (a lower rank has none either)
            if same_vc_only:
                self._hold_for_vc(shape, mine, ctx, self._over_quota_by(spec, ctx.state.vc_used.get(spec.vc, 0.0), ctx))
            return None
        return self._search(job, shape, mine, known, candidates, ctx)

    @staticmethod
    def _ranked_below(spec: JobSpec, rank: tuple, same_vc_only: bool, ctx: Handle) -> list[JobRun] | None:
        """The running jobs ranked below ``rank`` (of the job's VC alone with quotas) on nodes the
        job may use, least important first; None when none is ranked below it at all."""
        ranks, ranked = ctx.ranked_running(spec.vc if same_vc_only else None)
        first = bisect_right(ranks, rank)  # ranked[first:]: the running jobs ranked below this one
        if first == len(ranked):
            return None
        # A job ranked lower has fewer candidates, a prefix of these (least important first): a
        # failure that comes from too few candidates holds for it too (see _Failures).
        candidates = ranked[first:][::-1]
        if not ctx.open_to_every_node(spec):  # (most jobs may use every node)
            allowed = ctx.open_nodes(spec)
            candidates = [r for r in candidates if any(allowed[n] for n in r.placed.nodes)]
        return candidates

    def _search(self, job: JobRun, shape: tuple, mine: tuple, known: _Failures, candidates: list[JobRun],
                ctx: Handle) -> list[JobRun] | None:
        """The fewest candidates whose eviction lets the job fit, within its VC's quota with
        quotas; a failure noted in ``known`` (and the VC's memo) for the ranks it holds for."""
        spec = job.spec
        quota = ctx.quota_of(spec.vc)
        one_node = ctx.one_node(spec)
        by_node_of = victims_mod.candidates_by_node(ctx, spec, candidates) if one_node else None
        # (The VC's usage after evicting the most any victims could take off it.)
        after = self._usage_after_most(spec, candidates, by_node_of, ctx) if quota is not None else 0.0
        if not candidates or quota is not None and after + spec.gpu_demand > quota + 1e-9:
            known.fail_from(mine, lasting=True)
            if quota is not None:
                self._hold_for_vc(shape, mine, ctx, self._over_quota_by(spec, after, ctx))
            return None
        victims = victims_mod.victims_that_fit(ctx, job, candidates, by_node_of)
        if victims is None:
            known.fail_from(mine, lasting=True)
        elif quota is not None and self._over_quota(spec, victims, ctx):
            # A gang's victims are the shortest prefix that fits, which a lower-ranked job finds
            # too or not at all; a one-node job's are the fewest on one node, and on another node
            # for fewer candidates.
            if one_node:
                known.ranks.add(mine)
            else:
                known.fail_from(mine, lasting=False)
            victims = None
        return victims

    def finds_none_until(self, job: JobRun, ctx: Handle) -> float:
        """Without ranking the running jobs: under a queue that does not preempt, never any; with
        quotas, none while the VC's memo says a job of this shape ranked as high found too few
        candidates or too little of the VC's usage among them (see victims; most jobs that wait
        in a VC running over its quota are such)."""
        q = ctx.policy.queue
        if not ctx.traits.preemptive:
            return math.inf
        spec = job.spec
        if ctx.quota_of(spec.vc) is None or q.dynamic:  # (a dynamic key: its rank may move while it waits)
            return -math.inf
        return self._vc_none_until((self.name, spec.vc, spec.request), q.preempt_rank(job, ctx), ctx)

    def _vc_none_until(self, shape: tuple, rank: tuple, ctx: Handle) -> float:
        """Until when, as a search of the VC found, a job of ``shape`` ranked ``rank`` finds no
        victims: too few candidates, or too little of the VC's usage among them, as the VC's
        running jobs stood when a job of this shape ranked as high found so (the VC's memo), or
        the VC's quota margin (see _short_until). That reads nothing of the allocation outside
        the VC, so it stands across other VCs' launches and stops. ``now`` or earlier if a
        search is needed."""
        held = ctx.vc_memo(shape[1]).get(shape)
        if held is not None and rank >= held[0] and ctx.now < held[1]:
            return cast(float, held[1])
        return self._short_until(shape, rank, ctx)

    @staticmethod
    def _hold_for_vc(shape: tuple, rank: tuple, ctx: Handle, over_by: float) -> None:
        """Note in the VC's memo that jobs of ``shape`` ranked ``rank`` or lower find too few
        candidates or too little usage among them (a lower rank has a prefix of the candidates):
        while the VC's running jobs stay the same, until one of their ranks may move, or for
        as long where running ranks only rise (candidates then only drop out).

        And when the VC would stay over its quota by a margin whatever is evicted (``over_by``),
        note that margin in the memo that outlasts the VC's launches (see _short_until)."""
        spec_vc = shape[1]
        memo = ctx.vc_memo(spec_vc)
        held = memo.get(shape)
        until = math.inf if ctx.traits.running_ranks_only_rise else ctx.ranks_hold_until(spec_vc)
        if held is None or rank < held[0] or ctx.now >= held[1]:
            memo[shape] = (rank, until)
        if over_by > _MARGIN:
            ctx.lasting_memo()[shape] = (rank, over_by, ctx.stopped_demand(spec_vc), until)

    @staticmethod
    def _over_quota_by(spec: JobSpec, after: float, ctx: Handle) -> float:
        """By how much the job's VC would run over its quota with the job running and its usage
        brought down to ``after``."""
        quota = ctx.quota_of(spec.vc)
        assert quota is not None
        return after + spec.gpu_demand - quota

    @staticmethod
    def _short_until(shape: tuple, rank: tuple, ctx: Handle) -> float:
        """Until when a job of ``shape`` ranked ``rank`` finds no victims because its VC would stay
        over its quota whatever it evicted, by the margin a search of the shape found (see
        _hold_for_vc); ``now`` or earlier if it may find some. The margin lasts across the VC's
        launches, not its stops: a launch adds its GPUs to the VC's usage and at most as many to
        what its waiting jobs could evict, and a stop takes them off the usage. So the margin
        left is at least the one found less the GPUs the VC has stopped since, until a running
        job's rank may move the wrong way (as for the VC's memo); a lower rank has fewer
        candidates."""
        got = ctx.lasting_memo().get(shape)
        if got is None:
            return -math.inf
        low, margin, stopped_then, until = got
        if rank >= low and margin - (ctx.stopped_demand(shape[1]) - stopped_then) > _MARGIN:
            return cast(float, until)
        return -math.inf

    def answers_per_request(self, ctx: Handle) -> bool:
        """Under a queue that ranks no running job below a waiting one there are no victims; under
        one whose waiting jobs rank in key order, a job the queue orders later has a prefix of
        the earlier one's candidates (least important first), and a gang of the same request
        fits after none of its prefixes either."""
        return not ctx.traits.preemptive or ctx.traits.ranks_follow_keys

    def holds_until(self, job: JobRun, ctx: Handle) -> float:
        """The answer for a waiting job reads its rank (fixed while it waits, unless the queue's
        keys are dynamic), the running jobs and their ranks, which the queue may say stand."""
        q = ctx.policy.queue
        if not ctx.traits.preemptive:
            return math.inf
        if q.dynamic:
            return ctx.now
        if ctx.traits.running_ranks_only_rise:
            # Its candidates only shrink while the running jobs stay the same; a failure that
            # more candidates could not have undone stands as long as they do.
            known = ctx.plugin_memo().get((self.name, job.spec.vc, job.spec.request))
            if (known is not None and known.lasting_from is not None
                    and q.preempt_rank(job, ctx) >= known.lasting_from):
                return math.inf
        return ctx.ranks_hold_until(job.spec.vc if ctx.quota_of(job.spec.vc) is not None else None)

    @staticmethod
    def _over_quota(spec: JobSpec, evicted: list[JobRun], ctx: Handle) -> bool:
        """Whether the job's VC would still run over its quota with ``evicted`` gone."""
        after = PriorityPreemption._usage_after(spec, evicted, ctx)
        quota = ctx.quota_of(spec.vc)
        assert quota is not None  # (asked only of a VC with a quota: victims within the VC)
        return after + spec.gpu_demand > quota + 1e-9

    @staticmethod
    def _usage_after_most(spec: JobSpec, candidates: list[JobRun],
                          by_node_of: ByNode | None, ctx: Handle) -> float:
        """The job's VC's usage after evicting the most any victims among the candidates could
        take off it, asked before any eviction is tried: if that leaves the VC over its quota, no
        victims would do. The victims are a prefix of the candidates, or for a job that fits on
        one node (``by_node_of``: victims.candidates_by_node), a prefix of the candidates on one
        node (each counted whole). The float partial sums of a prefix, in the same order, are at
        most the full sum, so this never says so wrongly."""
        if by_node_of is None:
            return PriorityPreemption._usage_after(spec, candidates, ctx)
        most = 0.0
        for on_node in by_node_of[0].values():
            total = 0.0
            for v in on_node:
                total += v.spec.gpu_demand
            most = max(most, total)
        return ctx.state.vc_used.get(spec.vc, 0.0) - most

    @staticmethod
    def _usage_after(spec: JobSpec, evicted: list[JobRun], ctx: Handle) -> float:
        """The job's VC's usage with ``evicted`` gone."""
        return ctx.state.vc_used.get(spec.vc, 0.0) - sum(v.spec.gpu_demand for v in evicted)


# A margin by which a VC stays over its quota is taken to hold only when it is far above the
# rounding of the sums of GPUs it is made of.
_MARGIN = 1e-6


class _Failures:
    """What the memo knows of the waiting jobs of one shape and VC that found no victims, by rank:
    from ``hopeless_from`` on, none does (too few candidates: a job ranked at least as low has a
    prefix of them); at ``ranks``, exactly those. From ``lasting_from`` on, none does because even
    every candidate would not do (no candidates, no room or no quota with all of them evicted):
    fewer candidates would not either, which is what makes such a failure last while running
    ranks only rise (see PriorityPreemption.holds_until)."""

    __slots__ = ("hopeless_from", "lasting_from", "ranks")

    def __init__(self) -> None:
        self.hopeless_from: tuple | None = None  # (above) the lowest such rank; None: none known
        self.lasting_from: tuple | None = None  # (above) never below hopeless_from; None: none known
        self.ranks: set[tuple] = set()  # (above) ranks that found none, one by one

    def fail_from(self, rank: tuple, lasting: bool) -> None:
        if self.hopeless_from is None or rank < self.hopeless_from:
            self.hopeless_from = rank
        if lasting and (self.lasting_from is None or rank < self.lasting_from):
            self.lasting_from = rank


class QuotaReclaim:
    """A VC within its quota takes back GPUs from VCs running over theirs, newest jobs first.

    Only from VCs over quota, for a job that keeps its own VC within quota: GPUs always move from
    borrowers to owners, so reclaims cannot undo each other."""

    name: ClassVar[str] = "reclaim"
    finds_none_by_vc: ClassVar[bool] = True  # (see finds_none_until)

    def victims(self, job: JobRun, ctx: Handle) -> list[JobRun] | None:
        spec = job.spec
        if self._reclaims_nothing(job, ctx):
            return None
        # The answer depends on the request and VC, the allocation and the running jobs (the
        # last two fixed for the memo's life): identical requests are searched once.
        memo = ctx.plugin_memo()
        request = (self.name, spec.vc, spec.request)
        if request in memo:
            return memo[request]
        allowed = ctx.open_nodes(spec)
        lenders, free_after = self._lenders(memo, ctx)
        if lenders and spec.num_gpus and not spec.is_fractional and victims_mod.eviction_hopeless_over(
                ctx, spec, ctx.gang_size(spec), free_after):
            # (Most searches end here: 59,244 of tiresias + both's 76,759 over the whole extract,
            # each of which built and sorted the loans, ~118 of them, only to be refused by this
            # bound in victims_that_fit.)
            memo[request] = None
            return None
        loans = self._loans(memo, ctx, lenders)
        if not ctx.open_to_every_node(spec):
            loans = [r for r in loans if any(allowed[n] for n in r.placed.nodes)]
        memo[request] = victims = victims_mod.victims_that_fit(ctx, job, loans) if loans else None
        return victims

    def _loans(self, memo: dict, ctx: Handle, lenders: list[str]) -> list[JobRun]:
        """The lenders' running jobs, newest first: sorted once per memo, like _lenders (the
        sort was 0.82 G instructions of tiresias + both's whole extract when each search made it)."""
        key = (self.name, "loans")
        got = memo.get(key)
        if got is None:
            # By (last start, seq), which is unique, so the jobs are never compared. (Sorting
            # these rows cost less than a sort with a key function.)
            rows = [(r.last_start_s, r.seq, r) for vc in lenders for r in ctx.running_by_vc[vc].values()]
            rows.sort(reverse=True)
            got = memo[key] = [row[2] for row in rows]
        return cast(list[JobRun], got)

    def _lenders(self, memo: dict, ctx: Handle) -> tuple[list[str], np.ndarray]:
        """The VCs running over their quotas, and each node's whole GPUs free once all their jobs
        are evicted: found once per memo (every search of its life has the same ones, as they read
        only the running jobs and the allocation, both fixed for that life; the job's own VC is
        never among them, as a VC that reclaims is within its quota, see _reclaims_nothing)."""
        key = (self.name, "lenders")
        got = memo.get(key)
        if got is None:
            lenders = [vc for vc in ctx.running_by_vc if ctx.vc_over_quota(vc)]
            got = memo[key] = (lenders, victims_mod.free_after_evicting(ctx, [ctx.gpus_of_vc[vc] for vc in lenders]))
        return cast(tuple[list[str], np.ndarray], got)

    def holds_until(self, job: JobRun, ctx: Handle) -> float:
        """The answer reads the quotas, the running jobs and their start times only: it holds
        while they stay the same."""
        return math.inf

    def finds_none_until(self, job: JobRun, ctx: Handle) -> float:
        """Never anything for a job that reclaims nothing (_reclaims_nothing), while its VC's
        usage stays the same; else only a search can tell."""
        return math.inf if self._reclaims_nothing(job, ctx) else -math.inf

    @staticmethod
    def _reclaims_nothing(job: JobRun, ctx: Handle) -> bool:
        """A job of a VC without a quota, or one it would take over its quota, takes nothing back."""
        return ctx.quota_of(job.spec.vc) is None or not ctx.within_quota(job)

    def answers_per_request(self, ctx: Handle) -> bool:
        return True  # (the job's VC and request, and the running jobs: see victims)
