"""Kueue's own unit-test tables as AnalySIM cases: each case is the table's ClusterQueues,
Cohorts, ResourceFlavors and priorities as Kueue YAML, its admitted workloads running first and
its incoming workload(s) arriving after, and what Kueue's table expects (victims with their
reason, admissions with their flavors). README.md says how a Go case becomes one of these;
SKIPPED.md lists the cases the model cannot express."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# The Kueue commit every case is read from (kubernetes-sigs/kueue, August 2026).
KUEUE_COMMIT = "ff69552e79ad21652c36caa97038382e55625cf7"

# The running workloads are submitted one a second from t=0, in the case's order; the incoming
# ones arrive together (in the case's order, so the first is the older) after all are admitted.
ARRIVAL_S = 100.0
# Every workload, running or incoming, ends then (unless evicted or a filler): nothing happens
# between the arrival and then, and the run stays short (its time series is sampled over it).
END_S = 1_000.0


# Why a case fails today (its ``xfail``): where AnalySIM still decides differently (docs/kueue.md,
# "Which Kueue").
FAIR_SKIPS_QUEUE = ("bug: fair-sharing preemption leaves a ClusterQueue alone for the strategy when its first "
                    "candidate fails it; Kueue tries the queue's next candidates (runFirstFsStrategy)")
FAIR_ALMOST_LCA = ("bug: fair sharing compares the ClusterQueues' own shares; Kueue compares those of the "
                   "preemptor's and target's ancestors just below their lowest common ancestor (almostLCA)")
NO_RESERVATION = ("bug: a head that needs preemption and finds no candidate does not hold back the capacity it "
                  "needs when its ClusterQueue cannot always reclaim (Kueue's reserveCapacityForUnreclaimablePreempt): "
                  "another ClusterQueue's workload borrows it")


@dataclass(frozen=True)
class Workload:
    """One workload of a case: a job of the trace."""

    # Kueue's workload name, the job id.
    name: str
    # Its ClusterQueue (the LocalQueue of the same name).
    queue: str
    # Kueue quantities per resource (cpu, memory, nvidia.com/gpu).
    requests: Mapping[str, str]
    # Kueue's priority (a WorkloadPriorityClass of this value; 0 without one).
    priority: int = 0
    # For a running workload, the flavor per resource Kueue's table has it admitted to (checked
    # against the run, so a translation that admits it elsewhere fails); for an incoming one the
    # flavors it is expected to be admitted to at its arrival, empty if it is expected to wait,
    # None where the table does not say (a preemption table with no victim says only that).
    flavors: Mapping[str, str] | None = field(default_factory=dict)
    # When it completes, if before END_S: a filler that holds a flavor while the table's workloads
    # are admitted, so that they land on the flavors the table has them on, and is gone before
    # the incoming workloads arrive.
    ends_s: float | None = None


@dataclass(frozen=True)
class Case:
    """One row of a Kueue table test."""

    # Kueue's test file, relative to the repository root.
    source: str
    # The row's name, exactly as in the Go table.
    name: str
    # The partition: Kueue YAML of every object the row needs.
    partition: str
    # The table's admitted workloads, in the order they are submitted (the last one submitted is
    # the most recently admitted, as Kueue orders candidates among equal priorities).
    running: tuple[Workload, ...]
    # The workload(s) arriving after (together, at ARRIVAL_S).
    incoming: tuple[Workload, ...]
    # Kueue's expected victims: workload name -> Kueue's reason label.
    victims: Mapping[str, str]
    # Why AnalySIM does not agree yet (a behaviour it lacks, or "bug: ..."), or None.
    xfail: str | None = None

    @property
    def id(self) -> str:
        return f"{self.source.rsplit('/', 1)[-1].removesuffix('_test.go')}: {self.name}"
