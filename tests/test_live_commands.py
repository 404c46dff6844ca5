"""The translation of the engine's decisions into node-agent commands (scheduler_svc.commands),
driven without the network: a real live engine (predict_completions off), real sessions, a real
journal, and the agents' part played by this test, which reports each launch's end at the time
the launch gives. After every translation, what the agents were told is what the engine runs."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysim.clusters import parse_cluster
from analysim.core.job import JobSpec, JobStatus
from analysim.simulation import RunOptions
from scheduler_svc.accounts import DecisionAccounts
from scheduler_svc.commands import CommandTranslator
from scheduler_svc.core import live_engine
from scheduler_svc.journal import Journal
from scheduler_svc.ledger import JobLedger
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.sessions import Placements, Session
from scheduler_svc.watch import EventFeed

JOBS = st.lists(st.tuples(st.integers(0, 500), st.integers(1, 2000), st.sampled_from([1, 2, 4])),
                min_size=1, max_size=25)
OPTIONS = st.sampled_from([RunOptions(), RunOptions(policy="srtf", preemption=True), RunOptions(migration=True),
                           RunOptions(policy="tiresias", preemption=True, migration=True)])


def _told_matches_engine(engine, placements: Placements, owner: dict[str, Session]) -> None:
    running = {j.job_id: j for j in engine.jobs.values() if j.status is JobStatus.RUNNING}
    assert set(placements.told) == set(running)
    for job_id, job in running.items():
        told = placements.told[job_id]
        assert told.token == job.completion_token
        holders = {owner[engine.node_names[n]] for n, _ in job.placement.gpus}
        assert set(told.sessions) == holders


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=JOBS, opts=OPTIONS)
def test_the_agents_are_told_exactly_what_the_engine_runs(jobs, opts: RunOptions) -> None:
    specs = [JobSpec(job_id=f"j{i}", submit_s=float(s), duration_s=float(d), num_gpus=g)
             for i, (s, d, g) in enumerate(sorted(jobs))]
    cluster = parse_cluster("4x4")
    engine, recorder = live_engine(cluster, opts, specs)
    owner = {n.name: Session(agent_id=f"agent-{i}", session_id=str(i), nodes=(n.name,), connected=True)
             for i, n in enumerate(cluster.nodes)}
    placements, ledger, metrics = Placements(), JobLedger(), SchedulerMetrics()
    with tempfile.TemporaryDirectory() as d:
        journal = Journal(Path(d) / "journal.db")
        journal.add_jobs(specs, "trace")
        accounts = DecisionAccounts(engine, recorder, metrics, journal, ledger, EventFeed(engine))
        translator = CommandTranslator(engine, owner, placements, accounts, first_launch_id=1 << 40)
        last_id, arrivals = 1 << 40, list(specs)
        while True:
            ends = sorted((p.end_s, p.launch_id, job_id) for job_id, p in placements.told.items())
            nxt = engine.next_event_time()
            t = min(math.inf if nxt is None else nxt, arrivals[0].submit_s if arrivals else math.inf,
                    ends[0][0] if ends else math.inf)
            if t == math.inf:
                break
            for end, _, job_id in ends:  # the agents' reports, in launch order within a time
                if end <= t:
                    engine.job_finished(job_id, at=end)
            while arrivals and arrivals[0].submit_s <= t:
                engine.submit(arrivals.pop(0), hold=True)
            engine.run(until=t)
            before = dict(placements.told)
            migrated = {d.job_id for d in engine.decisions[translator.seen:] if d.kind == "migrate"}
            for cmds in translator.collect().values():
                for cmd in cmds:
                    kind = cmd.WhichOneof("kind")
                    job = engine.jobs[cmd.migrate.target.job_id if kind == "migrate" else getattr(cmd, kind).job_id]
                    # Nothing goes out for a job that ended (its agents stopped it themselves), nor
                    # for one that runs where the agents were told it runs.
                    assert job.status is not JobStatus.COMPLETED
                    was = before.get(job.job_id)
                    assert not (job.status is JobStatus.RUNNING and was is not None
                                and was.token == job.completion_token)
                    launch = cmd.launch if cmd.HasField("launch") else cmd.migrate.target if cmd.HasField("migrate") \
                        else None
                    if launch is not None:  # each launch a new id, ending where the engine expects
                        # a job moved is told where to (its old agents too), unless they never knew it
                        assert (kind == "migrate") == (job.job_id in migrated and was is not None)
                        assert last_id < launch.launch_id <= translator.launch_seq
                        told = placements.get(launch.job_id)
                        assert told is not None and told.launch_id == launch.launch_id
                        assert launch.end_s == told.end_s
            last_id = translator.launch_seq
            _told_matches_engine(engine, placements, owner)
        journal.commit()
        assert all(j.status is JobStatus.COMPLETED for j in engine.jobs.values())
        assert ledger.terminal == len(specs) == journal.count(ended=True)
        assert ledger.started_ids == {s.job_id for s in specs}
        journal.close()
