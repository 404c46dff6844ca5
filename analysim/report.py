"""Writing a run's results: summary.json, CSV tables, PNG plots, and the terminal table."""

from __future__ import annotations

import csv
import heapq
import importlib.util
import json
import math
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from analysim.core.job import JobSpec
from analysim.core.metrics import JOB_FIELDS
from analysim.core.partition import CPU, GPU, MEMORY
from analysim.errors import UserError


def json_safe(x: object) -> object:
    """``x`` with every infinite or NaN float replaced by None: JSON has neither (summary.json
    and the live scheduler's summary write null)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    return x


def write_json(obj: dict, path: Path) -> None:
    path.write_text(json.dumps(json_safe(obj), indent=2, sort_keys=False) + "\n")


def write_csv(rows: Sequence[dict], path: Path, fields: Sequence[str] | None = None) -> None:
    fields = list(fields or (rows[0].keys() if rows else []))
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(fields)
        w.writerows([_fmt(r.get(k)) for k in fields] for r in rows)


def _fmt(v: object) -> object:
    """Exact values (repr round-trips a float), empty for missing or infinite ones."""
    if v is None:
        return ""
    if type(v) is float:
        return repr(v) if math.isfinite(v) else ""
    return v


class _Line:
    """Takes the one write a csv writer makes per row."""

    __slots__ = ("text",)

    def write(self, text: str) -> None:
        self.text = text


# jobs.csv's column of the admission time the traced cluster recorded, present only when the
# trace has one (canonical's column of the same name).
RECORDED_ADMISSION = "recorded_admit_s"


class JobsCsv:
    """jobs.csv written while the run goes (a simulation.JobSink): rows arrive as jobs end and go
    out in the file's order, by (submit_s, job_id), the same bytes ``write_run`` writes from a
    list. A row waits in a reorder buffer only while a job before it in that order is still in
    flight (``expect``ed, not yet ended), so the buffer holds about the jobs in flight, not all
    the finished ones. Written to ``jobs.csv.partial`` and renamed when complete; a run that
    fails leaves no jobs.csv.

        with JobsCsv(out / "jobs.csv") as sink:
            result = simulation.run(..., job_sink=sink)
    """

    def __init__(self, path: Path, recorded_admit_s: dict[str, float] | None = None) -> None:
        self.path = path
        # job id -> the admission the traced cluster recorded (Trace.recorded_admit_s): given,
        # each row gets it as a last column, RECORDED_ADMISSION, for ``analysim fidelity``
        self._recorded = recorded_admit_s or None
        self.fields = (*JOB_FIELDS, RECORDED_ADMISSION) if self._recorded else JOB_FIELDS
        self._partial = path.with_name(path.name + ".partial")
        self._expected: list[tuple[float, str]] = []  # heap: jobs entered, row not yet written
        self._rows: list[tuple[tuple[float, str], str]] = []  # heap: ended, waiting for their turn
        self._horizon = -math.inf  # submit time of the latest job entered: later ones are not before it
        self._line = _Line()
        self._format = csv.writer(self._line, lineterminator="\n")
        self._file = None

    def __enter__(self) -> JobsCsv:
        self._file = self._partial.open("w", newline="")
        self._file.write(self._csv_line(self.fields))
        return self

    def __exit__(self, et: object, ev: object, tb: object) -> None:
        if et is None:
            while self._rows:  # what is left: after a job that never ended, in the file's order
                self._file.write(heapq.heappop(self._rows)[1])
            self._file.close()
            self._partial.replace(self.path)
        else:
            self._file.close()
            self._partial.unlink(missing_ok=True)

    def _csv_line(self, values: Iterable[object]) -> str:
        self._format.writerow(values)
        return self._line.text

    def expect(self, spec: JobSpec) -> None:
        heapq.heappush(self._expected, (spec.submit_s, spec.job_id))
        self._horizon = max(self._horizon, spec.submit_s)

    def write(self, row: dict) -> None:
        # The csv writer writes None empty and a float as its repr, as _fmt does; only an
        # infinite or NaN float differs, and its line says so ("inf", "nan"): it is written again
        # the long way (as is a row whose text merely contains those letters).
        if self._recorded is not None:
            row = {**row, RECORDED_ADMISSION: self._recorded.get(row["job_id"])}
        line = self._csv_line(list(map(row.get, self.fields)))
        if "inf" in line or "nan" in line:
            line = self._csv_line([_fmt(row.get(k)) for k in self.fields])
        heapq.heappush(self._rows, ((row["submit_s"], row["job_id"]), line))
        rows, expected = self._rows, self._expected
        # A row goes out when no job in flight comes before it, and no job still to enter can
        # (those have a later submit time than every job entered, or the same).
        while rows and expected and rows[0][0] == expected[0] and rows[0][0][0] < self._horizon:
            self._file.write(heapq.heappop(rows)[1])
            heapq.heappop(expected)

    def waiting(self) -> int:
        """Rows held back in the reorder buffer."""
        return len(self._rows)


# Free space an output folder needs at the start of a run: the summary, CSVs and plots of a
# large run are a few MB; under this, the run would fail at its end.
OUT_MIN_FREE_BYTES = 16 << 20


def check_out_folder(out: Path, flag: str = "--out") -> None:
    """UserError now, at the start of a run, if ``out`` could not take the run's outputs at its
    end: an existing file that is not a folder, a folder that cannot be made or written in, or
    a disk without room. Makes the folder."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{flag} {out}: is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
        st = os.statvfs(out)
    except OSError as e:
        raise UserError(f"{flag} {out}: cannot write there ({e.strerror})") from None
    free = st.f_bavail * st.f_frsize
    if free < OUT_MIN_FREE_BYTES:
        raise UserError(f"{flag} {out}: the disk is full ({free:,} bytes free; the run's outputs need about "
                        f"{OUT_MIN_FREE_BYTES >> 20} MB)")


