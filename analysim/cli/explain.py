"""``analysim explain``: why a job of a run waited, when it was admitted and on what, why it was
evicted, from the run's outputs (its events file); with ``--at`` why it was pending then; with
``--server`` why a job of a running replay is pending now."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import TYPE_CHECKING

from analysim.argtypes import seconds
from analysim.cli.submit import add_credentials, connect, refusal
from analysim.errors import UserError

if TYPE_CHECKING:
    from analysim.core.engine import Engine

HELP = "why a job of a run waited, was admitted or evicted"
DESCRIPTION = ("Answer, from OUT_DIR (an `analysim simulate --events FILE` run), when JOB_ID was admitted (flavors, "
               "GPUs borrowed), why it was evicted and by whom, and with --at SECONDS why it was pending then "
               "(the run is replayed up to that time). With --scheduler HOST:PORT, ask a running scheduler why JOB_ID is "
               "pending now. docs/kueue.md, 'Explaining a run'.")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help=HELP, description=DESCRIPTION)
    p.add_argument("target", nargs="+", metavar="OUT_DIR JOB_ID",
                   help="the run's output folder and the job (with --scheduler: the job alone)")
    p.add_argument("--at", type=seconds, metavar="SECONDS", help="the virtual time to explain the job at")
    p.add_argument("--scheduler", metavar="HOST:PORT",
                   help="a running scheduler service to ask instead of a run's outputs (as analysim status)")
    add_credentials(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.scheduler is not None:
        if len(args.target) != 1 or args.at is not None:
            raise UserError("--scheduler: give the job id alone (the scheduler answers for its present time)")
        print(explain_live(args, args.target[0]))
        return 0
    if len(args.target) != 2:
        raise UserError("give OUT_DIR and JOB_ID")
    out, job_id = Path(args.target[0]), args.target[1]
    for line in explain(out, job_id, args.at):
        print(line)
    return 0


def explain_live(args: argparse.Namespace, job_id: str) -> str:
    """The running scheduler's answer (ExplainJob) in one line."""
    import grpc

    from analysim._protos.v1 import scheduler_pb2 as spb
    from scheduler_svc.contract import word

    with connect(args) as c:
        try:
            r = c.explain(job_id)
        except grpc.RpcError as e:
            raise UserError(f"{args.scheduler}: {refusal(e)}") from None
    status = word(spb.JobStatus, r.status)
    why = f": {r.reason}: {r.detail}" if r.reason else ""
    return f"{job_id} ({r.queue}) at {_s(r.time_s)}: {status}{why}"


def read_run(out: Path) -> tuple[dict, Path]:
    """A run's summary and its events file; a UserError naming what is missing."""
    summary_path = out / "summary.json"
    if not summary_path.is_file():
        raise UserError(f"{out}: no summary.json: not the output folder of a run")
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{summary_path}: cannot read: {e}") from None
    recorded = summary.get("events")
    if not isinstance(recorded, dict) or not isinstance(recorded.get("file"), str):
        raise UserError(f"{summary_path}: the run wrote no events file (run analysim simulate with --events FILE)")
    events = out / recorded["file"]  # (an absolute path stays itself)
    if not events.is_file():
        raise UserError(f"{events}: the run's events file is gone")
    return summary, events


