"""The engine's decisions as node-agent commands: stops (Kill, checkpointing Preempt) first, then
Launches and Migrates in launch order, each to the agents holding the job's nodes. The translator
is the only writer of the launches the agents were told of (through ``Placements``, which the
recovery also fills at a restart) and of the launch ids."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping

from analysim._protos.v1 import agent_pb2 as apb
from analysim.core.engine import Engine
from analysim.core.job import JobRun, JobStatus
from analysim.core.records import Decision
from scheduler_svc.accounts import DecisionAccounts
from scheduler_svc.sessions import Placed, Placements, Session

log = logging.getLogger("scheduler_svc")

# job id -> (index of its last new decision, that decision's kind, its virtual time)
LastDecisions = dict[str, tuple[int, str, float]]


class CommandTranslator:
    """Turns the engine's new decisions into per-agent commands."""

    def __init__(self, engine: Engine, node_owner: Mapping[str, Session], placements: Placements,
                 accounts: DecisionAccounts, first_launch_id: int) -> None:
        self.engine = engine  # the live engine, whose decision log is read
        self.node_owner = node_owner  # node name -> the connected session holding it (the agents' map)
        self.placements = placements  # what the agents were told runs where
        self.accounts = accounts  # metrics, journal and watchers for each decision
        self.seen = 0  # how many of the engine's decisions have been translated (a prefix of its log)
        # The last launch id given; each scheduler life starts at its epoch << 40 (ids never repeat).
        self.launch_seq = first_launch_id

    def collect(self) -> dict[Session, list]:
        """Turn the engine's new decisions into per-agent commands: stops first, then starts in
        launch order. Compares what the agents were told with what the engine now runs, so a job
        launched and preempted within one pass costs nothing on the wire."""
        new = self._new_decisions()
        if not new:
            return {}
        last, migrated = self._account(new)
        out: dict[Session, list] = defaultdict(list)
        starts = []
        jobs = self.engine.jobs
        for job_id, (i, kind, t) in last.items():
            job = jobs[job_id]
            cur = self.placements.get(job_id)
            running = job.status is JobStatus.RUNNING
            if cur is not None and running and cur.token == job.completion_token:
                continue
            if cur is not None:
                self.placements.drop(job_id)
                if not (running and job_id in migrated):  # a Migrate command reaches the old agents too
                    self._stop(job, cur, kind, t, out)
            if running:
                starts.append((i, job_id, cur if job_id in migrated else None))
        starts.sort()
        for _, job_id, old in starts:
            self._start(jobs[job_id], old, out)
        return out

    def _new_decisions(self) -> list[Decision]:
        dec = self.engine.decisions
        if self.seen == len(dec):
            return []
        new = dec[self.seen:]
        self.seen = len(dec)
        return new

    def _account(self, new: list[Decision]) -> tuple[LastDecisions, set[str]]:
        """Each decision accounted for; each job's last decision, and the jobs that migrated."""
        last: LastDecisions = {}
        migrated: set[str] = set()
        for i, d in enumerate(new):
            self.accounts.account(d)
            last[d.job_id] = (i, d.kind, d.time)
            if d.kind == "migrate":
                migrated.add(d.job_id)
        return last, migrated

    def _stop(self, job: JobRun, told: Placed, kind: str, t: float, out: dict[Session, list]) -> None:
        """The agents running a job the engine stopped are told to (a completed one stopped itself;
        a cancelled one is killed, and a failed one too: its other agents still run their part)."""
        if job.status is JobStatus.COMPLETED:
            return
        if job.status is JobStatus.PENDING and kind == "preempt":
            cmd = apb.Command(time_s=t, preempt=apb.Preempt(job_id=job.job_id, checkpoint=True))
        else:
            cmd = apb.Command(time_s=t, kill=apb.Kill(job_id=job.job_id, reason=kind))
        for s in told.sessions:
            if s.connected:
                out[s].append(cmd)

    def _start(self, job: JobRun, old: Placed | None, out: dict[Session, list]) -> None:
        """A Launch (or, for a job moved, a Migrate) to the agents of its nodes."""
        pl = job.placement
        names = self.engine.node_names
        self.launch_seq += 1
        end = self.engine.expected_end(job)
        launch = apb.Launch(
            job_id=job.job_id, launch_id=self.launch_seq,
            slots=[apb.GpuSlots(node=names[n], gpus=slots) for n, slots in pl.gpus],
            gpu_milli=job.spec.gpu_milli, remaining_s=job.remaining_s, overhead_s=job.overhead_s,
            slowdown=pl.slowdown, end_s=end, duration_s=job.spec.duration_s or 0.0)
        targets = self._holders(job)
        # The launch time is the job's, not the engine's now: a paced tick may cover several
        # event times, and the agent computes the end from it.
        t = job.last_start_s
        if old is not None:
            cmd = apb.Command(time_s=t, migrate=apb.Migrate(target=launch))
            for s in old.sessions:
                if s.connected and s not in targets:
                    out[s].append(cmd)
        else:
            cmd = apb.Command(time_s=t, launch=launch)
        for s in targets:
            out[s].append(cmd)
            s.lower_bound(end)
        self.placements.put(job.job_id, Placed(self.launch_seq, job.completion_token, tuple(targets), t, end))

    def _holders(self, job: JobRun) -> list[Session]:
        """The sessions holding a placed job's nodes, each once, in the placement's order."""
        names = self.engine.node_names
        targets: list[Session] = []
        for n, _ in job.placement.gpus:
            s = self.node_owner.get(names[n])
            if s is None:
                log.error("job %s placed on %s, which has no agent", job.job_id, names[n])
            elif s not in targets:
                targets.append(s)
        return targets
