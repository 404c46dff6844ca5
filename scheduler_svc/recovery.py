"""A restarted scheduler picks up where the last one stopped. At construction (``restore``): the
journal's jobs that ended keep their records, the others wait for the agents. Once every node has
an agent again (``resume_reported``): the jobs the agents still run continue where they are (when
the journal has them and every part of each is reported the same way), the ends they report that
the journal missed are taken, and the other journalled jobs are resubmitted."""

from __future__ import annotations

import hashlib
import logging
import math
from collections import defaultdict
from dataclasses import replace
from typing import NamedTuple

from analysim._protos.v1 import agent_pb2 as apb
from analysim.core.cluster import ClusterSpec
from analysim.core.engine import Engine, InfeasibleJob
from analysim.core.job import JobRun
from analysim.errors import UserError
from scheduler_svc.accounts import LiveRecorder
from scheduler_svc.agents import Agents
from scheduler_svc.journal import TERMINAL, Journal
from scheduler_svc.ledger import JobLedger
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.pace import Pace
from scheduler_svc.sessions import Placed, Placements, Session
from scheduler_svc.trace_feed import TraceFeed

log = logging.getLogger("scheduler_svc")
# agent session -> the commands it gets at the start (Kills of what is not kept)
Kills = dict[Session, list]


class Reported(NamedTuple):
    """A journalled job an agent reports running (or ended), consistently: it is taken as reported."""

    job_id: str  # the job
    launch: apb.Launch  # the launch the agents run it under (the leader's report)
    start_s: float  # virtual seconds: when that launch started
    holders: tuple[Session, ...]  # the sessions holding the launch's nodes now
    report: apb.RunningJob  # the leader's report (with end_s once it ended)


def _kill(t: float, job_id: str) -> apb.Command:
    return apb.Command(time_s=t, kill=apb.Kill(job_id=job_id, reason="not resumed"))


