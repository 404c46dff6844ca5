"""``analysim report DIR``: one static HTML file for a sweep, every figure embedded as a PNG.

Sections: the summary table (mean ± 95 % CI over seeds, the best value of each metric
highlighted), JCT CDFs per policy, utilization and fragmentation over time, preemptions and
migrations against the JCT gain they buy, per-VC fairness, and every cell with its status.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from analysim import __version__
from analysim.errors import UserError
from analysim.report import cluster_queue_table, have_matplotlib, pyplot
from analysim.sweep.results import (
    GROUP_BY_ALL_BUT,
    HIGHER_IS_BETTER,
    LOWER_IS_BETTER,
    aggregate,
    read_results,
)
from analysim.sweep.spec import describe, show_value

# Summary-table columns: title, metric, scale, format.
COLUMNS = (
    ("avg JCT (h)", "avg_jct_s", 3600, "{:.2f}"),
    ("median JCT (h)", "median_jct_s", 3600, "{:.2f}"),
    ("p99 JCT (h)", "p99_jct_s", 3600, "{:.1f}"),
    ("avg queue (h)", "avg_queue_s", 3600, "{:.2f}"),
    ("GPU util", "gpu_utilization", 0.01, "{:.1f} %"),
    ("fragmentation", "avg_fragmentation", 0.01, "{:.2f} %"),
    ("preemptions", "preemptions", 1, "{:.0f}"),
    ("migrations", "migrations", 1, "{:.0f}"),
    ("Jain (VC slowdown)", "jain_fairness", 1, "{:.3f}"),
    ("tasks placed", "tasks_placed", 1, "{:.0f}"),
    ("GPU alloc ratio", "gpu_allocation_ratio", 0.01, "{:.1f} %"),
    ("frag GPUs", "fragmentation_gpus", 1, "{:.1f}"),
)
MAX_LINES = 10  # lines per time-series panel
NO_FIGURES = "Figure skipped: matplotlib is not installed (pip install 'analysim[plots]')."
MAX_PANELS = 9


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96)
    pyplot().close(fig)
    return base64.b64encode(buf.getvalue()).decode()


class SweepData:
    """A sweep folder read back: its cells' rows, groups (cells without their seed), per-cell files."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        meta = folder / "sweep.json"
        if not meta.exists() or not (folder / "results.csv").exists():
            raise UserError(f"{folder}: not a sweep folder (no sweep.json and results.csv): run analysim sweep first")
        self.meta = json.loads(meta.read_text())
        self.axes: list[str] = self.meta["axes"]
        self.params: list[str] = self.meta["params"]
        self.rows = read_results(folder / "results.csv")
        self.ok = [r for r in self.rows if r["status"] == "ok"]
        self.group_keys = [a for a in self.axes if a != GROUP_BY_ALL_BUT]
        self.groups = aggregate(self.rows, self.axes, self.params)
        self.replay = [r for r in self.ok if r.get("mode") != "inflate"]
        self.inflate = [r for r in self.ok if r.get("mode") == "inflate"]

    def group_of(self, row: dict) -> str:
        return describe({k: row.get(k) for k in self.group_keys}) or "all cells"

    def jobs(self, row: dict) -> list[dict]:
        path = self.folder / "cells" / row["cell"] / "jobs.csv"
        with path.open() as f:
            return list(csv.DictReader(f))

    def timeseries(self, row: dict) -> list[dict]:
        name = "inflate.csv" if row.get("mode") == "inflate" else "timeseries.csv"
        path = self.folder / "cells" / row["cell"] / name
        with path.open() as f:
            return list(csv.DictReader(f))

    def per_vc(self, row: dict) -> dict:
        return self.mapping(row, "per_vc")

    def mapping(self, row: dict, key: str) -> dict:
        """A summary's mapping as results.csv holds it (JSON text); {} for a cell without one."""
        v = row.get(key)
        return json.loads(v) if isinstance(v, str) and v else {}


# --- figures


