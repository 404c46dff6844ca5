"""The end of a replay: once every job has ended, the summary (compared with the offline run of
the same inputs), the events file closed and the run written to --out. A client's job after the
end opens the run again; it ends (and is written) again when that job has ended."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from analysim.events import EventsCsv
from scheduler_svc.agents import Agents
from scheduler_svc.pace import Pace
from scheduler_svc.read_model import LiveView
from scheduler_svc.settings import LiveSettings
from scheduler_svc.summary import build_summary, fidelity
from scheduler_svc.watch import EventFeed

log = logging.getLogger("scheduler_svc")


class RunEnd:
    """Whether the replay has ended, and what it ended with."""

    def __init__(self, settings: LiveSettings, events: EventsCsv | None, pace: Pace, agents: Agents,
                 feed: EventFeed) -> None:
        self.settings = settings  # --out, --plots, whether to compare with the offline run
        self.events = events  # the open --events file; None when not asked for or once closed
        self.pace = pace  # the wall time the replay ended is the clock's
        self.agents = agents  # the watchdog is paused during the offline comparison
        self.feed = feed  # "done" to the watchers
        self.done = False  # the replay has ended and its summary is written (until a client job reopens it)
        self.finishing = False  # the replay's end is being written (set before ``done``, cleared with it)
        self.summary: dict | None = None  # the summary of the latest end; None before the first
        self.fidelity: dict | None = None  # the comparison with the offline run, made once (the trace's does not change)
        self.out_error: str | None = None  # why the run's end could not be written to --out (it then takes no jobs)

    @property
    def writing_out(self) -> bool:
        """The replay's end is being written to --out: a submission now waits (UNAVAILABLE)."""
        return self.finishing and not self.done

    def reopen(self) -> None:
        """A job after the end: the run is open again, and --out is written again when it ends."""
        if self.done:
            self.done = self.finishing = False

    def check(self, replay_done: bool, view: LiveView, commit: Callable[[], None]) -> None:
        """At the replay's end: commit, then write its end (in a task of the loop)."""
        if self.done or not replay_done or self.finishing:
            return
        self.finishing = True
        self.pace.ended()
        commit()
        asyncio.get_running_loop().create_task(self._finish(view))

    async def _finish(self, view: LiveView) -> None:
        summary = build_summary(view)
        await self._compare(view, summary)
        if self.events is not None:
            self.events.pending()
            self.events.close(ok=True)
            self.events = None
        if self.settings.out is not None:
            await self._write_out(view, summary)
        self.summary = summary
        self.done = True
        self.feed.publish("done", "", (), f"{summary['jobs_completed']} completed")
        log.info("replay done: %d jobs completed, %d failed, %d cancelled in %.1f s wall (x%.0f)",
                 summary["jobs_completed"], summary["jobs_failed"], summary["jobs_cancelled"],
                 summary["wall_s"], summary["live"]["speedup"])

    async def _compare(self, view: LiveView, summary: dict) -> None:
        """The summary's fidelity: the offline run of the same inputs, made once."""
        if self.fidelity is not None:
            summary["fidelity"] = self.fidelity
        elif self.settings.offline_check and view.offline_input:
            with self.agents.watchdog_paused():  # the comparison holds the GIL for a while
                summary["fidelity"] = self.fidelity = await asyncio.to_thread(fidelity, view)

    async def _write_out(self, view: LiveView, summary: dict) -> None:
        from analysim.report import write_run

        out = self.settings.out
        try:
            await asyncio.to_thread(write_run, out, summary, view.recorder.jobs, view.recorder.timeseries(),
                                    self.settings.plots)
        except Exception as e:  # noqa: BLE001 — whatever the writer raises, the run still ends
            self.out_error = f"cannot write the run's end to --out {out}: {e}"
            log.error("%s; the run is done without it, and takes no more jobs", self.out_error)
            summary["out_error"] = self.out_error

    def stop(self) -> None:
        if self.events is not None:  # (stopped before the replay's end: no events file, as no jobs.csv)
            self.events.close(ok=False)
            self.events = None
