"""What the summary needs of every ended job, kept as flat arrays (about 65 bytes a job)."""

from __future__ import annotations

from array import array

import numpy as np

from analysim.core.job import JobStatus

_STATUSES = tuple(s.value for s in JobStatus)


class EndedJobs:
    """What the summary needs of every ended job, as flat arrays in the order the jobs ended
    (about 65 bytes a job, not a row dict): status, VC, JCT, wait, queueing, slowdown and counts."""

    def __init__(self) -> None:
        self.status = array("b")  # index of its JobStatus value in _STATUSES
        self.vc = array("l")  # index of its VC in vc_names
        self.vc_names: list[str] = []  # the VCs, in the order their first job ended
        self._vc_index: dict[str, int] = {}  # VC -> its index in vc_names
        self.jct = array("d")  # seconds from submission to end
        self.wait = array("d")  # seconds from submission to first start
        self.queue = array("d")  # seconds spent pending, over every wait (requeues included)
        self.slowdown = array("d")  # JCT over the run time it needed
        self.preemptions = array("q")  # times evicted
        self.migrations = array("q")  # times moved
        self.restarts = array("q")  # times restarted after a node failure
        self._rows: list[np.ndarray] = []  # per VC (by index), its rows, as of ``_rows_count`` (rows_of)
        self._rows_count = -1  # the jobs ended when ``_rows`` was made (-1: not made yet)

    def add(self, row: dict) -> None:
        self.status.append(_STATUSES.index(row["status"]))
        vc = self._vc_index.get(row["vc"])
        if vc is None:
            vc = self._vc_index[row["vc"]] = len(self.vc_names)
            self.vc_names.append(row["vc"])
        self.vc.append(vc)
        self.jct.append(row["jct_s"])
        self.wait.append(row["wait_s"])
        self.queue.append(row["queue_s"])
        self.slowdown.append(row["slowdown"])
        self.preemptions.append(row["preemptions"])
        self.migrations.append(row["migrations"])
        self.restarts.append(row["restarts"])

    def __len__(self) -> int:
        return len(self.status)

    def column(self, name: str) -> np.ndarray:
        values = getattr(self, name)
        return np.frombuffer(values, dtype=np.dtype(values.typecode)) if len(values) else np.zeros(0)

    def status_is(self, status: JobStatus) -> np.ndarray:
        return self.column("status") == _STATUSES.index(status.value)

    def rows_of(self, vc: str) -> np.ndarray:
        """The rows of a VC's jobs, in the order they ended (none for a VC none of whose jobs
        ended). Grouped once for every VC: a summary asks for each of thousands of queues."""
        if self._rows_count != len(self.vc):
            codes = self.column("vc")
            order = np.argsort(codes, kind="stable")  # (rows ascending within each VC)
            cuts = np.searchsorted(codes[order], np.arange(len(self.vc_names) + 1))
            self._rows = [order[cuts[v]:cuts[v + 1]] for v in range(len(self.vc_names))]
            self._rows_count = len(self.vc)
        v = self._vc_index.get(vc)
        return self._rows[v] if v is not None else np.zeros(0, dtype=np.intp)
