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