def write_run(out: Path, summary: dict, jobs: Sequence[dict] | None, timeseries: Sequence[dict], plots: bool = True,
              completed_jct: Sequence[float] | None = None) -> list[Path]:
    """The standard outputs of ``analysim simulate`` (and of ``analysim up --out``). ``jobs``
    None: jobs.csv was streamed already (JobsCsv), and the JCT plot takes ``completed_jct``."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "summary.json"]
    write_json(summary, written[0])
    if summary.get("mode") == "inflate":
        write_csv(timeseries, out / "inflate.csv")
        written.append(out / "inflate.csv")
        if plots:
            written += plot_inflate(timeseries, out)
        return written
    if jobs is not None:
        write_csv(sorted(jobs, key=lambda j: (j["submit_s"], j["job_id"])), out / "jobs.csv", JOB_FIELDS)
        completed_jct = [j["jct_s"] for j in jobs if j["status"] == "completed"]
    write_csv(timeseries, out / "timeseries.csv")
    written += [out / "jobs.csv", out / "timeseries.csv"]
    if plots:
        written += plot_run(summary, completed_jct if completed_jct is not None else [], timeseries, out)
    return written


def have_matplotlib() -> bool:
    """Whether matplotlib can be imported, without importing it."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except ValueError:  # sys.modules holds None for it: imports of it fail
        return False


def can_plot() -> bool:
    """Whether matplotlib is installed; if not, says on stderr that default plots are skipped
    (asked-for ones, --plots, are an error: ``pyplot``)."""
    if have_matplotlib():
        return True
    print("plots skipped: matplotlib is not installed (pip install 'analysim[plots]')", file=sys.stderr)
    return False


