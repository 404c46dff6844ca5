"""The simulation core, compiled to C by mypyc from the same Python source.

The modules below are what every pass, event and placement runs through; compiled, a simulation
runs about twice as fast with the same schedules (BENCHMARKS-HISTORY.md, "Seventh round"). The rest of the
package (readers, services, command line, sweeps) stays interpreted. Everything else about the
package is in pyproject.toml.

``ANALYSIM_PURE_PYTHON=1 pip install -e .`` builds nothing: the core then runs as plain Python,
which is what to use while editing the core without rebuilding it after every change (a compiled
module takes precedence over its .py file; ``make`` rebuilds when a core file changes).
"""

import os

from setuptools import setup

COMPILED = [
    "analysim/core/__init__.py",
    "analysim/core/backfill.py",
    "analysim/core/cluster.py",
    "analysim/core/control_plane.py",
    "analysim/core/cycle.py",
    "analysim/core/cycle_state.py",
    "analysim/core/engine.py",
    "analysim/core/events.py",
    "analysim/core/feasibility.py",
    "analysim/core/fragmentation.py",
    "analysim/core/framework.py",
    "analysim/core/hints.py",
    "analysim/core/interruptions.py",
    "analysim/core/job.py",
    "analysim/core/memos.py",
    "analysim/core/metrics.py",
    "analysim/core/node_views.py",
    "analysim/core/orders.py",
    "analysim/core/partition.py",
    "analysim/core/pass_streams.py",
    "analysim/core/placement.py",
    "analysim/core/queue_metrics.py",
    "analysim/core/ranked.py",
    "analysim/core/records.py",
    "analysim/core/scheduling_queue.py",
    "analysim/core/unschedulable.py",
    "analysim/core/scheduler.py",
    "analysim/core/rooms.py",
    "analysim/core/running_ends.py",
    "analysim/core/job_table.py",
    "analysim/core/tally.py",
    "analysim/core/quotas.py",
    "analysim/core/run_view.py",
    "analysim/core/ended_jobs.py",
    "analysim/core/figures.py",
    "analysim/core/gate.py",
    "analysim/core/sorted_keys.py",
    "analysim/core/victims.py",
    "analysim/core/plugins/__init__.py",
    "analysim/core/plugins/kueue.py",
    "analysim/core/plugins/kueue_bounds.py",
    "analysim/core/plugins/kueue_fair.py",
    "analysim/core/plugins/kueue_flavors.py",
    "analysim/core/plugins/kueue_preemption.py",
    "analysim/core/plugins/kueue_reasons.py",
    "analysim/core/plugins/kueue_room.py",
    "analysim/core/plugins/kueue_share.py",
    "analysim/core/plugins/kueue_state.py",
    "analysim/core/plugins/kueue_trial.py",
    "analysim/core/plugins/migration.py",
    "analysim/core/plugins/preemption.py",
    "analysim/core/plugins/queue.py",
    "analysim/core/plugins/score.py",
]


def _ext_modules() -> list:
    if os.environ.get("ANALYSIM_PURE_PYTHON", "") not in ("", "0"):
        return []
    from mypyc.build import mypycify

    return mypycify(COMPILED, opt_level="3", group_name="analysim_core")


setup(ext_modules=_ext_modules())
