"""What is in a trace, as numbers (summarize) and as a readable table (format_summary)."""

from __future__ import annotations

import math
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from analysim.core.job import JobSpec
from analysim.traces import scan_trace
from analysim.traces.base import Trace, gc_paused

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)


@dataclass(slots=True)
class TraceSummary:
    source: str
    format: str
    jobs: int
    first_submit_s: float
    last_submit_s: float
    gpu_counts: dict[int, int]  # whole-GPU jobs by GPUs asked for
    fractional: int  # jobs sharing one GPU
    unknown_duration: int
    duration_quantiles: dict[float, float]  # over jobs with a known duration; also "min"/"max" below
    duration_min: float | None
    duration_max: float | None
    duration_mean: float | None
    gpu_hours: float  # known durations only
    gpus_requested: float  # summed over jobs, fractional ones by their share
    vcs: list[tuple[str, int, float]]  # (vc, jobs, GPU-hours), most jobs first
    filtered: dict[str, int] = field(default_factory=dict)

    @property
    def span_s(self) -> float:
        return self.last_submit_s - self.first_submit_s


def summarize(trace: Trace) -> TraceSummary:
    tally = _Tally()
    for j in trace.jobs:
        tally.add(j)
    return tally.summary(trace.source, trace.format, trace.filtered)


def summarize_file(path: str | Path, fmt: str = "auto") -> TraceSummary:
    """The summary of a trace file, made in one pass that keeps a few numbers a job and no job
    (a 2.7 M-job file fits in a few hundred MB); the same figures as ``summarize(load_trace())``."""
    scan = scan_trace(path, fmt)
    tally = _Tally()
    with gc_paused():
        for j in scan:
            tally.add(j)
    return tally.summary(str(path), scan.fmt.name, scan.counts(), origin=scan.origin)


class _Tally:
    """Per job: submit time, duration, GPUs asked for and VC, as flat arrays, so that a summary of
    millions of jobs holds no job object. The figures are made in submit-time order (ties in the
    order jobs were added), the order of a loaded trace, so that sums come out the same to the bit
    whichever way the jobs came."""

    def __init__(self) -> None:
        self.submit = array("d")
        self.duration = array("d")  # NaN: unknown
        self.demand = array("d")
        self.vc = array("l")
        self.vc_index: dict[str, int] = {}
        self.gpu_counts: Counter[int] = Counter()
        self.fractional = 0

    def add(self, j: JobSpec) -> None:
        self.submit.append(j.submit_s)
        self.duration.append(math.nan if j.duration_s is None else j.duration_s)
        self.demand.append(j.gpu_demand)
        self.vc.append(self.vc_index.setdefault(j.vc, len(self.vc_index)))
        if j.is_fractional:
            self.fractional += 1
        else:
            self.gpu_counts[j.num_gpus] += 1

    def summary(self, source: str, fmt: str, filtered: dict[str, int], origin: float = 0.0) -> TraceSummary:
        """The figures (once: the tally's arrays are let go as they are used)."""
        submit = np.frombuffer(self.submit, dtype=float)
        n_jobs = len(submit)
        order = np.argsort(submit, kind="stable")
        first, last = (float(submit[order[0]]) - origin, float(submit[order[-1]]) - origin) if n_jobs else (0.0, 0.0)
        del submit, self.submit
        vc = np.frombuffer(self.vc, dtype=np.int_)[order]
        del self.vc
        duration = np.frombuffer(self.duration, dtype=float)[order]
        del self.duration
        demand = np.frombuffer(self.demand, dtype=float)[order]
        del self.demand, order
        # Summed one job after another in submit order, as sum() over the jobs of a loaded trace
        # does (in slices, so that no list of millions of floats is made).
        gpus_requested = 0
        for i in range(0, n_jobs, 1 << 16):
            gpus_requested = sum(demand[i : i + (1 << 16)].tolist(), gpus_requested)
        known = ~np.isnan(duration)
        durations = duration[known]
        del duration
        hours_of_job = demand[known] * durations / 3600
        del demand
        names = list(self.vc_index)
        # Per VC, in order of first appearance (ties in most_common() keep it), summed job by job.
        per_vc_jobs: Counter[str] = Counter()
        for i in _first_seen(vc):
            per_vc_jobs[names[i]] = 0
        for i, n in enumerate(np.bincount(vc, minlength=len(names)).tolist()):
            if n:
                per_vc_jobs[names[i]] = n
        hours = np.zeros(len(names))
        np.add.at(hours, vc[known], hours_of_job)
        per_vc_hours = {names[i]: float(hours[i]) for i in _first_seen(vc[known])}
        del vc, known, hours_of_job
        has = durations.size > 0
        return TraceSummary(
            source=source,
            format=fmt,
            jobs=n_jobs,
            first_submit_s=first,
            last_submit_s=last,
            gpu_counts=dict(sorted(self.gpu_counts.items())),
            fractional=self.fractional,
            unknown_duration=n_jobs - durations.size,
            duration_quantiles=dict(zip(QUANTILES, np.quantile(durations, QUANTILES).tolist(), strict=True))
            if has
            else {},
            duration_min=float(durations.min()) if has else None,
            duration_max=float(durations.max()) if has else None,
            duration_mean=float(durations.mean()) if has else None,
            gpu_hours=sum(per_vc_hours.values()),
            gpus_requested=gpus_requested,
            vcs=[(v, n, per_vc_hours.get(v, 0.0)) for v, n in per_vc_jobs.most_common()],
            filtered=dict(filtered),
        )