def pyplot():  # noqa: ANN201 — matplotlib.pyplot, off-screen
    """matplotlib.pyplot with the Agg backend; matplotlib is the optional ``plots`` extra."""
    try:
        import matplotlib
    except ImportError:
        raise UserError("plots need matplotlib: pip install 'analysim[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(summary: dict, completed_jct: Sequence[float], ts: Sequence[dict], out: Path) -> list[Path]:
    plt = pyplot()
    paths = []
    if ts:
        t = np.array([r["time_s"] for r in ts]) / 3600.0
        fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
        a1.plot(t, [r["allocated_gpus"] for r in ts], label="allocated GPUs", lw=1)
        a1.plot(t, [r["fragmented_gpus"] for r in ts], label="fragmented GPUs (head of line)", lw=1)
        a1.axhline(summary.get("cluster_gpus", 0), color="grey", ls="--", lw=0.8, label="cluster GPUs")
        a1.set_ylabel("GPUs")
        a1.legend(loc="upper right", fontsize=8)
        a1.set_title(f"{summary.get('policy')} on {summary.get('cluster')}: "
                     f"utilization {summary.get('gpu_utilization', 0):.1%}")
        a2.plot(t, [r["pending_gpu_demand"] for r in ts], label="pending GPU demand", color="tab:red", lw=1)
        a2.set_ylabel("GPUs waiting")
        a2.set_xlabel("virtual time (hours)")
        a2.legend(loc="upper right", fontsize=8)
        fig.tight_layout()
        p = out / "utilization.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    if len(completed_jct):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        _cdf(ax, completed_jct, summary.get("policy", ""))
        ax.set_title(f"{summary.get('policy')} on {summary.get('cluster')}: job completion time, "
                     f"{len(completed_jct):,} completed jobs", fontsize=10)
        ax.set_xscale("log")
        ax.set_xlabel("job completion time (s)")
        ax.set_ylabel("fraction of jobs")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        p = out / "jct_cdf.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def _cdf(ax, values: Iterable[float], label: str, color: str | None = None) -> None:
    v = np.sort(np.asarray(list(values), dtype=float))
    ax.plot(np.maximum(v, 1.0), np.arange(1, len(v) + 1) / len(v), label=label, lw=1.2, color=color)


def plot_inflate(rows: Sequence[dict], out: Path) -> list[Path]:
    """Weng et al.'s figure: allocation (and fragmentation) against the demand that has arrived,
    both as % of the cluster's GPUs; the diagonal is what a perfect scheduler would allocate."""
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True)
    x = [r["arrived_pct"] for r in rows]
    top = max(x, default=100.0)
    a1.plot([0, top], [0, top], color="grey", ls=":", lw=0.8, label="arrived demand")
    a1.plot(x, [100 * r["gpu_allocation_ratio"] for r in rows], label="GPUs allocated")
    if rows and "fragmentation_ratio" in rows[0]:
        a1.plot(x, [100 * r["fragmentation_ratio"] for r in rows], label="FGD expected fragmentation")
    a1.set_ylabel("% of the cluster's GPUs")
    a1.legend(fontsize=8)
    a1.grid(alpha=0.3)
    a2.plot(x, [r["tasks_failed"] for r in rows], color="tab:red", label="tasks failed")
    a2.set_xlabel("arrived GPU demand (% of the cluster's GPUs)")
    a2.set_ylabel("tasks")
    a2.legend(fontsize=8)
    a2.grid(alpha=0.3)
    fig.tight_layout()
    p = out / "inflate.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return [p]


def plot_compare(results: Sequence[tuple[str, dict, Sequence[float]]], out: Path) -> Path:
    """One figure for ``analysim compare``: JCT CDFs (from each run's completed jobs' JCTs), and
    average JCT and utilization per run."""
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 5))
    # One colour per run in both panels, so that a bar is read against its CDF line.
    colors = [f"C{i % 10}" for i in range(len(results))]
    for (label, _, done), color in zip(results, colors, strict=True):
        if len(done):
            _cdf(a1, done, label, color)
    a1.set_xscale("log")
    a1.set_xlabel("job completion time (s)")
    a1.set_ylabel("fraction of jobs")
    a1.legend(fontsize=7)
    a1.grid(alpha=0.3)
    labels = [r[0] for r in results]
    jct = [(r[1].get("avg_jct_s") or 0) / 3600 for r in results]
    y = np.arange(len(labels))
    a2.barh(y, jct, color=colors)
    a2.set_yticks(y, labels, fontsize=7)
    a2.set_xlabel("average JCT (hours)")
    a2.invert_yaxis()
    fig.tight_layout()
    p = out / "compare.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


SUMMARY_COLUMNS = (
    ("jobs", "jobs_completed", "{:d}"),
    ("avg JCT h", "avg_jct_s", "h"),
    ("p50 JCT h", "median_jct_s", "h"),
    ("p99 JCT h", "p99_jct_s", "h"),
    ("avg queue h", "avg_queue_s", "h"),
    ("util", "gpu_utilization", "{:.1%}"),
    ("frag", "avg_fragmentation", "{:.1%}"),
    ("preempt", "preemptions", "{:d}"),
    ("migrate", "migrations", "{:d}"),
    ("jain", "jain_fairness", "{:.3f}"),
    ("wall s", "wall_s", "{:.1f}"),
)
INFLATE_COLUMNS = (
    ("arrived", "arrived_pct", "{:.1f}%"),
    ("tasks", "tasks_placed", "{:d}"),
    ("failed", "tasks_failed", "{:d}"),
    ("alloc ratio", "gpu_allocation_ratio", "{:.2%}"),
    ("frag GPUs", "fragmentation_gpus", "{:.1f}"),
    ("wall s", "wall_s", "{:.1f}"),
)


