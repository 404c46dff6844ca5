"""What a run's recorder reads of the engine (analysim.core.metrics), and the hooks it is called at.

The recorder measures; it changes nothing. It sees what plugins see (framework.Handle) plus the
jobs table, the allocation's tally and the queue, read only. A class, not a typing.Protocol, for
the reason Handle gives; the engine is the one implementation.
"""

from __future__ import annotations

from typing import Protocol

from mypy_extensions import mypyc_attr

from analysim.core.framework import Handle
from analysim.core.job import JobRun
from analysim.core.job_table import JobTable
from analysim.core.scheduling_queue import SchedulingQueue
from analysim.core.tally import Tally


@mypyc_attr(allow_interpreted_subclasses=True)
class RunView(Handle):
    table: JobTable  # every job submitted and not forgotten (read only)
    tally: Tally  # what the running jobs hold (read only, but for the recorder's take_touched)
    squeue: SchedulingQueue  # the pending jobs (read only)

    def guaranteed_gpus(self, vc: str) -> float | None:
        """GPUs a VC can count on: its quota, or its dedicated nodes' GPUs; None without either."""
        raise NotImplementedError


class Recorder(Protocol):
    """What the engine reports to as time passes (see analysim.core.metrics)."""

    def advance(self, engine: RunView, t: float) -> None: ...

    def after_pass(self, engine: RunView) -> None: ...

    def job_ended(self, engine: RunView, job: JobRun) -> None: ...
