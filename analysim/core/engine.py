"""The discrete-event engine: the one implementation of scheduling that every front end drives.

Inputs are explicit events — job arrivals, completions, cancellations, node up/down — and outputs
are explicit decisions — launch, preempt, migrate, complete, requeue. No I/O and no wall clock:
``analysim simulate`` feeds it a trace; the live scheduler service feeds it the network.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol, cast

import numpy as np
from mypy_extensions import mypyc_attr
from sortedcontainers import SortedList  # type: ignore[import-untyped, import-not-found]

from analysim.core import placement, victims
from analysim.core.cluster import ClusterSpec, ClusterState
from analysim.core.events import ARRIVAL, COMPLETION, KIND, NODE, PAYLOAD, TIMER, EventQueue
from analysim.core.framework import Policy
from analysim.core.job import GPU_MILLI, MAX_TIME_S, JobRun, JobSpec, JobStatus, Placement, by_fields
from analysim.core.placement import cpu_mem_on

if TYPE_CHECKING:
    from analysim.core.fragmentation import FragmentationIndex


@dataclass(frozen=True)
class EngineConfig:
    """Knobs of the mechanism, independent of the policy.

    Overheads are virtual seconds a job spends before making progress again: reloading its
    checkpoint after a preemption (``restore_overhead_s``) or after being moved
    (``migration_overhead_s``). Preemption always checkpoints; a node failure rolls a job back to
    its last periodic checkpoint (every ``checkpoint_interval_s`` of progress; None: no periodic
    checkpoints, so only preemption checkpoints survive).
    """

    preemption: bool = False
    migration: bool = False
    restore_overhead_s: float = 30.0
    migration_overhead_s: float = 60.0
    checkpoint_interval_s: float | None = 1800.0
    rebalance_interval_s: float | None = None
    relaxed_locality: bool = False
    predict_completions: bool = True
    seed: int = 0
    # A run of millions of jobs keeps neither its ended jobs (the recorder has their rows; they are
    # only counted, in forgotten_by_vc) nor its decision log.
    keep_ended: bool = True
    keep_decisions: bool = True

    def __reduce__(self) -> tuple:
        return by_fields(self)


@dataclass(frozen=True, slots=True)
class Decision:
    """Something the engine did, in the order it did it."""

    time: float
    kind: str  # launch | preempt | migrate | complete | requeue | cancel | fail
    job_id: str
    nodes: tuple[str, ...] = ()

    def __reduce__(self) -> tuple:
        return by_fields(self)


class InfeasibleJob(ValueError):
    """A job that can never run on this cluster. ``reason`` is a short code for filter counts."""

    def __init__(self, message: str, reason: str = "infeasible") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(slots=True)
class _Extra:
    """Engine bookkeeping per job that plugins need not see."""

    checkpoint_work_s: float = 0.0  # progress saved by the last checkpoint
    expected_end_s: float = math.inf
    qkey: tuple | None = None
    qwork: float = 0.0  # overhead and work left when queued: a pending job ends this long after it starts
    promote_at: float | None = None
    # The last attempt to place it failed in this world (Engine._running_version), and would fail
    # the same way until this time (see Engine._answers_hold_until).
    failed_world: int = -1
    failed_until: float = -math.inf
    # The plugins whose finds_none_until reads only its VC (finds_none_by_vc) said, with the VC's
    # running jobs at this version (Engine._vc_versions) and the nodes at this one, that they
    # find nothing for it until this time (see Engine._surely_fails_until).
    none_vc_version: int = -1
    none_node_version: int = -1
    none_by_vc_until: float = -math.inf
    # When it was last evicted by a preemption: it is not launched again at that instant (see
    # Engine._preempt).
    evicted_at: float = -math.inf


@dataclass(slots=True)
class _Room:
    """The whole GPUs free on one dedicated VC's nodes (see Engine._scope_room)."""

    version: tuple[int, int]  # (Engine._running_version, Engine._node_version) when found
    most: int  # the most whole GPUs free on one of its nodes that is up
    total: int  # the whole GPUs free on its nodes that are up
    smallest: int  # the GPUs of its smallest node (Engine._vc_smallest)

    def cannot_fit(self, w: int) -> bool:
        """Whether no job of ``w`` whole GPUs can fit on these nodes as they stand (as _width_keys
        asks of the whole cluster: one that fits on any node of them, or one wider than all)."""
        return self.most < w <= self.smallest or self.total < w


@dataclass(slots=True)
class _Unsearched:
    """The plugins' finds_none_until a failed placement would ask (see Engine._surely_fails_until)."""

    by_vc: list[Callable[[JobRun, Engine], float]]  # those whose answer reads only the job's VC
    others: list[Callable[[JobRun, Engine], float]]


@dataclass(slots=True)
class _QuietPass:
    """What a pass that changed nothing left (see Engine._resumed_order)."""

    world: int  # Engine._running_version during it
    hold: float  # until when its failures hold (the earliest failed_until it met), and EASY's
    # answers (a job that may backfill by ending before a shadow time may not once time moves on)
    blocked: dict  # blocking queues: the heads blocked at its end, with their reservations
    failed: dict  # the smallest failed request per signature at its end (see Engine._pass)
    last_key: tuple  # the queue's last key then (a pass runs only with jobs waiting)
    new: list[tuple]  # keys queued since, each by an arrival