def summary_table(rows: Sequence[tuple[str, dict]]) -> str:
    """A fixed-width table, one line per run."""
    inflate = any(s.get("mode") == "inflate" for _, s in rows)
    cols = INFLATE_COLUMNS if inflate else SUMMARY_COLUMNS
    header = ["run"] + [c[0] for c in cols]
    body = [[label] + [_cell(s.get(key), fmt) for _, key, fmt in cols] for label, s in rows]
    return _fixed_width(header, body, left=1)


def _cell(v: object, fmt: str) -> str:
    if v is None:
        return "-"
    if fmt == "h":
        return f"{v / 3600:.2f}"  # type: ignore[operator]
    return fmt.format(v)


def _fixed_width(header: list[str], body: list[list[str]], left: int) -> str:
    """Columns padded to their widest cell: the first ``left`` flush left, the others right."""
    widths = [max(len(str(r[i])) for r in [header] + body) for i in range(len(header))]
    fmt_line = lambda r: "  ".join(str(c).ljust(w) if i < left else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))  # noqa: E731
    return "\n".join([fmt_line(header), "  ".join("-" * w for w in widths)] + [fmt_line(r) for r in body])


# The per-ClusterQueue table (summary.json's per_cluster_queue, analysim.core.queue_metrics): title,
# key, format. docs/kueue.md defines each column.
CLUSTER_QUEUE_COLUMNS = (
    ("jobs", "jobs_completed", "{:d}"),
    ("wait avg h", "avg_admission_wait_s", "h"),
    ("wait p50 h", "median_admission_wait_s", "h"),
    ("wait p95 h", "p95_admission_wait_s", "h"),
    ("JCT avg h", "avg_jct_s", "h"),
    ("JCT p99 h", "p99_jct_s", "h"),
    ("nominal", "nominal_gpus", "{:g}"),
    ("avg GPUs", "avg_gpus", "{:.1f}"),
    ("of nominal", "usage_of_nominal", "{:.0%}"),
    ("borrowed", "avg_borrowed_gpus", "{:.1f}"),
)
# The columns of the queue's quota and usage: its GPU figures (per_cluster_queue's GPU keys), or, for
# a queue without GPU quota, the same figures of the first resource it covers (``resources``).
QUOTA_COLUMNS = {"nominal_gpus": "nominal", "avg_gpus": "avg_usage", "usage_of_nominal": "usage_of_nominal",
                 "avg_borrowed_gpus": "avg_borrowed"}
# How a quantity of a resource other than GPUs is shown in those columns, in Kueue's reported unit
# (cores, bytes) divided by the divisor: divisor and suffix; any other resource: 1 and its name.
QUANTITY_SHOWN = {CPU: (1, "cpu"), MEMORY: (2**30, "Gi")}
# Preemptions by Kueue reason, one column: InClusterQueue/InCohortReclamation/InCohortFairSharing/
# InCohortReclaimWhileBorrowing (and any other reason recorded, after a +).
PREEMPTED_COLUMN = "preempted cq/rc/fs/rb"


def _preempted(evictions: dict) -> str:
    from analysim.core.queue_metrics import EVICTION_REASONS

    text = "/".join(str(evictions.get(r, 0)) for r in EVICTION_REASONS)
    other = sum(n for r, n in evictions.items() if r not in EVICTION_REASONS)
    return text + (f"+{other}" if other else "")


def cluster_queue_table(runs: Sequence[tuple[str, dict]]) -> str:
    """The per-ClusterQueue table of runs under a partition ('' when none has one): a line per
    ClusterQueue and run, the runs of a queue together (one run: no run column)."""
    runs = [(label, s) for label, s in runs if s.get("per_cluster_queue")]
    if not runs:
        return ""
    many = len(runs) > 1
    header = ["ClusterQueue"] + (["run"] if many else []) + [c[0] for c in CLUSTER_QUEUE_COLUMNS] + [PREEMPTED_COLUMN]
    body = []
    for name in _queue_names(runs):
        for label, s in runs:
            q = s["per_cluster_queue"].get(name)
            if q is None:
                continue
            cells = {k: _cell(q.get(k), f) for _, k, f in CLUSTER_QUEUE_COLUMNS} | _other_resource(q)
            body.append([name] + ([label] if many else []) + [cells[k] for _, k, _ in CLUSTER_QUEUE_COLUMNS]
                        + [_preempted(q.get("evictions") or {})])
    return _fixed_width(header, body, left=2 if many else 1)


