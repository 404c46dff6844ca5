"""How a live run is served: the service's flags (``python -m scheduler_svc serve``) as the
scheduler takes them, in one value rather than a dozen arguments."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LiveSettings:
    """The settings of one live run; none changes while it runs (the speed is where it starts)."""

    # Virtual seconds per wall second at the start (--speed); None: lockstep (--speed max).
    speed: float | None = None
    # Where the trace came from (the journal's identity of the run, the summary's "trace").
    trace_source: str = ""
    # Trace jobs the loader dropped before the run, by reason (the summary's jobs_filtered).
    trace_filtered: dict[str, int] | None = None
    # Wall seconds without a message after which an agent is lost (--heartbeat-deadline).
    heartbeat_deadline_s: float = 5.0
    # The folder the run's end is written to, as analysim simulate writes it (--out); None: none.
    out: Path | None = None
    # Plots too in --out (--plots).
    plots: bool = False
    # Compare the ended replay with its offline run (the summary's fidelity; --no-offline-check).
    offline_check: bool = True
    # Paced: wall seconds an event waits before it is taken up, in [0, 10] (--paced-lag).
    paced_lag_s: float = 0.0
    # The events CSV written as the engine decides (--events); None: none.
    events: Path | None = None
