"""The discrete-event engine: the one implementation of scheduling that every front end drives.

Inputs are explicit events — job arrivals, completions, cancellations, node up/down — and outputs
are explicit decisions — launch, preempt, migrate, complete, requeue. No I/O and no wall clock:
``analysim simulate`` feeds it a trace; the live scheduler service feeds it the network.

The engine owns every state change (launch, stop, preempt, migrate) and is the plugins' Handle.
What it delegates, each module owning its fields (docs/engine.md has the map and every cache):
the pending jobs and their indexes (scheduling_queue.SchedulingQueue), one scheduling pass
(cycle.run_pass, with cycle_state.CycleState, orders.py and backfill.py), the hints that let a pass
pass over jobs or be skipped (hints.py), the world's versions and the plugins' memos (memos.py),
the ranked running jobs (ranked.py) and the victim search (victims.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Final

import numpy as np
from mypy_extensions import mypyc_attr

from analysim.core import cycle, interruptions, placement
from analysim.core.cluster import ClusterSpec, ClusterState
from analysim.core.events import ARRIVAL, COMPLETION, KIND, NODE, PAYLOAD, TIMER, EventQueue
from analysim.core.feasibility import Feasibility
from analysim.core.fragmentation import FragmentationTracker
from analysim.core.framework import Policy, QueueTraits
from analysim.core.job import JobRun, JobSpec, JobStatus, Placement
from analysim.core.job_table import JobFeed, JobTable
from analysim.core.memos import Memos, NullMemos, World
from analysim.core.node_views import NodeViews
from analysim.core.quotas import VcQuotas
from analysim.core.ranked import FreshRanking, RankedIndex
from analysim.core.records import REBALANCE, UNBLOCK, Decision, DecisionLog, EngineConfig, InfeasibleJob
from analysim.core.run_view import Recorder, RunView
from analysim.core.running_ends import RunningEnds
from analysim.core.scheduler import Actuator, Scheduler
from analysim.core.scheduling_queue import IndexPlan, SchedulingQueue
from analysim.core.tally import Tally

if TYPE_CHECKING:
    from analysim.core.fragmentation import FragmentationIndex


@mypyc_attr(allow_interpreted_subclasses=True)  # (tests subclass it to check it)
class Engine(RunView):
    def __init__(self, spec: ClusterSpec, policy: Policy, config: EngineConfig | None = None,
                 recorder: Recorder | None = None, workload: Sequence[JobSpec] | None = None,
                 shortcuts: bool = True) -> None:
        """``shortcuts`` off gives the reference engine the tests compare against: every pass walks
        every waiting job (no order leaves any out, no attempt is left unmade), every plugin search
        starts afresh (NullMemos) and the running jobs are ranked anew whenever asked for."""
        self.spec = spec  # the cluster: nodes, racks, VCs and their quotas
        self.policy = policy  # the plugins: queue order, admission, scores, post-filters, rebalance
        self.config = config or EngineConfig()  # preemption, migration, overheads, seed, what to keep
        self.shortcuts = shortcuts  # off: the reference engine (see above)
        self.traits = QueueTraits.of(policy.queue)  # the queue's flags, read once
        self.state = ClusterState(spec)  # the nodes' free GPUs, CPU and memory; which are up
        self.rng = np.random.default_rng(self.config.seed)  # the run's one random stream
        self.now = 0.0  # virtual seconds: the time of the events being handled
        self.events = EventQueue()  # what happens next, in (time, class, order) order
        self.table = JobTable()  # every job submitted and not forgotten, with its bookkeeping
        self.running: dict[str, JobRun] = {}  # job id -> running job
        self.running_by_vc: dict[str, dict[str, JobRun]] = {}  # VC -> job id -> running job
        self.tally = Tally(self.state)  # what the running jobs hold, counted at each launch and stop
        self.gpus_of_vc = self.tally.gpus_of_vc  # (the tally's, for the Handle: read only)
        # where each decision goes, its nodes named
        self.decision_log = DecisionLog(self.config.keep_decisions, [n.name for n in spec.nodes])
        self.recorder = recorder  # what measures the run as it goes (None: nothing)
        self._feed: JobFeed | None = None  # jobs submitted as the clock reaches them (None: not fed)
        self._dirty = False  # something changed since the last scheduling pass
        # The cluster's shape.
        self.dedicated = {v.name for v in spec.vcs if v.nodes}  # VCs with nodes of their own
        self.quotas = VcQuotas(spec, self.dedicated)  # each shared-pool VC's quota
        if policy.admission is not None and (self.config.preemption or self.config.migration):
            raise ValueError(f"admission {policy.admission.name!r}: preemption under a partition is set by its "
                             "ClusterQueues' spec.preemption, not EngineConfig.preemption; migration is not modelled")
        # What a failed placement may do: evict (post-filters; under a partition, its own), move (rebalance).
        can_preempt = policy.may_preempt(self.config.preemption)
        can_migrate = self.config.migration and policy.rebalance is not None
        # The pending jobs, the key lists the passes read (only those some pass reads) and the
        # unschedulable pool.
        q, t = policy.queue, self.traits
        plan = IndexPlan.for_policy(q.blocking, q.dynamic, t.per_vc_order, policy.backfill, can_preempt or can_migrate,
                                    t.heads_ranked_by_state)
        self.squeue = SchedulingQueue(plan, self.dedicated)  # (see above)
        # the running jobs by expected end, for EASY's reservations (None: no backfilling)
        self.ends: RunningEnds | None = RunningEnds(self.dedicated) if policy.backfill else None
        # Versions and memos (docs/engine.md).
        self.world = World()  # versions of the running jobs and the nodes, bumped at each change
        self.memos: Memos = Memos() if shortcuts else NullMemos()  # the plugins' memos, by lifetime
        # the running jobs ranked for preemption
        self.ranked: RankedIndex = (RankedIndex(self.traits.per_job_rank_times) if shortcuts
                                    else FreshRanking(self.traits.per_job_rank_times))
        self.views = NodeViews(self.state, self.dedicated)  # the nodes open to a job
        self.feasibility = Feasibility(spec)  # whether a job could ever run here
        # FGD's index, built when first asked for, against ``workload``'s task sizes (None: the jobs')
        self.fragmentation = FragmentationTracker(self.state, workload)
        # The scheduling pass, its own state, and its views: it sees the engine as plugins do.
        self.scheduler = Scheduler(self, self.squeue, EngineActuator(self), self.world, self.ends, can_preempt,
                                   can_migrate)
        if self.config.rebalance_interval_s and policy.rebalance is not None:
            self.events.push(self.config.rebalance_interval_s, TIMER, "rebalance")

    # ----------------------------------------------------------------- inputs

    def submit(self, spec: JobSpec, hold: bool = False) -> JobRun:
        """Accept a job; it arrives at ``spec.submit_s`` (or now, if that is in the past).

        A job no up node set can hold raises InfeasibleJob; with ``hold``, one that only nodes
        that are down could hold ("not now", as opposed to "never") is accepted instead: pending,
        outside the queue, until a node comes up that lets it fit (then it arrives)."""
        if spec.job_id in self.table.jobs:
            raise InfeasibleJob(f"job {spec.job_id!r} already submitted", "duplicate_id")
        held = False
        try:
            self.check_feasible(spec)
        except InfeasibleJob as e:
            if not (hold and e.reason in ("no_matching_node", "larger_than_cluster") and self.feasibility.fits_when_all_up(self, spec)):
                raise
            held = True
        job = self.table.new_run(spec, spec.duration_s or 0.0)
        self.table.add(job)
        if held:
            self.table.held[spec.job_id] = job
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
        self._feed = JobFeed(jobs)

    def _submit_fed(self, feed: JobFeed) -> None:
        """Submit every fed job due no later than the first event queued (or the next fed job)."""
        events = self.events
        spec = feed.next
        while spec is not None and (not events or spec.submit_s <= events.next_time()):
            self.submit(spec)
            feed.advance()
            spec = feed.next

    # What the jobs table holds, as the engine's readers (the recorder, the services, tests) ask.
    @property
    def jobs(self) -> dict[str, JobRun]:
        """Job id -> its run, for every job submitted and not forgotten."""
        return self.table.jobs

    @property
    def forgotten_jobs(self) -> int:
        """Ended jobs dropped from ``jobs`` (EngineConfig.keep_ended off)."""
        return self.table.forgotten

    @property
    def decisions(self) -> list[Decision]:
        """Every decision so far, in order (empty with EngineConfig.keep_decisions off)."""
        return self.decision_log.kept

    @property
    def node_names(self) -> list[str]:
        return self.decision_log.node_names

    @property
    def allocated_gpus(self) -> float:
        return self.tally.allocated_gpus

    def _ended(self, job: JobRun) -> None:
        if self.recorder is not None:
            self.recorder.job_ended(self, job)
        if not self.config.keep_ended:
            self.table.forget(job)

    def place_now(self, spec: JobSpec) -> bool:
        """Place a job at once if it fits, with no queue (inflate mode). False if it does not fit."""
        job = self.table.new_run(spec, spec.duration_s or 0.0)
        self.table.add(job)
        pl = placement.bind(self, job, self.static_mask(spec))
        if pl is None:
            self.table.drop(spec.job_id)
            return False
        self.launch(job, pl)
        return True

    def cancel(self, job_id: str, at: float | None = None) -> None:
        self.events.push(self._at(at), ARRIVAL, "cancel", job_id)

    def node_down(self, node: str, at: float | None = None) -> None:
        self.events.push(self._at(at), NODE, "node_down", self.state.node_index[node])

    def node_up(self, node: str, at: float | None = None) -> None:
        self.events.push(self._at(at), NODE, "node_up", self.state.node_index[node])

    def job_finished(self, job_id: str, at: float | None = None) -> None:
        """A completion reported from outside (live mode, where agents run the jobs)."""
        job = self.table.jobs[job_id]
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
        if spec.job_id in self.table.jobs:
            raise InfeasibleJob(f"job {spec.job_id!r} already submitted", "duplicate_id")
        pl = Placement(gpus=gpus, slowdown=slowdown)
        st = self.state
        for n, slots in gpus:
            if not st.up[n] or any(not 0 <= g < st.gpus[n] or st.free_milli[n, g] < spec.gpu_milli for g in slots):
                raise InfeasibleJob(f"job {spec.job_id!r}: GPUs {list(slots)} of {self.decision_log.node_names[n]} are not free",
                                    "gpus_taken")
        job = self.table.new_run(spec, remaining_s, overhead_s)
        if self.policy.admission is not None:  # charged to its ClusterQueue as at a launch, on its flavors' nodes
            admitted = self.policy.admission.admit(job, self)
            if admitted is None or not all(admitted[1][n] for n, _ in gpus):
                raise InfeasibleJob(f"job {spec.job_id!r}: its ClusterQueue does not admit it on these nodes now",
                                    "not_admitted")
        self.table.add(job)
        job.enqueued_s = started_s
        self.policy.queue.on_event("arrival", job, self)
        self.launch(job, pl, record=False)
        job.last_start_s = job.first_start_s = started_s
        ex = self.table.books[spec.job_id]
        if self.ends is not None:
            self.ends.remove(job, ex.expected_end_s)
        ex.expected_end_s = started_s + overhead_s + remaining_s * slowdown
        if self.ends is not None:
            self.ends.add(job, ex.expected_end_s)
        self.decision_log.record(self.now, "resume", job.job_id, tuple(self.decision_log.node_names[n] for n in pl.nodes))
        return job

    def _at(self, at: float | None) -> float:
        return self.now if at is None else max(at, self.now)

    def check_feasible(self, spec: JobSpec) -> None:
        """Raise InfeasibleJob if no empty cluster could ever run the job."""
        self.feasibility.check(self, spec)

    # ------------------------------------------------------------------ driving

    def next_event_time(self) -> float | None:
        return self.events.peek_time()

    def run(self, until: float = math.inf) -> None:
        """Process every event up to ``until`` (inclusive), one scheduling pass per distinct time."""
        events = self.events
        while True:
            feed = self._feed
            if feed is not None and feed.next is not None:
                self._submit_fed(feed)
            if not events or events.next_time() > until:
                break
            t = events.next_time()
            self._advance_clock(t)
            while events and events.next_time() == t:
                ev = events.pop()
                self._dispatch(ev[KIND], ev[PAYLOAD])
            if self.policy.control is not None and self._dirty:
                self.policy.control.want_cycle(self.now, self.events)  # (paced: passes run in its cycles)
            # A pass that evicts or moves jobs runs again, so that they can go somewhere at once.
            # Evictions only ever go down a strict order, so this ends; the bound turns a bug
            # into an error instead of a hang.
            passes = 0
            while self._dirty and self.policy.control is None:
                self._dirty = False
                self._schedule()
                passes += 1
                if passes > 2 * len(self.table.jobs) + 10:
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
        return self.fragmentation.current(lambda: [j.spec for j in self.table.jobs.values()])

    # --------------------------------------------------------------- event handlers

    def _dispatch(self, kind: str, payload: object) -> None:
        """An event to its handler, ``_on_<kind>``."""
        _HANDLERS[kind](self, payload)

    def _on_arrival(self, job: JobRun) -> None:
        if job.status is not JobStatus.PENDING or job.end_s is not None:
            return
        job.enqueued_s = self.now
        self.policy.queue.on_event("arrival", job, self)
        self._enqueue(job)

    def _on_cancel(self, job_id: str, status: JobStatus = JobStatus.CANCELLED) -> None:
        job = self.table.jobs.get(job_id)
        if job is None or job.status in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED):
            return
        self.table.held.pop(job_id, None)
        if job.status is JobStatus.RUNNING:
            self._stop(job)
        elif self.squeue.holds(job):
            self.dequeue(job)
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
        self.decision_log.record(self.now, "complete", job.job_id, nodes)
        self._ended(job)

    def _on_node_down(self, node: int) -> None:
        if not self.state.up[node]:
            return
        self.world.nodes_changed()  # (what the nodes offer changes: see hints)
        self.state.set_up(node, False)
        self.state.touched.add(node)
        self.tally.up_gpus -= float(self.state.gpus[node])
        self._forget_node_answers()
        for job in [j for j in self.running.values() if node in j.placed.nodes]:
            self._stop(job)
            interruptions.after_failure(job, self.table.books[job.job_id], self.config)
            job.restarts += 1
            self._decide("requeue", job)
            self._requeue(job)

    def _forget_node_answers(self) -> None:
        """A node went down or up: drop what was remembered of the nodes open to each job."""
        self.views.forget()
        self.memos.nodes_changed()
        self.feasibility.forget()

    def _on_node_up(self, node: int) -> None:
        if self.state.up[node]:
            return
        self.world.nodes_changed()  # (what the nodes offer changes: see hints)
        self.state.set_up(node, True)
        self.state.touched.add(node)
        self.tally.up_gpus += float(self.state.gpus[node])
        self._forget_node_answers()
        self._dirty = True
        for job_id, job in list(self.table.held.items()):  # in submission order
            try:
                self.check_feasible(job.spec)
            except InfeasibleJob:
                continue
            del self.table.held[job_id]
            self.events.push(self.now, ARRIVAL, "arrival", job)

    def _on_timer(self, payload: tuple[str, JobRun | None]) -> None:
        """Policy timers (e.g. a queue level change): the job's key may have changed."""
        _, job = payload
        if job is not None and job.status is JobStatus.PENDING and self.squeue.holds(job):
            self.dequeue(job)
            self._enqueue(job)
        self.squeue.pool.timer()
        self._dirty = True

    def _on_rebalance(self, _payload: object) -> None:
        rebalance, interval = self.policy.rebalance, self.config.rebalance_interval_s
        assert rebalance is not None and interval is not None  # (the timer is only set with both)
        moves = rebalance.rebalance(self) if self.config.migration else []
        for job, node, slots in moves:
            self.migrate(job, node, slots, (REBALANCE, "", ""))
        if self.running or self.pending_count:
            self.events.push(self.now + interval, TIMER, "rebalance")
        self._dirty = True

    def _on_cycle(self, _payload: object) -> None:
        """A cycle of the control plane: one pass; another follows while the queues offer heads."""
        control = self.policy.control
        assert control is not None
        offered = control.begin_cycle(self.now)
        self._dirty = False
        self._schedule()
        self._dirty = self._dirty or control.offered != offered

    def _on_evicted(self, payload: tuple[JobRun, int, tuple[str, str, str]]) -> None:
        """Under the control plane, an eviction a cycle issued is sent: the victim goes now."""
        job, token, why = payload
        if job.status is JobStatus.RUNNING and token == job.completion_token:
            self.preempt(job, why)  # (else it ended, or was cancelled, before the write went)

    def set_timer(self, at: float, job: JobRun | None = None, tag: str = "") -> None:
        """For plugins: re-examine ``job`` (re-key it if pending) and run a pass at ``at``."""
        self.events.push(max(at, self.now), TIMER, "timer", (tag, job))

    # ------------------------------------------------------------------ the queue

    @property
    def pending_count(self) -> int:
        return len(self.squeue.by_seq)

    @property
    def pending_demand(self) -> float:
        """The pending jobs' GPU demand."""
        return self.squeue.demand

    def pending_jobs(self) -> Iterator[JobRun]:
        """Pending jobs in queue order (as of the last re-key)."""
        return self.squeue.jobs()

    def head_of_line(self) -> JobRun | None:
        sq = self.squeue
        if not sq.by_seq:
            return None
        q = self.policy.queue
        if q.dynamic:
            return next(q.order(sq.for_dynamic_order(self.traits.per_vc_order), self), None)  # type: ignore[arg-type]
        return sq.by_seq[next(sq.keys())[1]]

    def _enqueue(self, job: JobRun) -> None:
        q = self.policy.queue
        qkey = q.key(job, self)
        self.squeue.check_key(qkey, q.name)
        self.squeue.add(job, (qkey, job.seq), job.overhead_s + job.remaining_s)
        self._dirty = True

    def dequeue(self, job: JobRun) -> None:
        self.squeue.remove(job)

    def rekey(self, job: JobRun) -> None:
        if self.squeue.holds(job):
            self.dequeue(job)
            self._enqueue(job)

    def _requeue(self, job: JobRun) -> None:
        job.status = JobStatus.PENDING
        job.enqueued_s = self.now
        self.policy.queue.on_event("stop", job, self)
        self._enqueue(job)

    # ------------------------------------------------------- the Handle: nodes, quotas, jobs

    def static_key(self, spec: JobSpec) -> tuple:
        return self.views.static_key(spec)

    def static_mask(self, spec: JobSpec) -> np.ndarray:
        return self.views.static_mask(spec)

    def open_nodes(self, spec: JobSpec) -> list[bool]:
        return self.views.open_nodes(spec)[0]

    def open_to_every_node(self, spec: JobSpec) -> bool:
        return self.views.open_nodes(spec)[1]

    def one_node(self, spec: JobSpec) -> bool:
        if spec.num_gpus <= self.state.smallest_node_gpus:
            return True  # (gang_size's own first answer, without the lookup)
        return self.views.gang_size(spec) == 1

    def gang_size(self, spec: JobSpec) -> int:
        return self.views.gang_size(spec)

    def quota_of(self, vc: str) -> float | None:
        return self.quotas.quota_of(vc)

    def guaranteed_gpus(self, vc: str) -> float | None:
        """GPUs a VC can count on: its quota, or its dedicated nodes' GPUs; None without either."""
        v = self.spec.vc(vc)
        if vc in self.dedicated and v is not None:
            return float(sum(n.gpus for n in self.spec.nodes if n.name in v.nodes))
        return self.quota_of(vc)

    def within_quota(self, job: JobRun) -> bool:
        return self.within_quota_of(job.spec.vc, job.spec.gpu_demand)

    def within_quota_of(self, vc: str, demand: float) -> bool:
        """Whether a job of ``vc`` asking for ``demand`` GPUs keeps its VC within its quota now."""
        q = self.quota_of(vc)
        return q is None or self.state.vc_used.get(vc, 0.0) + demand <= q + 1e-9

    def vc_over_quota(self, vc: str) -> bool:
        q = self.quota_of(vc)
        return q is not None and self.state.vc_used.get(vc, 0.0) > q + 1e-9

    def expected_end(self, job: JobRun) -> float:
        return self.table.books[job.job_id].expected_end_s

    def remaining_now(self, job: JobRun) -> float:
        return job.remaining_s if job.status is not JobStatus.RUNNING else job.remaining_at(self.now)

    def attained_now(self, job: JobRun) -> float:
        return job.attained_gpu_s if job.status is not JobStatus.RUNNING else job.attained_at(self.now)

    def ranked_running(self, vc: str | None) -> tuple[list[tuple], list[JobRun]]:
        return self.ranked.ranked(self, vc, self.scheduler.pass_no)

    def ranks_hold_until(self, vc: str | None) -> float:
        return self.ranked.hold_until(self, vc, self.scheduler.pass_no)

    def plugin_memo(self) -> dict:
        return self.memos.pass_memo(self.scheduler.pass_no, self.world.running, self.now)  # (now: a rebalance outside a pass)

    def vc_memo(self, vc: str) -> dict:
        return self.memos.vc_memo(vc, self.world.vc_version(vc), self.world.nodes)

    def lasting_memo(self) -> dict:
        return self.memos.lasting()

    def stopped_demand(self, vc: str) -> float:
        return self.tally.stopped_by_vc.get(vc, 0.0)

    # ------------------------------------------------------------ the scheduling cycle

    def _schedule(self) -> None:
        if not self.squeue.by_seq:
            return
        self.squeue.begin_pass()
        try:
            cycle.run_pass(self.scheduler)
        finally:
            self.squeue.end_pass()

    # ------------------------------------------------------------ state transitions

    def launch(self, job: JobRun, pl: Placement, record: bool = True) -> None:
        spec = job.spec
        self.tally.charge(job, pl)
        ex = self.table.books[spec.job_id]
        if self.policy.admission is not None:
            self.policy.admission.on_launch(job, self)
        job.status = JobStatus.RUNNING
        job.placement = pl
        job.last_start_s = self.now
        if job.first_start_s is None:
            job.first_start_s = self.now
        job.placements_seen.append(pl.nodes)
        self.running[spec.job_id] = job
        self.running_by_vc.setdefault(spec.vc, {})[spec.job_id] = job
        self.world.job_changed(spec.vc)
        self.ranked.on_change(self, job, True)
        job.completion_token += 1
        if self.policy.control is not None:
            job.overhead_s += self.policy.control.admission_lag(self.now)  # (quota held until its write goes)
        ex.expected_end_s = self.now + job.overhead_s + job.remaining_s * pl.slowdown
        if self.ends is not None:
            self.ends.add(job, ex.expected_end_s)
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
        spec = job.spec
        self.tally.release(job, pl)
        if self.policy.admission is not None:
            self.policy.admission.on_stop(job, self)
        del self.running[spec.job_id]
        del self.running_by_vc[spec.vc][spec.job_id]
        self.world.job_changed(spec.vc)
        self.ranked.on_change(self, job, False)
        if self.ends is not None:
            self.ends.remove(job, self.table.books[spec.job_id].expected_end_s)
        self.world.stops += 1
        job.completion_token += 1
        self.table.books[spec.job_id].expected_end_s = math.inf
        self._dirty = True
        return tuple(self.decision_log.node_names[n] for n in pl.nodes)

    def preempt(self, job: JobRun, why: tuple[str, str, str] = ("", "", "")) -> None:
        """Evict a running job for a waiting one (a post-filter's victim). It is not launched again
        at this instant, by this pass or the passes that follow it at the same time: that would be
        a move (a migration's work, counted as one), or a cascade, where the victim evicts others
        in turn, each paying the restore overhead. It waits for the next pass after this instant
        (a pass runs when something changes: an arrival, an end, a node event, a timer)."""
        nodes = self._stop(job)
        self.squeue.pool.evicted(job, self.now)
        interruptions.after_preemption(job, self.table.books[job.job_id], self.config)
        job.preemptions += 1
        job.placement = None
        self.decision_log.record(self.now, "preempt", job.job_id, nodes, why)
        self._requeue(job)

    def migrate(self, job: JobRun, node: int, slots: tuple[int, ...], why: tuple[str, str, str]) -> None:
        self._stop(job)
        interruptions.after_move(job, self.table.books[job.job_id], self.config)
        job.migrations += 1
        job.status = JobStatus.PENDING
        pl = Placement(gpus=((node, slots),), slowdown=1.0)
        self.launch(job, pl, record=False)  # (recorded as a migration, not a fresh launch)
        self.decision_log.record(self.now, "migrate", job.job_id, (self.decision_log.node_names[node],), why)

    def _decide(self, kind: str, job: JobRun) -> None:
        nodes = tuple(self.decision_log.node_names[n] for n in job.placement.nodes) if job.placement else ()
        self.decision_log.record(self.now, kind, job.job_id, nodes)