def _other_resource(q: dict) -> dict[str, str]:
    """The quota columns' cells of a queue without GPU quota: its first covered resource's figures,
    with the resource's unit (``QUANTITY_SHOWN``); none for a queue with GPU quota or none at all."""
    resources = q.get("resources") or {}
    if GPU in resources or not resources:
        return {}
    resource, figures = next(iter(resources.items()))
    divisor, suffix = QUANTITY_SHOWN.get(resource, (1, resource))
    out = {}
    for key, figure in QUOTA_COLUMNS.items():
        v = figures.get(figure)
        fmt = next(f for _, k, f in CLUSTER_QUEUE_COLUMNS if k == key)
        out[key] = _cell(v, fmt) if v is None or key == "usage_of_nominal" else _cell(v / divisor, fmt) + suffix
    return out


def _queue_names(runs: Sequence[tuple[str, dict]]) -> list[str]:
    names: dict[str, None] = {}
    for _, s in runs:
        names.update(dict.fromkeys(s.get("per_cluster_queue") or {}))
    return list(names)


def cluster_queue_rows(runs: Sequence[tuple[str, dict]]) -> list[dict]:
    """cluster_queues.csv: a row per run and ClusterQueue, every figure of per_cluster_queue
    (evictions as ``preempted_<reason>``, each resource's figures as ``<resource>_<figure>``),
    every row with every column any row has (empty where its queue has none)."""
    rows = []
    for label, s in runs:
        for name, q in (s.get("per_cluster_queue") or {}).items():
            row = {"run": label, "cluster_queue": name}
            for k, v in q.items():
                if k == "evictions":
                    row.update({f"preempted_{r}": n for r, n in v.items()})
                elif k == "local_queues":
                    row[k] = "|".join(v)
                elif k == "resources":
                    for resource, figures in v.items():
                        row.update({f"{resource}_{f}": "|".join(x) if f == "flavors" else x
                                    for f, x in figures.items()})
                else:
                    row[k] = v
            rows.append(row)
    fields = dict.fromkeys(k for row in rows for k in row)
    return [{k: row.get(k) for k in fields} for row in rows]


def plot_cluster_queues(runs: Sequence[tuple[str, dict]], out: Path) -> Path | None:
    """cluster_queues.png: per ClusterQueue and run, the mean admission wait, and the GPUs held on
    average against the nominal quota (the part borrowed hatched). None when no run has a partition."""
    runs = [(label, s) for label, s in runs if s.get("per_cluster_queue")]
    if not runs:
        return None
    plt = pyplot()
    names = _queue_names(runs)
    y = np.arange(len(names))
    height = 0.8 / len(runs)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, max(4.0, 0.3 * len(names) * len(runs) + 1.5)), sharey=True)
    for k, (label, s) in enumerate(runs):
        qs = [s["per_cluster_queue"].get(n) or {} for n in names]
        at = y + (k - (len(runs) - 1) / 2) * height
        color = f"C{k % 10}"
        a1.barh(at, [(q.get("avg_admission_wait_s") or 0) / 3600 for q in qs], height, color=color, label=label)
        used = np.array([q.get("avg_gpus") or 0.0 for q in qs])
        borrowed = np.array([q.get("avg_borrowed_gpus") or 0.0 for q in qs])
        a2.barh(at, used - borrowed, height, color=color, label=label)
        a2.barh(at, borrowed, height, left=used - borrowed, color=color, hatch="//", edgecolor="white", alpha=0.7)
    nominal = [next((s["per_cluster_queue"][n]["nominal_gpus"] for _, s in runs if n in s["per_cluster_queue"]), 0)
               for n in names]
    a2.scatter(nominal, y, marker="|", s=300, color="black", zorder=3, label="nominal quota")
    a1.set_yticks(y, names, fontsize=8)
    a1.invert_yaxis()
    a1.set_xlabel("mean admission wait (hours)")
    a1.set_title("admission wait per ClusterQueue", fontsize=10)
    a1.legend(fontsize=7)
    a1.grid(alpha=0.3, axis="x")
    a2.set_xlabel("GPUs held, time average (hatched: borrowed past nominal)")
    a2.set_title("usage against nominal quota", fontsize=10)
    a2.legend(fontsize=7)
    a2.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    p = out / "cluster_queues.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