def explain(out: Path, job_id: str, at: float | None) -> list[str]:
    """The answer's lines."""
    summary, events_path = read_run(out)
    with events_path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["job_id"] == job_id]
    submit = _submit_time(out, job_id)
    if submit is None and not rows:
        raise UserError(f"{out}: no job {job_id!r} in this run")
    end = summary.get("makespan_s")
    if at is not None and end is not None and at > end:
        raise UserError(f"--at {at:g}: outside the run, which ends at {_s(end)}")
    lines = [f"{job_id}: submitted at {_s(submit)}" if submit is not None else job_id,
             *(_line(r) for r in rows if at is None or float(r["time_s"]) <= at)]
    if at is None:
        return lines
    if submit is not None and at < submit:
        return [f"{job_id}: not submitted yet at {_s(at)} (submitted at {_s(submit)})"]
    last = next((r for r in reversed(rows) if float(r["time_s"]) <= at and r["event"] != "pending"), None)
    if last is not None and last["event"] in ("admit", "migrate"):
        return [*lines, f"at {_s(at)}: running"]
    if last is not None and last["event"] in ("complete", "fail", "cancel"):
        return [*lines, f"at {_s(at)}: ended"]
    code, detail = pending_at(summary, job_id, at)
    return [*lines, f"at {_s(at)}: pending: {code}: {detail}"]


def _s(t: float) -> str:
    """A virtual time in seconds, as the events file writes it but without a trailing .0."""
    return f"{t:.0f} s" if t == int(t) else f"{t!r} s"


def _submit_time(out: Path, job_id: str) -> float | None:
    jobs = out / "jobs.csv"
    if not jobs.is_file():
        return None
    with jobs.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["job_id"] == job_id:
                return float(row["submit_s"])
    return None


def _line(r: dict) -> str:
    """One event of the job, in words."""
    t, event = _s(float(r["time_s"])), r["event"]
    if event == "admit":
        on = f" on {r['flavors']}" if r["flavors"] else ""
        borrowed = f", borrowing {r['borrowed_gpus']} GPUs" if r["borrowed_gpus"] not in ("", "0") else ""
        return f"{t}: admitted to {r['queue']}{on}{borrowed} (nodes {r['nodes'].replace(';', ', ')})"
    if event == "evict":
        return (f"{t}: evicted ({r['reason'] or 'no reason recorded'}) to make room for {r['preemptor']} of "
                f"{r['preemptor_queue']}")
    if event == "migrate":
        why = f" ({r['reason']}" + (f", for {r['preemptor']})" if r["preemptor"] else ")") if r["reason"] else ""
        return f"{t}: moved to {r['nodes'].replace(';', ', ')}{why}"
    if event == "pending":
        return f"{t}: still pending at the end of the run: {r['reason']}: {r['detail']}"
    return f"{t}: {event}" + (f" on {r['nodes'].replace(';', ', ')}" if r["nodes"] else "")


class _Probe:
    """An event sink (simulation.EventSink) that, when the run stops, asks why one job is pending."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id  # the job asked about
        self.engine: Engine | None = None  # the replay's (attach)
        self.answer: tuple[str, str] | None = None  # (code, sentence) when the job was pending at the end

    def attach(self, engine: Engine) -> None:
        self.engine = engine

    def pending(self) -> None:
        from analysim.core.job import JobStatus
        from analysim.events import why_pending

        job = self.engine.jobs.get(self.job_id)
        if job is not None and job.status is JobStatus.PENDING:
            self.answer = why_pending(self.engine, job)


def pending_at(summary: dict, job_id: str, at: float) -> tuple[str, str]:
    """Why a job was pending at ``at``: the run replayed (deterministic) up to that time, then
    asked the one reason function (analysim.events.why_pending)."""
    from analysim.cli.common import load_inputs, run_options
    from analysim.cli.simulate import simulate_namespace
    from analysim.simulation import run

    recorded = summary["events"].get("args")
    if not isinstance(recorded, dict):
        raise UserError("--at: the run did not record the options that replay it (analysim compare's runs do not): "
                        "run it with analysim simulate --events FILE")
    args = simulate_namespace(recorded)
    trace, cluster = load_inputs(args)
    probe = _Probe(job_id)
    try:
        run(trace.jobs, cluster, run_options(args, args.policy, args.placement), trace_filtered=trace.filtered,
            event_sinks=[probe], until=at)
    except ValueError as e:
        raise UserError(str(e)) from None
    if probe.answer is None:
        raise UserError(f"{job_id}: not pending at {_s(at)} in the replayed run")
    return probe.answer
