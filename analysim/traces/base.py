"""The Trace record and the CSV plumbing every reader shares: opening, header checks, row
iteration with editor line numbers, and field parsers whose errors name the line and column."""

from __future__ import annotations

import csv
import gc
import math
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from pathlib import Path
from types import TracebackType
from typing import IO, NamedTuple, TypeVar

import numpy as np

from analysim.core.job import MAX_COUNT, MAX_TIME_S, JobSpec
from analysim.errors import InputFileError, UserError

_EPOCH = datetime(1970, 1, 1)
T = TypeVar("T")


@dataclass(slots=True)
class Trace:
    """A loaded trace. ``jobs`` are sorted by (submit_s, order in the file); ``filtered`` counts the
    rows a reader left out, by reason, so that nothing is dropped silently."""

    jobs: list[JobSpec]
    source: str
    format: str
    filtered: dict[str, int] = field(default_factory=dict)
    # job id -> when the cluster the trace was taken from admitted the job, on the trace's clock
    # (formats that record it: kueue-workloads, and canonical's optional column); what
    # ``analysim fidelity`` compares a replay's admissions with. Empty: not recorded.
    recorded_admit_s: dict[str, float] = field(default_factory=dict)


def make_trace(jobs: list[JobSpec], source: str, fmt: str, filtered: dict[str, int]) -> Trace:
    jobs.sort(key=attrgetter("submit_s"))  # stable: ties keep file order
    return Trace(jobs, source, fmt, {k: v for k, v in filtered.items() if v})


Row = tuple[int, "float | None", "JobSpec | str"]
"""What a format's row parser gives per data row: (line, origin time, job or reason). The job's
``submit_s`` is on the file's own clock; a str instead of a job is the reason the row is left out
(counted under it). The origin time is the row's time if it counts toward the trace's time origin
(formats whose submit times count from the earliest one), else None."""


class TraceFormat(NamedTuple):
    """One trace format: how to open its CSV and parse its rows."""

    name: str
    open: Callable[[str | Path], CsvInput]
    rows: Callable[[CsvInput], Iterator[Row]]
    rebase: bool = False  # submit times count from the earliest origin time of the file
    unique_ids: bool = False  # a job id may appear only once in the file
    reasons: tuple[str, ...] = ()  # why rows are left out, in the order ``filtered`` lists them


class TraceScan:
    """One pass over a trace file, row by row, holding no job it has handed out.

    Iterating gives the jobs in file order, with ``submit_s`` on the file's own clock (subtract
    ``origin`` for the trace's). With ``limit``, the pass stops after that many jobs, or, should a
    job come before ``limit`` with an earlier submit time than the one before it, at that job
    (``unsorted_line`` then says where): the first ``limit`` jobs of a file sorted by submit time
    are the first ``limit`` of its rows. After the pass: ``filtered`` counts the rows left out by
    reason; ``origin`` is the time origin; job ids were checked to be unique among the rows read.
    """

    def __init__(self, fmt: TraceFormat, path: str | Path, *, limit: int | None = None,
                 drop_cpu_only: bool = False) -> None:
        self.fmt, self.path, self.limit, self.drop_cpu_only = fmt, path, limit, drop_cpu_only
        self.filtered: Counter[str] = Counter()
        self.origin = 0.0
        self.unsorted_line: int | None = None
        self.jobs = 0
        self.recorded_admit_s: dict[str, float] = {}  # the reader's record (CsvInput's), on the file's clock

    def counts(self) -> dict[str, int]:
        """``filtered`` in the format's order of reasons (then cpu_only, if dropped)."""
        order = {r: i for i, r in enumerate(self.fmt.reasons)}
        return {r: self.filtered[r] for r in sorted(self.filtered, key=lambda r: order.get(r, len(order)))}

    def __iter__(self) -> Iterator[JobSpec]:
        fmt, limit, drop = self.fmt, self.limit, self.drop_cpu_only
        origin, last = math.inf, -math.inf
        # Ids are checked by their 64-bit hashes (8 bytes a job, not a set of strings): a repeated
        # hash is then looked up in the file for the real duplicate, if any.
        hashes = array("q") if fmt.unique_ids else None
        line = 0
        with fmt.open(self.path) as src:
            for line, t, item in fmt.rows(src):
                if t is not None and t < origin:
                    origin = t
                if type(item) is str:
                    self.filtered[item] += 1
                    continue
                if hashes is not None:
                    hashes.append(hash(item.job_id))
                if drop and item.num_gpus == 0:
                    self.filtered["cpu_only"] += 1
                    continue
                if limit is not None:
                    if item.submit_s < last:
                        self.unsorted_line = line
                        break
                    last = item.submit_s
                self.jobs += 1
                yield item
                if self.jobs == limit:
                    break
            self.recorded_admit_s = src.recorded_admit_s
        if fmt.rebase and origin != math.inf:
            self.origin = origin
        if hashes is not None and len(hashes) > 1 and self.unsorted_line is None:  # (else read again)
            _check_unique_ids(fmt, self.path, hashes, line)