def fig_jct_cdfs(d: SweepData) -> tuple[str, str] | None:
    if not d.replay:
        return None
    plt = pyplot()
    others = [k for k in d.group_keys if k != "policy"]
    panels: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in d.replay:
        panel = describe({k: r.get(k) for k in others}) or "all cells"
        line = r.get("summary.policy") or r.get("policy") or "run"
        panels[panel][line] += [float(j["jct_s"]) for j in d.jobs(r) if j["status"] == "completed" and j["jct_s"]]
    names = list(panels)[:MAX_PANELS]
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axs = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False, sharey=True)
    for ax, name in zip(axs.flat, names, strict=False):
        for line, values in sorted(panels[name].items()):
            if values:
                v = np.sort(np.maximum(np.asarray(values), 1.0))
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), lw=1.3, label=line)
        ax.set_xscale("log")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("job completion time (s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for ax in axs[:, 0]:
        ax.set_ylabel("fraction of jobs")
    for ax in list(axs.flat)[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    note = f" (first {MAX_PANELS} of {len(panels)} panels)" if len(panels) > MAX_PANELS else ""
    return _png(fig), ("CDF of job completion time, one line per policy, the jobs of every seed pooled; one "
                       f"panel per combination of the other axes{note}. Further left and higher is better.")


def _first_seed_per_group(d: SweepData, rows: Sequence[dict]) -> list[tuple[str, dict]]:
    seen: dict[str, dict] = {}
    for r in rows:
        seen.setdefault(d.group_of(r), r)
    ranked = sorted(seen.items(), key=lambda kv: kv[1].get("avg_jct_s") or -(kv[1].get("tasks_placed") or 0))
    return ranked[:MAX_LINES]


def fig_utilization(d: SweepData) -> tuple[str, str] | None:
    if not d.replay:
        return None
    plt = pyplot()
    picked = _first_seed_per_group(d, d.replay)
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(12, 6.5), sharex=True)
    span = 0.0
    for name, r in picked:
        ts = d.timeseries(r)
        if not ts:
            continue
        gpus = float(r.get("cluster_gpus") or 1)
        t = np.array([float(x["time_s"]) for x in ts]) / 3600
        span = max(span, _busy_span(t, np.array([float(x["allocated_gpus"]) for x in ts])))
        a1.plot(t, [float(x["allocated_gpus"]) / gpus * 100 for x in ts], lw=0.9, label=name)
        a2.plot(t, [float(x["fragmented_gpus"]) / gpus * 100 for x in ts], lw=0.9, label=name)
    a1.set_ylabel("GPUs allocated (%)")
    a2.set_ylabel("GPUs fragmented (%)")
    a2.set_xlabel("virtual time (hours)")
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
    a1.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if span > 0:
        a2.set_xlim(0, span * 1.05)
    fig.tight_layout()
    more = f"; the {MAX_LINES} with the lowest average JCT" if len({d.group_of(r) for r in d.replay}) > MAX_LINES else ""
    return _png(fig), ("Cluster GPU utilization and head-of-line fragmentation (free GPUs the first waiting job "
                       f"cannot use) over virtual time, one line per cell group, its first seed{more}; up to the time "
                       "by which 99 % of the GPU-time was used (a long last job would flatten the rest).")


def fig_inflate(d: SweepData) -> tuple[str, str] | None:
    """The FGD experiment: fragmentation as the cluster fills, per cell group (first seed)."""
    if not d.inflate:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, r in _first_seed_per_group(d, d.inflate):
        ts = d.timeseries(r)
        if ts and "fgd_fragmentation_gpus" in ts[0]:
            ax.plot([float(x["gpu_allocation_ratio"]) * 100 for x in ts],
                    [float(x["fgd_fragmentation_gpus"]) for x in ts], lw=1.2, marker=".", label=name)
    ax.set_xlabel("GPUs allocated (%)")
    ax.set_ylabel("expected fragmentation (GPUs, FGD)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig), ("Inflate mode: FGD's expected fragmentation of the cluster as tasks are placed until the next "
                       "one does not fit, one line per cell group (its first seed). Lower, and further right, is "
                       "better.")


def _busy_span(t: np.ndarray, allocated: np.ndarray) -> float:
    """The time by which 99 % of the run's GPU-time (area under allocated GPUs) was used."""
    if len(t) < 2:
        return float(t[-1]) if len(t) else 0.0
    area = np.concatenate([[0.0], np.cumsum(allocated[:-1] * np.diff(t))])
    if area[-1] <= 0:
        return float(t[-1])
    return float(t[np.searchsorted(area, 0.99 * area[-1])])


def _baseline_key(d: SweepData, r: dict) -> str:
    return json.dumps({k: r.get(k) for k in d.params if k not in ("preemption", "migration", "no_plots")},
                      sort_keys=True, default=str)


def fig_mechanisms(d: SweepData) -> tuple[str, str] | str | None:
    """Preemptions and migrations of each cell against its JCT gain over the same cell with both off."""
    if not d.replay:
        return None
    base = {_baseline_key(d, r): r for r in d.replay if not r.get("preemption") and not r.get("migration")}
    points = []
    for r in d.replay:
        if not (r.get("preemption") or r.get("migration")):
            continue
        b = base.get(_baseline_key(d, r))
        if b and b.get("avg_jct_s") and r.get("avg_jct_s") is not None:
            gain = (b["avg_jct_s"] - r["avg_jct_s"]) / b["avg_jct_s"] * 100
            points.append((r, gain))
    if not points:
        return ("No cell with --preemption or --migration has a twin with both off in this sweep, so there is "
                "no JCT gain to plot (add preemption: [false, true] to the SPEC).")
    plt = pyplot()
    kinds = [k for k in ("preemptions", "migrations") if any(r.get(k) for r, _ in points)] or ["preemptions"]
    fig, axs = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4.2), sharey=True, squeeze=False)
    axs = axs[0]
    policies = sorted({r.get("summary.policy") or "" for r, _ in points})
    colors = {p: f"C{i % 10}" for i, p in enumerate(policies)}
    for ax, key in zip(axs, kinds, strict=True):
        for p in policies:
            pts = [(float(r.get(key) or 0), g) for r, g in points if (r.get("summary.policy") or "") == p]
            ax.scatter([x for x, _ in pts], [y for _, y in pts], s=28, color=colors[p], label=p, alpha=0.8)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel(f"{key} in the cell")
        ax.grid(alpha=0.3)
    axs[0].set_ylabel("avg JCT gain (%)\nover the same cell without them")
    axs[-1].legend(fontsize=7)
    fig.tight_layout()
    return _png(fig), ("Each point is a cell with preemption and/or migration on: how many it did against how much "
                       "it cut the average JCT relative to the same cell (same seed) with both off. Above zero "
                       "the mechanism paid for its overheads.")


