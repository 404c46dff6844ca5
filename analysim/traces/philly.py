"""Microsoft Philly per-job extract (the Pollux artifact's philly.csv).

Header ``timestamp,duration,num_gpus,gpu_time,cluster``. Rows are not sorted; submit times count from
the earliest timestamp. ``cluster`` is the virtual cluster. ``gpu_time`` is duration × num_gpus, so it
is redundant and not read. Job ids are ``philly-<i>``, i the 0-based data row in file order. Jobs
asking for no GPU would be left out and counted as ``cpu_only`` (the extract has none).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from analysim.core.job import MAX_COUNT, MAX_TIME_S, JobSpec
from analysim.traces.base import CsvInput, Row, TraceFormat

FORMAT = "philly"
COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")
_EPOCH = datetime(1970, 1, 1)


def _open(path: str | Path) -> CsvInput:
    return CsvInput(path, FORMAT, COLUMNS)


def _rows(src: CsvInput) -> Iterator[Row]:
    i_t, i_d, i_g, i_vc = (src.index[c] for c in COLUMNS)
    parse_time = datetime.fromisoformat
    shared = src.shared
    # The whole file is 82k rows: conversions are inlined, and the slow, careful field parsers
    # only run to explain a row that failed the quick path.
    for i, (line, row) in enumerate(src.rows()):
        try:
            ts = row[i_t]
            if len(ts) != 19:
                raise ValueError
            t = (parse_time(ts) - _EPOCH).total_seconds()
            d = float(row[i_d])
            g = int(row[i_g])
            if not (0.0 <= d <= MAX_TIME_S and 0 <= g <= MAX_COUNT):
                raise ValueError
        except ValueError:
            t = src.time_field(row, "timestamp", line)
            d = src.float_field(row, "duration", line)
            g = src.int_field(row, "num_gpus", line)
        yield line, t, JobSpec(f"philly-{i}", t, d, g, 1000, 0, 0, shared(row[i_vc])) if g > 0 else "cpu_only"


READER = TraceFormat(FORMAT, _open, _rows, rebase=True, reasons=("cpu_only",))
