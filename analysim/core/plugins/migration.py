"""Rebalance plugin: move running jobs so that a job blocked by fragmentation fits on one node."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from analysim.core import placement
from analysim.core.job import GPU_MILLI, JobRun, JobStatus

if TYPE_CHECKING:
    from analysim.core.framework import Handle

Move = tuple[JobRun, int, tuple[int, ...]]


class DefragMigration:
    """For a blocked whole-GPU job that fits on one node: pick the node where the fewest running
    single-node jobs must move (then the fewest GPUs), and move them to the best-fitting other
    nodes. Only when the whole move is possible; jobs about to finish are not worth moving.

    ``max_candidates`` bounds the nodes examined per attempt (those with the smallest deficit),
    which keeps an attempt cheap on clusters of thousands of nodes.
    """

    name: ClassVar[str] = "defrag"
    finds_none_by_vc: ClassVar[bool] = False  # (finds_none_until reads every VC's free GPUs)

    def __init__(self, max_candidates: int = 16) -> None:
        self.max_candidates = max_candidates  # (above) nodes, >= 1

    def unblock(self, job: JobRun, ctx: Handle) -> list[Move] | None:
        static = ctx.static_mask(job.spec)
        if not self._may_move_for(job, static, ctx):
            return None
        return self._search(job, static, ctx)[0]

    def answers_per_request(self, ctx: Handle) -> bool:
        return True  # (the search is by request and the nodes open to it: see _search)

    def holds_until(self, job: JobRun, ctx: Handle) -> float:
        """The answer reads the running jobs, and the time only through which of them are about
        to finish: it holds until a movable job on a node the search looked at comes within the
        overhead of its end (a node it did not look at may lose its movable jobs: it only drops
        out of the candidates behind those looked at)."""
        static = ctx.static_mask(job.spec)
        if not self._may_move_for(job, static, ctx):
            return math.inf
        return self._search(job, static, ctx)[1]

    def finds_none_until(self, job: JobRun, ctx: Handle) -> float:
        """No moves for a job they could not let run (see _may_move_for), while the nodes stand."""
        return -math.inf if self._may_move_for(job, None, ctx) else math.inf

    @staticmethod
    def _may_move_for(job: JobRun, static: np.ndarray | None, ctx: Handle) -> bool:
        """Whether moves could let the job run: a whole-GPU job that fits on one node, with
        enough whole GPUs free on its nodes (``static``, the job's static_mask, found if None),
        summed (moving jobs around cannot create any). Asked before the search's memo: most
        jobs that wait on a busy cluster are not such."""
        spec, st = job.spec, ctx.state
        # (ctx.one_node: gang_size over the nodes open to it, remembered by request.)
        if not (spec.num_gpus >= 1 and not spec.is_fractional and ctx.one_node(spec)
                and st.total_full_free >= spec.num_gpus):
            return False
        if ctx.open_to_every_node(spec):
            return True  # (the sum over every node is total_full_free)
        return int(st.full_free[static if static is not None else ctx.static_mask(spec)].sum()) >= spec.num_gpus

    def _search(self, job: JobRun, static: np.ndarray, ctx: Handle) -> tuple[list[Move] | None, float]:
        """The moves, and until when they hold. They depend on the job's shape, the allocation, the
        running jobs and the time, the last three fixed for the memo's life: identical requests
        are searched once."""
        memo = ctx.plugin_memo()
        shape = (self.name, job.spec.request, ctx.static_key(job.spec))  # (the nodes open to it stand for its VC)
        found = memo.get(shape)
        if found is None:
            movable = memo.get((self.name, "movable"))
            if movable is None:
                movable = memo[self.name, "movable"] = self._movable(ctx)
            found = memo[shape] = self._unblock(job, static, movable, ctx)
        return found

    @staticmethod
    def _movable(ctx: Handle) -> dict[int, list[JobRun]]:
        """Running whole-GPU jobs on one node, by node, that are not about to finish."""
        min_left = ctx.config.migration_overhead_s
        movable: dict[int, list[JobRun]] = {}
        for r in ctx.running.values():
            rs, pl = r.spec, r.placed
            if (len(pl.gpus) == 1 and not rs.is_fractional and rs.num_gpus >= 1
                    and ctx.expected_end(r) - ctx.now > min_left):
                movable.setdefault(pl.gpus[0][0], []).append(r)
        return movable

    def _unblock(self, job: JobRun, static: np.ndarray, movable: dict[int, list[JobRun]],
                 ctx: Handle) -> tuple[list[Move] | None, float]:
        spec = job.spec
        st = ctx.state
        deficit = spec.num_gpus - st.full_free
        room = static & (st.gpus >= spec.num_gpus) & (deficit > 0) & (st.cpu_free >= 0) & (st.mem_free >= 0)
        deficit_of = deficit.tolist()  # (one numpy scalar per node read cost more than the sort)
        cands = [n for n in room.nonzero()[0].tolist() if n in movable]
        cands.sort(key=deficit_of.__getitem__)  # by (deficit, node): stable, and cands ascend
        # A plan's cost (moves, GPUs moved, node) is known from its movers alone: the trial
        # placement of the movers, which clones the allocation, is made in order of cost and
        # stops at the first that works, instead of for every candidate node.
        plans: list[tuple[tuple[int, int, int], list[JobRun]]] = []
        first_end = math.inf
        for n in cands[: self.max_candidates]:
            first_end = min(first_end, min(ctx.expected_end(r) for r in movable[n]))
            movers = self._movers(deficit_of[n], movable[n])
            if movers is not None:
                plans.append(((len(movers), sum(r.spec.num_gpus for r in movers), n), movers))
        plans.sort(key=lambda p: p[0])
        # The first of those jobs to come within the overhead of its end (with a margin far above
        # the rounding of ``end - now``, as Tiresias' levels have).
        min_left = ctx.config.migration_overhead_s
        until = (first_end - min_left - (1e-9 * (abs(first_end) + min_left) + 1e-6)
                 if first_end < math.inf else math.inf)
        # Most plans fail because some mover fits on no other node even as the nodes stand
        # (a trial only takes more GPUs): that is known without a trial, from each mover
        # request's fitting nodes, found once.
        fitting: dict[tuple, tuple[np.ndarray, int]] = {}
        for (_, _, n), movers in plans:
            if any(self._fits_only_on(r, n, fitting, ctx) for r in movers):
                continue
            moves = self._place(job, n, movers, ctx)
            if moves is not None:
                return moves, until
        return None, until

    @staticmethod
    def _fits_only_on(mover: JobRun, node: int, fitting: dict[tuple, tuple[np.ndarray, int]], ctx: Handle) -> bool:
        """Whether ``mover`` fits on no node but ``node`` as the nodes stand (by request and the
        nodes open to it, in ``fitting``)."""
        spec = mover.spec
        key = (spec.request, ctx.static_key(spec))
        got = fitting.get(key)
        if got is None:
            ok = ctx.static_mask(spec) & placement.single_node_fit(ctx.state, spec)
            got = fitting[key] = (ok, int(ok.sum()))
        ok, count = got
        return count - int(ok[node]) == 0

    @staticmethod
    def _movers(deficit: int, residents: list[JobRun]) -> list[JobRun] | None:
        """The residents to move off a node to free ``deficit`` GPUs, None if they cannot. One
        job big enough, the smallest such, moves the fewest GPUs; failing that, the biggest
        residents first make the fewest moves."""
        single = [r for r in residents if r.spec.num_gpus >= deficit]
        if single:
            return [min(single, key=lambda r: (r.spec.num_gpus, r.seq))]
        movers, freed = [], 0
        for r in sorted(residents, key=lambda r: (-r.spec.num_gpus, r.seq)):
            movers.append(r)
            freed += r.spec.num_gpus
            if freed >= deficit:
                return movers
        return None

    @staticmethod
    def _place(job: JobRun, node: int, movers: list[JobRun], ctx: Handle) -> list[Move] | None:
        """Where the movers go (best fit, on a trial copy of the allocation), None if the job
        still does not fit on ``node`` or some mover fits nowhere else."""
        trial = ctx.state.clone()
        for r in movers:
            placement.release_on(trial, r)
        if not placement.single_node_fit(trial, job.spec)[node]:
            return None  # CPU or memory, not GPUs, is what blocks
        moves: list[Move] = []
        for r in movers:
            ok = ctx.static_mask(r.spec) & placement.single_node_fit(trial, r.spec)
            ok[node] = False  # the freed node is reserved for the blocked job
            dest = np.flatnonzero(ok)
            if dest.size == 0:
                return None
            left = trial.full_free[dest] - r.spec.num_gpus
            d = int(dest[int(np.argmin(left))])
            slots = placement.default_slots(trial, d, r.spec)
            trial.allocate(d, slots, GPU_MILLI, r.spec.cpu_milli, r.spec.memory_mib)
            moves.append((r, d, slots))
        return moves

    def rebalance(self, ctx: Handle) -> list[Move]:
        head = ctx.head_of_line()
        if head is None or head.status is not JobStatus.PENDING:
            return []
        if placement.bind(ctx, head, ctx.static_mask(head.spec)) is not None:
            return []
        return self.unblock(head, ctx) or []
