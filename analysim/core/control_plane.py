"""Kueue's control plane as a model a run may be paced by (off by default): scheduling cycles, one
head per ClusterQueue per cycle, and an API client with a write rate.

Without it the engine decides at the instant something changes and admits every workload that
fits at once. Real Kueue is slower in three ways, each taken from its code (docs/kueue.md,
"The control-plane model", cites where):

- **Cycles.** The scheduler runs cycles one after another (``pkg/scheduler/scheduler.go``,
  ``schedule``); a cycle that admits nothing is followed by a back-off of 1 ms doubling to 10 ms
  (``pkg/util/wait/backoff.go``). Modelled: cycles at least ``cycle_s`` apart, run while
  something is left to try, none while nothing changed.
- **One head per ClusterQueue per cycle** (``queue.Manager.Heads``): each queue offers its first
  workload; one that cannot be admitted goes to the queue's inadmissible pool, and with it every
  workload of the same request (``SchedulingEquivalenceHashing``'s bulk move), until capacity is
  released in its cohort tree (``QueueInadmissibleWorkloads``). ``heads_per_queue`` > 1 is the
  what-if of admitting more per queue per cycle. The pool is requeued ``requeue_batch_s`` after
  the first release that asks for it (``pkg/cache/queue/inadmissible_workloads.go``: a delaying
  queue with a batch period of 1 s per cohort, which merges the asks in between). (Kept by
  kueue.KueueQueue and kueue.KueueAdmission, which read this.)
- **An API client with a rate limit** (client-go's token bucket; Kueue's configuration
  ``clientConnection``: ``qps`` 50, ``burst`` 100). Every write waits its turn: an admission
  (the workload's status patch, sent by a goroutine after the cycle took the quota), an eviction,
  and the first ``Pending`` status of a workload that could not be admitted. The quota is taken
  when the cycle decides; the job starts running when its admission is written (the job
  controller sees it then), so a queue of writes holds quota without work. The ``Pending``
  status is written from the cycle itself (``requeueAndUpdate`` waits for its patch): no cycle
  begins before it is sent.
- **Evictions take their write's time.** Kueue writes a cycle's evictions from the cycle itself
  (``IssuePreemptions`` waits for its patches), so no cycle begins before they are sent; the
  victims keep their quota and nodes until then, and their evictions complete then (the perf
  runner's controller clears an evicted workload's quota reservation at once, through a client of
  1,000 writes a second). The preemptor is not admitted in the cycle that chose its victims: it is
  requeued at once (``RequeueReasonPendingPreemption``) and tried again in the next cycle, against
  the quota they gave back. (A victim that ends before its eviction is sent ends as it would have.)

What a victim loses is ``preemption_cost`` (records.EngineConfig), not part of this model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from analysim.core.events import COMPLETION, TIMER, EventQueue


@dataclass(frozen=True, slots=True)
class ControlPlaneConfig:
    """The model's parameters; the defaults are Kueue's (module docstring)."""

    cycle_s: float = 0.01  # least time between two cycles' starts (the back-off's cap)
    heads_per_queue: int = 1  # workloads a ClusterQueue offers per cycle
    api_qps: float = 50.0  # writes per second, sustained
    api_burst: int = 100  # writes that may go at once after a quiet spell
    requeue_batch_s: float = 1.0  # inadmissible workloads come back this long after a release

    def as_flag(self) -> str:
        """The ``--control-plane`` value that gives this configuration (argtypes.control_plane)."""
        return "kueue," + ",".join(f"{k}={getattr(self, k)}" for k in
                                   ("cycle_s", "heads_per_queue", "api_qps", "api_burst", "requeue_batch_s"))

    def __post_init__(self) -> None:
        for name, value in (("cycle_s", self.cycle_s), ("api_qps", self.api_qps)):
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"control plane: {name} must be a finite number > 0, got {value!r}")
        if not math.isfinite(self.requeue_batch_s) or self.requeue_batch_s < 0:
            raise ValueError(f"control plane: requeue_batch_s must be a finite number >= 0, got {self.requeue_batch_s!r}")
        if self.heads_per_queue < 1:
            raise ValueError(f"control plane: heads_per_queue must be >= 1, got {self.heads_per_queue!r}")
        if self.api_burst < 1:
            raise ValueError(f"control plane: api_burst must be >= 1, got {self.api_burst!r}")


@dataclass(slots=True)
class ApiClient:
    """A token bucket as a generic cell rate algorithm: write n may go at the earliest
    ``tat - tolerance``, where ``tat`` (theoretical arrival time) advances by one interval per
    write. Invariant: writes go in the order they are asked for, never more than ``burst`` at
    once and never more than ``qps`` a second over any longer span."""

    qps: float  # writes a second, sustained (> 0)
    burst: int  # writes that may go at once after a quiet spell (>= 1)
    tat: float = -math.inf  # when the bucket would be full again, had every write gone on time
    writes: dict[str, int] = field(default_factory=dict)  # writes sent, by kind

    def write(self, now: float, kind: str) -> float:
        """Ask for a write at ``now``; the time it is sent (``now``, or later when the bucket is empty)."""
        interval = 1.0 / self.qps
        sent = max(now, self.tat - (self.burst - 1) * interval)
        self.tat = max(self.tat, sent) + interval
        self.writes[kind] = self.writes.get(kind, 0) + 1
        return sent


class ControlPlane:
    """The model's state in one run: when the last cycle began, whether one is due, the API client.

    Invariant: ``due`` is True exactly while the cycle event it pushed is in the engine's queue (so
    there is at most one); no cycle begins less than ``config.cycle_s`` after the one before, nor
    before ``writing_until``; ``cycles``, ``offered`` and ``writing_until`` only rise."""

    def __init__(self, config: ControlPlaneConfig) -> None:
        self.config = config  # the cycle period, heads per queue, API rate and requeue batch
        self.api = ApiClient(config.api_qps, config.api_burst)  # the scheduler's writes to the API server
        self.last_cycle = -math.inf  # when the last cycle began
        self.due = False  # a cycle event is in the engine's queue
        self.cycles = 0  # cycles run (for the summary)
        self.offered = 0  # heads the queues offered to cycles (kueue.KueueQueue counts them)
        # when the last write a cycle sends itself (an eviction, a Pending status) goes (cycles wait for it)
        self.writing_until = -math.inf

    def want_cycle(self, now: float, events: EventQueue) -> None:
        """Something changed: a cycle is due, at once or when the last one is ``cycle_s`` old
        (nothing to do if one is due already)."""
        if not self.due:
            self.due = True
            events.push(max(now, self.last_cycle + self.config.cycle_s, self.writing_until), TIMER, "cycle")

    def begin_cycle(self, now: float) -> int:
        """A cycle begins: the count of heads offered so far (another cycle follows this one if
        the queues offer any in it: each is admitted, or parked till capacity is released)."""
        self.due = False
        self.last_cycle = now
        self.cycles += 1
        return self.offered

    def admission_lag(self, now: float) -> float:
        """An admission decided at ``now``: how long until its write is sent and the job starts."""
        return self.api.write(now, "admission") - now

    def _write_from_cycle(self, now: float, kind: str) -> float:
        """A write the cycle at ``now`` sends itself and waits for: when it is sent (no cycle
        begins before)."""
        sent = self.api.write(now, kind)
        self.writing_until = max(self.writing_until, sent)
        return sent

    def write_pending(self, now: float) -> None:
        """A head a cycle did not admit at ``now``: its ``Pending`` status is written from the cycle
        itself (Kueue's ``requeueAndUpdate``, which waits for its patch)."""
        self._write_from_cycle(now, "pending")

    def evict(self, now: float, events: EventQueue, payload: object) -> None:
        """A cycle evicts a workload at ``now``: its write waits its turn, cycles wait for the
        write, and the eviction completes when it is sent (the ``evicted`` event, carrying
        ``payload``; of the completions' class, so that a cycle at that instant sees the quota it
        gives back)."""
        events.push(self._write_from_cycle(now, "eviction"), COMPLETION, "evicted", payload)
