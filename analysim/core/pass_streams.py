"""The per-VC streams a pass under a partition gives a queue that merges them (``per_vc_order``):
each VC's pending jobs in key order, as the reference engine gives them
(``SchedulingQueue.jobs_by_vc``), plus what lets the queue leave out runs of jobs whose visits
would change nothing (framework.PassStream).

Why: under a partition, most waiting jobs fail their ClusterQueue's quota, or are too wide for
the free GPUs, pass after pass, and a pass that visits each of them one by one through the queue's
merge cost most of the run (Philly's first 20,000 jobs with examples/kueue/philly-preemption.yaml:
6.5 M such visits in 22,700 passes; the whole extract under examples/kueue/philly.yaml, which does
not preempt, took 102 s that way and 29 s with the drains). A run of them is left out only where
the queue's merge would take them one after the other, with nothing changing in between
(KueueQueue.order says when), so the pass visits the same jobs, with the same state, in the same
order.

A visit changes nothing (``no_op``) when the job is no longer pending, or when the gate (gate.py)
fails it or passes over it without an attempt (``UNFIT``, ``REFUSED``): its queue's quota does not
admit it (a ClusterQueue that does not preempt), or a request no smaller than it failed in this
pass with the same signature. A job evicted at this instant is never one (its visit holds the
pass's answers to now). Everything but that and being pending is the same for every job of one
(VC, request) and priority (what a search for victims reads of a job waiting for quota, with its
creation where that matters, which only such a job's own failure can make a no-op): a run is found
a shape at a time, with a bisection or two per shape. (A key begins with the job's priority:
KueueQueue's, the one queue whose heads are ranked by state.)
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from sortedcontainers import SortedList  # type: ignore[import-untyped, import-not-found]

from analysim.core.cycle_state import CycleState
from analysim.core.framework import PassStream, PassStreams
from analysim.core.gate import REFUSED, UNFIT, gate
from analysim.core.job import JobRun, JobStatus
from analysim.core.sorted_keys import cursor_after, cursor_next, first_after, first_key

if TYPE_CHECKING:
    from analysim.core.scheduler import Scheduler


class ShapeStreams(PassStreams):
    """The VCs with pending jobs as a pass begins (``SchedulingQueue.of_vc_shape``'s), a
    ShapeStream of any of them on demand, and the versions the pass's failures stand on."""

    def __init__(self, s: Scheduler, c: CycleState) -> None:
        self.s = s  # the pass's scheduler
        self.c = c  # the pass's cycle state

    def vcs(self) -> list[str]:
        lists = self.s.queue.of_vc_shape
        assert lists is not None
        return list(lists)

    def stream(self, vcs: list[str]) -> PassStream:
        return ShapeStream(self.s, self.c, vcs)

    def world(self) -> int:
        return self.s.world.running

    def holds(self) -> float:
        return self.c.hold


class ShapeStream(PassStream):
    """The pending jobs of some VCs in key order, from their per-(VC, request) lists
    (``SchedulingQueue.of_vc_shape``, which do not change during a pass): a heap of each shape's
    next key. Keys are (queue key, seq), unique.

    Invariant (once built): ``heap`` holds, for each list with a key past ``last`` (while ``last``
    is None: with any key) that ``leave_out`` did not drop, its first such key and that key's
    cursor in the list (sorted_keys.cursor_after), which stands because the lists do not change
    during a pass. (A backward ``seek_after`` takes every list again; a queue that drains never
    leaves any out: KueueQueue.order drains only without the control plane.)"""

    def __init__(self, s: Scheduler, c: CycleState, vcs: list[str]) -> None:
        self.s = s  # the pass's scheduler: its queue, handle and gate
        self.c = c  # the pass's cycle state
        self.vcs = vcs  # the VCs (ClusterQueues) it merges
        # Built on first use (``_build``): a queue may leave a stream out of its merge unread
        # (KueueQueue's inadmissible pool), and a pass makes one per VC with pending jobs.
        self.built = False
        self.lists: list[SortedList] = []  # each shape's keys
        self.shapes: list[tuple] = []  # each list's request
        self.heap: list[tuple[tuple, int, int, int]] = []  # (next key, list, its cursor: sublist, index)
        # Jobs of these VCs evicted at this instant (waiting for the next one), as of its build:
        # never left out. (Read per VC: an instant's evictions can be thousands, and a pass builds
        # a stream per ClusterQueue.)
        self.evicted: list[tuple] = []
        self.last: tuple | None = None  # the key of the last job given
        self.only_refused = True  # (PassStream's)

    def _build(self) -> None:
        s, vcs = self.s, self.vcs
        lists = s.queue.of_vc_shape
        assert lists is not None
        self.lists = [keys for vc in vcs for keys in lists[vc].values()]
        self.shapes = [shape for vc in vcs for shape in lists[vc]]
        self.heap = [(first_key(keys), i, 0, 0) for i, keys in enumerate(self.lists)]
        heapq.heapify(self.heap)
        self.evicted = sorted(k for keys in s.queue.held_out(vcs, s.handle.now).values() for k in keys)
        self.built = True

    def __iter__(self) -> ShapeStream:
        return self

    def __next__(self) -> JobRun:
        if not self.built:
            self._build()
        heap, by_seq = self.heap, self.s.queue.by_seq
        while heap:
            key, i, pos, at = heap[0]
            nxt = cursor_next(self.lists[i], pos, at)
            if nxt is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (nxt[0], i, nxt[1], nxt[2]))
            job = by_seq.get(key[1])
            if job is not None:
                self.last = key
                return job
        raise StopIteration

    def no_op(self, job: JobRun) -> bool:
        """Whether cycle._visit would change nothing for this job now (module docstring): it is no
        longer pending, or the gate fails it or passes over it without an attempt (for a queue that
        does not block, the same)."""
        if job.status is not JobStatus.PENDING:
            return True
        code = gate(self.s, self.c, job)
        if code == UNFIT:
            self.only_refused = False
        return code in (UNFIT, REFUSED)

    def seek_after(self, key: tuple) -> None:
        """(PassStream's.) Forward, past ``last``, a list whose next key is past ``key`` keeps it
        (its keys before that one are no later than ``last``): only the others are looked up, as
        at the end of a drain, where most lists are past its stop. Backward, every list is."""
        if not self.built:
            self._build()
        heap: list[tuple[tuple, int, int, int]] = []
        behind: list[int] = list(range(len(self.lists)))
        if self.last is None or key >= self.last:
            heap = [entry for entry in self.heap if entry[0] > key]
            behind = [entry[1] for entry in self.heap if entry[0] <= key]
        for i in behind:
            cur = cursor_after(self.lists[i], key)
            if cur is not None:
                heap.append((cur[0], i, cur[1], cur[2]))
        heapq.heapify(heap)
        self.heap = heap
        self.last = key

    def leave_out(self, requests: set[tuple]) -> None:
        if not self.built:
            self._build()
        self.heap = [entry for entry in self.heap if self.shapes[entry[1]] not in requests]
        heapq.heapify(self.heap)

    def drain(self, also: Callable[[JobRun], bool]) -> JobRun | None:
        """Leave out the next jobs while each is a no-op and ``also`` holds for it; the first job
        that is not (None: none is left), which the stream has then given."""
        if not self.built:
            self._build()
        by_seq = self.s.queue.by_seq
        stop: tuple | None = None  # the first key not left out
        for key, i, _, _ in self.heap:
            keys = self.lists[i]
            k: tuple | None = key
            while k is not None and k[1] not in by_seq:
                k = first_after(keys, k)  # (placed earlier in the pass: given by no order)
            if k is None or stop is not None and k >= stop:
                continue
            rep = by_seq[k[1]]
            if not (self.no_op(rep) and also(rep)):
                stop = k  # this shape's next job is visited
            else:
                lower = first_after(keys, _past_priority(k))
                if lower is not None and (stop is None or lower < stop):
                    stop = lower  # (a job of lower priority may be no no-op)
        last = self.last
        for k in self.evicted:
            if last is None or k > last:
                if stop is None or k < stop:
                    stop = k
                break
        if stop is None:
            self.heap = []
            self.last = _PAST_ALL  # (the invariant: no list has a key past it)
            return None
        self.seek_after(_before(stop))
        return next(self, None)

    def __repr__(self) -> str:
        return f"ShapeStream({self.vcs!r})"


def _past_priority(k: tuple) -> tuple:
    """A key above every key of ``k``'s priority (keys are ((-priority, creation), seq))."""
    return ((k[0][0], math.inf), math.inf)


# A key above every key ((-priority, creation), seq): where a stream drained to its end stands.
_PAST_ALL: tuple = ((math.inf, math.inf), math.inf)


def _before(k: tuple) -> tuple:
    """A key just below ``k`` and above every key before it (keys are (queue key, seq), seq an
    integer unique to its job): ``seek_after(_before(k))`` gives ``k`` next."""
    return (k[0], k[1] - 0.5)
