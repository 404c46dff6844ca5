"""The engine's records: its configuration, its decisions, its refusals and its bookkeeping per job."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from analysim.core.job import by_fields

# Why a job was moved (Decision.reason of a migration): to make room for a waiting job, or by the
# periodic rebalance (EngineConfig.rebalance_interval_s).
UNBLOCK = "unblock"
REBALANCE = "rebalance"


# What a preempted job keeps of its work (interruptions.after_preemption): all of it (it checkpoints
# when evicted: AnalySIM's default, and what a job that saves its state on SIGTERM gets); none (its
# pods are deleted and it starts again: Kueue's, for a job that does not checkpoint); or what its
# last periodic checkpoint saved.
PREEMPTION_COSTS = ("keep", "restart", "checkpoint")


@dataclass(frozen=True)
class EngineConfig:
    """Knobs of the mechanism, independent of the policy.

    Overheads are virtual seconds a job spends before making progress again: reloading its
    checkpoint after a preemption (``restore_overhead_s``) or after being moved
    (``migration_overhead_s``). A node failure rolls a job back to its last periodic checkpoint
    (every ``checkpoint_interval_s`` of progress; None: no periodic checkpoints, so only the
    checkpoints of preemptions and moves survive). What a preemption costs its victim is
    ``preemption_cost`` (PREEMPTION_COSTS): by default it checkpoints, keeping all its work.
    """

    preemption: bool = False  # whether the policy may preempt (a partition's queues say so themselves)
    migration: bool = False  # whether running jobs may be moved (with a rebalance plugin)
    restore_overhead_s: float = 30.0  # (above) seconds
    migration_overhead_s: float = 60.0  # (above) seconds
    checkpoint_interval_s: float | None = 1800.0  # (above) seconds of progress
    rebalance_interval_s: float | None = None  # seconds between rebalance passes (None or 0: none)
    relaxed_locality: bool = False  # a gang may span any number of nodes, not only the fewest that hold it
    # Whether the engine schedules each launched job's completion itself; off when something
    # outside reports completions (the live scheduler's agents).
    predict_completions: bool = True
    seed: int = 0  # seeds the run's one random stream (Engine.rng)
    preemption_cost: str = "keep"  # one of PREEMPTION_COSTS
    # A run of millions of jobs keeps neither its ended jobs (the recorder has their rows; they are
    # only counted, in forgotten_by_vc) nor its decision log.
    keep_ended: bool = True
    keep_decisions: bool = True  # (above) whether DecisionLog keeps every decision in a list

    def __post_init__(self) -> None:
        if self.preemption_cost not in PREEMPTION_COSTS:
            raise ValueError(f"unknown preemption cost {self.preemption_cost!r}; known: {', '.join(PREEMPTION_COSTS)}")

    def __reduce__(self) -> tuple:
        return by_fields(self)


@dataclass(frozen=True, slots=True)
class Decision:
    """Something the engine did, in the order it did it."""

    time: float  # when it was made, seconds on the engine's clock
    kind: str  # launch | preempt | migrate | complete | requeue | cancel | fail
    job_id: str  # the job it was made about
    nodes: tuple[str, ...] = ()  # the nodes the job holds as it is made, by name (empty: none)
    # An eviction's or a migration's reason, the queue (ClusterQueue, or VC without a partition)
    # of the job it made room for, and that job's id; "" otherwise. A preemption's reason is its
    # post-filter's when that says (Kueue's: InClusterQueue, ...), else the post-filter's name
    # (priority, reclaim); a migration's is UNBLOCK or REBALANCE.
    reason: str = ""
    by: str = ""  # (above) the queue made room for
    preemptor: str = ""  # (above) the job made room for

    def __reduce__(self) -> tuple:
        return by_fields(self)


class DecisionLog:
    """Where the engine's decisions go as they are made: the kept list (with
    EngineConfig.keep_decisions; off for long runs) and every sink handed to it (an events file,
    analysim.events), in that order. With neither, no Decision is made at all. Invariant:
    ``kept.append`` is the first sink exactly when decisions are kept."""

    def __init__(self, keep: bool, node_names: list[str]) -> None:
        self.node_names = node_names  # node index -> its name, as decisions give nodes
        self.kept: list[Decision] = []  # every decision, in order, when kept; else empty
        # (each takes every decision before the next one changes anything it may read, such as
        # the quota usage)
        self.sinks: list[Callable[[Decision], None]] = [self.kept.append] if keep else []

    def add(self, sink: Callable[[Decision], None]) -> None:
        self.sinks.append(sink)

    def record(self, now: float, kind: str, job_id: str, nodes: tuple[str, ...],
               why: tuple[str, str, str] = ("", "", "")) -> None:
        """A decision of the engine's (``why``: see Decision), to every sink; none is made without one."""
        if self.sinks:
            d = Decision(now, kind, job_id, nodes, *why)
            for sink in self.sinks:
                sink(d)


class InfeasibleJob(ValueError):
    """A job that can never run on this cluster. ``reason`` is a short code for filter counts."""

    def __init__(self, message: str, reason: str = "infeasible") -> None:
        super().__init__(message)
        self.reason = reason  # (above)


@dataclass(slots=True)
class JobBook:
    """Engine bookkeeping per job that plugins need not see. Invariant: ``checkpoint_work_s`` is
    at most the job's progress (its duration less its remaining work)."""

    checkpoint_work_s: float = 0.0  # progress saved by the last checkpoint
    expected_end_s: float = math.inf  # when it ends if nothing happens to it (inf while not running)
