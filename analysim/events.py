"""The events file (``--events FILE``): every decision of a run, one CSV row each, written as the
engine makes it (so that a run of millions of jobs holds none of them), and at the end one row per
job still pending with the reason it waits. docs/kueue.md describes the columns.

    with EventsCsv(path) as events:
        result = simulation.run(..., event_sinks=[events])  # (attach, then pending at the end)
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING

from analysim.core.job import JobRun, JobStatus
from analysim.core.partition import GPU
from analysim.core.placement import can_place
from analysim.core.plugins.kueue import KueueAdmission, KueueQueue
from analysim.core.plugins.kueue_reasons import amount_text, pending_reason
from analysim.report import _fmt

if TYPE_CHECKING:
    from analysim.core.engine import Engine
    from analysim.core.plugins.kueue import KueueState
    from analysim.core.records import Decision

EVENTS_FILE = "events.csv"  # its name in a folder of runs (analysim compare --events)
EVENT_FIELDS = ("time_s", "event", "job_id", "queue", "flavors", "borrowed_gpus", "nodes", "preemptor",
                "preemptor_queue", "reason", "detail")
# The engine's decision kinds as the file names them.
EVENT_OF = {"launch": "admit", "resume": "admit", "preempt": "evict", "migrate": "migrate", "requeue": "requeue",
            "complete": "complete", "fail": "fail", "cancel": "cancel"}


def kueue_state(engine: Engine) -> KueueState | None:
    """The run's Kueue state (its quota tree and queues) under a partition, else None."""
    admission = engine.policy.admission
    return admission.state if isinstance(admission, KueueAdmission) else None


class EventsCsv:
    """Writes the events file of one engine's run: a row per decision as it is made (the engine's
    ``Engine.decision_log``), to ``FILE.partial``, renamed to FILE when the run ends well."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.engine: Engine | None = None  # the run's (attach)
        self.kueue: KueueState | None = None  # None: the VC model (queue is the job's VC)
        self._partial = path.with_name(path.name + ".partial")  # written while the run goes
        self._file = None  # the open .partial (open)
        self._writer = None  # its csv writer; _Nowhere once closed

    def __enter__(self) -> EventsCsv:
        self.open()
        return self

    def __exit__(self, et: object, ev: object, tb: object) -> None:
        self.close(ok=et is None)

    def open(self) -> None:
        """Start the file (its header), as ``with`` does."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self._partial.open("w", newline="")
        self._writer = csv.writer(self._file, lineterminator="\n")
        self._writer.writerow(EVENT_FIELDS)

    def close(self, ok: bool) -> None:
        """Finish the file: in place when the run ended well (``ok``), else removed. Decisions made
        after (a live run opened again by a client's job) go nowhere."""
        self._file.close()
        self._writer = _Nowhere()
        if ok:
            self._partial.replace(self.path)
        else:
            self._partial.unlink(missing_ok=True)

    def attach(self, engine: Engine) -> None:
        """Write the decisions of this engine from now on."""
        self.engine = engine
        self.kueue = kueue_state(engine)
        engine.decision_log.add(self.decided)

    def decided(self, d: Decision) -> None:
        job = self.engine.jobs[d.job_id]
        event = EVENT_OF[d.kind]
        flavors = borrowed = ""
        if event == "admit" and self.kueue is not None:
            flavors, borrowed = admitted_on(self.kueue, d.job_id)
        self._writer.writerow((_fmt(d.time), event, d.job_id, queue_in(self.kueue, job.spec.vc), flavors, borrowed,
                               ";".join(d.nodes), d.preemptor, d.by, d.reason, ""))

    def pending(self) -> None:
        """A row per job still pending, with the reason it waits (kueue_reasons), in submit order."""
        engine = self.engine
        waiting = sorted((j for j in engine.jobs.values() if j.status is JobStatus.PENDING),
                         key=lambda j: (j.spec.submit_s, j.job_id))
        for job in waiting:
            code, detail = why_pending(engine, job)
            self._writer.writerow((_fmt(engine.now), "pending", job.job_id, queue_in(self.kueue, job.spec.vc), "", "", "",
                                   "", "", code, detail))


class _Nowhere:
    """A csv writer that writes nothing: an events file's after it is closed."""

    def writerow(self, row: object) -> None:
        pass


def queue_in(state: KueueState | None, vc: str) -> str:
    """A job's queue: its ClusterQueue under a partition (``state``), its VC without."""
    return vc if state is None else state.partition.nodes[state.queue_of[vc]].name


def admitted_on(state: KueueState, job_id: str) -> tuple[str, str]:
    """A running job's flavors (``resource=flavor;...``) and the GPUs of it its ClusterQueue holds
    past its nominal quota: per GPU flavor it is charged, the smaller of its charge and the
    queue's usage past its nominal quota (QuotaTree.borrowing), summed."""
    q, charges = state.held[job_id]
    tree = state.tree
    borrowed = sum(min(amount, tree.borrowing(q, fr)) for fr, amount in charges if fr[1] == GPU)
    return ";".join(f"{r}={f}" for (f, r), _ in charges), amount_text(borrowed, GPU)


def why_pending(engine: Engine, job: JobRun) -> tuple[str, str]:
    """Why a pending job waits now: (code, sentence). Under a partition, Kueue's reason
    (kueue_reasons.pending_reason); in the VC model, its VC's quota or the nodes."""
    state = kueue_state(engine)
    if state is not None:
        queue = engine.policy.queue
        return pending_reason(state, queue if isinstance(queue, KueueQueue) else None, job)
    return vc_pending_reason(engine, job)


def vc_pending_reason(engine: Engine, job: JobRun) -> tuple[str, str]:
    """The VC model's reason a pending job waits: its VC is at its quota and may not borrow, the
    nodes open to it have no room for it now, or they have and the queue ranks other jobs first."""
    spec = engine.spec
    vc = spec.vc(job.spec.vc)
    demand = job.spec.gpu_demand
    if vc is not None and vc.quota_gpus is not None and not spec.allow_borrowing:
        used = engine.state.vc_used.get(vc.name, 0.0)
        if used + demand > vc.quota_gpus:
            return "vc_quota", (f"VC {vc.name} uses {used:g} of its {vc.quota_gpus:g} GPUs and may not borrow: "
                                f"{demand:g} more would exceed its quota")
    if can_place(engine, job.spec, engine.static_mask(job.spec), engine.state):
        return "queue_order", (f"the nodes open to VC {job.spec.vc} have room for it, but the queue "
                               f"({engine.policy.queue.name}) runs the jobs it ranks first")
    return "no_node_room", f"no node open to VC {job.spec.vc} has room for {demand:g} GPUs now"