@mypyc_attr(allow_interpreted_subclasses=True)  # (tests subclass it to check it)
class Engine:
    def __init__(self, spec: ClusterSpec, policy: Policy, config: EngineConfig | None = None,
                 recorder: Recorder | None = None, workload: Sequence[JobSpec] | None = None) -> None:
        self.spec = spec
        self.policy = policy
        self.config = config or EngineConfig()
        # Passes leave out what would only be passed over (blocked VCs, widths and shapes that
        # cannot fit, jobs a jump goes over) and remember failures: for speed. Tests turn this
        # off to compare against an engine that walks every job.
        self._skip_ahead = True
        self.state = ClusterState(spec)
        self.rng = np.random.default_rng(self.config.seed)
        self.now = 0.0
        self.events = EventQueue()
        self.jobs: dict[str, JobRun] = {}
        self.extra: dict[str, _Extra] = {}
        self.running: dict[str, JobRun] = {}
        self.running_by_vc: dict[str, dict[str, JobRun]] = {}  # for plugins that look within a VC
        # Every pending key, (queue key, seq), in order: for static queue orders. (None when the
        # per-width or per-shape lists below hold every key: see _pending_keys.)
        self._pending: SortedList | None = SortedList()
        # The same keys per VC, for a blocking queue: a pass skips a VC whose queue is blocked
        # without walking its jobs (a long queue of one tenant must not cost every pass).
        # Kept too for a queue that orders each VC's jobs by its key and picks among the VCs
        # (fair share): a pass then merges the VCs' lists instead of sorting every pending job.
        by_vc = policy.queue.blocking or getattr(policy.queue, "per_vc_order", False)
        self._pending_of_vc: dict[str, SortedList] | None = {} if by_vc else None
        # And per VC and GPU demand, for per-VC FIFO: when the shared queue is blocked, a pass
        # jumps over a VC's jobs that would borrow to its next job within quota.
        self._pending_of_vc_demand: dict[str, dict[float, SortedList]] | None = (
            {} if policy.queue.blocking and not policy.backfill else None)
        # Under EASY backfilling, per VC, GPU demand and power-of-two bucket of queued work: a pass
        # jumps over a VC's jobs that its reservations keep from backfilling to the next that
        # they do not (see _backfill_order).
        self._pending_of_vc_dw: dict[str, dict[tuple[float, int, int], SortedList]] | None = (
            {} if policy.backfill else None)
        # For a queue that does not block, by width (the whole GPUs a job asks for; 0 for
        # fractional and CPU-only jobs), globally or per VC (``per_vc_order``): a pass without
        # preemption or migration then leaves out the widths that cannot fit as capacity stands,
        # instead of passing over their jobs one by one (see _width_keys). And per VC and
        # request shape: a pass with them leaves out the shapes whose every request is at least
        # one that failed in the pass (see _shape_order). Only the lists a pass reads are kept:
        # the per-shape ones when it may preempt or migrate, else the per-width ones.
        # A width's bucket is (width, scope): the scope is a dedicated VC's name (its jobs run only
        # on its own nodes, so whether a width can fit is asked of those: see _scope_room), else None.
        self._pending_of_width: dict[tuple[int, str | None], SortedList] | None = None
        self._pending_of_vc_width: dict[str, dict[tuple[int, str | None], SortedList]] | None = None
        self._pending_of_vc_shape: dict[str, dict[tuple, SortedList]] | None = None
        # Whether a failed placement may evict (post-filters) or move (rebalance) running jobs.
        self._can_preempt = self.config.preemption and bool(policy.post_filters)
        self._can_migrate = self.config.migration and policy.rebalance is not None
        if not policy.queue.blocking:
            if (self._can_preempt or self._can_migrate) and (getattr(policy.queue, "per_vc_order", False) or not policy.queue.dynamic):
                self._pending_of_vc_shape = {}
            elif getattr(policy.queue, "per_vc_order", False):
                self._pending_of_vc_width = {}
            elif not policy.queue.dynamic:
                self._pending_of_width = {}
            if self._pending_of_width is not None or self._pending_of_vc_width is not None or (
                    self._pending_of_vc_shape is not None):
                self._pending = None
        # Shapes of the pending requests, to tell cheaply when nothing waiting can fit.
        self._pending_whole: Counter[int] = Counter()
        self._pending_frac: Counter[int] = Counter()
        self._pending_cpu_only = 0
        self._pending_with_models = 0  # (see _worse_from)
        self._pending_vcs: Counter[str] = Counter()  # VC -> jobs waiting
        self._pending_demands: dict[str, Counter[float]] = {}  # VC -> GPU demand -> jobs waiting
        self._stops = 0  # jobs taken off their GPUs so far
        # Preemption's per-pass caches (see ranked_running): the ranked running jobs live for a
        # pass (launches and stops update them in place); the failures, while the running jobs
        # stay the same (every launch and stop bumps the version).
        self._pass_no = 0
        self._running_version = 0
        self._ranked: dict[str | None, _RankedRunning] = {}
        self._memo_key: tuple[int, int, float] | None = None
        self._memo: dict = {}
        self._vc_versions: dict[str, int] = {}  # per VC, bumped by each launch and stop of its jobs
        self._node_version = 0  # bumped by each node going down or up
        self._vc_memos: dict[str, tuple[tuple[int, int], dict]] = {}  # (see vc_memo)
        self._gmax = max((n.gpus for n in spec.nodes), default=0)
        self._pending_by_seq: dict[int, JobRun] = {}
        self._key_len = -1  # the length of the queue's keys, once one is known
        # Running jobs by expected end, (end, GPUs, seq), for EASY backfilling's reservations: the
        # shadow time is found by walking the earliest ends, not by sorting every running job.
        # Per dedicated VC as well, for a dedicated VC's head.
        self._ends: SortedList | None = SortedList() if policy.backfill else None
        self._ends_of_vc: dict[str, SortedList] = {}
        self.decisions: list[Decision] = []  # (empty with EngineConfig.keep_decisions off)
        self._keep_decisions = self.config.keep_decisions
        self.forgotten_by_vc: Counter[str] = Counter()  # ended jobs dropped from jobs, by VC
        self._feed: Iterator[JobSpec] | None = None  # jobs submitted as the clock reaches them
        self._fed_next: JobSpec | None = None
        self.recorder = recorder
        self._seq = 0
        self._static_cache: dict[tuple, np.ndarray] = {}
        self._gang_size_cache: dict[tuple, int] = {}  # (GPUs, models, dedicated VC) -> gang_size
        self._unsearched_cache: dict[tuple[bool, bool], _Unsearched | None] = {}  # (see _unsearched_checks)
        self._open_nodes_cache: dict[tuple, tuple[list[bool], bool]] = {}  # (see _open_nodes)
        self._lasting_memo: dict = {}  # (see lasting_memo)
        self._stopped_demand: dict[str, float] = {}  # (see stopped_demand)
        # Whether a job shape fits the empty cluster (with the nodes that are up now): every
        # submitted job is checked, and traces repeat a few shapes.
        self._fits_empty: dict[tuple, bool] = {}
        self._vc_dedicated = {v.name for v in spec.vcs if v.nodes}
        # A dedicated VC's node indexes, the GPUs of its smallest node, and what _scope_room last
        # found free on them.
        self._vc_nodes: dict[str, list[int]] = {
            vc: [i for i, owner in enumerate(self.state.owner_vc) if owner == vc] for vc in self._vc_dedicated}
        self._vc_smallest: dict[str, int] = {
            vc: min((int(self.state.gpus[n]) for n in nodes), default=0) for vc, nodes in self._vc_nodes.items()}
        self._rooms: dict[str, _Room] = {}
        self._vc_names = frozenset(v.name for v in spec.vcs)
        # quota_of's answers, looked up a few times per job per pass under per-VC queues.
        self._quota_by_vc = {v.name: None if v.name in self._vc_dedicated else v.quota_gpus for v in spec.vcs}
        self._quota_unknown_vc = 0.0 if spec.vcs else None
        self.node_names = [n.name for n in spec.nodes]
        self.allocated_gpus = 0.0  # sum of running jobs' GPU demand
        self.up_gpus = float(self.state.gpus.sum())  # GPUs on nodes that are up
        self.allocated_by_model = np.zeros(len(self.state.model_names))
        self.pending_demand = 0.0
        self._dirty = False  # something changed since the last scheduling pass
        self.workload = workload  # the task sizes FGD's expected fragmentation is measured against
        self._frag_index: FragmentationIndex | None = None
        self._empty_state: ClusterState | None = None
        self._in_pass = False
        self._quiet: _QuietPass | None = None  # the last pass, if it changed nothing and nothing has since
        # (running jobs' version, queue's version, hold) of the last per-shape pass, if it gave
        # no job to attempt: the next such pass gives none either while all three stand.
        self._idle: tuple[int, int, float] | None = None
        self._queue_version = 0  # bumped by every change to the queue's key lists
        self._pass_hold = math.inf  # the pass's failures hold until then (see _QuietPass)
        self._evicted_at = -math.inf  # the time of the last eviction by a preemption (see _preempt)
        self._backfill_walks: dict[tuple, tuple[tuple, tuple | None]] = {}
        # The last answers of _next_backfill_effect in a pass that only launches, by what it reads:
        # (the key asked after, the answer). The merge asks again from each later key of a VC,
        # and the answer stands for every key from the one asked after to the answer.
        self._next_answers: dict[tuple, tuple[tuple, tuple | None]] = {}
        self._wide_merges: dict[tuple[str, int], _NextKeys] = {}  # (see _next_as_wide)
        self._handlers = {k: getattr(self, "_on_" + k) for k in
                          ("arrival", "cancel", "fail", "complete", "node_down", "node_up", "timer", "rebalance")}
        self._deferred_adds: list[tuple] = []
        self._deferred_removals: list[tuple] = []
        self.held: dict[str, JobRun] = {}  # submitted with hold=True, waiting for nodes to come up
        if self.config.rebalance_interval_s and policy.rebalance is not None:
            self.events.push(self.config.rebalance_interval_s, TIMER, "rebalance")

    # ----------------------------------------------------------------- inputs

    def submit(self, spec: JobSpec, hold: bool = False) -> JobRun:
        """Accept a job; it arrives at ``spec.submit_s`` (or now, if that is in the past).

        A job no up node set can hold raises InfeasibleJob; with ``hold``, one that only nodes
        that are down could hold ("not now", as opposed to "never") is accepted instead: pending,
        outside the queue, until a node comes up that lets it fit (then it arrives)."""
        if spec.job_id in self.jobs:
            raise InfeasibleJob(f"job {spec.job_id!r} already submitted", "duplicate_id")
        held = False
        try:
            self.check_feasible(spec)
        except InfeasibleJob as e:
            if not (hold and e.reason in ("no_matching_node", "larger_than_cluster") and self._fits_when_all_up(spec)):
                raise
            held = True
        job = JobRun(spec=spec, seq=self._seq, remaining_s=spec.duration_s or 0.0)
        self._seq += 1
        self.jobs[spec.job_id] = job
        self.extra[spec.job_id] = _Extra()
        if held:
            self.held[spec.job_id] = job
        else:
            self.events.push(max(spec.submit_s, self.now), ARRIVAL, "arrival", job)
        return job

    def feed(self, jobs: Iterable[JobSpec]) -> None:
        """Submit these jobs, sorted by submit time, each only as the clock reaches its submit time
        (as ``run`` goes), not all at once: the engine then holds the jobs in flight, not the whole
        trace. Same schedule as submitting them all first (arrivals at one time still come in this
        order, before anything else of their time is taken) for a trace replay, where nothing
        happens to a job before it arrives: a fed job is checked when submitted, against the nodes
        up then (a job the engine refuses raises from ``run``), and a cancel before its submission
        finds no job."""
        self._feed = iter(jobs)
        self._fed_next = next(self._feed, None)

    def _submit_fed(self) -> None:
        """Submit every fed job due no later than the first event queued (or the next fed job)."""
        events, spec, feed = self.events, self._fed_next, self._feed
        assert feed is not None
        while spec is not None and (not events or spec.submit_s <= events.next_time()):
            self.submit(spec)
            spec = next(feed, None)
        self._fed_next = spec

    @property
    def forgotten_jobs(self) -> int:
        """Ended jobs dropped from ``jobs`` (EngineConfig.keep_ended off)."""
        return sum(self.forgotten_by_vc.values())

    def _ended(self, job: JobRun) -> None:
        if self.recorder is not None:
            self.recorder.job_ended(self, job)
        if not self.config.keep_ended:
            del self.jobs[job.job_id], self.extra[job.job_id]
            self.forgotten_by_vc[job.spec.vc] += 1

    def _fits_when_all_up(self, spec: JobSpec) -> bool:
        """Whether the job would fit the empty cluster with every node up."""
        if self.state.up.all():
            return False
        if self._empty_state is None:
            self._empty_state = ClusterState(self.spec)
        st = self.state
        mask = np.array([o == (spec.vc if spec.vc in self._vc_dedicated else None) for o in st.owner_vc], dtype=bool)
        if spec.gpu_models:
            mask &= np.isin(st.model_id, [i for i, m in enumerate(st.model_names) if m in spec.gpu_models])
        return bool(mask.any()) and placement.can_place(self, spec, mask, self._empty_state)

    def place_now(self, spec: JobSpec) -> bool:
        """Place a job at once if it fits, with no queue (inflate mode). False if it does not fit."""
        job = JobRun(spec=spec, seq=self._seq, remaining_s=spec.duration_s or 0.0)
        self.jobs[spec.job_id] = job
        self.extra[spec.job_id] = _Extra()
        pl = placement.bind(self, job, self.static_mask(spec))
        if pl is None:
            del self.jobs[spec.job_id], self.extra[spec.job_id]
            return False
        self._seq += 1
        self._launch(job, pl)
        return True

    def cancel(self, job_id: str, at: float | None = None) -> None:
        self.events.push(self._at(at), ARRIVAL, "cancel", job_id)

    def node_down(self, node: str, at: float | None = None) -> None:
        self.events.push(self._at(at), NODE, "node_down", self.state.node_index[node])

    def node_up(self, node: str, at: float | None = None) -> None:
        self.events.push(self._at(at), NODE, "node_up", self.state.node_index[node])

    def job_finished(self, job_id: str, at: float | None = None) -> None:
        """A completion reported from outside (live mode, where agents run the jobs)."""
        job = self.jobs[job_id]
        self.events.push(self._at(at), COMPLETION, "complete", (job, job.completion_token))

    def job_failed(self, job_id: str, at: float | None = None) -> None:
        """A failure reported from outside (live mode): the job stops and ends as failed."""
        self.events.push(self._at(at), COMPLETION, "fail", job_id)

    def resume_running(self, spec: JobSpec, gpus: tuple[tuple[int, tuple[int, ...]], ...], slowdown: float,
                       started_s: float, remaining_s: float, overhead_s: float) -> JobRun:
        """Take in a job that is already running (live mode, a scheduler restarted while its agents
        kept their jobs): on these GPUs since ``started_s`` with ``remaining_s`` of work and
        ``overhead_s`` to pay at that start, so that it ends when it would have. Recorded as a
        "resume" decision, not a launch. Raises InfeasibleJob if the GPUs are not free."""
        if spec.job_id in self.jobs:
            raise InfeasibleJob(f"job {spec.job_id!r} already submitted", "duplicate_id")
        pl = Placement(gpus=gpus, slowdown=slowdown)
        st = self.state
        for n, slots in gpus:
            if not st.up[n] or any(not 0 <= g < st.gpus[n] or st.free_milli[n, g] < spec.gpu_milli for g in slots):
                raise InfeasibleJob(f"job {spec.job_id!r}: GPUs {list(slots)} of {self.node_names[n]} are not free",
                                    "gpus_taken")
        job = JobRun(spec=spec, seq=self._seq, remaining_s=remaining_s, overhead_s=overhead_s)
        self._seq += 1
        self.jobs[spec.job_id] = job
        self.extra[spec.job_id] = _Extra()
        job.enqueued_s = started_s
        self.policy.queue.on_event("arrival", job, self)
        self._launch(job, pl, record=False)
        job.last_start_s = job.first_start_s = started_s
        self._forget_end(job)
        self.extra[spec.job_id].expected_end_s = started_s + overhead_s + remaining_s * slowdown
        self._note_end(job)
        self._record("resume", job.job_id, tuple(self.node_names[n] for n in pl.nodes))
        return job

    def _at(self, at: float | None) -> float:
        return self.now if at is None else max(at, self.now)

    def check_feasible(self, spec: JobSpec) -> None:
        """Raise InfeasibleJob if no empty cluster could ever run the job."""
        if spec.duration_s is not None and not 0 <= spec.duration_s <= MAX_TIME_S:  # (NaN fails too)
            raise InfeasibleJob(f"job {spec.job_id!r}: duration must be a number from 0 to {MAX_TIME_S:g} s",
                                "bad_duration")
        if not 0 <= spec.submit_s <= MAX_TIME_S:
            raise InfeasibleJob(f"job {spec.job_id!r}: submit time must be from 0 to {MAX_TIME_S:g} s", "bad_submit")
        if self.spec.vcs and spec.vc not in self._vc_names:
            # The one rule, offline and live: a cluster that names its VCs runs only their jobs
            # (map a trace's VCs onto them first: analysim.vcmap).
            raise InfeasibleJob(f"job {spec.job_id!r}: unknown virtual cluster {spec.vc!r}", "unknown_vc")
        quota = self.quota_of(spec.vc)
        if not self.spec.allow_borrowing and quota is not None and spec.gpu_demand > quota + 1e-9:
            raise InfeasibleJob(f"job {spec.job_id!r}: asks for {spec.gpu_demand:g} GPUs, more than VC {spec.vc!r}'s "
                                f"quota of {quota:g}, and borrowing is off", "larger_than_vc_quota")
        static = self.static_mask(spec)
        if not static.any():
            models = "|".join(spec.gpu_models) or "any"
            raise InfeasibleJob(f"job {spec.job_id!r}: no node of GPU model {models} is open to VC {spec.vc!r}",
                                "no_matching_node")
        shape = (spec.num_gpus, spec.gpu_milli, spec.cpu_milli, spec.memory_mib, spec.gpu_models,
                 spec.vc if spec.vc in self._vc_dedicated else None)  # fmt: skip
        fits = self._fits_empty.get(shape)
        if fits is None:
            if self._empty_state is None:
                self._empty_state = ClusterState(self.spec)
            fits = self._fits_empty[shape] = placement.can_place(self, spec, static, self._empty_state)
        if not fits:
            raise InfeasibleJob(
                f"job {spec.job_id!r}: asks for {spec.num_gpus} GPU(s) x {spec.gpu_milli}/1000, "
                f"{spec.cpu_milli} CPU milli, {spec.memory_mib} MiB, more than the cluster can ever hold",
                "larger_than_cluster")

    # ------------------------------------------------------------------ driving

    def next_event_time(self) -> float | None:
        return self.events.peek_time()

    def run(self, until: float = math.inf) -> None:
        """Process every event up to ``until`` (inclusive), one scheduling pass per distinct time."""
        events = self.events
        handlers = self._handlers
        while True:
            if self._fed_next is not None:
                self._submit_fed()
            if not events or events.next_time() > until:
                break
            t = events.next_time()
            self._advance_clock(t)
            while events and events.next_time() == t:
                ev = events.pop()
                handlers[ev[KIND]](ev[PAYLOAD])
            # A pass that evicts or moves jobs runs again, so that they can go somewhere at once.
            # Evictions only ever go down a strict order, so this ends; the bound turns a bug
            # into an error instead of a hang.
            passes = 0
            while self._dirty:
                self._dirty = False
                self._schedule()
                passes += 1
                if passes > 2 * len(self.jobs) + 10:
                    raise AssertionError(f"scheduling livelock at t={self.now}: jobs keep evicting each other")
            if self.recorder is not None:
                self.recorder.after_pass(self)
        if until != math.inf and until > self.now:
            self._advance_clock(until)

    def _advance_clock(self, t: float) -> None:
        if t < self.now:
            raise AssertionError(f"time went backwards: {t} < {self.now}")
        if self.recorder is not None and t > self.now:
            self.recorder.advance(self, t)
        self.now = t

    def fragmentation_index(self) -> FragmentationIndex:
        """FGD's per-node expected fragmentation, brought up to date with the allocation."""
        from analysim.core.fragmentation import FragmentationIndex, WorkloadDistribution

        if self._frag_index is None:
            jobs = self.workload if self.workload else [j.spec for j in self.jobs.values()]
            index = self._frag_index = FragmentationIndex(self.state, WorkloadDistribution.from_jobs(jobs))
            self.state.touched.clear()
            return index
        if self.state.touched:
            self._frag_index.refresh(sorted(self.state.touched))
            self.state.touched.clear()
        return self._frag_index

    # --------------------------------------------------------------- event handlers

    def _on_arrival(self, job: JobRun) -> None:
        if job.status is not JobStatus.PENDING or job.end_s is not None:
            return
        job.enqueued_s = self.now
        self.policy.queue.on_event("arrival", job, self)
        self._enqueue(job)

    def _on_cancel(self, job_id: str, status: JobStatus = JobStatus.CANCELLED) -> None:
        job = self.jobs.get(job_id)
        if job is None or job.status in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED):
            return
        self.held.pop(job_id, None)
        if job.status is JobStatus.RUNNING:
            self._stop(job)
        elif self.extra[job_id].qkey is not None:
            self._dequeue(job)
        job.status = status
        job.end_s = self.now
        self._decide("cancel" if status is JobStatus.CANCELLED else "fail", job)
        self._ended(job)

    def _on_fail(self, job_id: str) -> None:
        self._on_cancel(job_id, JobStatus.FAILED)

    def _on_complete(self, payload: tuple[JobRun, int]) -> None:
        job, token = payload
        if job.status is not JobStatus.RUNNING or token != job.completion_token:
            return  # stale: the job was preempted or moved after this completion was predicted
        nodes = self._stop(job)
        job.remaining_s = 0.0
        job.status = JobStatus.COMPLETED
        job.end_s = self.now
        self.policy.queue.on_event("complete", job, self)
        self._record("complete", job.job_id, nodes)
        self._ended(job)

    def _on_node_down(self, node: int) -> None:
        if not self.state.up[node]:
            return
        self._running_version += 1  # (what the nodes offer changes: see _answers_hold_until)
        self._node_version += 1
        self.state.set_up(node, False)
        self.state.touched.add(node)
        self.up_gpus -= float(self.state.gpus[node])
        self._forget_node_answers()
        for job in [j for j in self.running.values() if node in j.placed.nodes]:
            self._stop(job)
            ex = self.extra[job.job_id]
            done = (job.spec.duration_s or 0.0) - job.remaining_s
            kept = ex.checkpoint_work_s
            if self.config.checkpoint_interval_s:
                kept = max(kept, math.floor(done / self.config.checkpoint_interval_s) * self.config.checkpoint_interval_s)
            job.remaining_s = (job.spec.duration_s or 0.0) - kept
            job.overhead_s = self.config.restore_overhead_s if kept > 0 else 0.0
            job.restarts += 1
            self._decide("requeue", job)
            self._requeue(job)

    def _forget_node_answers(self) -> None:
        """A node went down or up: drop what was remembered of the nodes open to each job."""
        self._static_cache.clear()
        self._gang_size_cache.clear()
        self._open_nodes_cache.clear()
        self._lasting_memo.clear()
        self._fits_empty.clear()

    def _on_node_up(self, node: int) -> None:
        if self.state.up[node]:
            return
        self._running_version += 1  # (what the nodes offer changes: see _answers_hold_until)
        self._node_version += 1
        self.state.set_up(node, True)
        self.state.touched.add(node)
        self.up_gpus += float(self.state.gpus[node])
        self._forget_node_answers()
        self._dirty = True
        for job_id, job in list(self.held.items()):  # in submission order
            try:
                self.check_feasible(job.spec)
            except InfeasibleJob:
                continue
            del self.held[job_id]
            self.events.push(self.now, ARRIVAL, "arrival", job)

    def _on_timer(self, payload: tuple[str, JobRun | None]) -> None:
        """Policy timers (e.g. a queue level change): the job's key may have changed."""
        _, job = payload
        if job is not None and job.status is JobStatus.PENDING and self.extra[job.job_id].qkey is not None:
            self._dequeue(job)
            self._enqueue(job)
        self._quiet = None  # (a plugin asks for a pass: something it reads has changed)
        self._dirty = True

    def _on_rebalance(self, _payload: object) -> None:
        rebalance, interval = self.policy.rebalance, self.config.rebalance_interval_s
        assert rebalance is not None and interval is not None  # (the timer is only set with both)
        moves = rebalance.rebalance(self) if self.config.migration else []
        for job, node, slots in moves:
            self._migrate(job, node, slots)
        if self.running or self.pending_count:
            self.events.push(self.now + interval, TIMER, "rebalance")
        self._dirty = True

    def set_timer(self, at: float, job: JobRun | None = None, tag: str = "") -> None:
        """For plugins: re-examine ``job`` (re-key it if pending) and run a pass at ``at``."""
        self.events.push(max(at, self.now), TIMER, "timer", (tag, job))

    # ------------------------------------------------------------------ the queue

    @property
    def pending_count(self) -> int:
        return len(self._pending_by_seq)

    def pending_jobs(self) -> Iterator[JobRun]:
        """Pending jobs in queue order (as of the last re-key)."""
        for _, seq in self._pending_keys():
            job = self._pending_by_seq.get(seq)
            if job is not None:  # placed earlier in this pass
                yield job

    def _pending_keys(self) -> Iterator[tuple]:
        """Every pending key in order: from the list of them all, or merged from the per-width or
        per-shape lists when only those are kept (each key is in exactly one of them)."""
        if self._pending is not None:
            return iter(self._pending)
        lists: list[SortedList] = []
        if self._pending_of_width is not None:
            lists.extend(self._pending_of_width.values())
        for nested in (self._pending_of_vc_width, self._pending_of_vc_shape):
            if nested is not None:
                for per_vc in nested.values():
                    lists.extend(per_vc.values())
        return heapq.merge(*lists)

    def pending_by_vc(self) -> dict[str, Iterator[JobRun]]:
        """Per VC, its pending jobs in queue-key order, lazily (jobs placed during a pass are
        left out). Only for queues that keep per-VC lists (blocking, or ``per_vc_order``)."""
        by_seq = self._pending_by_seq
        lists = self._pending_of_vc
        assert lists is not None

        def jobs(keys: SortedList) -> Iterator[JobRun]:
            for _, seq in keys:
                job = by_seq.get(seq)
                if job is not None:
                    yield job

        return {vc: jobs(keys) for vc, keys in lists.items()}

    def _dynamic_source(self) -> Iterable[JobRun] | dict[str, Iterator[JobRun]]:
        # A queue that orders from the per-VC lists gets them, not a list of every pending job.
        if getattr(self.policy.queue, "per_vc_order", False):
            return self.pending_by_vc()
        return list(self._pending_by_seq.values())

    def _merge_widths(self, lists: dict[tuple[int, str | None], SortedList]) -> Iterator[JobRun]:
        """Pending jobs in queue-key order from per-width lists (see _width_keys)."""
        by_seq = self._pending_by_seq
        for key in self._width_keys(lists):
            job = by_seq.get(key[1])
            if job is not None:
                yield job

    def _width_keys(self, lists: dict[tuple[int, str | None], SortedList]) -> Iterator[tuple]:
        """Keys in order from per-width lists, leaving out a width once no job
        of it could fit, for the rest of a pass that only launches (free GPUs only shrink): a
        width no larger than the smallest node, when no node has that many whole GPUs free; a
        width larger than every node, when all nodes together do not. The nodes are those of the
        bucket's scope: a dedicated VC's own, else all of them (see _scope_room). The pass would
        pass over each such job as one that cannot fit (see the capacity checks in _pass)."""
        st = self.state
        small, gmax = st.smallest_node_gpus, self._gmax
        heap = _merge_heap(lists)
        while heap:
            key, bucket, _, it = heap[0]
            w, scope = bucket
            if w and (st.max_full_free() < w <= small or st.total_full_free < w > gmax
                      or scope is not None and self._scope_room(scope).cannot_fit(w)):
                heapq.heappop(heap)
                continue
            yield key
            nxt = next(it, None)
            if nxt is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (nxt, bucket, 0, it))

    def _width_bucket(self, spec: JobSpec) -> tuple[int, str | None]:
        """A pending job's per-width bucket: its whole GPUs, and its VC if that VC has dedicated nodes."""
        return _width(spec), spec.vc if spec.vc in self._vc_dedicated else None

    def _scope_room(self, vc: str) -> _Room:
        """The whole GPUs free on a dedicated VC's own nodes that are up, as they stand: asked by
        _width_keys as it leaves out widths (kept while the running jobs and the nodes stay the
        same). Without it, on a cluster of dedicated VCs, one VC's idle nodes keep every width
        of every other VC in the pass, whose jobs are then passed over one by one."""
        version = (self._running_version, self._node_version)
        got = self._rooms.get(vc)
        if got is None or got.version != version:
            st = self.state
            nodes = self._vc_nodes[vc]
            free = [int(st.full_free[n]) for n in nodes if st.up[n]]
            got = self._rooms[vc] = _Room(version, max(free, default=0), sum(free), self._vc_smallest[vc])
        return got

    def _shape_order(self, failed: dict, quotas_matter: bool, vcs: Iterable[str], gangs_per_request: bool,
                     unsearched: _Unsearched | None) -> Iterator[JobRun]:
        """The pending jobs of ``vcs`` in queue-key order from the per-VC, per-shape lists, for a
        pass that may preempt or migrate: a shape whose requests are all at least as large as a
        failed one of the same signature is left out (the pass passes over each such job: see
        ``worse`` in _pass; gangs are always tried), until a preemption or migration succeeds,
        which clears the failures: then the shapes left out come back from the job after the
        last one this gave. Each next job is chosen when asked for.

        With ``gangs_per_request`` (every plugin the pass asks answers per VC and request: see
        PostFilter.answers_per_request), a gang's shape is left out too once one of its gangs
        fails and changes nothing, or would fail again (see _answers_hold_until), until the
        next launch or stop: every other gang of it would fail the same way.

        A job whose attempt is known to fail without being made (``unsearched``: see
        _surely_fails_until) is recorded as failed here, and passed over as one that would fail again."""
        by_seq = self._pending_by_seq
        borrowing = self.spec.allow_borrowing
        dedicated = self._vc_dedicated
        extra = self.extra
        of_vc_shape = self._pending_of_vc_shape
        assert of_vc_shape is not None
        # Each shape's first key (see _merge_entry), sorted; order[i] is the next. The next key of
        # a shape is looked up when it is needed (most shapes give one job a pass), from the list,
        # which does not change during the pass, and goes in past i: keys only grow.
        order = sorted([_merge_entry(keys._lists[0][0], vc, shape)
                        for vc in vcs for shape, keys in of_vc_shape[vc].items()])
        i = 0
        dropped: list[tuple[str, tuple]] = []
        gangs_dropped: list[tuple[str, tuple]] = []  # left out while the running jobs stay the same
        world = self._running_version
        stops, last = self._stops, None
        while i < len(order):
            entry = order[i]
            key, vc, shape = entry[-3], entry[-2], entry[-1]
            job = by_seq.get(key[1])
            if job is not None:
                models, frac, g, milli, cpu, mem = shape  # (JobSpec.request)
                sig = (models, vc if quotas_matter or vc in dedicated else None, frac)  # (_failure_vc, written out)
                worse = failed.get(sig)
                gang = g > self.state.smallest_node_gpus and not self.one_node(job.spec)
                if (worse is not None and g >= worse[0] and milli >= worse[1] and cpu >= worse[2] and mem >= worse[3]
                        and not gang):  # (_no_smaller, written out as in _pass)
                    i += 1
                    dropped.append((vc, shape))
                    continue
                ex = extra[job.job_id]
                if (unsearched is not None and ex.failed_world != self._running_version
                        and (borrowing or self.within_quota(job))):  # (else the pass passes over it: see _pass)
                    sure = self._surely_fails_until(job, unsearched)
                    if sure > self.now:
                        ex.failed_world = self._running_version
                        ex.failed_until = sure
                if ex.failed_world == self._running_version and self.now < ex.failed_until:
                    # It would fail again (see _answers_hold_until): the pass's bookkeeping of a
                    # failure, without the visit. (A gang's is failed_gangs, which a pass that may
                    # preempt or migrate does not read: it is only passed over.)
                    if ex.failed_until < self._pass_hold:
                        self._pass_hold = ex.failed_until
                    if not gang:
                        # (_note_failure, written out with the ``worse`` read above: nothing
                        # between changed ``failed``)
                        if worse is None or (worse[0] >= g and worse[1] >= milli and worse[2] >= cpu
                                             and worse[3] >= mem):
                            failed[sig] = (g, milli, cpu, mem)
                        i += 1  # (the rest of the shape is no smaller: left out, as above)
                        dropped.append((vc, shape))
                        continue
                    if gangs_per_request:
                        i += 1
                        gangs_dropped.append((vc, shape))
                        continue
                elif ex.evicted_at == self.now:
                    self._pass_hold = self.now  # evicted at this instant: it waits (see _pass)
                else:
                    last = key
                    yield job
                    if self._running_version != world:
                        world = self._running_version
                        _bring_back(order, i, of_vc_shape, gangs_dropped, last)
                    elif gang and gangs_per_request and job.status is JobStatus.PENDING:
                        i += 1  # (pushes above went in past it)
                        gangs_dropped.append((vc, shape))
                        continue
                if self._stops != stops:
                    stops = self._stops
                    assert last is not None  # (jobs stop only in answer to a job given)
                    _bring_back(order, i, of_vc_shape, dropped, last)
            i += 1  # (shapes brought back went in past this entry: it is still order[i])
            nxt = _first_after(of_vc_shape[vc][shape], key)
            if nxt is not None:
                bisect.insort(order, _merge_entry(nxt, vc, shape), i)

    def head_of_line(self) -> JobRun | None:
        if not self._pending_by_seq:
            return None
        if self.policy.queue.dynamic:
            return next(self.policy.queue.order(self._dynamic_source(), self), None)  # type: ignore[arg-type]
        return self._pending_by_seq[next(self._pending_keys())[1]]

    def _enqueue(self, job: JobRun) -> None:
        qkey = self.policy.queue.key(job, self)
        if len(qkey) != self._key_len:  # (see _merge_entry)
            if self._key_len >= 0:
                raise ValueError(f"queue {self.policy.queue.name!r} gave keys of {self._key_len} and {len(qkey)} "
                                 "fields: every key of a queue must have the same length")
            self._key_len = len(qkey)
        key = (qkey, job.seq)
        ex = self.extra[job.job_id]
        ex.qkey = key
        ex.failed_world = -1  # (queued again: its own key and rank may have changed)
        ex.none_by_vc_until = -math.inf
        ex.qwork = job.overhead_s + job.remaining_s
        if self._in_pass:
            self._deferred_adds.append((key, job.spec, ex.qwork))  # the pass is iterating the queue
        else:
            self._add_key(key, job.spec, ex.qwork)
            if self._quiet is not None:
                self._quiet.new.append(key)  # (an arrival: a job queued again comes with a stop)
        self._pending_by_seq[job.seq] = job
        self._pending_vcs[job.spec.vc] += 1
        self._pending_demands.setdefault(job.spec.vc, Counter())[job.spec.gpu_demand] += 1
        self.pending_demand += job.spec.gpu_demand
        self._count_shape(job.spec, 1)
        self._dirty = True

    def _dequeue(self, job: JobRun) -> None:
        ex = self.extra[job.job_id]
        key = ex.qkey
        assert key is not None
        if self._in_pass:
            self._deferred_removals.append((key, job.spec, ex.qwork))
        else:
            self._remove_key(key, job.spec, ex.qwork)
            self._quiet = None  # (a head leaving may unblock a queue)
        del self._pending_by_seq[job.seq]
        vc = job.spec.vc
        left = self._pending_vcs[vc] - 1
        demands = self._pending_demands[vc]
        demands[job.spec.gpu_demand] -= 1
        if not demands[job.spec.gpu_demand]:
            del demands[job.spec.gpu_demand]
        if left:
            self._pending_vcs[vc] = left
        else:
            del self._pending_vcs[vc], self._pending_demands[vc]
        ex.qkey = None
        self.pending_demand -= job.spec.gpu_demand
        self._count_shape(job.spec, -1)

    def _add_key(self, key: tuple, spec: JobSpec, work: float) -> None:
        vc = spec.vc
        self._queue_version += 1
        if self._pending is not None:
            self._pending.add(key)
        if self._pending_of_vc is not None:
            _file(self._pending_of_vc, vc, key)
        if self._pending_of_width is not None:
            _file(self._pending_of_width, self._width_bucket(spec), key)
        for nested, bucket in self._nested_lists(spec, work):
            _file(nested.setdefault(vc, {}), bucket, key)

    def _remove_key(self, key: tuple, spec: JobSpec, work: float) -> None:
        vc = spec.vc
        self._queue_version += 1
        if self._pending is not None:
            self._pending.remove(key)
        if self._pending_of_vc is not None:
            _unfile(self._pending_of_vc, vc, key)
        if self._pending_of_width is not None:
            _unfile(self._pending_of_width, self._width_bucket(spec), key)
        for nested, bucket in self._nested_lists(spec, work):
            _unfile(nested[vc], bucket, key)
            if not nested[vc]:
                del nested[vc]

    def _nested_lists(self, spec: JobSpec, work: float) -> Iterator[tuple[dict, object]]:
        """The per-VC-and-bucket key lists this engine keeps, each with the job's bucket."""
        if self._pending_of_vc_width is not None:
            yield self._pending_of_vc_width, self._width_bucket(spec)
        if self._pending_of_vc_shape is not None:
            yield self._pending_of_vc_shape, spec.request
        if self._pending_of_vc_demand is not None:
            yield self._pending_of_vc_demand, spec.gpu_demand
        if self._pending_of_vc_dw is not None:
            yield self._pending_of_vc_dw, (spec.gpu_demand, _width(spec), int(work).bit_length())

    def _next_within_quota(self, vc: str, after: tuple) -> tuple | None:
        """The first key past ``after`` of a job of ``vc`` that its quota can hold now (the
        within-quota test of queue_scopes), from the per-demand lists: under a blocked shared
        queue the jobs between would only be passed over one by one."""
        q = self._quota_by_vc.get(vc, self._quota_unknown_vc)
        assert q is not None and self._pending_of_vc_demand is not None  # (asked of a VC borrowing)
        used = self.state.vc_used.get(vc, 0.0)
        best = None
        for demand, keys in self._pending_of_vc_demand[vc].items():
            if used + demand <= q + 1e-9:
                first = _first_after(keys, after)
                if first is not None and (best is None or first < best):
                    best = first
        return best

    def _blocking_order(self, blocked: dict, jump: bool) -> Iterator[JobRun]:
        """Pending jobs in queue order, as ``pending_jobs``, but leaving out, from the moment the
        pass blocks them, the VCs none of whose jobs could pass (see ``_vc_blocked``), and, with
        ``jump``, the jobs that would borrow while the shared queue is blocked. The queue is not
        changed during a pass (changes are deferred), so positions stay valid."""
        lists = self._pending_of_vc
        assert lists is not None
        # Each VC's list is walked by an iterator (a SortedList's positional lookup costs a
        # Python-level index search per step).
        heap = _merge_heap(lists)
        gen: dict[str, int] = dict.fromkeys(lists, 0)  # a VC's heap entries from undone jumps are stale
        dropped: list[str] = []
        jumped: set[str] = set()  # VCs with a jump ahead of the merge
        stops = self._stops
        while heap:
            key, vc, g, it = heapq.heappop(heap)
            if g != gen[vc]:
                continue
            if jumped:
                jumped.discard(vc)
            if blocked and self._vc_blocked(vc, blocked):
                dropped.append(vc)  # out of the merge
                continue
            job = self._pending_by_seq.get(key[1])
            if (jump and job is not None and None in blocked and vc not in self._vc_dedicated
                    and not self._within_quota_of(vc, job.spec.gpu_demand)):
                # It would borrow, and the shared queue is blocked: it and every job of its VC up
                # to the next one within quota would be passed over (launches only raise the VC's
                # usage). Resume the VC there.
                self._jump(heap, vc, self._next_within_quota(vc, key), gen)
                jumped.add(vc)
                continue
            if job is not None:
                yield job
                if self._stops != stops:
                    # A job was taken off its GPUs (preemption, migration), and its VC's usage
                    # may be lower: a VC left out or jumped over as borrowing may have jobs within
                    # its quota again. From here on, their jobs come back into the merge. (With
                    # the built-in post-filters a VC jumped over is within its quota and keeps its
                    # GPUs, as reclaim takes from VCs over theirs; another post-filter may not.)
                    stops = self._stops
                    for d in dropped + list(jumped):
                        gen[d] += 1
                        self._push_from(heap, d, _keys_from(lists[d], key, False), gen[d])
                    dropped.clear()
                    jumped.clear()
            nxt = next(it, None)  # (_push_from, written out: once per job the merge passes)
            if nxt is not None:
                heapq.heappush(heap, (nxt, vc, g, it))

    def _backfill_order(self, blocked: dict, failed: dict, only_capacity: bool,
                        quotas_matter: bool) -> Iterator[JobRun]:
        """Pending jobs in queue order, as ``pending_jobs``, but leaving out jobs the pass would
        pass over with no effect:
        - once every queue a VC's jobs block is blocked (until then, a job that is not placed
          blocks its queues), those its reservations keep from backfilling (they only lose spare
          GPUs during a pass), those that fail as no smaller than a request that failed in the
          pass (see _worse_from) and, in a pass that only launches, those of widths that cannot
          fit as capacity stands (it only shrinks): the merge jumps to the VC's next job that is
          none of these. With preemption or migration, a job taken off its GPUs may bring a VC back
          within quota, out of the shared queue: such jumps are taken again after one;
        - before that, with the shared queue blocked, a VC's jobs that would borrow, could fit,
          and the shared reservation keeps out: the merge jumps to the VC's next job that is
          within quota, cannot fit (it blocks) or may backfill, or, once a request has failed in
          the pass, may ask for as many GPUs (as large a request takes the failure path and
          blocks). In a pass that only launches, a launch or a failure can turn a job jumped over
          into one that blocks, so such jumps are taken again from each job the pass looks at;
          with preemption or migration, from each job after which a job was stopped."""
        lists = self._pending_of_vc
        assert lists is not None
        by_seq = self._pending_by_seq
        scopes_of = {vc: self._scopes_blocked_by(vc) for vc in lists}
        self._backfill_walks = {}  # (see _next_backfill_effect)
        self._next_answers = {}
        self._wide_merges = {}
        heap = _merge_heap(lists)
        gen: dict[str, int] = dict.fromkeys(lists, 0)  # a VC's heap entries from older jumps are stale
        narrowed: set[str] = set()
        jumped: set[str] = set()  # VCs with a jump ahead that the next job's launch or failure may undo
        until_stop: set[str] = set()  # with preemption or migration, VCs with a jump ahead only a stop may undo
        stops = self._stops
        while heap:
            key, vc, g, it = heapq.heappop(heap)
            if g != gen[vc]:
                continue
            jumped.discard(vc)
            until_stop.discard(vc)
            job = by_seq.get(key[1])
            if job is not None:
                scopes = scopes_of[vc]
                if vc in narrowed or all(sc in blocked for sc in scopes):
                    narrowed.add(vc)
                    # (A job that fails as no smaller than a failed request has no effect once its
                    # queues are blocked: it only fails again, in queues already blocked.)
                    if not self._backfill_effect(job, blocked, scopes, True, only_capacity) or (
                            failed and self._fails_as_worse(job, failed, quotas_matter)):
                        worse_from = self._worse_from(vc, failed, quotas_matter) if failed else None
                        self._jump(heap, vc, self._next_backfill_effect(vc, key, blocked, scopes, True, only_capacity,
                                                                        worse_from), gen)
                        if not only_capacity:
                            until_stop.add(vc)
                        continue
                elif (len(scopes) == 2 and None in blocked
                      and not self._backfill_effect(job, blocked, scopes, False, only_capacity)
                      and not (failed and self._fails_as_worse(job, failed, quotas_matter))):
                    # Held by the shared reservation, and the pass would pass it over. Once a
                    # request has failed, a later job as large takes the failure path and blocks
                    # its VC's queue instead: the jump stops at any that may be.
                    wide = None
                    if failed:
                        # (Only a failure of a signature this VC's jobs have counts: with quotas
                        # that matter, the VC's own.)
                        mine = self._failure_vc(vc, quotas_matter)
                        widths = [req[0] for sig, req in failed.items() if sig[1] == mine]
                        if widths:
                            wide = self._next_as_wide(vc, key, min(widths))
                    to = self._next_backfill_effect(vc, key, blocked, scopes, False, only_capacity, before=wide)
                    self._jump(heap, vc, to, gen)
                    # With preemption or migration (and so quotas that matter), what a launch or a
                    # failure of another VC's job changes turns none of the jobs jumped over into
                    # one the pass would not pass over: that VC's usage (which only rises), the
                    # shared spare GPUs (which only shrink) and the failures of that VC's own
                    # signature. A stop may bring them back within their VC's quota.
                    (until_stop if quotas_matter and not only_capacity else jumped).add(vc)
                    continue
                yield job
                if self._stops != stops:
                    stops = self._stops
                    jumped |= until_stop
                    until_stop.clear()
                for v in jumped:  # taken again from here (see above)
                    gen[v] += 1
                    self._push_from(heap, v, _keys_from(lists[v], key, False), gen[v])
                jumped.clear()
            self._push_from(heap, vc, it, g)

    def _next_as_wide(self, vc: str, after: tuple, gpus: int) -> tuple | None:
        """The first key past ``after`` of a job of ``vc`` that may ask for ``gpus`` GPUs or more
        (fractional and CPU-only jobs, width 0, ask for at most one), from the per-demand, width
        and work-bucket lists. The lists do not change during a pass, and the merge asks from
        ever later keys (each one it takes, often the last answer): each list's next key past
        the last ``after`` is kept, and a question moves on only those it passed."""
        merge = self._wide_merges.get((vc, gpus))
        if merge is None or after < merge.after:
            lists = self._pending_of_vc_dw
            assert lists is not None
            merge = self._wide_merges[vc, gpus] = _NextKeys(
                [keys for (_, width, _), keys in lists[vc].items() if width >= gpus or (width == 0 and gpus <= 1)],
                after)
        return merge.next_after(after)

    def _failure_vc(self, vc: str, quotas_matter: bool) -> str | None:
        """The VC a failed request's signature names (see ``worse`` in _pass): its own where quotas
        or dedicated nodes make VCs differ in what they can get, None where all share the pool."""
        return vc if quotas_matter or vc in self._vc_dedicated else None

    def _fails_as_worse(self, job: JobRun, failed: dict, quotas_matter: bool) -> bool:
        """Whether the pass takes the job as failed without an attempt: a one-node request at
        least as large as one that failed in the pass, with the same constraints (``worse``)."""
        spec = job.spec
        worse = failed.get((spec.gpu_models, self._failure_vc(spec.vc, quotas_matter), spec.is_fractional))
        return (worse is not None and _no_smaller((spec.num_gpus, spec.gpu_milli, spec.cpu_milli, spec.memory_mib), worse)
                and not (spec.num_gpus > self.state.smallest_node_gpus and not self.one_node(spec)))

    def _jump(self, heap: list, vc: str, to: tuple | None, gen: dict[str, int]) -> None:
        gen[vc] += 1
        if to is not None:
            lists = self._pending_of_vc
            assert lists is not None
            self._push_from(heap, vc, _keys_from(lists[vc], to, True), gen[vc])

    @staticmethod
    def _push_from(heap: list, vc: str, keys: Iterator[tuple], gen: int) -> None:
        key = next(keys, None)
        if key is not None:
            heapq.heappush(heap, (key, vc, gen, keys))  # (a stale entry may share key and VC, not gen)

    def _backfill_effect(self, job: JobRun, blocked: dict, scopes: tuple, narrowed: bool,
                         only_capacity: bool) -> bool:
        """Whether the pass would do anything with this pending job (see _backfill_order)."""
        spec = job.spec
        cannot, gang_cannot = self._width_cannot_fit(_width(spec)) if only_capacity else (False, False)
        if narrowed:
            return not (cannot or gang_cannot) and all(
                self._may_backfill(job, r) for r in self._held(spec.vc, spec.gpu_demand, blocked, scopes))
        if self._within_quota_of(spec.vc, spec.gpu_demand):
            return True  # not held by the shared queue
        return cannot or self._may_backfill(job, blocked[None])

    def _width_cannot_fit(self, w: int) -> tuple[bool, bool]:
        """(a job of this width takes the pass's "cannot fit" path, which blocks its queues;
        it is a gang the pass passes over as larger than all free GPUs). Both False for widths
        whose answer depends on the job (nodes of several sizes)."""
        st = self.state
        return (0 < w <= st.smallest_node_gpus and w > st.max_full_free(),
                w > self._gmax and w > st.total_full_free)

    def _held(self, vc: str, demand: float, blocked: dict, scopes: tuple) -> list[tuple[float, float]]:
        """The reservations a job of ``vc`` asking for ``demand`` GPUs must let it pass, when
        every queue the VC's jobs block (``scopes``) is blocked (the blocked of its queue_scopes)."""
        if self._within_quota_of(vc, demand):  # (a VC with one queue has no quota to exceed)
            return [blocked[scopes[0]]]
        return [blocked[sc] for sc in scopes]

    def _worse_from(self, vc: str, failed: dict, quotas_matter: bool) -> int | None:
        """The width from which every waiting one-node whole-GPU job of ``vc`` fails as no
        smaller than a request that failed in the pass (see ``worse`` in _pass), or None. Only
        when no waiting job names GPU models: then each such job has the signature of the VC's
        unconstrained whole-GPU requests, and one that failed asking no CPU or memory is no
        larger than any of them of its width or more."""
        if self._pending_with_models:
            return None
        req = failed.get(((), self._failure_vc(vc, quotas_matter), False))
        if req is None or req[0] < 1 or req[2] or req[3]:
            return None
        return int(req[0])

    def _next_backfill_effect(self, vc: str, after: tuple, blocked: dict, scopes: tuple, narrowed: bool,
                              only_capacity: bool, worse_from: int | None = None,
                              before: tuple | None = None) -> tuple | None:
        """The first key past ``after`` of a job of ``vc`` that _backfill_order does not jump
        over (see _backfill_effect), or ``before`` if none comes earlier, from the per-demand,
        width and work-bucket lists: a list whose jobs all fail some reservation holding them is
        left out, one whose jobs all pass every one (or need none) gives its first key past
        ``after``, and the few on a shadow time's boundary are walked with the exact test."""
        if not only_capacity or before is not None:
            # (With preemption or migration the same question is hardly ever asked twice.)
            return self._first_backfill_effect(vc, after, blocked, scopes, narrowed, only_capacity, worse_from, before)
        # What it reads besides the lists: quotas and free GPUs (launches and stops change them),
        # and the reservations of the VC's queues.
        asked = ("effect", vc, narrowed, self._running_version, tuple([blocked.get(sc) for sc in scopes]),
                 worse_from)
        last = self._next_answers.get(asked)
        if last is not None and last[0] <= after and (last[1] is None or after < last[1]):
            return last[1]
        best = self._first_backfill_effect(vc, after, blocked, scopes, narrowed, only_capacity, worse_from, None)
        self._next_answers[asked] = (after, best)
        return best

    def _first_backfill_effect(self, vc: str, after: tuple, blocked: dict, scopes: tuple, narrowed: bool,
                               only_capacity: bool, worse_from: int | None, before: tuple | None) -> tuple | None:
        best = before
        # One-node widths whose jobs all fail as worse (see _worse_from): left out. (An empty
        # range without a failure to go by.)
        worse_lo, worse_hi = (worse_from, self.state.smallest_node_gpus) if worse_from is not None else (1, 0)
        by_seq = self._pending_by_seq
        now = self.now
        # (demand, width) -> reservations; None: leave out
        held_of: dict[tuple[float, int], list[tuple[float, float]] | None] = {}
        lists = self._pending_of_vc_dw
        assert lists is not None
        for (demand, width, b), keys in lists[vc].items():
            if worse_lo <= width <= worse_hi:
                continue
            got = held_of.get((demand, width), _UNSET)
            if got is _UNSET:
                cannot, gang_cannot = self._width_cannot_fit(width) if only_capacity else (False, False)
                if narrowed:
                    got = None if cannot or gang_cannot else self._held(vc, demand, blocked, scopes)
                elif cannot or self._within_quota_of(vc, demand):
                    got = []  # every job here has an effect
                else:
                    got = [blocked[None]]
                held_of[demand, width] = got
            if got is None:
                continue
            # (Typed, so that the compiled loop below compares unboxed floats.)
            held = cast(list[tuple[float, float]], got)
            # Bucket b holds work in [2^(b-1), 2^b) (b = 0: under 1 s); a second either side
            # covers rounding in now + overhead + work.
            low, high = _WORK_BUCKET_BOUNDS[b]
            sure = True
            for shadow, spare in held:
                if demand <= spare or now + high <= shadow:
                    continue
                if now + low > shadow:
                    break  # every job here ends past this shadow time and does not fit in its spare
                sure = False
            else:
                if sure:
                    # (A list whose first key is no earlier than the best so far cannot give an
                    # earlier one: no search.)
                    if best is not None and not keys._lists[0][0] < best:
                        continue
                    first = _first_after(keys, after)
                    if first is not None and (best is None or first < best):
                        best = first
                    continue
                # The first job here past ``after`` that passes every reservation, read from there
                # up to the best so far. What a read found stands for a later ask before it, while
                # the reservations are the same (the lists do not change during a pass, and the
                # merge asks again from later keys after each job it gives).
                walk = (vc, demand, width, b, tuple(held))
                known = self._backfill_walks.get(walk)
                if known is not None and known[0] <= after and (known[1] is None or after < known[1]):
                    found = known[1]
                else:
                    found = None
                    cut = False
                    for k in _keys_from(keys, after, False):
                        if best is not None and not k < best:
                            cut = True  # (nothing earlier than the best so far here)
                            break
                        job = by_seq.get(k[1])
                        if job is not None and all(self._may_backfill(job, r) for r in held):
                            found = k
                            break
                    if not cut:
                        self._backfill_walks[walk] = (after, found)
                if found is not None and (best is None or found < best):
                    best = found
        return best

    def _vc_blocked(self, vc: str, blocked: dict) -> bool:
        """Whether every waiting job of ``vc`` is behind a blocked head (never wrongly True)."""
        if vc in blocked:
            return True  # its own queue (a VC with a guarantee: every job waits in it)
        if None not in blocked or vc in self._vc_dedicated:
            return False
        q = self.quota_of(vc)
        if q is None:
            return True  # the shared pool's queue is its only one
        # Even its smallest waiting job would take it over its quota: every one of them would borrow,
        # and waits in the shared queue (until preemption lowers its usage: _blocking_order).
        return self.state.vc_used.get(vc, 0.0) + min(self._pending_demands[vc]) > q + 1e-9

    def _count_shape(self, spec: JobSpec, delta: int) -> None:
        if spec.gpu_models:
            self._pending_with_models += delta
        if spec.num_gpus == 0:
            self._pending_cpu_only += delta
            return
        counter = self._pending_frac if spec.is_fractional else self._pending_whole
        key = spec.gpu_milli if spec.is_fractional else spec.num_gpus
        counter[key] += delta
        if counter[key] == 0:
            del counter[key]

    def _hopeless(self) -> bool:
        """True when no pending job could fit on the free GPUs, whatever its other constraints:
        a pass without preemption or migration can stop early. Conservative: never wrongly True."""
        if self._pending_cpu_only:
            return False
        st = self.state
        if self._pending_frac:
            free = st.free_milli[st.up]
            if free.size and int(free.max()) >= min(self._pending_frac):
                return False
        if self._pending_whole:
            smallest = min(self._pending_whole)
            if smallest <= self._gmax and st.max_full_free() >= smallest:
                return False
            ff = st.full_free[st.up]
            if not ff.size:
                return True
            # Jobs wider than the largest node open to them span several: as few as possible
            # unless locality is relaxed, so the emptiest nodes must hold them. Which nodes are
            # open to a job depends on its constraints (GPU model, VC), so any job wider than the
            # smallest node may be one, over at most ceil(g / smallest node) nodes.
            gangs = [g for g in self._pending_whole if g > st.smallest_node_gpus]
            if not gangs or min(gangs) > st.total_full_free:
                return True
            if self.config.relaxed_locality:
                return int(ff.sum()) < min(gangs)
            desc = np.sort(ff)[::-1]
            return all(int(desc[: math.ceil(g / max(st.smallest_node_gpus, 1))].sum()) < g for g in gangs)
        return True

    def one_node(self, spec: JobSpec) -> bool:
        """Whether the job must fit on one node: some node open to it (up) has enough GPUs."""
        if spec.num_gpus <= self.state.smallest_node_gpus:
            return True  # (gang_size's own first answer, without the lookup)
        return self.gang_size(spec) == 1

    def gang_size(self, spec: JobSpec) -> int:
        """placement.gang_size over the nodes open to the job (static_mask), by (GPUs, models,
        dedicated VC) until a node goes down or up: asked for most jobs a pass looks at."""
        key = (spec.num_gpus, spec.gpu_models, spec.vc if spec.vc in self._vc_dedicated else None)
        k = self._gang_size_cache.get(key)
        if k is None:
            k = self._gang_size_cache[key] = placement.gang_size(self.state, spec, self.static_mask(spec))
        return k

    def rekey(self, job: JobRun) -> None:
        """For plugins: the job's queue key changed while it was pending."""
        if self.extra[job.job_id].qkey is not None:
            self._dequeue(job)
            self._enqueue(job)

    def _requeue(self, job: JobRun) -> None:
        job.status = JobStatus.PENDING
        job.enqueued_s = self.now
        self.policy.queue.on_event("stop", job, self)
        self._enqueue(job)

    # --------------------------------------------------------------- masks and quota

    def static_key(self, spec: JobSpec) -> tuple:
        """What ``static_mask`` reads of a job: jobs with the same key may use the same nodes."""
        return (spec.gpu_models, spec.vc if spec.vc in self._vc_dedicated else None)

    def static_mask(self, spec: JobSpec) -> np.ndarray:
        """Nodes the job may ever use right now: up, of an allowed GPU model, open to its VC."""
        dedicated = spec.vc if spec.vc in self._vc_dedicated else None
        key = (spec.gpu_models, dedicated)  # (static_key, written out: asked for every attempt)
        mask = self._static_cache.get(key)
        if mask is None:
            st = self.state
            mask = st.up.copy()
            if spec.gpu_models:
                allowed = [i for i, m in enumerate(st.model_names) if m in spec.gpu_models]
                mask &= np.isin(st.model_id, allowed)
            owners = np.array([o == dedicated for o in st.owner_vc], dtype=bool)
            mask &= owners
            self._static_cache[key] = mask
        return mask

    def open_nodes(self, spec: JobSpec) -> list[bool]:
        """static_mask as a list, for loops over running jobs' nodes (a numpy index per node cost
        more than the rest of such a loop)."""
        return self._open_nodes(spec)[0]

    def open_to_every_node(self, spec: JobSpec) -> bool:
        """Whether static_mask is all True (every node is up and open to the job)."""
        return self._open_nodes(spec)[1]

    def _open_nodes(self, spec: JobSpec) -> tuple[list[bool], bool]:
        key = self.static_key(spec)
        got = self._open_nodes_cache.get(key)
        if got is None:
            nodes = cast(list[bool], self.static_mask(spec).tolist())
            got = self._open_nodes_cache[key] = (nodes, all(nodes))
        return got

    def quota_of(self, vc: str) -> float | None:
        """GPUs guaranteed to a VC; None when it has none (no VCs, or dedicated nodes)."""
        return self._quota_by_vc.get(vc, self._quota_unknown_vc)

    def guaranteed_gpus(self, vc: str) -> float | None:
        """GPUs a VC can count on: its quota, or its dedicated nodes' GPUs; None without either."""
        v = self.spec.vc(vc)
        if vc in self._vc_dedicated and v is not None:
            return float(sum(n.gpus for n in self.spec.nodes if n.name in v.nodes))
        return self.quota_of(vc)

    def within_quota(self, job: JobRun) -> bool:
        return self._within_quota_of(job.spec.vc, job.spec.gpu_demand)

    def _within_quota_of(self, vc: str, demand: float) -> bool:
        """Whether a job of ``vc`` asking for ``demand`` GPUs keeps its VC within its quota now."""
        q = self.quota_of(vc)
        return q is None or self.state.vc_used.get(vc, 0.0) + demand <= q + 1e-9

    def vc_over_quota(self, vc: str) -> bool:
        """Whether the VC holds more GPUs than its quota: it is borrowing, and can be reclaimed from."""
        q = self.quota_of(vc)
        return q is not None and self.state.vc_used.get(vc, 0.0) > q + 1e-9

    def expected_end(self, job: JobRun) -> float:
        return self.extra[job.job_id].expected_end_s

    def remaining_now(self, job: JobRun) -> float:
        """Work left at ``now``, for a running job counting the progress of its current segment."""
        if job.status is not JobStatus.RUNNING:
            return job.remaining_s
        elapsed, pl = self.now - job.last_start_s, job.placement
        assert pl is not None
        return max(0.0, job.remaining_s - max(0.0, elapsed - job.overhead_s) / pl.slowdown)

    def attained_now(self, job: JobRun) -> float:
        if job.status is not JobStatus.RUNNING:
            return job.attained_gpu_s
        return job.attained_gpu_s + (self.now - job.last_start_s) * job.spec.gpu_demand

    # ------------------------------------------------------------ the scheduling cycle

    def _schedule(self) -> None:
        if not self._pending_by_seq:
            return
        self._in_pass = True
        try:
            self._pass()
        finally:
            self._in_pass = False
            for key, spec, work in self._deferred_removals:
                self._remove_key(key, spec, work)
            for key, spec, work in self._deferred_adds:
                self._add_key(key, spec, work)
            self._deferred_removals.clear()
            self._deferred_adds.clear()

    def _pass(self) -> None:
        self._pass_no += 1
        pol = self.policy
        q = pol.queue
        st = self.state
        # A blocking queue is one queue per VC (see queue_scopes): a job that cannot be placed
        # blocks its scopes, and, under EASY backfilling, holds a reservation in each of them
        # (scope -> (shadow time, spare GPUs then)).
        blocked: dict[str | None, tuple[float, float] | None] = {}
        blocking = q.blocking
        can_preempt, can_migrate = self._can_preempt, self._can_migrate
        only_capacity = not (can_preempt or can_migrate)
        failed: dict[tuple, tuple[int, int, int, int]] = {}  # signature -> smallest failed request
        quotas_matter = bool(self.spec.vcs) and (can_preempt or not self.spec.allow_borrowing)

        world = self._running_version
        # What tells, without an attempt, that it fails (see _surely_fails_until); None when some
        # plugin an attempt asks cannot.
        unsearched = self._unsearched_checks(can_preempt, can_migrate) if self._skip_ahead and not only_capacity else None
        # A per-shape pass after one that gave no job to attempt (every job passed over as one
        # that would fail again, or as no smaller than a failed request), with the running jobs
        # and the queue the same since, and before any of those answers may turn: it would be
        # that pass again. (Timers alone do not end it: what a plugin's answer reads of the time
        # is in its holds_until, and a timer that re-keys a job changes the queue.)
        idle, self._idle = self._idle, None
        if idle is not None and idle[0] == world and idle[1] == self._queue_version and self.now < idle[2]:
            self._idle = idle
            return
        by_shape = False
        # A blocking queue's pass after one that changed nothing, with nothing changed since but
        # arrivals, and before any answer of that pass may turn: see _resumed_order.
        quiet, self._quiet = self._quiet, None
        if (quiet is not None and quiet.world == world and self.now < quiet.hold
                and (not quiet.new or min(quiet.new) > quiet.last_key)):
            if not quiet.new:
                self._quiet = quiet  # it would be that pass again
                return
            blocked.update(quiet.blocked)
            failed.update(quiet.failed)
            self._pass_hold = quiet.hold
            source: Iterable[JobRun] | dict[str, Iterator[JobRun]] = self._resumed_order(sorted(quiet.new))
        else:
            self._pass_hold = math.inf
            if blocking and not pol.backfill and self._pending_of_vc is not None:
                source = self._blocking_order(blocked, jump=self._skip_ahead)
            elif blocking and self._skip_ahead and self._evicted_at != self.now:
                # (EASY's jumps read the pass's failures, and a victim held out at its eviction
                # instant blocks its queues without one: such a pass walks every job.)
                source = self._backfill_order(blocked, failed, only_capacity, quotas_matter)
            elif only_capacity and self._skip_ahead and self._pending_of_width is not None:
                source = self._merge_widths(self._pending_of_width)
            elif only_capacity and self._skip_ahead and self._pending_of_vc_width is not None:
                source = {vc: self._merge_widths(lists) for vc, lists in self._pending_of_vc_width.items()}
            elif self._skip_ahead and self._pending_of_vc_shape is not None and not q.dynamic:
                source = self._shape_order(failed, quotas_matter, list(self._pending_of_vc_shape),
                                           self._gangs_per_request(can_preempt, can_migrate), unsearched)
                by_shape = True
            elif self._skip_ahead and self._pending_of_vc_shape is not None:
                per_request = self._gangs_per_request(can_preempt, can_migrate)
                source = {vc: self._shape_order(failed, quotas_matter, (vc,), per_request, unsearched)
                          for vc in self._pending_of_vc_shape}
                by_shape = True
            else:
                source = self._dynamic_source() if q.dynamic else self.pending_jobs()
        # Gangs that failed: a gang bigger than one that failed may fit (it spans more nodes), but
        # the same request again cannot while launches only take GPUs (without preemption or migration).
        failed_gangs: set[tuple] = set()
        if only_capacity and self._hopeless():
            return
        gmax = self._gmax
        # The most whole GPUs free on one node: a job that fits on one node but asks for more
        # cannot be placed, and is passed over without the cost of a placement attempt.
        ffmax = st.max_full_free()
        extra = self.extra
        # (A queue with per_vc_order is given the mapping: see _dynamic_source.)
        given = 0
        for job in q.order(source, self):  # type: ignore[arg-type]
            given += 1
            if job.status is not JobStatus.PENDING:
                continue
            spec = job.spec
            g = spec.num_gpus
            pl = None
            if blocking:
                scopes = self.queue_scopes(job)
                held = [blocked[sc] for sc in scopes if sc in blocked]
                if held and not pol.backfill:
                    continue  # behind a blocked head of its own queue
            if extra[spec.job_id].evicted_at == self.now:
                # Evicted at this instant: it waits, blocking its queues as a failure would, and
                # what this pass leaves holds no later than now (see _preempt).
                self._pass_hold = self.now
            elif only_capacity and 0 < g <= gmax and g > ffmax and not spec.is_fractional and (
                    g <= st.smallest_node_gpus or self.one_node(spec)):
                pass  # cannot fit: a failure, as below
            elif not self.spec.allow_borrowing and not self.within_quota(job):
                continue  # over its VC's quota: waits without blocking other tenants
            else:
                # A request at least as big as one that just failed, with the same constraints,
                # fails too: skipping it keeps a pass over a long queue cheap when the cluster is full.
                # Only for jobs that must fit on one node: a gang over k nodes may fit where a
                # smaller request failed (9 GPUs over two 8-GPU nodes with 7 free each, where 8 on
                # one node did not), so gangs are always tried.
                sig = (spec.gpu_models,  # (_failure_vc, written out: asked for every job a pass visits)
                       spec.vc if quotas_matter or spec.vc in self._vc_dedicated else None, spec.is_fractional)
                req = (g, spec.gpu_milli, spec.cpu_milli, spec.memory_mib)
                gang = g > st.smallest_node_gpus and not self.one_node(spec)
                worse = None if gang else failed.get(sig)
                # (_no_smaller's test, written out: a generator over the four fields cost more
                # than the rest of the check for the long queues of LAS-like policies.)
                if worse is None or not (req[0] >= worse[0] and req[1] >= worse[1] and req[2] >= worse[2]
                                         and req[3] >= worse[3]):  # fmt: skip
                    if blocking and held:
                        reservations = cast(list[tuple[float, float]], held)  # (EASY: each blocked queue has one)
                        if not all(self._may_backfill(job, r) for r in reservations):
                            continue
                        self._note_backfill_hold(job, reservations)
                    ex = extra[spec.job_id]
                    if ex.failed_world == self._running_version and self.now < ex.failed_until:
                        # Failed in an earlier pass, and nothing its attempt reads has changed.
                        if ex.failed_until < self._pass_hold:
                            self._pass_hold = ex.failed_until
                    elif gang and only_capacity and (g > st.total_full_free or (sig, req) in failed_gangs):
                        pass  # more whole GPUs than are free, or the same gang failed with more free
                    else:
                        # An attempt known to fail without being made is recorded as made.
                        sure = -math.inf if unsearched is None else self._surely_fails_until(job, unsearched)
                        if sure <= self.now:
                            pl = placement.bind(self, job, self.static_mask(spec))
                            if pl is None and can_migrate:
                                pl = self._try_migration(job)
                                if pl is not None:
                                    failed.clear()
                            if pl is None and can_preempt:
                                pl = self._try_preemption(job)
                                if pl is not None:
                                    failed.clear()
                        if pl is None and self._skip_ahead:
                            ex.failed_world = self._running_version
                            ex.failed_until = (sure if sure > self.now
                                               else self._answers_hold_until(job, can_migrate, can_preempt))
                            if ex.failed_until < self._pass_hold:
                                self._pass_hold = ex.failed_until
                if pl is not None:
                    if blocking and held:
                        for sc in scopes:
                            r = blocked.get(sc)
                            if r is not None:
                                blocked[sc] = self._consume_reservation(job, r)
                    self._dequeue(job)
                    self._launch(job, pl)
                    ffmax = st.max_full_free()
                    if only_capacity and not q.blocking and self._hopeless():
                        break
                    continue
                if gang:
                    failed_gangs.add((sig, req))
                else:
                    _note_failure(failed, sig, req)
            if blocking:
                for sc in self.blocked_scopes(job):
                    if sc not in blocked:
                        blocked[sc] = self._reserve(job, sc) if pol.backfill else None
                # (Once no job still waiting can pass a blocked head, the merge drops each VC as
                # it next comes up, at less cost than a sweep over every VC after each failure.)
        if by_shape and not given and self._running_version == world:
            self._idle = (world, self._queue_version, self._pass_hold)
        if blocking and self._skip_ahead and self._running_version == world:
            assert self._pending is not None  # (kept for a blocking queue)
            self._quiet = _QuietPass(world, self._pass_hold, dict(blocked), dict(failed), self._pending[-1], [])

    def _resumed_order(self, new: list[tuple]) -> Iterator[JobRun]:
        """The order of a blocking queue's pass after a pass that changed nothing (it launched,
        evicted and moved nothing), with nothing changed since but arrivals (keys ``new``, in
        order, each after every key that pass saw), and before any answer of that pass may turn
        (``_QuietPass.hold``). Such a pass would do again what that one did, every job failing or
        passed over the same way, and end with the same heads blocked and requests failed: only
        the arrivals are visited, from there.

        (A queue that does not block is left out: its arrivals fall among the jobs that pass saw,
        each of which it would visit with the failures before it in hand, and those failures
        decide: ``worse`` passes over a request as large as a failed one, which with preemption
        may find victims where the smaller did not.)"""
        by_seq = self._pending_by_seq
        for key in new:
            job = by_seq.get(key[1])
            if job is not None:
                yield job

    # EASY backfilling: the blocked head gets a reservation at the earliest time enough GPUs free
    # up (the shadow time); a later job may jump ahead if it ends by then or uses only spare GPUs.

    def queue_scopes(self, job: JobRun) -> tuple[str | None, ...]:
        """The FIFO queues a pending job waits in, now: its own VC's, for a VC with a guarantee
        (dedicated nodes or a quota), and the shared pool's (None) when it draws on GPUs no one
        guarantees to it: a VC without quota (or no VCs at all), or a job that would borrow."""
        spec = job.spec
        vc = spec.vc
        if vc in self._vc_dedicated:
            return (vc,)
        q = self.quota_of(vc)
        if q is None:
            return (None,)
        # within_quota, written out: asked for every job a pass visits
        return (vc,) if self.state.vc_used.get(vc, 0.0) + spec.gpu_demand <= q + 1e-9 else (vc, None)

    def blocked_scopes(self, job: JobRun) -> tuple[str | None, ...]:
        """The queues a job that cannot be placed blocks: its own, and in the shared pool also
        the shared queue, even when it is within its quota: a job that would borrow takes the
        free GPUs a guaranteed head is waiting for."""
        return self._scopes_blocked_by(job.spec.vc)

    def _scopes_blocked_by(self, vc: str) -> tuple[str | None, ...]:
        """blocked_scopes of any job of ``vc``; the first is the queue its every job waits in."""
        if vc in self._vc_dedicated:
            return (vc,)
        if self.quota_of(vc) is None:
            return (None,)
        return (vc, None)

    def _reserve(self, head: JobRun, scope: str | None = None) -> tuple[float, float]:
        if scope is not None and scope in self._vc_dedicated:
            # A dedicated VC's head can only get its own nodes' GPUs.
            st = self.state
            own = np.array([o == scope for o in st.owner_vc], dtype=bool) & st.up
            free = float(st.free_total[own].sum()) / GPU_MILLI
            ends = self._ends_of_vc.get(scope, ())
        else:
            free = self.state.free_gpus_total()
            ends = self._ends
        need = head.spec.gpu_demand
        # In (end, GPUs) order; jobs with equal end and GPUs add the same, so seq's order among
        # them does not change a sum.
        for entry in ends:
            end, gpus, _ = cast(tuple[float, float, int], entry)  # (typed: unboxed in the compiled loop)
            free += gpus
            if free >= need:
                return end, free - need
        return math.inf, 0.0

    def _may_backfill(self, job: JobRun, reservation: tuple[float, float]) -> bool:
        shadow, spare = reservation
        ends = self.now + job.overhead_s + job.remaining_s
        return ends <= shadow or job.spec.gpu_demand <= spare

    def _note_backfill_hold(self, job: JobRun, held: list[tuple[float, float]]) -> None:
        """A job that may backfill only because it ends by a shadow time may not a little later:
        the pass's answer for it holds until then (see _QuietPass), less a margin far above the
        rounding of ``now + work``."""
        work = job.overhead_s + job.remaining_s
        for shadow, spare in held:
            if job.spec.gpu_demand > spare:
                until = shadow - work - (1e-9 * (abs(shadow) + work) + 1e-6)
                if until < self._pass_hold:
                    self._pass_hold = until

    def _consume_reservation(self, job: JobRun, reservation: tuple[float, float]) -> tuple[float, float]:
        shadow, spare = reservation
        if self.now + job.overhead_s + job.remaining_s <= shadow:
            return reservation
        return shadow, spare - job.spec.gpu_demand

    def _answers_hold_until(self, job: JobRun, can_migrate: bool, can_preempt: bool) -> float:
        """Until when a failed attempt to place ``job`` fails again, as long as the running jobs and
        the nodes stay the same (a launch, a stop or a node going up or down bumps
        ``_running_version``): placement reads only those, and each plugin says how long its
        answer holds (``holds_until``: e.g. until a running job's preemption rank may move).
        The waiting job's own rank may change only when it is queued again (``_enqueue``)."""
        until = math.inf
        if can_preempt:
            for pf in self.policy.post_filters:
                until = min(until, pf.holds_until(job, self))
                if until <= self.now:
                    return until
        if can_migrate:
            rebalance = self.policy.rebalance
            assert rebalance is not None
            until = min(until, rebalance.holds_until(job, self))
        return until

    def _failure_plugins(self, can_preempt: bool, can_migrate: bool) -> list:
        """The plugins a placement that fails asks, in order: the post-filters, then rebalance."""
        plugins: list = list(self.policy.post_filters) if can_preempt else []
        if can_migrate:
            plugins.append(self.policy.rebalance)
        return plugins

    def _unsearched_checks(self, can_preempt: bool, can_migrate: bool) -> _Unsearched | None:
        """The finds_none_until of every plugin a failed placement asks, those that read only the
        job's VC apart (finds_none_by_vc); None when a plugin has none. (Found once: asked by
        every pass, and the plugins stay.)"""
        key = (can_preempt, can_migrate)
        if key in self._unsearched_cache:
            return self._unsearched_cache[key]
        checks: _Unsearched | None = _Unsearched([], [])
        for p in self._failure_plugins(can_preempt, can_migrate):
            check = getattr(p, "finds_none_until", None)
            if check is None:
                checks = None
                break
            assert checks is not None
            (checks.by_vc if getattr(p, "finds_none_by_vc", False) else checks.others).append(check)
        self._unsearched_cache[key] = checks
        return checks

    def _surely_fails_until(self, job: JobRun, checks: _Unsearched) -> float:
        """Until when an attempt to place ``job`` surely fails while the running jobs and the nodes
        stay the same, known without making it: too few whole GPUs are free for it, by count, and
        each plugin the attempt would ask finds nothing (``checks``: see _unsearched_checks).
        ``now`` or earlier when only the attempt can tell. Most jobs waiting on a busy cluster with
        preemption are such (their VC runs over its quota), and each stop anywhere would have them
        attempted again. What the plugins that read only the job's VC said is kept with the job,
        and stands while the VC's running jobs and the nodes do."""
        spec = job.spec
        g = spec.num_gpus
        if g < 1 or spec.is_fractional:
            return -math.inf
        st = self.state
        if self.one_node(spec):
            if g <= st.max_full_free():
                return -math.inf
        else:
            # A gang over k nodes gets at most the k largest counts of whole free GPUs (any number
            # of them, with relaxed locality): see placement._gang_fits.
            k = self.gang_size(spec)
            most = st.total_full_free if self.config.relaxed_locality else min(st.total_full_free,
                                                                                k * st.max_full_free())
            if k and most >= g:
                return -math.inf
        ex = self.extra[spec.job_id]
        vc_version = self._vc_versions.get(spec.vc, 0)
        if (ex.none_vc_version == vc_version and ex.none_node_version == self._node_version
                and self.now < ex.none_by_vc_until):
            until = ex.none_by_vc_until
        else:
            until = math.inf
            for check in checks.by_vc:
                until = min(until, check(job, self))
                if until <= self.now:
                    return until
            ex.none_vc_version, ex.none_node_version, ex.none_by_vc_until = vc_version, self._node_version, until
        for check in checks.others:
            until = min(until, check(job, self))
            if until <= self.now:
                break
        return until

    def _gangs_per_request(self, can_preempt: bool, can_migrate: bool) -> bool:
        """Whether every plugin a failed attempt asks answers alike for all jobs of a VC and
        request (``answers_per_request``; a plugin without it does not)."""
        return all(getattr(p, "answers_per_request", None) is not None and p.answers_per_request(self)
                   for p in self._failure_plugins(can_preempt, can_migrate))

    def ranks_hold_until(self, vc: str | None) -> float:
        """For plugins: a time before which no preemption rank of ``vc``'s running jobs (every
        running job's for None) can move while they keep running."""
        self.ranked_running(vc)
        return self._ranked[vc].hold_until

    def _try_preemption(self, job: JobRun) -> Placement | None:
        for pf in self.policy.post_filters:
            victims = pf.victims(job, self)
            if not victims:
                continue
            for v in victims:
                self._preempt(v)
            pl = placement.bind(self, job, self.static_mask(job.spec))
            if pl is None:
                raise AssertionError(f"{pf.name}: evicted {len(victims)} jobs but {job.job_id} still does not fit")
            return pl
        return None

    def _try_migration(self, job: JobRun) -> Placement | None:
        rebalance = self.policy.rebalance
        assert rebalance is not None
        moves = rebalance.unblock(job, self)
        if not moves:
            return None
        for mover, node, slots in moves:
            self._migrate(mover, node, slots)
        return placement.bind(self, job, self.static_mask(job.spec))

    def ranked_running(self, vc: str | None) -> tuple[list[tuple], list[JobRun]]:
        """The running jobs of ``vc`` (every running job for None), ascending by (preemption rank,
        last start, seq), with their ranks alongside for bisecting. Ranks are taken at the current
        time (a preemption rank depends on the job and the time only), so the list is ranked once
        per pass and kept up to date by launches and stops, instead of ranking every running job
        for every waiting job that does not fit."""
        got = self._ranked.get(vc)
        if got is not None and got.pass_no == self._pass_no:
            return got.ranks, got.jobs
        # A list from an earlier pass (kept up to date with launches and stops) stands while no
        # rank can have moved (the queue says until when); after that it is ranked again in the
        # order it has, and sorted only if that order no longer holds (ranks that move with time
        # mostly keep their order: SRTF's all shrink at the same pace).
        q = self.policy.queue
        if got is not None:
            if self.now >= got.hold_until:
                if got.due is not None:
                    got.rank_due(self)
                else:
                    got.rank_again(q.preempt_ranks(got.jobs, self))
                    got.hold_until = q.preempt_ranks_hold_until(got.jobs, self)
            got.pass_no = self._pass_no
            return got.ranks, got.jobs
        jobs = list((self.running if vc is None else self.running_by_vc.get(vc, {})).values())
        if getattr(q, "per_job_rank_times", False):
            untils = [q.preempt_rank_until(j, self) for j in jobs]
            got = _RankedRunning(jobs, q.preempt_ranks(jobs, self), self._pass_no, min(untils, default=math.inf), untils)
        else:
            got = _RankedRunning(jobs, q.preempt_ranks(jobs, self), self._pass_no, q.preempt_ranks_hold_until(jobs, self))
        self._ranked[vc] = got
        return got.ranks, got.jobs

    def plugin_memo(self) -> dict:
        """For plugins: a memo that lives while the pass and the running jobs stay the same
        (every launch and stop starts a new one), for what one waiting job's search found out
        about the others (e.g. that none of the same shape finds victims). Each plugin keys its
        entries with its own name."""
        key = (self._pass_no, self._running_version, self.now)  # (now: a rebalance outside a pass)
        if self._memo_key != key:
            self._memo_key = key
            self._memo.clear()
        return self._memo

    def lasting_memo(self) -> dict:
        """For plugins: a memo that lives while the nodes stay the same, for answers that say
        themselves how long they hold (e.g. by how much a VC runs over its quota, which its
        launches do not shrink: see stopped_demand). Each plugin keys its entries with its own
        name."""
        return self._lasting_memo

    def stopped_demand(self, vc: str) -> float:
        """For plugins: the GPUs (gpu_demand) of every stop of a job of ``vc`` so far: ended,
        evicted or moved."""
        return self._stopped_demand.get(vc, 0.0)

    def vc_memo(self, vc: str) -> dict:
        """For plugins: a memo of one VC that lives while that VC's running jobs and the nodes stay
        the same (launches and stops of other VCs' jobs do not end it), for answers that read
        nothing else of the allocation (e.g. that evicting every candidate of the VC would not
        bring it within its quota). An entry says itself until when it holds, if the answer reads
        the time. Each plugin keys its entries with its own name."""
        key = (self._vc_versions.get(vc, 0), self._node_version)
        got = self._vc_memos.get(vc)
        if got is None or got[0] != key:
            got = self._vc_memos[vc] = (key, {})
        return got[1]

    def _rerank(self, job: JobRun, running: bool) -> None:
        """Keep the ranked running jobs (those built) in step with a launch or a stop."""
        self._running_version += 1
        vc = job.spec.vc
        self._vc_versions[vc] = self._vc_versions.get(vc, 0) + 1
        for scope in (None, job.spec.vc):
            got = self._ranked.get(scope)
            if got is not None:
                if running:
                    got.add(self, job)
                else:
                    got.discard(job)

    def candidates_by_node(self, spec: JobSpec, candidates: list[JobRun]) -> victims.ByNode:
        """For plugins: the candidates grouped by node (victims.candidates_by_node)."""
        return victims.candidates_by_node(self, spec, candidates)

    def victims_that_fit(self, job: JobRun, candidates: list[JobRun],
                         by_node_of: victims.ByNode | None = None) -> list[JobRun] | None:
        """For plugins: the victims among ``candidates`` (least important first) that let ``job``
        run, by the one victim rule (victims.py), or None."""
        return victims.victims_that_fit(self, job, candidates, by_node_of)

    @staticmethod
    def release_on(state: ClusterState, job: JobRun) -> None:
        spec, pl = job.spec, job.placement
        assert pl is not None
        for n, slots in pl.gpus:
            cpu, mem = cpu_mem_on(spec, slots, len(pl.gpus))
            state.release(n, slots, spec.gpu_milli, cpu, mem)

    # ------------------------------------------------------------ state transitions

    def _launch(self, job: JobRun, pl: Placement, record: bool = True) -> None:
        spec = job.spec
        for n, slots in pl.gpus:
            cpu, mem = cpu_mem_on(spec, slots, len(pl.gpus))
            self.state.allocate(n, slots, spec.gpu_milli, cpu, mem)
            self.allocated_by_model[self.state.model_id[n]] += len(slots) * spec.gpu_milli / GPU_MILLI
        ex = self.extra[spec.job_id]
        self.state.vc_used[spec.vc] = self.state.vc_used.get(spec.vc, 0.0) + spec.gpu_demand
        self.allocated_gpus += spec.gpu_demand
        job.status = JobStatus.RUNNING
        job.placement = pl
        job.last_start_s = self.now
        if job.first_start_s is None:
            job.first_start_s = self.now
        job.placements_seen.append(pl.nodes)
        self.running[spec.job_id] = job
        self.running_by_vc.setdefault(spec.vc, {})[spec.job_id] = job
        self._rerank(job, True)
        job.completion_token += 1
        ex.expected_end_s = self.now + job.overhead_s + job.remaining_s * pl.slowdown
        if self._ends is not None:
            self._note_end(job)
        if self.config.predict_completions:
            self.events.push(ex.expected_end_s, COMPLETION, "complete", (job, job.completion_token))
        self.policy.queue.on_event("launch", job, self)
        if record:
            self._decide("launch", job)

    def _stop(self, job: JobRun) -> tuple[str, ...]:
        """Take a running job off its GPUs, crediting the progress of its current segment."""
        pl = job.placement
        assert pl is not None
        elapsed = self.now - job.last_start_s
        job.remaining_s = self.remaining_now(job)
        job.overhead_s = max(0.0, job.overhead_s - elapsed)
        job.attained_gpu_s += elapsed * job.spec.gpu_demand
        job.executed_s += elapsed
        self.release_on(self.state, job)
        spec = job.spec
        for n, slots in pl.gpus:
            self.allocated_by_model[self.state.model_id[n]] -= len(slots) * spec.gpu_milli / GPU_MILLI
        self.state.vc_used[spec.vc] -= spec.gpu_demand
        self._stopped_demand[spec.vc] = self._stopped_demand.get(spec.vc, 0.0) + spec.gpu_demand
        self.allocated_gpus -= spec.gpu_demand
        del self.running[spec.job_id]
        del self.running_by_vc[spec.vc][spec.job_id]
        self._rerank(job, False)
        if self._ends is not None:
            self._forget_end(job)
        self._stops += 1
        job.completion_token += 1
        self.extra[spec.job_id].expected_end_s = math.inf
        self._dirty = True
        return tuple(self.node_names[n] for n in pl.nodes)

    def _note_end(self, job: JobRun) -> None:
        if self._ends is None:
            return
        entry = (self.extra[job.job_id].expected_end_s, job.spec.gpu_demand, job.seq)
        self._ends.add(entry)
        if job.spec.vc in self._vc_dedicated:
            self._ends_of_vc.setdefault(job.spec.vc, SortedList()).add(entry)

    def _forget_end(self, job: JobRun) -> None:
        if self._ends is None:
            return
        entry = (self.extra[job.job_id].expected_end_s, job.spec.gpu_demand, job.seq)
        self._ends.remove(entry)
        if job.spec.vc in self._vc_dedicated:
            self._ends_of_vc[job.spec.vc].remove(entry)

    def _preempt(self, job: JobRun) -> None:
        """Evict a running job for a waiting one (a post-filter's victim). It is not launched again
        at this instant, by this pass or the passes that follow it at the same time: that would be
        a move (a migration's work, counted as one), or a cascade, where the victim evicts others
        in turn, each paying the restore overhead. It waits for the next pass after this instant
        (a pass runs when something changes: an arrival, an end, a node event, a timer)."""
        nodes = self._stop(job)
        self.extra[job.job_id].evicted_at = self._evicted_at = self.now
        self.extra[job.job_id].checkpoint_work_s = (job.spec.duration_s or 0.0) - job.remaining_s
        job.overhead_s = self.config.restore_overhead_s
        job.preemptions += 1
        job.placement = None
        self._record("preempt", job.job_id, nodes)
        self._requeue(job)

    def _migrate(self, job: JobRun, node: int, slots: tuple[int, ...]) -> None:
        self._stop(job)
        self.extra[job.job_id].checkpoint_work_s = (job.spec.duration_s or 0.0) - job.remaining_s
        job.overhead_s = self.config.migration_overhead_s
        job.migrations += 1
        job.status = JobStatus.PENDING
        pl = Placement(gpus=((node, slots),), slowdown=1.0)
        self._launch(job, pl, record=False)  # (recorded as a migration, not a fresh launch)
        self._record("migrate", job.job_id, (self.node_names[node],))

    def _decide(self, kind: str, job: JobRun) -> None:
        self._record(kind, job.job_id, tuple(self.node_names[n] for n in job.placement.nodes) if job.placement else ())

    def _record(self, kind: str, job_id: str, nodes: tuple[str, ...]) -> None:
        """A decision, in the log only with EngineConfig.keep_decisions (off for long runs)."""
        if self._keep_decisions:
            self.decisions.append(Decision(self.now, kind, job_id, nodes))