def fig_fairness(d: SweepData) -> tuple[str, str] | None:
    groups = [g for g in d.groups if g.get("jain_fairness_mean") is not None]
    if not groups or not d.replay:
        return None
    plt = pyplot()
    slow: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in d.replay:
        for vc, m in d.per_vc(r).items():
            if m.get("avg_slowdown") is not None:
                slow[d.group_of(r)][vc].append(float(m["avg_slowdown"]))
    vcs = sorted({vc for g in slow.values() for vc in g})
    names = [g["group"] for g in groups]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, max(3.0, 0.38 * len(names) + 1.4)),
                                 gridspec_kw={"width_ratios": [1, 1.6]})
    y = np.arange(len(names))
    a1.barh(y, [g["jain_fairness_mean"] for g in groups], xerr=[g.get("jain_fairness_ci95") or 0 for g in groups],
            color="tab:green", alpha=0.8, capsize=3)
    a1.set_yticks(y, names, fontsize=7)
    a1.invert_yaxis()
    a1.set_xlim(0, 1.05)
    a1.set_xlabel("Jain's index of the VCs' mean slowdown (1 = fair)")
    a1.grid(alpha=0.3, axis="x")
    if vcs:
        grid = np.array([[np.mean(slow[n][vc]) if slow[n].get(vc) else np.nan for vc in vcs] for n in names])
        im = a2.imshow(np.log10(np.maximum(grid, 1.0)), aspect="auto", cmap="magma_r")
        a2.set_xticks(np.arange(len(vcs)), vcs, rotation=60, fontsize=7)
        a2.set_yticks(y, names, fontsize=7)  # rows read without going back to the left panel
        a2.set_xlabel("virtual cluster")
        fig.colorbar(im, ax=a2, label="log10 mean job slowdown")
    else:
        a2.axis("off")
    fig.tight_layout()
    return _png(fig), ("Per-VC fairness: left, Jain's fairness index over the virtual clusters' mean job slowdown "
                       "(mean ± 95 % CI over seeds); right, each VC's mean slowdown per cell group (darker: "
                       "that tenant's jobs wait longer relative to their run time).")


