"""The scheduling queue: the pending jobs and the indexes the passes read them through.

After Kubernetes' scheduling queue (pkg/scheduler/backend/queue): it owns the pending jobs, the
engine adds and removes them, and the passes only read. What Kubernetes keeps as an
unschedulable pool is here the failure memo on each job and the quiet-pass hint (analysim.core.hints):
a job whose attempt failed is passed over, without an attempt, until an event its plugins' hints
name (a launch, a stop, a node event, a time).

Each pending job has a key, (queue key, seq), unique by seq. The indexes are families of sorted key
lists, each family bucketing the keys by one thing; which families are kept depends on the policy
(``IndexPlan``: only what some pass reads is kept, since each costs an insert per arrival).

Invariant: every pending job (``by_seq``) has its key and queued work in ``filed``, its key in
exactly one list of each family kept, in
the bucket of the job's own fields; no family keeps an empty list; the shape counters count the
pending jobs by shape; every change to the lists bumps ``version`` once. During a pass the lists
are not changed (the passes iterate them): adds and removals are deferred to the pass's end, while
``by_seq`` and the counters change at once (a pass reads jobs through ``by_seq``, so a job placed
or re-keyed during it is not given twice).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
from sortedcontainers import SortedList  # type: ignore[import-untyped, import-not-found]

from analysim.core.cluster import ClusterState
from analysim.core.job import JobRun, JobSpec
from analysim.core.sorted_keys import file_key, first_after, unfile_key
from analysim.core.unschedulable import UnschedulablePool


def width(spec: JobSpec) -> int:
    """The whole GPUs a job asks for; 0 for a fractional or CPU-only job."""
    return 0 if spec.is_fractional else spec.num_gpus


@dataclass(frozen=True)
class IndexPlan:
    """Which key-list families a queue keeps: what the passes of its policy read.

    - ``every``: all keys in one list, for queue orders with no other list holding them all.
    - ``of_vc``: per VC, for a blocking queue (a pass skips a VC whose queue is blocked without
      walking its jobs) and for a queue ordering each VC's jobs by key (fair share merges them).
    - ``of_vc_demand``: per VC and GPU demand, for per-VC FIFO: with the shared queue blocked, a
      pass jumps over a VC's jobs that would borrow to its next one within quota.
    - ``of_vc_dw``: per VC, GPU demand, width and power-of-two bucket of queued work, under EASY
      backfilling: a pass jumps over the jobs its reservations keep out.
    - ``of_width``/``of_vc_width``: per width bucket (globally, or per VC for a per-VC order but not
      one whose heads are ranked by state, QueueTraits.heads_ranked_by_state), for a non-blocking
      pass that only launches: it leaves out the widths that cannot fit.
    - ``of_vc_shape``: per VC and request (JobSpec.request), for a non-blocking pass that may
      preempt or migrate: it leaves out shapes no smaller than a failed one; and for a queue whose
      heads are ranked by state, whose merge leaves out only runs it would take one after another
      with nothing changing (pass_streams).
    """

    every: bool  # (each: whether that family is kept; see above)
    of_vc: bool  # (see above)
    of_vc_demand: bool  # (see above)
    of_vc_dw: bool  # (see above)
    of_width: bool  # (see above)
    of_vc_width: bool  # (see above)
    of_vc_shape: bool  # (see above)

    @staticmethod
    def for_policy(blocking: bool, dynamic: bool, per_vc_order: bool, backfill: bool,
                   may_preempt_or_migrate: bool, heads_ranked_by_state: bool) -> IndexPlan:
        of_width = of_vc_width = of_vc_shape = False
        if not blocking:
            if may_preempt_or_migrate and (per_vc_order or not dynamic) or per_vc_order and heads_ranked_by_state:
                of_vc_shape = True
            elif per_vc_order:
                of_vc_width = True
            elif not dynamic:
                of_width = True
        return IndexPlan(every=not (of_width or of_vc_width or of_vc_shape), of_vc=blocking or per_vc_order,
                         of_vc_demand=blocking and not backfill, of_vc_dw=backfill, of_width=of_width,
                         of_vc_width=of_vc_width, of_vc_shape=of_vc_shape)


class SchedulingQueue:
    """The pending jobs, their key lists and shape counters (see the module's invariant)."""

    def __init__(self, plan: IndexPlan, dedicated: set[str]) -> None:
        self.dedicated = dedicated  # VCs with dedicated nodes: their width buckets are their own
        self.by_seq: dict[int, JobRun] = {}  # every pending job, by seq
        # seq -> (its key, its queued work: overhead and work left when queued), for every pending job
        self.filed: dict[int, tuple[tuple, float]] = {}
        self.pool = UnschedulablePool()  # what the passes know of the pending jobs they could not place
        # The key-list families of the plan (None: not kept).
        self.every: SortedList | None = SortedList() if plan.every else None
        self.of_vc: dict[str, SortedList] | None = {} if plan.of_vc else None  # VC -> its keys
        # VC -> GPU demand -> keys
        self.of_vc_demand: dict[str, dict[float, SortedList]] | None = {} if plan.of_vc_demand else None
        # VC -> (GPU demand, width, work bucket) -> keys
        self.of_vc_dw: dict[str, dict[tuple[float, int, int], SortedList]] | None = {} if plan.of_vc_dw else None
        # A width bucket is (width, scope): the scope is a dedicated VC's name, else None.
        self.of_width: dict[tuple[int, str | None], SortedList] | None = {} if plan.of_width else None
        self.of_vc_width: dict[str, dict[tuple[int, str | None], SortedList]] | None = (  # VC -> width bucket -> keys
            {} if plan.of_vc_width else None)
        # VC -> request (JobSpec.request) -> keys
        self.of_vc_shape: dict[str, dict[tuple, SortedList]] | None = {} if plan.of_vc_shape else None
        self.version = 0  # bumped by every change to the lists
        self.key_len = -1  # the length of the queue keys, once one is known (see add)
        # Shapes of the pending requests, to tell cheaply when nothing waiting can fit (hopeless).
        # (The counts here are plain dicts, not Counters: a Counter's missing key and deletion
        # are Python-level calls, and these change at every arrival and launch.)
        self.whole: dict[int, int] = {}  # whole-GPU jobs by GPUs asked
        self.frac: dict[int, int] = {}  # fractional jobs by GPU share (milli)
        self.cpu_only = 0  # jobs asking for no GPU
        self.with_models = 0  # jobs that name GPU models
        self.vcs: dict[str, int] = {}  # VC -> jobs waiting
        self.demands: dict[str, dict[float, int]] = {}  # VC -> GPU demand -> jobs waiting
        self.demand = 0.0  # the pending jobs' GPU demand
        self.in_pass = False  # a pass is walking the lists: changes to them wait for its end
        self._adds: list[tuple] = []  # (key, spec, work) deferred during a pass
        self._removals: list[tuple] = []  # the same, for keys that left

    def __len__(self) -> int:
        return len(self.by_seq)

    # ----------------------------------------------------------------- changes

    def check_key(self, qkey: tuple, queue_name: str) -> None:
        """Every key of a queue has the same length: the merges compare keys laid out flat."""
        if len(qkey) != self.key_len:
            if self.key_len >= 0:
                raise ValueError(f"queue {queue_name!r} gave keys of {self.key_len} and {len(qkey)} "
                                 "fields: every key of a queue must have the same length")
            self.key_len = len(qkey)

    def add(self, job: JobRun, key: tuple, work: float) -> None:
        """Queue ``job`` with ``key`` and its queued work (overhead and work left): afresh, with
        nothing it failed at before standing. Its key goes into the lists now, or at the end of
        the pass (then it is not an arrival a quiet pass takes up: a job queued again in a pass
        comes with a stop)."""
        spec = job.spec
        self.pool.activate(job)
        if self.in_pass:
            self._adds.append((key, spec, work))
        else:
            self._file(key, spec, work)
            self.pool.arrived(key)
        self.by_seq[job.seq] = job
        self.filed[job.seq] = (key, work)
        _count(self.vcs, spec.vc, 1)
        demands = self.demands.get(spec.vc)
        if demands is None:
            demands = self.demands[spec.vc] = {}
        _count(demands, spec.gpu_demand, 1)
        self.demand += spec.gpu_demand
        self._count_shape(spec, 1)

    def remove(self, job: JobRun) -> None:
        """Take a pending job out (placed, cancelled, or about to be queued again)."""
        spec = job.spec
        key, work = self.filed.pop(job.seq)
        self.pool.drop(job)
        if self.in_pass:
            self._removals.append((key, spec, work))
        else:
            self._unfile(key, spec, work)
            self.pool.head_left()
        del self.by_seq[job.seq]
        vc = spec.vc
        _count(self.vcs, vc, -1)
        _count(self.demands[vc], spec.gpu_demand, -1)
        if vc not in self.vcs:
            del self.demands[vc]  # (its last pending job)
        self.demand -= spec.gpu_demand
        self._count_shape(spec, -1)

    def begin_pass(self) -> None:
        self.in_pass = True

    def end_pass(self) -> None:
        """Apply the changes deferred during the pass: removals first, then adds (a job re-keyed
        in the pass is removed with its old key and added with its new one)."""
        self.in_pass = False
        for key, spec, work in self._removals:
            self._unfile(key, spec, work)
        for key, spec, work in self._adds:
            self._file(key, spec, work)
        self._removals.clear()
        self._adds.clear()

    def _file(self, key: tuple, spec: JobSpec, work: float) -> None:
        vc = spec.vc
        self.version += 1
        if self.every is not None:
            self.every.add(key)
        if self.of_vc is not None:
            file_key(self.of_vc, vc, key)
        if self.of_width is not None:
            file_key(self.of_width, self.width_bucket(spec), key)
        for nested, bucket in self._nested(spec, work):
            file_key(nested.setdefault(vc, {}), bucket, key)

    def _unfile(self, key: tuple, spec: JobSpec, work: float) -> None:
        vc = spec.vc
        self.version += 1
        if self.every is not None:
            self.every.remove(key)
        if self.of_vc is not None:
            unfile_key(self.of_vc, vc, key)
        if self.of_width is not None:
            unfile_key(self.of_width, self.width_bucket(spec), key)
        for nested, bucket in self._nested(spec, work):
            unfile_key(nested[vc], bucket, key)
            if not nested[vc]:
                del nested[vc]

    def _nested(self, spec: JobSpec, work: float) -> Iterator[tuple[dict, object]]:
        """The per-VC-and-bucket families kept, each with the job's bucket."""
        if self.of_vc_width is not None:
            yield self.of_vc_width, self.width_bucket(spec)
        if self.of_vc_shape is not None:
            yield self.of_vc_shape, spec.request
        if self.of_vc_demand is not None:
            yield self.of_vc_demand, spec.gpu_demand
        if self.of_vc_dw is not None:
            yield self.of_vc_dw, (spec.gpu_demand, width(spec), int(work).bit_length())

    def _count_shape(self, spec: JobSpec, delta: int) -> None:
        if spec.gpu_models:
            self.with_models += delta
        if spec.num_gpus == 0:
            self.cpu_only += delta
            return
        if spec.is_fractional:
            _count(self.frac, spec.gpu_milli, delta)
        else:
            _count(self.whole, spec.num_gpus, delta)

    # ----------------------------------------------------------------- reads

    def holds(self, job: JobRun) -> bool:
        """Whether the job is pending in the queue."""
        return job.seq in self.by_seq

    def key_of(self, job: JobRun) -> tuple | None:
        """A pending job's key (None: not queued)."""
        filed = self.filed.get(job.seq)
        return None if filed is None else filed[0]

    def held_out(self, vcs: Iterable[str] | None, now: float) -> dict[str, list[tuple]]:
        """The keys, per VC (of ``vcs``, or every VC) and in order, of the pending jobs evicted at
        ``now``: each waits for a later instant, blocking its queues as a failure would."""
        pool = self.pool
        out: dict[str, list[tuple]] = {}
        if pool.evicted_at != now:
            return out  # (the evictions are of an earlier instant: none now)
        of_vc = pool.victims_of_vc
        for vc in of_vc if vcs is None else vcs:
            for job in of_vc.get(vc, ()):
                filed = self.filed.get(job.seq)
                if filed is not None:
                    out.setdefault(vc, []).append(filed[0])
        for keys in out.values():
            keys.sort()
        return out

    def width_bucket(self, spec: JobSpec) -> tuple[int, str | None]:
        """A job's width bucket: its whole GPUs, and its VC if that VC has dedicated nodes."""
        return width(spec), spec.vc if spec.vc in self.dedicated else None

    def keys(self) -> Iterator[tuple]:
        """Every pending key in order: from the list of them all, or merged from the families
        that hold them all (each key is in exactly one list of each)."""
        if self.every is not None:
            return iter(self.every)
        lists: list[SortedList] = []
        if self.of_width is not None:
            lists.extend(self.of_width.values())
        for nested in (self.of_vc_width, self.of_vc_shape):
            if nested is not None:
                for per_vc in nested.values():
                    lists.extend(per_vc.values())
        return heapq.merge(*lists)

    def jobs(self) -> Iterator[JobRun]:
        """Pending jobs in key order (as of the last change applied), leaving out jobs placed
        during the pass."""
        by_seq = self.by_seq
        for _, seq in self.keys():
            job = by_seq.get(seq)
            if job is not None:
                yield job

    def jobs_by_vc(self) -> dict[str, Iterator[JobRun]]:
        """Per VC, its pending jobs in key order, lazily (jobs placed during a pass are left out).
        Only where ``of_vc`` is kept."""
        by_seq = self.by_seq
        lists = self.of_vc
        assert lists is not None

        def jobs(keys: SortedList) -> Iterator[JobRun]:
            for _, seq in keys:
                job = by_seq.get(seq)
                if job is not None:
                    yield job

        return {vc: jobs(keys) for vc, keys in lists.items()}

    def for_dynamic_order(self, per_vc: bool) -> list[JobRun] | dict[str, Iterator[JobRun]]:
        """What a queue with a dynamic key orders: every pending job, or per VC (``per_vc_order``)
        each VC's jobs in key order."""
        return self.jobs_by_vc() if per_vc else list(self.by_seq.values())

    def last_key(self) -> tuple:
        """The largest pending key (a non-empty queue keeping ``every``)."""
        assert self.every is not None
        return self.every[-1]

    def next_within_quota(self, vc: str, after: tuple, quota: float, used: float) -> tuple | None:
        """The first key past ``after`` of a job of ``vc`` that its quota can hold with ``used``
        GPUs in use, from the per-demand lists."""
        assert self.of_vc_demand is not None
        best = None
        for demand, keys in self.of_vc_demand[vc].items():
            if used + demand <= quota + 1e-9:
                first = first_after(keys, after)
                if first is not None and (best is None or first < best):
                    best = first
        return best

    def hopeless(self, st: ClusterState, gmax: int, relaxed_locality: bool) -> bool:
        """True when no pending job could fit on the free GPUs, whatever its other constraints (a
        pass without preemption or migration can stop early). Never wrongly True."""
        if self.cpu_only:
            return False
        if self.frac:
            free = st.free_milli[st.up]
            if free.size and int(free.max()) >= min(self.frac):
                return False
        if not self.whole:
            return True
        smallest = min(self.whole)
        if smallest <= gmax and st.max_full_free() >= smallest:
            return False
        ff = st.full_free[st.up]
        if not ff.size:
            return True
        # Jobs wider than the largest node open to them span several: as few as possible unless
        # locality is relaxed, so the emptiest nodes must hold them. Which nodes are open to a job
        # depends on its constraints (GPU model, VC), so any job wider than the smallest node may
        # be one, over at most ceil(g / smallest node) nodes.
        gangs = [g for g in self.whole if g > st.smallest_node_gpus]
        if not gangs or min(gangs) > st.total_full_free:
            return True
        if relaxed_locality:
            return int(ff.sum()) < min(gangs)
        desc = np.sort(ff)[::-1]
        return all(int(desc[: math.ceil(g / max(st.smallest_node_gpus, 1))].sum()) < g for g in gangs)


def _count(counts: dict, key: object, delta: int) -> None:
    """Add ``delta`` to a count, dropping it at 0 (the counts keep only the keys with jobs)."""
    n = counts.get(key, 0) + delta
    if n:
        counts[key] = n
    else:
        del counts[key]
