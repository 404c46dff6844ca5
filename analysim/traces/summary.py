"""What is in a trace, as numbers (summarize) and as a readable table (format_summary)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from analysim.traces.base import Trace

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
    jobs = trace.jobs
    durations = np.array([j.duration_s for j in jobs if j.duration_s is not None], dtype=float)
    per_vc_jobs: Counter[str] = Counter()
    per_vc_hours: Counter[str] = Counter()
    gpu_counts: Counter[int] = Counter()
    fractional = 0
    for j in jobs:
        per_vc_jobs[j.vc] += 1
        if j.duration_s is not None:
            per_vc_hours[j.vc] += j.gpu_demand * j.duration_s / 3600
        if j.is_fractional:
            fractional += 1
        else:
            gpu_counts[j.num_gpus] += 1
    known = durations.size > 0
    return TraceSummary(
        source=trace.source,
        format=trace.format,
        jobs=len(jobs),
        first_submit_s=jobs[0].submit_s if jobs else 0.0,
        last_submit_s=jobs[-1].submit_s if jobs else 0.0,
        gpu_counts=dict(sorted(gpu_counts.items())),
        fractional=fractional,
        unknown_duration=len(jobs) - durations.size,
        duration_quantiles=dict(zip(QUANTILES, np.quantile(durations, QUANTILES).tolist(), strict=True))
        if known
        else {},
        duration_min=float(durations.min()) if known else None,
        duration_max=float(durations.max()) if known else None,
        duration_mean=float(durations.mean()) if known else None,
        gpu_hours=sum(per_vc_hours.values()),
        gpus_requested=sum(j.gpu_demand for j in jobs),
        vcs=[(vc, n, per_vc_hours[vc]) for vc, n in per_vc_jobs.most_common()],
        filtered=dict(trace.filtered),
    )


def human_seconds(s: float) -> str:
    """A duration at a glance: 45s, 19m, 3.2h, 12.4d."""
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s / 60:.0f}m"
    if s < 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def format_summary(s: TraceSummary, max_vcs: int = 20) -> str:
    out: list[str] = []
    add = out.append
    filtered = ", ".join(f"{k} {v:,}" for k, v in s.filtered.items()) or "none"
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