def _check_unique_ids(fmt: TraceFormat, path: str | Path, hashes: array, last_line: int) -> None:
    """Raise the error of the first repeated job id in the file up to ``last_line``, if any."""
    h = np.sort(np.frombuffer(hashes, dtype=np.int64))
    repeated = set(h[1:][h[1:] == h[:-1]].tolist())
    if not repeated:
        return
    first: dict[str, int] = {}
    with fmt.open(path) as src:
        for line, _, item in fmt.rows(src):
            if line > last_line:
                break
            if type(item) is str or hash(item.job_id) not in repeated:
                continue
            if item.job_id in first:
                raise src.error(line, "job_id", f"duplicate job id {item.job_id!r} (first on line {first[item.job_id]})")
            first[item.job_id] = line


def shifted(jobs: list[JobSpec], origin: float) -> list[JobSpec]:
    """The jobs with ``origin`` subtracted from their submit times, changed in place: the specs
    were made by the reader a moment ago and nothing else holds them (no second object a job)."""
    if origin:
        set_attr = object.__setattr__  # JobSpec is frozen for its users, not for its maker
        for j in jobs:
            set_attr(j, "submit_s", j.submit_s - origin)
    return jobs


def read_trace(fmt: TraceFormat, path: str | Path, *, limit: int | None = None,
               drop_cpu_only: bool = False) -> Trace:
    """The trace in a file, its jobs sorted by submit time (ties in file order). With ``limit``:
    its first ``limit`` jobs, read from the top of a file sorted by submit time (the rest is not
    read, nor checked); on a file that is not sorted before the limit, the whole file is read."""
    scan = TraceScan(fmt, path, limit=limit, drop_cpu_only=drop_cpu_only)
    jobs = list(scan)
    if scan.unsorted_line is not None:
        scan = TraceScan(fmt, path, drop_cpu_only=drop_cpu_only)
        jobs = list(scan)
    trace = make_trace(shifted(jobs, scan.origin), str(path), fmt.name, scan.counts())
    if limit is not None:
        del trace.jobs[limit:]
    if scan.recorded_admit_s:
        recorded = scan.recorded_admit_s
        trace.recorded_admit_s = {j.job_id: recorded[j.job_id] - scan.origin
                                  for j in trace.jobs if j.job_id in recorded}
    return trace


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building a trace: 10^5 new JobSpecs trigger repeated
    full collections that find nothing (the records hold no cycles) yet add up to a noticeable share
    of the load time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def read_header(path: str | Path) -> list[str]:
    """The header line's column names (used by format detection)."""
    with CsvInput(path, "trace", ()) as src:
        return list(src.header)