def _note_failure(failed: dict, sig: tuple, req: tuple) -> None:
    """A pass's memory of the smallest request of each signature that failed (see ``worse`` in
    Engine._pass): kept when no smaller one failed before."""
    worse = failed.get(sig)
    if worse is None or _no_smaller(worse, req):
        failed[sig] = req


def _no_smaller(req: tuple, than: tuple) -> bool:
    """Whether a request (GPUs, GPU share, CPU, memory) asks for at least as much as ``than`` of
    each: where ``than`` failed, so does it (see ``worse`` in Engine._pass, which writes this out)."""
    return req[0] >= than[0] and req[1] >= than[1] and req[2] >= than[2] and req[3] >= than[3]


# Bucket b of queued work holds [2^(b-1), 2^b) seconds (b = 0: under 1 s), widened by a second
# either side (see _first_backfill_effect); b = int(work).bit_length() <= 34 (MAX_TIME_S).
_UNSET: Final[list] = []  # (a dict.get default that no answer is)
_WORK_BUCKET_BOUNDS: Final = [((2.0 ** (b - 1) if b else 0.0) - 1.0, 2.0 ** b + 1.0) for b in range(64)]


def _bring_back(order: list, top: int, lists: dict, dropped: list[tuple[str, tuple]], after: tuple) -> None:
    """Shapes the shape order left out, (VC, shape) in ``lists``, back into its merge from their
    first key past ``after`` (the key of ``order[top]``): in past it."""
    for vc, shape in dropped:
        first = _first_after(lists[vc][shape], after)
        if first is not None:
            bisect.insort(order, _merge_entry(first, vc, shape), top + 1)
    dropped.clear()


