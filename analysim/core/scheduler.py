"""The scheduling pass as an object (Kubernetes' scheduler, beside its framework and its queue):
built once per engine, holding what only the passes use, and seeing the rest through four narrow
views instead of the engine:

- the **queue** (SchedulingQueue, with its unschedulable pool): the pending jobs, their key
  lists, and what earlier passes learnt of them;
- the **handle** (framework.Handle): the clock, the nodes and their free GPUs, the quotas and the
  nodes open to a job, read only; the pass hands it to the plugins, which see nothing more;
- the **actuator** (``Actuator``): the only way a pass changes the cluster (launch a job, take it
  out of the queue, evict for it, move others for it);
- the **plugins** (framework.Policy): the queue order, the admission, the post-filters and the
  rebalancer, with their optional hints found once (hints.failure_checks).

``cycle.run_pass`` runs one pass over a Scheduler; orders.py, backfill.py, pass_streams.py and
cycle_state.py read the same views through it. Each pass makes a CycleState and drops it.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from analysim.core import hints
from analysim.core.framework import Handle, Policy
from analysim.core.job import JobRun, Placement
from analysim.core.memos import World
from analysim.core.rooms import DedicatedRooms
from analysim.core.running_ends import RunningEnds
from analysim.core.scheduling_queue import SchedulingQueue


@mypyc_attr(allow_interpreted_subclasses=True)
class Actuator:
    """What a pass may do to the cluster; the engine is the one implementation (it owns every
    state change: the quota, the free GPUs, the decisions, the events)."""

    def __init__(self) -> None:
        # Set by preempt_for when it issued evictions the job waits for instead of being placed
        # (the control-plane model: they complete when written, and the pass ends there).
        self.evicting = False

    def launch(self, job: JobRun, pl: Placement) -> None:
        """Start a pending job on ``pl`` (it has been taken out of the queue)."""
        raise NotImplementedError

    def dequeue(self, job: JobRun) -> None:
        """Take a pending job out of the queue."""
        raise NotImplementedError

    def preempt_for(self, job: JobRun) -> Placement | None:
        """Evict what the post-filters name for ``job``; where it then fits (None: they named no
        victims, and nothing changed; or, with ``evicting`` set, their evictions are under way)."""
        raise NotImplementedError

    def migrate_for(self, job: JobRun) -> Placement | None:
        """Move running jobs as the rebalancer says, to make room for ``job``; where it then fits
        (None: no moves, nothing changed)."""
        raise NotImplementedError


class Scheduler:
    """The passes' own state and their views (module docstring). Invariant: nothing outside the
    passes writes these fields, and the passes write nothing else but through the queue, its
    pool and the actuator."""

    def __init__(self, handle: Handle, queue: SchedulingQueue, actuator: Actuator, world: World,
                 ends: RunningEnds | None, can_preempt: bool, can_migrate: bool) -> None:
        policy = handle.policy
        self.handle = handle  # the clock, the cluster and the quotas, read only; what plugins get
        self.queue = queue  # the pending jobs and the unschedulable pool
        self.actuator = actuator  # launches, dequeues, evictions and moves
        self.plugins: Policy = policy  # the queue order, admission, post-filters, rebalancer
        self.admission = policy.admission  # the partition's quota admission (None: no partition)
        self.world = world  # versions of the running jobs and the nodes (memos.World), read only
        self.ends = ends  # the running jobs by expected end, for EASY's reservations (None: no backfill)
        self.shortcuts = handle.shortcuts  # off: the reference pass, walking every waiting job
        self.can_preempt = can_preempt  # a failed placement may evict (post-filters)
        self.can_migrate = can_migrate  # or move running jobs (rebalance)
        # The plugins a failed placement asks, and their optional hints, found once.
        self.failure_plugins = hints.failure_plugins(policy, can_preempt, can_migrate)
        self.checks = (hints.failure_checks(self.failure_plugins)  # None: some plugin has no sure-failure hint
                       if self.shortcuts and (can_preempt or can_migrate) else None)
        self.per_request = hints.answer_per_request(self.failure_plugins)  # [] unless every one answers per request
        self.gmax = max((n.gpus for n in handle.spec.nodes), default=0)  # GPUs of the largest node
        self.rooms = DedicatedRooms(handle.state, handle.dedicated)  # free GPUs per dedicated VC's nodes
        self.pass_no = 0  # passes run so far (the plugins' per-pass memos are keyed by it)