class CsvInput:
    """A CSV file opened for a reader: ``with CsvInput(path, fmt, required, optional) as src``.

    Column names not in ``required`` or ``optional`` are allowed (ignored) unless ``strict``.
    """

    def __init__(
        self,
        path: str | Path,
        fmt: str,
        required: Iterable[str],
        optional: Iterable[str] = (),
        strict: bool = False,
    ) -> None:
        self.path = str(path)
        self.fmt = fmt
        self.required = tuple(required)
        self.optional = tuple(optional)
        self.strict = strict
        self._file: IO[str] | None = None
        self.header: list[str] = []
        self.index: dict[str, int] = {}
        self._shared: dict = {}
        # job id -> recorded admission time (file's clock), filled by formats that carry one
        self.recorded_admit_s: dict[str, float] = {}

    def __enter__(self) -> CsvInput:
        p = Path(self.path)
        if not p.exists():
            raise UserError(f"{self.path}: no such file")
        if p.is_dir():
            raise UserError(f"{self.path}: is a directory, expected a {self.fmt} CSV file")
        try:
            # utf-8-sig: spreadsheets often prepend a byte-order mark to the header
            self._file = p.open(newline="", encoding="utf-8-sig")
        except OSError as e:
            raise UserError(f"{self.path}: cannot open: {e.strerror}") from None
        self._reader = csv.reader(self._file)
        try:
            first = self._next()
            while first is not None and not first:
                first = self._next()
        except BaseException:
            self._file.close()
            raise
        if first is None:
            self._file.close()
            raise UserError(f"{self.path}: empty file, expected a {self.fmt} CSV header line")
        self.header = [h.strip() for h in first]
        self.header_line = self._reader.line_num
        self.index = {h: i for i, h in enumerate(self.header)}
        missing = [c for c in self.required if c not in self.index]
        problem = ""
        if missing:
            problem = f"missing column(s) {', '.join(missing)} for the {self.fmt} format"
        elif self.strict:
            known = set(self.required) | set(self.optional)
            unknown = [c for c in self.header if c not in known]
            if unknown:
                problem = f"unknown column(s) {', '.join(unknown)} for the {self.fmt} format"
        if not problem and len(self.index) != len(self.header):
            dup = sorted({h for h in self.header if self.header.count(h) > 1})
            problem = f"duplicate column(s) {', '.join(dup)}"
        if problem:
            self._file.close()
            raise InputFileError(
                self.path, self.header_line, None, f"{problem} (header: {','.join(self.header)})"
            )
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._file is not None:
            self._file.close()

    def _next(self) -> list[str] | None:
        try:
            return next(self._reader)
        except StopIteration:
            return None
        except UnicodeDecodeError:
            raise InputFileError(self.path, None, None, "not a UTF-8 text file") from None
        except csv.Error as e:
            raise InputFileError(self.path, self._reader.line_num, None, f"bad CSV: {e}") from None

    def has(self, column: str) -> bool:
        return column in self.index

    def rows(self) -> Iterator[tuple[int, list[str]]]:
        """(line number, fields) per data row; blank lines are not rows and are skipped."""
        n = len(self.header)
        reader = self._reader
        try:
            for row in reader:
                if len(row) != n:
                    if not row:
                        continue
                    raise InputFileError(
                        self.path,
                        reader.line_num,
                        None,
                        f"expected {n} fields as in the header, found {len(row)}",
                    )
                yield reader.line_num, row
        except UnicodeDecodeError:
            raise InputFileError(self.path, None, None, "not a UTF-8 text file") from None
        except csv.Error as e:
            raise InputFileError(self.path, reader.line_num, None, f"bad CSV: {e}") from None

    def shared(self, value: T) -> T:
        """One object for every row that has this value: for columns with few distinct values (VC,
        user, QoS, CPU milli, MiB), so that a million jobs do not hold a million copies of a VC
        name or of the number 6000."""
        return self._shared.setdefault(value, value)

    def error(self, line: int, column: str, problem: str) -> InputFileError:
        return InputFileError(self.path, line, column, problem)

    # Field parsers: ``row`` is a data row from rows(), ``column`` a header name.

    def int_field(self, row: list[str], column: str, line: int, minimum: int = 0, maximum: int = MAX_COUNT) -> int:
        text = row[self.index[column]]
        try:
            value = int(text)
        except ValueError:
            value = self._integral_float(text)
            if value is None:
                raise self.error(line, column, f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise self.error(line, column, f"must be at least {minimum}, got {text!r}")
        if value > maximum:
            raise self.error(line, column, f"must be at most {maximum:g}, got {text!r}")
        return value

    def _integral_float(self, text: str) -> int | None:
        # Traces exported through pandas often write counts as "8.0".
        try:
            f = float(text)
        except ValueError:
            return None
        return int(f) if math.isfinite(f) and f == int(f) else None

    def float_field(self, row: list[str], column: str, line: int, minimum: float | None = 0.0,
                    maximum: float = MAX_TIME_S) -> float:
        text = row[self.index[column]]
        try:
            value = float(text)
        except ValueError:
            raise self.error(line, column, f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise self.error(line, column, f"expected a finite number, got {text!r}")
        if minimum is not None and value < minimum:
            raise self.error(line, column, f"must be at least {minimum:g}, got {text!r}")
        if value > maximum:
            raise self.error(line, column, f"must be at most {maximum:g}, got {text!r}")
        return value

    def time_field(self, row: list[str], column: str, line: int) -> float:
        """``YYYY-MM-DD HH:MM:SS`` as seconds since 1970 in the trace's own (naive) clock: no time
        zone or daylight-saving shift is applied, so differences are exact."""
        text = row[self.index[column]]
        try:
            if len(text) != 19 or text[10] not in " T":
                raise ValueError
            return (datetime.fromisoformat(text) - _EPOCH).total_seconds()
        except ValueError:
            raise self.error(line, column, f"expected a time as YYYY-MM-DD HH:MM:SS, got {text!r}") from None