def _merge_entry(key: tuple, vc: str, shape: tuple) -> tuple:
    """A shape's entry in the shape order's merge: the queue key (its own fields, then the job's
    seq) laid out flat, so that entries compare field by field without nested tuples (most of
    the merge's cost was those comparisons), then the key itself, the VC and the shape, which
    are never compared (seq is unique)."""
    return key[0] + (key[1], key, vc, shape)


def _first_after(keys: SortedList, after: tuple) -> tuple | None:
    """The first of ``keys`` greater than ``after`` (None: none is). SortedList's own search
    (bisect_right) without its positional index, which it builds and walks to give a position
    that is then only used to read the key back: asked per VC the merges jump, and that walk cost
    more than the search. (tests/test_engine_lists.py checks this against bisect_right.)"""
    maxes = keys._maxes  # the largest key of each of its sublists, ascending
    pos = bisect.bisect_right(maxes, after)
    if pos == len(maxes):
        return None
    sub = keys._lists[pos]
    return sub[bisect.bisect_right(sub, after)]


class _NextKeys:
    """The first key past a moving point in any of some sorted lists that do not change: a heap
    of each list's first key past the last point asked (keys are unique across the lists)."""

    __slots__ = ("after", "heap")

    def __init__(self, lists: list[SortedList], after: tuple) -> None:
        self.after = after
        self.heap: list[tuple[tuple, SortedList]] = []
        for keys in lists:
            first = _first_after(keys, after)
            if first is not None:
                self.heap.append((first, keys))
        heapq.heapify(self.heap)

    def next_after(self, after: tuple) -> tuple | None:
        """The first key past ``after``, which is no earlier than the last point asked."""
        heap = self.heap
        while heap and heap[0][0] <= after:
            keys = heap[0][1]
            first = _first_after(keys, after)
            if first is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (first, keys))
        self.after = after
        return heap[0][0] if heap else None