# --- tables and page


def _best(groups: Sequence[dict], metric: str) -> float | None:
    vals = [g[f"{metric}_mean"] for g in groups if g.get(f"{metric}_mean") is not None]
    if not vals or len(set(vals)) < 2:
        return None
    if metric in LOWER_IS_BETTER:
        return min(vals)
    if metric in HIGHER_IS_BETTER:
        return max(vals)
    return None


def summary_table(d: SweepData) -> str:
    groups = sorted(d.groups, key=lambda g: (g.get("avg_jct_s_mean") is None, g.get("avg_jct_s_mean") or 0,
                                             g.get("tasks_placed_mean") is None, -(g.get("tasks_placed_mean") or 0)))
    cols = [c for c in COLUMNS if any(g.get(f"{c[1]}_mean") is not None for g in groups)]
    best = {m: _best(groups, m) for _, m, _, _ in cols}
    head = "".join(f"<th>{html.escape(k)}</th>" for k in d.group_keys) + "<th>seeds</th>"
    head += "".join(f"<th>{html.escape(t)}{_arrow(m)}</th>" for t, m, _, _ in cols)
    body = []
    for g in groups:
        cells = "".join(f"<td>{html.escape(show_value(g.get(k)))}</td>" for k in d.group_keys)
        cells += f"<td class=num>{g['seeds']}</td>"
        for _, m, scale, fmt in cols:
            mean, half = g.get(f"{m}_mean"), g.get(f"{m}_ci95")
            if mean is None:
                cells += "<td class=num>–</td>"
                continue
            text = fmt.format(mean / scale)
            # Best as shown: every row that reads the same as the best value is highlighted.
            cls = "num best" if best.get(m) is not None and text == fmt.format(best[m] / scale) else "num"
            if half is not None:
                text += f" <span class=ci>± {fmt.format(half / scale).replace(' %', '')}</span>"
            cells += f"<td class='{cls}'>{text}</td>"
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _arrow(metric: str) -> str:
    return " ↓" if metric in LOWER_IS_BETTER else " ↑" if metric in HIGHER_IS_BETTER else ""


def cells_table(d: SweepData) -> str:
    body = []
    for r in d.rows:
        jct = r.get("avg_jct_s")
        status = html.escape(r["status"])
        body.append(
            f"<tr class='{status}'><td><code>{html.escape(r['cell'])}</code></td><td>{html.escape(r['label'])}</td>"
            f"<td>{status}</td><td class=num>{'' if jct is None else f'{jct / 3600:.2f}'}</td>"
            f"<td class=err>{html.escape(r.get('error') or '')}</td></tr>")
    return ("<table><thead><tr><th>cell (folder under cells/)</th><th>parameters</th><th>status</th>"
            f"<th>avg JCT (h)</th><th>error</th></tr></thead><tbody>{''.join(body)}</tbody></table>")


