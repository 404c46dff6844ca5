"""Time to read the real Philly trace (82,247 jobs) into canonical jobs: the median of 5 loads.
(A test once asserted "under 3 s"; speed belongs here, not in the test suite.)

    .venv/bin/python bench/bench_trace_load.py

Skips cleanly when ../shared/traces is absent.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from analysim.traces import load_trace

PHILLY = Path(__file__).resolve().parents[2] / "shared" / "traces" / "philly.csv"


def main() -> int:
    if not PHILLY.exists():
        print(f"skipped: {PHILLY} absent")
        return 0
    times = []
    for _ in range(5):
        start = time.perf_counter()
        jobs = len(load_trace(PHILLY, "philly").jobs)
        times.append(time.perf_counter() - start)
    print(f"philly.csv: {jobs} jobs, median load {statistics.median(times):.2f} s of 5 "
          f"(min {min(times):.2f}); load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
