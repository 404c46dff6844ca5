"""``monitor-eval``'s figures: per strategy each method's status against the truth, and the
default method for every attacker on one log-scaled axis (status_*.png)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlaas_monitor.monitor.config import EXTENT_METHODS, METHODS
from mlaas_monitor.monitor.curves import SubjectCurve
from mlaas_monitor.monitor.infogain import extent


def plot_status(
    out: Path, curves: list[SubjectCurve], k: int, thresholds: dict[str, float], method: str, alarms: dict[str, float]
) -> None:
    """status_<strategy>.png per strategy and status_vs_queries.png into ``out``."""
    from analysim.report import pyplot

    plt = pyplot()
    strategies = list(dict.fromkeys(c.strategy for c in curves))
    for s in strategies:
        fig = _strategy_figure(plt, s, [c for c in curves if c.strategy == s], k, thresholds, method, alarms)
        fig.savefig(out / f"status_{s}.png", dpi=100)
        plt.close(fig)
    fig = _default_method_figure(plt, curves, [x for x in strategies if x != "benign"], k, thresholds, method)
    fig.savefig(out / "status_vs_queries.png", dpi=110)
    plt.close(fig)


def _strategy_figure(plt: Any, s: str, cs: list[SubjectCurve], k: int, thresholds: dict[str, float], method: str,
                     alarms: dict[str, float]) -> Any:  # fmt: skip
    """One strategy: a grid of panels, one per method, status vs queries with the truth
    overlaid (the extent: balanced fidelity on the status scale); the benign population as
    thin lines. Three columns, so that each panel is large enough to read."""
    cols = 3
    rows = -(-len(METHODS) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), sharey=True, squeeze=False)
    for ax, m in zip(axes.flat, METHODS, strict=False):
        level = thresholds.get(m, 0.5) if m in EXTENT_METHODS else alarms.get(m, 0.5)
        _method_panel(ax, m, cs, k, level, m == method)
    for ax in axes.flat[len(METHODS):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("queries", fontsize=10)
    for ax in axes[:, 0]:
        ax.set_ylabel("status", fontsize=10)
    fig.suptitle(f"{s}: each method's status (blue) against the true extent (orange, dashed); "
                 "grey: warning threshold or alarm level", fontsize=11)  # fmt: skip
    fig.tight_layout()
    return fig


def _method_panel(ax: Any, m: str, cs: list[SubjectCurve], k: int, level: float, default: bool) -> None:
    """One method's panel: each curve's status, and its truth where the method has one."""
    lw, alpha = (0.7, 0.5) if len(cs) > 1 else (1.6, 1.0)
    for c in cs:
        pts = c.method(m)
        if pts:
            ax.plot(*zip(*pts, strict=True), color="tab:blue", linewidth=lw, alpha=alpha)
        if m in EXTENT_METHODS and c.truth:  # intent has no truth to overlay
            ax.plot([n for n, _ in c.truth], [extent(v, k) for _, v in c.truth], color="tab:orange",
                    linewidth=lw, alpha=alpha, linestyle="--")  # fmt: skip
    ax.axhline(level, color="grey", linewidth=0.8, linestyle=":")
    kind = "extent" if m in EXTENT_METHODS else "intent"
    ax.set_title(f"{m} ({kind}){'  default' if default else ''}", fontsize=11)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=9)


def _default_method_figure(plt: Any, curves: list[SubjectCurve], attackers: list[str], k: int,
                           thresholds: dict[str, float], method: str) -> Any:  # fmt: skip
    """The default method for every attacker, with each one's truth. Log x axis from the
    first evaluation on (queries are positive; the statuses start at min_refit)."""
    fig, ax = plt.subplots(figsize=(8, 4.8))
    first = []
    for i, s in enumerate(attackers):
        for c in (c for c in curves if c.strategy == s):
            color = f"C{i}"
            pts = c.method(method)
            if pts:
                ax.plot(*zip(*pts, strict=True), color=color, label=s)
                first.append(pts[0][0])
            # The truth from the monitor's first evaluation on (before it there is no status).
            start = pts[0][0] if pts else 1
            tr = [(n, v) for n, v in c.truth if n >= start]
            if tr:
                ax.plot([n for n, _ in tr], [extent(v, k) for _, v in tr], color=color, linestyle="--", linewidth=0.8)
    ax.axhline(thresholds.get(method, 0.5), color="grey", linewidth=0.8, linestyle=":")
    ax.set_xscale("log")
    if first:
        _plain_log_ticks(ax, max(1.0, 0.9 * min(first)))
    ax.set(xlabel="queries (log scale)", ylabel=f"{method} (solid), true extent (dashed)", ylim=(-0.02, 1.02),
           title=f"Default method ({method}) for each attacker, truth dashed")  # fmt: skip
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=9, loc="upper left")
    fig.tight_layout()
    return fig


def _plain_log_ticks(ax: Any, lo: float) -> None:
    """The log axis from ``lo``, with plain numbers at 1-2-5 steps: a reader should not have
    to decode 10^3."""
    ax.set_xlim(left=lo)
    hi = ax.get_xlim()[1]
    ticks = [m * 10**e for e in range(0, 8) for m in (1, 2, 5) if lo <= m * 10**e <= hi]
    ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
    ax.minorticks_off()