CSS = """
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1280px;
padding:0 1rem;color:#1d2330}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{margin-top:2.2rem;border-bottom:1px solid #dde;padding-bottom:.2rem}
.meta{color:#556}table{border-collapse:collapse;font-size:13px;margin:.6rem 0}
th,td{border:1px solid #dde;padding:.25rem .5rem;text-align:left}th{background:#f3f5fa}
td.num{text-align:right;white-space:nowrap}td.best{background:#d9f2dd;font-weight:600}
.ci{color:#778;font-weight:400;font-size:12px}tr.failed td,tr.lost td{background:#fdecec}
td.err{font-size:12px;color:#933}figure{margin:1rem 0}figure img{max-width:100%;border:1px solid #eef}
figcaption{color:#445;font-size:13px;max-width:1000px}p.note{color:#665;font-style:italic}
"""


def render(folder: Path) -> str:
    d = SweepData(folder)
    counts = defaultdict(int)
    for r in d.rows:
        counts[r["status"]] += 1
    spec_name = html.escape(Path(d.meta.get("spec", "sweep")).name)
    traces = sorted({str(r.get("summary.trace") or r.get("trace") or "embedded synthetic") for r in d.ok})
    clusters = sorted({str(r.get("summary.cluster") or r.get("cluster")) for r in d.ok})
    seeds = sorted({r.get("seed") for r in d.rows}, key=str)
    parts = [
        f"<h1>AnalySIM sweep: {spec_name}</h1>",
        f"<p class=meta>{len(d.rows)} cells: {counts['ok']} ok, {counts['failed']} failed, {counts['lost']} lost, "
        f"{counts['pending']} not run · axes: {html.escape(', '.join(d.axes) or 'none')} · seeds: "
        f"{html.escape(', '.join(map(str, seeds)))} · trace: {html.escape(', '.join(traces))} · cluster: "
        f"{html.escape(', '.join(clusters))} · analysim {__version__}, "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}</p>",
        "<h2>Summary</h2>",
        "<p>One row per combination of the axes other than the seed: the mean over seeds and the half-width of "
        "its 95 % confidence interval (Student's t). The best value of each metric (↓ lower is better, "
        "↑ higher) is highlighted.</p>",
        summary_table(d),
    ]
    sections = (("JCT distribution per policy", fig_jct_cdfs), ("Utilization and fragmentation over time",
                fig_utilization), ("Preemptions and migrations against JCT gain", fig_mechanisms),
                ("Per-VC fairness", fig_fairness))
    if d.inflate:  # a sweep of the FGD experiment: its figure first, the replay ones only if any
        sections = (("Fragmentation as the cluster fills", fig_inflate),) + tuple(
            s for s in sections if d.replay)
    # The tables need no matplotlib: without it the page has them, and says where the figures went.
    plotting = have_matplotlib()
    for title, make in sections:
        parts.append(f"<h2>{title}</h2>")
        if not plotting:
            parts.append(f"<p class=note>{NO_FIGURES}</p>")
            continue
        fig = make(d)
        if fig is None:
            parts.append("<p class=note>Not applicable: no replay-mode cell finished.</p>")
        elif isinstance(fig, str):
            parts.append(f"<p class=note>{html.escape(fig)}</p>")
        else:
            png, caption = fig
            parts.append(f"<figure><img alt='{html.escape(title)}' src='data:image/png;base64,{png}'>"
                         f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    queues = [(r["label"], {"per_cluster_queue": d.mapping(r, "per_cluster_queue")}) for r in d.ok]
    if any(q for _, q in queues):
        parts += ["<h2>Per ClusterQueue</h2>", "<p>The cells run under a partition: admission wait, JCT, quota "
                  "and usage, preemptions (docs/kueue.md, “The per-ClusterQueue report”).</p>",
                  f"<pre>{html.escape(cluster_queue_table(queues))}</pre>"]
    parts += ["<h2>Cells</h2>", cells_table(d)]
    return ("<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport "
            "content='width=device-width,initial-scale=1'>"
            f"<title>AnalySIM sweep: {spec_name}</title><style>{CSS}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")
