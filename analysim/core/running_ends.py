"""The running jobs by expected end, kept for EASY backfilling's reservations."""

from __future__ import annotations

from sortedcontainers import SortedList  # type: ignore[import-untyped, import-not-found]

from analysim.core.job import JobRun


class RunningEnds:
    """Running jobs by expected end, (end, GPUs, seq), globally and per dedicated VC: the shadow
    time is found by walking the earliest ends, not by sorting every running job.

    Invariant: every running job has exactly one entry in ``every`` (and one in its VC's list if
    its VC has dedicated nodes), with its current expected end."""

    def __init__(self, dedicated: set[str]) -> None:
        self.dedicated = dedicated  # VCs with nodes of their own: their jobs also go in of_vc
        self.every = SortedList()  # (expected end, GPUs, seq) of every running job
        self.of_vc: dict[str, SortedList] = {}  # dedicated VC -> the same, for its running jobs

    def add(self, job: JobRun, end: float) -> None:
        entry = (end, job.spec.gpu_demand, job.seq)
        self.every.add(entry)
        if job.spec.vc in self.dedicated:
            self.of_vc.setdefault(job.spec.vc, SortedList()).add(entry)

    def remove(self, job: JobRun, end: float) -> None:
        entry = (end, job.spec.gpu_demand, job.seq)
        self.every.remove(entry)
        if job.spec.vc in self.dedicated:
            self.of_vc[job.spec.vc].remove(entry)