class Recovery:
    """The restart's two steps, over the parts a restart reaches: the journal, the engine, the
    ledger, the trace, the agents and the launches they were told of."""

    def __init__(self, engine: Engine, journal: Journal, ledger: JobLedger, trace: TraceFeed, agents: Agents,
                 placements: Placements, pace: Pace, metrics: SchedulerMetrics) -> None:
        self.engine = engine  # the live engine the resumed jobs go into
        self.journal = journal  # what the previous lives recorded
        self.ledger = ledger  # the jobs read back go there
        self.trace = trace  # trace jobs the journal has are not fed again
        self.agents = agents  # their sessions' reports of what they still run
        self.placements = placements  # a resumed job's launch, as the agents know it
        self.pace = pace  # the clock resumes at the latest time the agents have shown
        self.metrics = metrics  # trace jobs taken from the agents' reports are counted submitted
        self.jobs_resumed = 0  # jobs that continued where they were on their agents at the start

    # ------------------------------------------------------------------ the journal

    def restore(self, cluster: ClusterSpec, seed: int, recorder: LiveRecorder) -> int:
        """Resume from the journal: ended jobs keep their records, the others wait for the agents.
        Returns the last launch id of the previous lives (this life's launches come after)."""
        meta = self._claim(cluster, seed)
        # Launch ids name a launch across scheduler lives too: agents keep jobs launched by the
        # previous one, so each life numbers its launches from its own epoch.
        epoch = int(meta.get("epoch", 0)) + 1
        self.journal.set_meta("epoch", epoch)
        rows = self.journal.jobs()
        seen = set()
        if rows:
            t = float(meta.get("clock", 0.0))
            if t > 0:
                self.engine.run(until=t)  # no events yet: only moves the clock
            self.pace.move_to(t)
            ledger = self.ledger
            for job_id, source, spec, status, record in rows:
                seen.add(job_id)
                ended = status in TERMINAL and record is not None
                ledger.journalled(job_id, source, spec, record if ended else None)
                if ended:
                    recorder.add_row(record)
            log.info("resumed from %s at t=%.1f: %d ended, %d to resume or resubmit", self.journal.path, t,
                     len(ledger.restored), len(ledger.unresumed))
        self.trace.skip_journalled(seen)
        self.journal.commit()
        return epoch << 40

    def _claim(self, cluster: ClusterSpec, seed: int) -> dict:
        """The journal's meta, once it is known to be this run's (UserError if another's)."""
        ident = {"trace": self.trace.source, "cluster": cluster.name, "policy": self.engine.policy.name,
                 "seed": seed, "trace_jobs": self.trace.total}
        if cluster.partition is not None:  # what the file says, wherever it is: another says another run
            what = replace(cluster.partition, source="")
            ident["partition"] = hashlib.sha256(repr(what).encode()).hexdigest()[:16]
        meta = self.journal.meta()
        if meta.get("identity") not in (None, ident):
            raise UserError(f"journal {self.journal.path} belongs to another run ({meta['identity']}); "
                            f"this one is {ident}: give a fresh --journal")
        self.journal.set_meta("identity", ident)
        return meta

    # ------------------------------------------------------------------ the agents' reports

    def resume_reported(self) -> Kills:
        """Every node has an agent again: take up what the agents report; Kill commands for what
        is not kept."""
        reports = self.agents.take_running()
        self._take_arrived(reports)
        kills: Kills = defaultdict(list)
        keep = self._kept(reports, kills)
        t = max([self.pace.t_cur, *(k.start_s for k in keep)])
        resumed = 0
        for k in keep:
            job = self._resume(k, kills)
            if job is None:
                continue
            resumed += 1
            if k.report.HasField("end_s"):
                t = max(t, self._end_reported(k))
            else:
                end = self.engine.expected_end(job)
                for s in k.holders:
                    s.lower_bound(end)
        # The clock resumes at the latest time the agents have shown; nothing happened after it.
        self.engine.run(until=t)
        self.pace.t_cur_is(t)
        unresumed = self.ledger.unresumed
        for spec in unresumed.values():
            self.engine.submit(spec, hold=True)
        if unresumed or resumed:
            log.info("after the restart: %d job(s) resumed where they were, %d resubmitted, %d report(s) refused",
                     resumed, len(unresumed), sum(len(v) for v in kills.values()))
        self.jobs_resumed = resumed
        self.ledger.resubmitted()
        return kills

    def _take_arrived(self, reports: dict) -> None:
        """Trace jobs that arrived after the journal's last commit, which an agent runs or ran:
        taken from the trace now (the replay would read them again anyway)."""
        arrived = self.trace.take(reports)
        if not arrived:
            return
        for spec in arrived:
            self.ledger.hold(spec)
            self.ledger.accept(spec.job_id, "trace")
            self.metrics.submitted.labels(spec.vc, "trace").inc()
        self.journal.add_jobs(arrived, "trace")

    def _kept(self, reports: dict[str, list[tuple[Session, apb.RunningJob]]], kills: Kills) -> list[Reported]:
        """The reports taken up: ended ones first, in order of their ends (their GPUs may have gone
        to a later launch), then the ones still running. Running jobs not taken up are killed."""
        keep = []
        for job_id, parts in reports.items():
            first = parts[0][1]
            holders = {self.agents.node_owner.get(sl.node) for sl in first.launch.slots}
            ended = first.HasField("end_s")
            if ended and job_id not in self.ledger.unresumed:
                continue  # its outcome is in the journal already
            if self._consistent(job_id, parts, holders):
                keep.append(Reported(job_id, first.launch, first.start_s, tuple(holders), first))  # type: ignore[arg-type]
            elif not ended:
                for s, _ in parts:
                    kills[s].append(_kill(self.pace.t_cur, job_id))
        keep.sort(key=lambda k: (not k.report.HasField("end_s"), k.report.end_s, k.start_s))
        return keep

    def _consistent(self, job_id: str, parts: list[tuple[Session, apb.RunningJob]],
                    holders: set[Session | None]) -> bool:
        """A journalled job, reported with possible times, the same launch and start by every part,
        and by every agent of its nodes (an ended one by its leader alone)."""
        first = parts[0][1]
        start, ended = first.start_s, first.HasField("end_s")
        if job_id not in self.ledger.unresumed or not (math.isfinite(start) and start >= 0):
            return False
        if ended and not (math.isfinite(first.end_s) and first.end_s >= start):
            return False
        if not all(r.launch.launch_id == first.launch.launch_id and r.start_s == start for _, r in parts):
            return False
        return (ended or holders == {s for s, _ in parts}) and None not in holders

    def _resume(self, k: Reported, kills: Kills) -> JobRun | None:
        """The job into the engine as running on its launch's GPUs; None (and killed) if it cannot be."""
        spec = self.ledger.unresumed[k.job_id]
        la = k.launch
        gpus = tuple((self.agents.node_index[sl.node], tuple(sl.gpus)) for sl in la.slots)
        try:
            job = self.engine.resume_running(spec, gpus, la.slowdown, k.start_s, la.remaining_s, la.overhead_s)
        except (InfeasibleJob, KeyError, IndexError) as e:
            log.warning("job %s reported running, but cannot be resumed (%s): resubmitted", k.job_id, e)
            for s in k.holders:
                kills[s].append(_kill(self.pace.t_cur, k.job_id))
            return None
        self.ledger.resumed(k.job_id)
        self.ledger.first_start(k.job_id)
        self.placements.put(k.job_id, Placed(la.launch_id, job.completion_token, k.holders, k.start_s,
                                             self.engine.expected_end(job)))
        return job

    def _end_reported(self, k: Reported) -> float:
        """A resumed job's reported end, taken at its time; returns that time."""
        end = max(k.report.end_s, self.engine.now)
        (self.engine.job_failed if k.report.failed else self.engine.job_finished)(k.job_id, at=end)
        self.engine.run(until=end)  # nothing else is queued yet: only this job ends
        return end
