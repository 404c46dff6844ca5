"""Kueue's admission, as plugins of the framework: the quota check (``KueueAdmission``, the
Admission point) and Kueue's queueing (``KueueQueue``, the QueueSort point), over one partition
(analysim.core.partition) and its quota tree, whose usage they share with the other Kueue plugins
in a KueueState (kueue_state).

What they do, after Kueue's documentation (docs/kueue.md has the details and what is not modelled):

- A job is a workload of the ClusterQueue its VC's LocalQueue points to. It is admitted when
  Kueue's flavor assignment (kueue_flavors: a flavor per resource group its requests touch, chosen
  by mode and borrowing level under the queue's flavor fungibility) fits now. Admitted, it is
  placed on its flavors' nodes in one piece, or not at all.
- Workloads are ordered by priority, then creation (submit) time, within a ClusterQueue; across
  ClusterQueues, one pass takes the heads by their borrowing level first (0, fits within nominal
  quota, first; then those borrowing from the nearest, lowest cohorts), then priority and time.
- Under StrictFIFO only a ClusterQueue's head is tried: a head that cannot be admitted or placed
  blocks the workloads behind it; under BestEffortFIFO they go past it.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, ClassVar, Final

import numpy as np
from sortedcontainers import SortedList  # type: ignore[import-untyped, import-not-found]

from analysim.core.framework import QUOTA_WAIT, PassStream, PassStreams
from analysim.core.job import JobRun, JobStatus
from analysim.core.partition import LOWER_OR_NEWER_EQUAL, STRICT_FIFO
from analysim.core.plugins.kueue_state import KueueState
from analysim.core.plugins.queue import _QueueSort

if TYPE_CHECKING:
    from analysim.core.control_plane import ControlPlane
    from analysim.core.framework import Handle


class KueueAdmission:
    """The quota check: admits a job to its ClusterQueue when a flavor assignment fits (above),
    and keeps the usage of what runs."""

    name: ClassVar[str] = "kueue"

    def __init__(self, state: KueueState, control: ControlPlane | None = None) -> None:
        self.state = state  # the usage it charges and releases, shared with the other Kueue plugins
        self.control = control  # (under the control-plane model: releases ask for requeues)
        # Queues that may preempt: a job of one whose quota does not fit now is still attempted
        # (on no nodes, so that it fails and the post-filter may find victims); others wait.
        self.preempting = [n.is_queue and n.preemption.enabled for n in state.partition.nodes]
        # Queues whose preemption reads a job's creation (its own candidates are newer than it).
        self.by_creation = [n.is_queue and n.preemption.within_cluster_queue == LOWER_OR_NEWER_EQUAL
                            for n in state.partition.nodes]
        self.nowhere: np.ndarray | None = None  # a mask of no node (made on first use), for those attempts

    def admit(self, job: JobRun, ctx: Handle) -> tuple[tuple, np.ndarray] | None:
        st = self.state
        # (right after a preemption for it: the flavors the preemption chose, which now fit)
        got = st.after_preemption.pop(job.job_id, None) or st.assign(job)
        if got is None:
            q = st.queue(job)
            if not self.preempting[q]:
                return None
            if ctx.shortcuts and st.no_candidate is not None and st.no_candidate(job):
                return None  # (nothing could be evicted for it now: a visit that changes nothing)
            if self.nowhere is None:
                self.nowhere = np.zeros(ctx.state.num_nodes, dtype=bool)
            # The failure signature (per VC under a preempting partition) then ends with QUOTA_WAIT
            # and what the search reads of the job besides its queue and request: its priority,
            # and itself where its creation matters. The pass fails a later job for this one's
            # failure only at that same signature and request (gate.py), for a search is not
            # monotone in the job: a higher priority can make the flavor choice pick a flavor
            # whose search then fails on the nodes, where a lower one's succeeds on another.
            prio = st.priority_of(job)
            return (QUOTA_WAIT + ((prio, job.seq) if self.by_creation[q] else (prio,))), self.nowhere
        flavors, charges, _ = got
        st.chosen[job.job_id] = (st.queue(job), charges, flavors)
        return flavors, st.nodes_of(job, flavors, ctx)

    def forget(self, job: JobRun) -> None:
        """The flavors a preemption chose for the job go unused: it waits for its victims'
        evictions to be written (the control plane), and is assigned afresh when next tried."""
        self.state.after_preemption.pop(job.job_id, None)

    def on_launch(self, job: JobRun, ctx: Handle) -> None:
        chosen = self.state.chosen.pop(job.job_id, None)
        if chosen is None:
            raise AssertionError(f"kueue: job {job.job_id!r} launched without an admission")
        q, charges, _ = chosen
        self.state.charge(job, q, charges, ctx.now)

    def on_stop(self, job: JobRun, ctx: Handle) -> None:
        st = self.state
        st.release(job)
        if self.control is not None:  # (the control plane's inadmissible pool: see KueueQueue)
            due = st.requeues.ask(st.root[st.queue(job)], ctx.now, self.control.config.requeue_batch_s)
            if due is not None:
                ctx.set_timer(due)


class KueueQueue(_QueueSort):
    """Kueue's queueing: by priority, then creation time, per ClusterQueue; the workloads that fit
    within nominal quota before those that would borrow; StrictFIFO queues only from their head.
    (Kueue's preemption is the post-filter kueue_preemption.KueuePreemption.)

    Invariant: a StrictFIFO queue's ``waiting`` holds (key, seq, job) of each of its jobs that
    arrived or stopped and has not launched since (ended ones until they reach the head), and
    ``keyed`` maps each of those jobs to its (key, seq); a ``parked`` entry stands only while its
    stamp is the current one (``_stamp``)."""

    name: ClassVar[str] = "kueue"
    # The order reads the quota usage (who would borrow), so it is taken afresh each pass; each
    # LocalQueue's jobs come in key order from the engine's per-VC lists.
    dynamic: ClassVar[bool] = True
    per_vc_order: ClassVar[bool] = True
    # A stream's head is ranked (would it borrow?) when it comes up, against the usage of that
    # moment in the pass: a head left out for want of room would bring the next one up early.
    heads_ranked_by_state: ClassVar[bool] = True

    def __init__(self, state: KueueState, control: ControlPlane | None = None) -> None:
        self.state = state  # the usage its ranks read (who would borrow), shared with the admission
        # Under the control-plane model: each ClusterQueue offers its first ``heads_per_queue``
        # workloads to a cycle; one that is not admitted is parked, with every workload of its
        # queue with the same request (Kueue's equivalence hashing), until quota is released in its
        # cohort tree is requeued: per queue, the tree's requeue count when parked and the requests.
        self.control = control
        self.parked: dict[tuple[int, bool], tuple[int, set[tuple]]] = {}  # (queue, on nodes) -> (stamp, requests)
        nodes = state.partition.nodes
        self.strict = [n.is_queue and n.strategy == STRICT_FIFO for n in nodes]  # per tree node: a StrictFIFO queue
        # A StrictFIFO queue's pending jobs by key, to know its head (jobs that end while pending,
        # cancelled, are dropped when they come to the head).
        self.waiting: dict[int, SortedList] = {i: SortedList() for i, s in enumerate(self.strict) if s}
        self.keyed: dict[str, tuple] = {}  # job id -> its (key, seq) in ``waiting``, while it is there
        self.pass_now = 0.0  # the time of the pass under way (order)
        self.pending_written: set[str] = set()  # workloads whose Pending status was written (control plane)
        # Without the control plane, the inadmissible pool: a ClusterQueue a pass found all of
        # whose pending jobs fail, none launching, each ranked 0 -> what their failures stand on
        # (``_Failing``). While it stands each fails still, and a pass leaves the queue out of its
        # merge (order).
        self.inadmissible: dict[int, _Failing] = {}
        self.queued = [0] * len(nodes)  # per ClusterQueue: its jobs queued so far (arrivals and stops)
        # Jobs the orders gave the passes, and runs drained (order): counts for tests and profiles.
        self.given = 0
        self.drains = 0  # (above)
        self.left_out = 0  # (above: queues the inadmissible pool left out of a pass, per pass)

    def key(self, job: JobRun, ctx: Handle) -> tuple:
        return self._key(job)

    def _key(self, job: JobRun) -> tuple:
        return (-self.state.priority.get(job.spec.qos, 0), job.spec.submit_s)

    def on_event(self, kind: str, job: JobRun, ctx: Handle) -> None:
        q = self.state.queue(job)
        if kind in ("arrival", "stop"):
            self.queued[q] += 1
        if not self.strict[q]:
            return
        if kind in ("arrival", "stop"):
            k = (self._key(job), job.seq)
            self.keyed[job.job_id] = k
            self.waiting[q].add(k + (job,))
        elif kind == "launch":
            known = self.keyed.pop(job.job_id, None)
            if known is not None:
                self.waiting[q].remove(known + (job,))

    def _is_head(self, job: JobRun, q: int) -> bool:
        waiting = self.waiting[q]
        while waiting:
            head = waiting[0]
            if head[-1].status is JobStatus.PENDING:
                return head[-1] is job
            waiting.pop(0)  # (ended while pending: cancelled)
            self.keyed.pop(head[-1].job_id, None)
        return False

    def head(self, q: int) -> JobRun | None:
        """A StrictFIFO queue's head: its first pending workload by key (kueue_reasons)."""
        for entry in self.waiting[q]:
            if entry[-1].status is JobStatus.PENDING:
                return entry[-1]
        return None

    def order(self, pending: Mapping[str, Iterator[JobRun]] | PassStreams,  # type: ignore[override]
              ctx: Handle) -> Iterator[JobRun]:
        # Each ClusterQueue is a stream of its jobs in key order (its LocalQueues' lists merged);
        # the heads of the streams are taken by (rank, key), Kueue's order across queues (rank:
        # would borrow; with fair sharing, the share it would give its queue), lazily: a pass
        # costs the jobs it looks at. A head's rank is read when it comes to the head and again
        # when taken (a head whose rank rose since goes back behind the others).
        #
        # Drains (framework.PassStreams, given with the shortcuts on under a partition;
        # not with fair sharing, whose ranks are not 0 or 1). A head taken whose visit would change
        # nothing (most often: its quota does not fit, and a no smaller request of its VC failed
        # so in this pass) is not given; nor are the jobs after it in its stream while each is
        # such a no-op of rank 0. The merge would have taken each of them as soon as it was the
        # least entry, changing nothing, so their stream's next entry goes in at once with the
        # rank it would have had. Until a launch or stop: then the jobs of the run the merge had
        # not taken yet come back (``_undrain``). It had taken those below every entry it took
        # since the drain began (the run's ``front``: the most of those entries, and of the least
        # entry when the drain began; one of rank 1 is above the whole run).
        st = self.state
        self.pass_now = ctx.now
        # The queues of the inadmissible pool (queue -> its tree's version, or _ANY_CHANGE), left
        # out of the merge as runs drained from before their first job: while what their jobs'
        # failures read does not change, the merge would take each of them, failing still,
        # changing nothing. Their streams are made only if a change brings their jobs back.
        made, refused = self._streams(pending, ctx)
        self.left_out += len(refused)
        streams, drainable = made.streams, made.drainable
        book = _Book({q: self.queued[q] for q in made.may_drain})  # what the pass found of each queue (_to_pool)
        heap: list[tuple[float, tuple, int, int, int, JobRun]] = []
        for q, jobs in streams.items():
            self._push(heap, q, jobs, 0)
        gen = dict.fromkeys(made.vcs_of, 0)  # a queue's entries from before an undrain are stale
        # queue -> its run (past this key, before that one: None, to the end), the least entry when
        # the drain began, and where in ``taken`` the drain began (its front: _undrain)
        drained: dict[int, list] = {}
        if refused and heap and heap[0][0] == 0.0:  # (else the merge takes them all before any entry)
            for q in refused:
                drained[q] = [_FIRST, None, heap[0][:3], 0]
        taken = _Taken()  # what the merge took while a run was drained
        offered = dict.fromkeys(made.vcs_of, 0)  # (under the control plane: heads offered this cycle)
        while heap:
            rank, key, seq, g, q, job = heapq.heappop(heap)
            if g != gen[q]:
                continue
            if drained:
                taken.add((rank, key, seq))
            elif taken.count:
                taken.clear()  # (no run drained: the entries before now matter to none)
            now = self._rank(q, job)
            if now > rank:
                heapq.heappush(heap, (now, key, seq, g, q, job))
                continue
            if self.strict[q] and not self._is_head(job, q):
                continue  # behind its StrictFIFO queue's head, which was not admitted: the stream ends
            drained.pop(q, None)  # (its run, if any, ranked before this entry: all taken)
            stream = drainable.get(q)
            if stream is not None:
                book.take(q, now, st)
                if stream.no_op(job):
                    self._drain(heap, q, stream, (key, seq), g, gen, drained, taken.count)
                    continue
            version = st.version
            self.given += 1
            book.gave.add(q)
            yield job
            if drained and st.version != version:
                self._undrain(heap, drained, made, gen, taken, refused, book)
            if self.control is not None and not self._offered(q, job, offered, ctx.now):
                continue  # (the queue's heads for this cycle are all taken)
            self._push(heap, q, streams[q], gen[q])
        self._to_pool(made, refused, book)

    def _drain(self, heap: list, q: int, stream: PassStream, start: tuple, g: int, gen: dict[int, int],
               drained: dict[int, list], since: int) -> None:
        """Leave out the run of no-ops that begins with the entry just taken (its ``start``), and
        put the stream's next job in; the run is drained (order) unless nothing else can come
        before its end."""
        nxt = stream.drain(self._lowest)
        self.drains += 1
        while heap and heap[0][3] != gen[heap[0][4]]:
            heapq.heappop(heap)  # (stale: the least entry the merge has is the next valid one)
        if heap and heap[0][0] == 0.0:  # (else nothing else comes before the run ends)
            drained[q] = [start, None if nxt is None else (self._key(nxt), nxt.seq), heap[0][:3], since]
        if nxt is not None:
            heapq.heappush(heap, (self._rank(q, nxt), self._key(nxt), nxt.seq, g, q, nxt))

    def _inadmissible(self, queues: list[int], source: PassStreams, ctx: Handle) -> dict[int, int]:
        """Of these queues, those of the inadmissible pool whose place there stands (``_Failing``),
        each with its tree's version if that is what it stands on, else ``_ANY_CHANGE``."""
        st = self.state
        out: dict[int, int] = {}
        if not self.inadmissible or not ctx.spec.allow_borrowing:  # (without, a VC's own quota refuses too)
            return out
        world = -1  # (read once, when a queue's place stands on it)
        for q in queues:
            stamp = self.inadmissible.get(q)
            if stamp is None or stamp.queued != self.queued[q]:
                continue
            if stamp.on_world:
                if world < 0:
                    world = source.world()
                if stamp.version == world:
                    out[q] = _ANY_CHANGE
            elif stamp.version == st.tree_versions[st.root[q]]:
                out[q] = stamp.version
        return out

    def _to_pool(self, made: _Streams, refused: dict[int, int], book: _Book) -> None:
        """After a whole pass, which queues go into the inadmissible pool, and on what their place
        stands (``_Failing``); the others leave it. A queue the pass left out keeps its place, which
        stood through the pass.

        A queue goes in when none of its jobs launched and the pass found each of them failing at
        the state of now (its first was taken at the last version, so none changed since), each
        ranked 0 (a queue left out is one drained run from before its first job, which rank 0
        keys alone order: order). Its place stands on its tree's version when all of them were
        refused by the quota (the gate's REFUSED, read from its tree's usage alone) and none was
        given; else on the running jobs and the nodes, if every failure the pass found holds while
        those stand (not one that holds for an instant only, like a job's evicted at it: the pool
        would then have to bound the hints the pass leaves, cycle.run_pass)."""
        st = self.state
        world, forever = -1, False
        for q, stream in made.drainable.items():
            if q in refused:
                continue
            tree = st.tree_versions[st.root[q]]
            on = book.failing_on(q, tree, st.version, stream.only_refused)
            if on == _ON_TREE:
                self.inadmissible[q] = _Failing(False, tree, book.queued[q])
                continue
            if on == _ON_WORLD:
                if world < 0:
                    assert made.source is not None  # (a drainable stream was made from it)
                    world, forever = made.source.world(), made.source.holds() == math.inf
                if forever:
                    self.inadmissible[q] = _Failing(True, world, book.queued[q])
                    continue
            self.inadmissible.pop(q, None)

    def _streams(self, pending: Mapping[str, Iterator[JobRun]] | PassStreams,
                 ctx: Handle) -> tuple[_Streams, dict[int, int]]:
        """Each ClusterQueue's stream of jobs (its LocalQueues' lists merged), and which of them may
        be drained (order); and the queues of the inadmissible pool whose place there stands
        (_inadmissible), whose streams are not made (_Streams.back makes them)."""
        st = self.state
        lazy: PassStreams | None = None
        if isinstance(pending, PassStreams):
            lazy, names = pending, pending.vcs()
        else:
            names = list(pending)
        vcs_of: dict[int, list[str]] = {}  # queue -> its VCs with pending jobs
        for vc in names:
            vcs_of.setdefault(st.queue_of[vc], []).append(vc)
        drains = lazy is not None and st.shares is None and self.control is None
        may_drain = [q for q in vcs_of if not self.strict[q]] if drains else []
        refused = self._inadmissible(may_drain, lazy, ctx) if lazy is not None else {}
        made = _Streams(lazy, vcs_of, may_drain)
        for q, vcs in vcs_of.items():
            if drains and not self.strict[q]:
                if q not in refused:
                    made.back(q)
            else:
                made.streams[q] = self._merged(q, [lazy.stream([vc]) for vc in vcs] if lazy is not None
                                               else [pending[vc] for vc in vcs])  # type: ignore[index]
        return made, refused

    def _merged(self, q: int, lists: list[Iterator[JobRun]]) -> Iterator[JobRun]:
        """A queue's stream that is not drained: its VCs' lists merged in key order, without the
        requests parked in it (under the control plane)."""
        parked = self._parked(q, self.pass_now) if self.control is not None else None
        if parked:
            for one in lists:
                if isinstance(one, PassStream):
                    one.leave_out(parked)  # (else each is skipped as it comes: _push)
        return lists[0] if len(lists) == 1 else heapq.merge(*lists, key=self._merge_key)

    def _parked(self, q: int, now: float) -> set[tuple] | None:
        """The requests parked in the queue (None: none)."""
        shapes: set[tuple] | None = None
        for on_nodes in (False, True):
            parked = self.parked.get((q, on_nodes))
            if parked is None:
                continue
            if parked[0] != self._stamp(q, on_nodes, now):
                del self.parked[(q, on_nodes)]  # (requeued: all come back)
            else:
                shapes = parked[1] if shapes is None else shapes | parked[1]
        return shapes

    def _stamp(self, q: int, on_nodes: bool, now: float) -> int:
        """What a parked request waits to change: the requeues of its queue's cohort tree (its
        quota did not fit: Kueue's inadmissible pool), or any release of quota anywhere (its quota
        fit but no nodes were free, which Kueue, not placing pods, does not see)."""
        st = self.state
        return st.requeues.releases if on_nodes else st.requeues.counted(st.root[q], now)

    def pool_of(self, job: JobRun) -> str | None:
        """Under the control-plane model, where a pending job waits as of the last pass: "quota"
        (parked in its ClusterQueue's inadmissible pool), "nodes" (parked: its quota fitted, its
        nodes had no room) or None (not parked: waiting to be offered to a cycle)."""
        q = self.state.queue(job)
        requeues, root = self.state.requeues, self.state.root[q]
        for on_nodes, pool in ((True, "nodes"), (False, "quota")):
            parked = self.parked.get((q, on_nodes))
            stamp = requeues.releases if on_nodes else requeues.by(root, self.pass_now)
            if parked is not None and parked[0] == stamp and job.spec.request in parked[1]:
                return pool
        return None

    def _is_parked(self, q: int, job: JobRun, now: float) -> bool:
        parked = self._parked(q, now)
        return parked is not None and job.spec.request in parked

    def _offered(self, q: int, job: JobRun, offered: dict[int, int], now: float) -> bool:
        """A head was offered to a cycle: one not admitted is parked (unless it was evicted at this
        instant: it is requeued at once, as Kueue does after an eviction), and its first Pending
        status is written. Whether its queue may offer another in this cycle."""
        control = self.control
        assert control is not None
        control.offered += 1
        offered[q] += 1
        more = offered[q] < control.config.heads_per_queue
        if job.status is not JobStatus.PENDING or job.preemptions and job.enqueued_s == now:
            return more
        on_nodes = self.state.assign(job) is not None
        stamp = self._stamp(q, on_nodes, now)
        parked = self.parked.get((q, on_nodes))
        if parked is None or parked[0] != stamp:
            parked = self.parked[(q, on_nodes)] = (stamp, set())
        parked[1].add(job.spec.request)
        if job.job_id not in self.pending_written:
            self.pending_written.add(job.job_id)
            control.write_pending(now)
        return more

    def _lowest(self, job: JobRun) -> bool:
        """Whether a job ranks below every other (0: it would not borrow), so that a run of them
        in a stream is taken by the merge before anything after them in it."""
        return self._rank(self.state.queue(job), job) == 0.0

    def _undrain(self, heap: list, drained: dict[int, list], made: _Streams, gen: dict[int, int], taken: _Taken,
                 refused: dict[int, int], book: _Book) -> None:
        """After a launch or stop: each drained run's jobs past its front were not taken yet; the
        first becomes its queue's entry again, with the rank 0 it had when its turn came (before
        the change). The front is the most of the least entry when the drain began and of every
        entry the merge took since; one taken of rank above 0 is above the whole run, taken
        whole. A queue of the inadmissible pool whose tree did not change, and whose place stood on
        that alone, stays drained: its jobs are refused still. Another is the pass's own from then
        on, never put back in the pool by this pass (its jobs before the front were found failing
        before the change)."""
        st = self.state
        kept: dict[int, list] = {}
        for q, (start, stop, least, since) in drained.items():
            front = least
            most = taken.most_since(since)
            if most is not None and most > least:
                if most[0] > 0.0:
                    continue  # (taken whole)
                front = most
            if q in refused:
                if refused[q] == st.tree_versions[st.root[q]]:
                    kept[q] = [start, stop, front, 0]  # (``taken`` starts again below)
                    continue
                del refused[q]
                book.left_stale(q)
            after = max(start, (front[1], front[2]))
            if stop is not None and after >= stop:
                continue
            stream = made.drainable.get(q)
            if stream is None:
                stream = made.back(q)  # (left out as the pass began: its stream is made now)
            stream.seek_after(after)
            job = next(stream, None)
            if job is None or stop is not None and (self._key(job), job.seq) >= stop:
                continue  # (none left before the entry: the stream is past it again)
            gen[q] += 1
            heapq.heappush(heap, (0.0, self._key(job), job.seq, gen[q], q, job))
        drained.clear()
        taken.clear()
        drained.update(kept)

    def _merge_key(self, job: JobRun) -> tuple:
        return (self._key(job), job.seq)

    def _rank(self, q: int, job: JobRun) -> float:
        """A head's rank across queues, lower first: its borrowing level when it fits now (0 within
        nominal quota; a head that does not fit is ranked 0, its visit a quota wait or a preemption
        search); with fair sharing, its queue's share with it admitted (kueue_fair)."""
        got = self.state.assign(job)
        shares = self.state.shares
        if shares is None:
            return float(got[2]) if got is not None else 0.0
        return shares.share(q, got[1] if got is not None else ())

    def _push(self, heap: list[tuple[float, tuple, int, int, int, JobRun]], q: int, stream: Iterator[JobRun],
              g: int) -> None:
        job = next(stream, None)
        if self.control is not None:
            while job is not None and self._is_parked(q, job, self.pass_now):
                job = next(stream, None)
        if job is not None:
            heapq.heappush(heap, (self._rank(q, job), self._key(job), job.seq, g, q, job))


# A key below every key ((-priority, creation), seq): where a run drained from a stream's start begins.
_FIRST: tuple = ((-math.inf, -math.inf), -math.inf)
# The version a left-out queue is given when its place in the pool stands on the running jobs and
# the nodes (KueueQueue._inadmissible): none a tree has, so that any launch or stop brings it back.
_ANY_CHANGE: Final = -1
# What _Book.failing_on finds a queue's jobs failing on: nothing known, the tree's usage, the world.
_NOT_FAILING: Final = 0
_ON_TREE: Final = 1
_ON_WORLD: Final = 2


class _Failing:
    """What a queue's place in the inadmissible pool stands on (KueueQueue.inadmissible): while it
    does, and the queue's queued count is the same, each of its pending jobs fails still."""

    __slots__ = ("on_world", "version", "queued")  # (not a dataclass: one per queue and pass)

    def __init__(self, on_world: bool, version: int, queued: int) -> None:
        # False: its cohort tree's usage (every job refused by the quota, which reads that alone);
        # True: the running jobs and the nodes (some failed on nodes or in a search for victims).
        self.on_world = on_world
        self.version = version  # that one's version then: the tree's, or World.running (PassStreams.world)
        self.queued = queued  # the queue's KueueQueue.queued then (an arrival or a stop brings a job unseen)


class _Streams:
    """The streams of one pass's ClusterQueues (KueueQueue.order): each queue's jobs, its
    LocalQueues' lists merged into one.

    Invariant: ``drainable`` holds the streams of ``streams`` that may be drained (of queues in
    ``may_drain``): one PassStream per queue, of all its VCs."""

    __slots__ = ("source", "vcs_of", "may_drain", "streams", "drainable")  # (not a dataclass: one per pass)

    def __init__(self, source: PassStreams | None, vcs_of: dict[int, list[str]], may_drain: list[int]) -> None:
        self.source = source  # what the drainable streams are made from (None: no queue's may be drained)
        self.vcs_of = vcs_of  # queue -> its VCs with pending jobs
        self.may_drain = may_drain  # the queues whose streams may be drained, made or not
        self.streams: dict[int, Iterator[JobRun]] = {}  # queue -> its stream, for those made
        self.drainable: dict[int, PassStream] = {}  # (above)

    def back(self, q: int) -> PassStream:
        """Make the drainable stream of a queue (at the pass's start, or once a change brings back
        the jobs of one the inadmissible pool left out)."""
        assert self.source is not None
        stream = self.streams[q] = self.drainable[q] = self.source.stream(self.vcs_of[q])
        return stream


class _Book:
    """What one pass found of each drainable queue, for the inadmissible pool (KueueQueue._to_pool).

    Invariant: a queue is in ``first`` once the merge took one of its jobs, and in ``gave`` only then."""

    __slots__ = ("queued", "first", "high", "gave")  # (not a dataclass: one per pass)

    def __init__(self, queued: dict[int, int]) -> None:
        # KueueQueue.queued as the pass began, of each queue that may drain (the only ones the
        # pool takes, not all of them: a thousand in Kueue's large-scale scenario, every pass):
        # the jobs its lists hold. (A job evicted in the pass is queued again at once, but the
        # pass does not see it: its queue's place in the pool must not stand on a count that
        # includes it.)
        self.queued = queued
        # Queue -> its tree's version and the usage's (KueueState.version) when the merge took its
        # first job; (-1, -1), versions nothing has, for one it left out until a change brought
        # its jobs back (the jobs before the change were found failing before it).
        self.first: dict[int, tuple[int, int]] = {}
        self.high: set[int] = set()  # the queues of which a job was taken ranked above 0
        self.gave: set[int] = set()  # the queues of the jobs given (the pass visited them)

    def take(self, q: int, rank: float, st: KueueState) -> None:
        """The merge took a job of ``q`` ranked ``rank`` (its versions are read at the first)."""
        if q not in self.first:
            self.first[q] = (st.tree_versions[st.root[q]], st.version)
        if rank > 0.0:
            self.high.add(q)

    def left_stale(self, q: int) -> None:
        self.first[q] = (-1, -1)

    def failing_on(self, q: int, tree: int, version: int, only_refused: bool) -> int:
        """On what the pass found every job of ``q`` failing at the versions of now: the tree's
        usage when it gave none and the stream found each refused, the world when it found each
        failing with nothing changed since its first (so none of its visits launched), ranked 0;
        else ``_NOT_FAILING``."""
        first = self.first.get(q)
        if first is None or q in self.high:
            return _NOT_FAILING
        if only_refused and q not in self.gave and first[0] == tree:
            return _ON_TREE
        return _ON_WORLD if first[1] == version else _NOT_FAILING


class _Taken:
    """The entries a merge took, in order, kept as their maxima from the end: the most of those
    taken since any point, in a binary search, where a scan of every drained run per entry taken
    cost a thousand comparisons an entry over a thousand ClusterQueues.

    Invariant: ``top`` is strictly decreasing, ``at`` strictly increasing; ``top[j]`` is the
    entry taken ``at[j]``-th, and the most of all entries taken from then on."""

    def __init__(self) -> None:
        self.count = 0  # entries taken
        self.at: list[int] = []  # the positions of the maxima, in ``count``'s numbering
        self.top: list[tuple[float, tuple, int]] = []  # the maxima, (rank, key, seq)

    def add(self, entry: tuple[float, tuple, int]) -> None:
        top, at = self.top, self.at
        while top and top[-1] <= entry:
            top.pop()
            at.pop()
        top.append(entry)
        at.append(self.count)
        self.count += 1

    def most_since(self, i: int) -> tuple[float, tuple, int] | None:
        """The most of the entries taken from the ``i``-th on (None: none)."""
        j = bisect_left(self.at, i)
        return self.top[j] if j < len(self.top) else None

    def clear(self) -> None:
        self.count = 0
        self.at.clear()
        self.top.clear()
