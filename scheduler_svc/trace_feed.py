"""The trace a live run replays: its jobs fed to the engine as the clock passes their submit
times, exactly as ``analysim.simulation.run`` takes them (sorted, cut at --limit, filtered for the
cluster), so that the live run and the offline one can be compared. The feed is the only writer
of what is left to feed."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence

from analysim.core.cluster import ClusterSpec
from analysim.core.engine import Engine, InfeasibleJob
from analysim.core.job import JobSpec
from analysim.simulation import RunOptions, filter_for_cluster, summary_header
from scheduler_svc.journal import Journal
from scheduler_svc.ledger import JobLedger
from scheduler_svc.metrics import SchedulerMetrics

log = logging.getLogger("scheduler_svc")
INF = math.inf


def offline_jobs(trace_jobs: Sequence[JobSpec], opts: RunOptions) -> list[JobSpec]:
    """Exactly what analysim.simulation.run does with a trace, so that the runs can be compared."""
    return sorted(trace_jobs, key=lambda j: j.submit_s)[: opts.limit] if opts.limit else list(trace_jobs)


class TraceFeed:
    """The trace's jobs still to come, fed to the engine in submit order."""

    def __init__(self, jobs: list[JobSpec], cluster: ClusterSpec, opts: RunOptions, engine: Engine,
                 trace_filtered: dict[str, int] | None, source: str) -> None:
        self.offline_input = jobs  # the trace as the offline run takes it (before the cluster's filter)
        self.filtered = trace_filtered  # jobs the loader dropped, by reason
        self.source = source  # where the trace came from
        kept, reasons = filter_for_cluster(jobs, engine, "replay")
        # The summary's first keys, as analysim simulate writes them (the cluster's filter included).
        self.header = summary_header(cluster, engine.policy.name, opts, len(jobs), trace_filtered, reasons)
        self.kept = kept  # the trace jobs this cluster can run, by submit time
        self.total = len(kept)  # how many (the summary's jobs_total counts them)
        # Client ids may not take these, arrived or not: a trace job is never displaced.
        self.ids = frozenset(j.job_id for j in kept)
        # The trace jobs not journalled by an earlier life, by submit time; fed from ``cursor`` on.
        self.jobs: list[JobSpec] = list(kept)
        self.cursor = 0  # the next job to feed
        self.skipped = 0  # trace jobs skipped because a client took their id first

    def skip_journalled(self, seen: set[str]) -> None:
        """A restart: the jobs the journal has are not fed again."""
        self.jobs = [j for j in self.kept if j.job_id not in seen]
        self.cursor = 0

    def take(self, ids: Iterable[str]) -> list[JobSpec]:
        """Take these jobs out of what is left to feed (an agent ran them before the journal had
        them), and return them."""
        wanted = set(ids)
        taken = [j for j in self.jobs if j.job_id in wanted]
        if taken:
            gone = {j.job_id for j in taken}
            self.jobs = [j for j in self.jobs if j.job_id not in gone]
        return taken

    def feed(self, until: float, engine: Engine, ledger: JobLedger, metrics: SchedulerMetrics,
             journal: Journal) -> None:
        """Every job submitted up to ``until`` into the engine, the ledger and the journal."""
        jobs, i, n = self.jobs, self.cursor, len(self.jobs)
        if i >= n or jobs[i].submit_s > until:
            return
        batch = []
        while i < n and jobs[i].submit_s <= until:
            spec = jobs[i]
            i += 1
            try:
                engine.submit(spec, hold=True)
            except InfeasibleJob as e:  # a client took the id first
                log.warning("trace job skipped: %s", e)
                self.skipped += 1
                continue
            ledger.accept(spec.job_id, "trace")
            metrics.submitted.labels(spec.vc, "trace").inc()
            batch.append(spec)
        self.cursor = i
        journal.add_jobs(batch, "trace")

    def next_time(self) -> float:
        return self.jobs[self.cursor].submit_s if self.cursor < len(self.jobs) else INF

    def exhausted(self) -> bool:
        return self.cursor >= len(self.jobs)
