"""What a job keeps of its work when it is stopped before its end, and what it pays to go on.

Three interruptions: a preemption (what it keeps is EngineConfig.preemption_cost), a node failure
(its last checkpoint: no warning, so no checkpoint of its own) and a move (a migration checkpoints
first, so it keeps everything). Each sets the job's remaining work, the overhead it pays at its
next start (restoring a checkpoint; nothing when it starts from zero) and the progress its last
checkpoint holds (``JobBook.checkpoint_work_s``, what a later failure rolls back to).
"""

from __future__ import annotations

import math

from analysim.core.job import JobRun
from analysim.core.records import EngineConfig, JobBook


def work_kept(done_s: float, checkpointed_s: float, interval_s: float | None) -> float:
    """The progress a job stopped without warning keeps: its last checkpoint, of those taken every
    ``interval_s`` of progress (None: none) and the one a preemption or move took."""
    if interval_s:
        return max(checkpointed_s, math.floor(done_s / interval_s) * interval_s)
    return checkpointed_s


def after_preemption(job: JobRun, book: JobBook, config: EngineConfig) -> None:
    cost = config.preemption_cost
    if cost == "keep":
        _checkpoint(job, book, config.restore_overhead_s)
    else:
        _roll_back(job, book, config, None if cost == "restart" else book.checkpoint_work_s)


def after_failure(job: JobRun, book: JobBook, config: EngineConfig) -> None:
    _roll_back(job, book, config, book.checkpoint_work_s)


def after_move(job: JobRun, book: JobBook, config: EngineConfig) -> None:
    _checkpoint(job, book, config.migration_overhead_s)


def _checkpoint(job: JobRun, book: JobBook, overhead_s: float) -> None:
    book.checkpoint_work_s = (job.spec.duration_s or 0.0) - job.remaining_s
    job.overhead_s = overhead_s


def _roll_back(job: JobRun, book: JobBook, config: EngineConfig, checkpointed_s: float | None) -> None:
    """Back to the last checkpoint (None: to the start), restoring it first if there is one."""
    duration = job.spec.duration_s or 0.0
    kept = 0.0 if checkpointed_s is None else work_kept(duration - job.remaining_s, checkpointed_s,
                                                        config.checkpoint_interval_s)
    book.checkpoint_work_s = kept
    job.remaining_s = duration - kept
    job.overhead_s = config.restore_overhead_s if kept > 0 else 0.0