def _first_seen(codes: np.ndarray) -> list[int]:
    """The distinct values of ``codes`` in order of first appearance."""
    values, first = np.unique(codes, return_index=True)
    return values[np.argsort(first)].tolist()


def human_seconds(s: float) -> str:
    """A duration at a glance: 45s, 19m, 3.2h, 12.4d."""
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s / 60:.0f}m"
    if s < 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def describe_filtered(counts: dict[str, int]) -> str:
    """The rows a reader left out, by reason: ``never_scheduled 897, cpu_only 1,052`` (or none)."""
    return ", ".join(f"{k} {v:,}" for k, v in counts.items()) or "none"


def format_summary(s: TraceSummary, max_vcs: int = 20) -> str:
    out: list[str] = []
    add = out.append
    filtered = describe_filtered(s.filtered)
    add(f"{s.source}  (format {s.format})")
    add(f"  jobs              {s.jobs:,}")
    add(f"  filtered out      {filtered}")
    add(
        f"  submit span       {human_seconds(s.span_s)} ({s.first_submit_s:,.0f} s .. {s.last_submit_s:,.0f} s)"
    )
    busy = (
        f"; {s.gpu_hours * 3600 / s.span_s:,.1f} GPUs busy on average over the span" if s.span_s > 0 else ""
    )
    add(f"  GPU demand        {s.gpu_hours:,.0f} GPU-hours{busy}")
    add(f"  GPUs asked for    {s.gpus_requested:,.1f} summed over jobs")
    add(f"  fractional jobs   {s.fractional:,} (sharing one GPU)")
    add(f"  CPU-only jobs     {s.gpu_counts.get(0, 0):,} (no GPU: CPU and memory only)")
    add(f"  unknown duration  {s.unknown_duration:,}")
    if not s.jobs:
        return "\n".join(out)

    add("")
    add(f"  {'GPUs per job':<14}{'jobs':>10}{'share':>9}")
    rows = ([("<1 (shared)", s.fractional)] if s.fractional else []) + [
        (str(g), n) for g, n in s.gpu_counts.items()
    ]
    for label, n in rows:
        add(f"  {label:<14}{n:>10,}{n / s.jobs:>9.1%}")

    if s.duration_mean is not None:
        add("")
        cols = ["min", *(f"p{q * 100:g}" for q in s.duration_quantiles), "max", "mean"]
        vals = [s.duration_min, *s.duration_quantiles.values(), s.duration_max, s.duration_mean]
        add("  duration  " + "".join(f"{c:>9}" for c in cols))
        add("  seconds   " + "".join(f"{v:>9.0f}" for v in vals))
        add("            " + "".join(f"{human_seconds(v):>9}" for v in vals))

    add("")
    add(f"  {'VC':<16}{'jobs':>10}{'share':>9}{'GPU-hours':>14}{'share':>9}")
    for vc, n, hours in s.vcs[:max_vcs]:
        hshare = hours / s.gpu_hours if s.gpu_hours else 0.0
        add(f"  {vc or '(empty)':<16}{n:>10,}{n / s.jobs:>9.1%}{hours:>14,.0f}{hshare:>9.1%}")
    if len(s.vcs) > max_vcs:
        add(f"  ... and {len(s.vcs) - max_vcs} more VCs")
    add(f"  ({len(s.vcs)} VC{'s' if len(s.vcs) != 1 else ''})")
    return "\n".join(out)