# Each event kind's handler.
_HANDLERS: Final = {k: getattr(Engine, "_on_" + k) for k in
                    ("arrival", "cancel", "fail", "complete", "node_down", "node_up", "timer", "rebalance", "cycle",
                     "evicted")}


class EngineActuator(Actuator):
    """The pass's actuator: the engine's own state changes, asked for by a pass."""

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine  # the one owner of every state change
        self.reasons = engine.policy.eviction_reasons()  # the post-filters that say why they evict, found once
        admission = engine.policy.admission
        # (the admission's optional hint that a preemption's flavors go unused, found once)
        self.forget: Callable[[JobRun], None] | None = getattr(admission, "forget", None)

    def launch(self, job: JobRun, pl: Placement) -> None:
        self.engine.launch(job, pl)

    def dequeue(self, job: JobRun) -> None:
        self.engine.dequeue(job)

    def preempt_for(self, job: JobRun) -> Placement | None:
        eng = self.engine
        self.evicting = False  # (Actuator.evicting: set below when the evictions are only under way)
        admission = eng.policy.admission
        for pf in eng.policy.post_filters:
            victims = pf.victims(job, eng)
            if not victims:
                continue
            control = eng.policy.control
            for v in victims:
                reason, by = self.reasons[pf.name](v) if pf.name in self.reasons else (pf.name, job.spec.vc)
                if control is None:
                    eng.preempt(v, (reason, by, job.job_id))
                else:  # (the control plane: the victim goes when its eviction is written)
                    control.evict(eng.now, eng.events, (v, v.completion_token, (reason, by, job.job_id)))
            if control is not None:
                if self.forget is not None:
                    self.forget(job)
                self.evicting = True
                return None
            admitted = admission.admit(job, eng) if admission is not None else None  # (its flavors' nodes)
            pl = placement.bind(eng, job, eng.static_mask(job.spec) if admitted is None else admitted[1])
            if pl is None:
                raise AssertionError(f"{pf.name}: evicted {len(victims)} jobs but {job.job_id} still does not fit")
            return pl
        return None

    def migrate_for(self, job: JobRun) -> Placement | None:
        eng = self.engine
        rebalance = eng.policy.rebalance
        assert rebalance is not None
        moves = rebalance.unblock(job, eng)
        if not moves:
            return None
        for mover, node, slots in moves:
            eng.migrate(mover, node, slots, (UNBLOCK, job.spec.vc, job.job_id))
        return placement.bind(eng, job, eng.static_mask(job.spec))