def _keys_from(keys: SortedList, start: tuple, inclusive: bool) -> Iterator[tuple]:
    """The keys from ``start`` on (past it unless ``inclusive``), as SortedList.irange gives
    them, for a list that does not change while they are read (the queue's lists during a pass:
    changes are deferred). Read from its sublists directly: irange builds and walks the list's
    positional index, which cost more than the rest of a merge's jumps."""
    maxes = keys._maxes
    pos = (bisect.bisect_left if inclusive else bisect.bisect_right)(maxes, start)
    if pos == len(maxes):
        return iter(())
    lists = keys._lists
    sub = lists[pos]
    i = (bisect.bisect_left if inclusive else bisect.bisect_right)(sub, start)
    return itertools.chain(itertools.islice(sub, i, None), *lists[pos + 1:])


def _merge_heap(lists: dict) -> list:
    """(first key, bucket, generation 0, iterator) for each non-empty sorted list, as a heap: the
    start of a k-way merge. Keys are unique: two entries tie on key and bucket only across the
    generations of a jump (see _jump), which the generation settles, so iterators are never
    compared."""
    heap = []
    for bucket, keys in lists.items():
        it = iter(keys)
        first = next(it, None)
        if first is not None:
            heap.append((first, bucket, 0, it))
    heapq.heapify(heap)
    return heap


def _file(lists: dict, bucket: object, key: tuple) -> None:
    mine = lists.get(bucket)
    if mine is None:
        mine = lists[bucket] = SortedList()
    mine.add(key)


def _unfile(lists: dict, bucket: object, key: tuple) -> None:
    mine = lists[bucket]
    mine.remove(key)
    if not mine:
        del lists[bucket]


def _started_before(a: JobRun, b: JobRun) -> bool:
    """Whether ``a`` ranks ahead of ``b`` among running jobs of one preemption rank: (last start, seq)."""
    return a.last_start_s < b.last_start_s or a.last_start_s == b.last_start_s and a.seq < b.seq


def _width(spec: JobSpec) -> int:
    """The whole GPUs a job asks for; 0 for a fractional or CPU-only job."""
    return 0 if spec.is_fractional else spec.num_gpus


class _RankedRunning:
    """Running jobs ascending by (preemption rank, last start, seq), in parallel lists: the ranks
    (for bisecting) and the jobs. The ranks are those of the last pass that ranked the jobs; a job
    launched since is filed by its rank at its launch (exact while no rank moves; once one may
    have, the engine ranks them again before the list is read: see rank_again and rank_due)."""

    __slots__ = ("ranks", "jobs", "pass_no", "hold_until", "due", "until_of")

    def __init__(self, jobs: list[JobRun], ranks: list[tuple], pass_no: int, hold_until: float,
                 untils: list[float] | None = None) -> None:
        self.ranks: list[tuple] = []
        self.jobs: list[JobRun] = []
        self._sort(jobs, ranks)
        self.pass_no = pass_no  # the last pass whose ranks it holds
        self.hold_until = hold_until  # no rank moves before (QueueSort.preempt_ranks_hold_until)
        # Under a queue with per_job_rank_times, ``untils``: when each job's rank may next move
        # (preempt_rank_until). Then ``due`` is a heap of (that time, seq) and ``until_of`` maps
        # the seq of each job listed to (that time, job): a heap entry that differs is stale.
        self.due: list[tuple[float, int]] | None = None
        self.until_of: dict[int, tuple[float, JobRun]] = {}
        if untils is not None:
            self.due = [(u, j.seq) for u, j in zip(untils, jobs, strict=True) if u < math.inf]
            heapq.heapify(self.due)
            self.until_of = {j.seq: (u, j) for u, j in zip(untils, jobs, strict=True)}

    def _sort(self, jobs: list[JobRun], ranks: list[tuple]) -> None:
        rows = sorted([(rank, r.last_start_s, r.seq, r) for rank, r in zip(ranks, jobs, strict=True)])  # (seq is unique)
        self.ranks = [row[0] for row in rows]
        self.jobs = [row[3] for row in rows]

    def rank_again(self, ranks: list[tuple]) -> None:
        """Take ``ranks``, the jobs' ranks now in the list's order; sort only if that order no longer
        holds."""
        jobs = self.jobs
        for i in range(1, len(ranks)):
            a, b = ranks[i - 1], ranks[i]
            if a < b:
                continue
            if a == b and _started_before(jobs[i - 1], jobs[i]):
                continue
            self._sort(jobs, ranks)
            return
        self.ranks = ranks

    def rank_due(self, ctx: Engine) -> None:
        """Under per-job rank times: file again, by their rank now, the jobs whose time to be
        ranked again has come; every other job's rank stands (so the list's order is the one a
        ranking of them all would give)."""
        heap, until_of, now = self.due, self.until_of, ctx.now
        assert heap is not None
        moved: dict[int, JobRun] = {}  # (by seq: a job filed again at once has two like entries)
        while heap and heap[0][0] <= now:
            until, seq = heapq.heappop(heap)
            got = until_of.get(seq)
            if got is not None and got[0] == until:
                moved[seq] = got[1]
        for job in moved.values():
            self.discard(job)
        for job in moved.values():
            self.add(ctx, job)
        while heap and until_of.get(heap[0][1], (None,))[0] != heap[0][0]:
            heapq.heappop(heap)  # (stale: the job stopped, or was filed again)
        self.hold_until = heap[0][0] if heap else math.inf

    def add(self, ctx: Engine, job: JobRun) -> None:
        q = ctx.policy.queue
        rank = q.preempt_rank(job, ctx)
        if self.due is not None:
            until = q.preempt_rank_until(job, ctx)
            self.until_of[job.seq] = (until, job)
            if until < math.inf:
                heapq.heappush(self.due, (until, job.seq))
        else:
            until = q.preempt_ranks_hold_until([job], ctx)
        self.hold_until = min(self.hold_until, until)
        ranks, jobs = self.ranks, self.jobs
        i = bisect.bisect_left(ranks, rank)
        while i < len(ranks) and ranks[i] == rank and _started_before(jobs[i], job):
            i += 1
        ranks.insert(i, rank)
        jobs.insert(i, job)

    def discard(self, job: JobRun) -> None:
        # (By identity: the job's rank now may differ from the one it is filed by.)
        jobs = self.jobs
        for i in range(len(jobs)):
            if jobs[i] is job:
                del self.ranks[i], jobs[i]
                if self.due is not None:
                    del self.until_of[job.seq]
                return


class Recorder(Protocol):
    """What the engine reports to as time passes (see analysim.core.metrics)."""

    def advance(self, engine: Engine, t: float) -> None: ...

    def after_pass(self, engine: Engine) -> None: ...

    def job_ended(self, engine: Engine, job: JobRun) -> None: ...


