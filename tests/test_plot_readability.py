"""Plots a reader can read at a glance: every panel says what it shows, every row and axis has
its label inside the image and within its axis, one run has one colour across the panels of a
figure, text stays legible when the figure is shown at a screen's width, and an axis shows the
range its data has. The figures are taken as matplotlib draws them (Figure.savefig, recorded)
and measured with the Agg renderer that writes the PNG."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from analysim.cli import main as analysim
from analysim.sweep.report import SweepData, fig_fairness, fig_mechanisms
from tests.test_sweep_report import sweep_dir  # noqa: F401 — the module's sweep fixture


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    figures: list[Figure] = []
    save = Figure.savefig

    def record(self: Figure, *a, **kw):  # noqa: ANN202
        figures.append(self)
        out = save(self, *a, **kw)
        renderers[self] = self.canvas.get_renderer()  # the Agg canvas, before plt.close replaces it
        return out

    monkeypatch.setattr(Figure, "savefig", record)
    return figures


renderers: dict[Figure, object] = {}
# A figure is looked at about this wide (a laptop's browser or image viewer, GitHub's column),
# and text below MIN_TEXT_PX there is not read at a glance.
DISPLAY_WIDTH_PX = 1000
MIN_TEXT_PX = 9.0


def _shown_px(fig: Figure, text) -> float:  # noqa: ANN001 — a matplotlib Text
    """The height of ``text``'s font when ``fig`` is shown DISPLAY_WIDTH_PX wide."""
    return text.get_fontsize() / 72 * DISPLAY_WIDTH_PX / fig.get_figwidth()


def _inside(fig: Figure, artist) -> bool:  # noqa: ANN001 — a matplotlib Text
    box, frame = artist.get_window_extent(renderers[fig]), fig.bbox
    return box.x0 >= frame.x0 and box.y0 >= frame.y0 and box.x1 <= frame.x1 and box.y1 <= frame.y1


def test_compare_bars_take_the_colour_of_their_cdf_line(tmp_path: Path, drawn: list[Figure]) -> None:
    assert analysim(["compare", "--jobs", "150", "--policies", "fifo,srtf,sjf", "--workers", "1", "--no-progress",
                     "--out", str(tmp_path / "c")]) == 0
    (fig,) = drawn
    cdf, bars = fig.axes
    lines = {line.get_label(): to_hex(line.get_color()) for line in cdf.get_lines()}
    labels = [t.get_text() for t in bars.get_yticklabels()]
    assert labels == ["fifo/consolidate", "srtf/consolidate", "sjf/consolidate"]
    assert [to_hex(p.get_facecolor()) for p in bars.patches] == [lines[x] for x in labels]
    assert len(set(lines.values())) == 3


def test_jct_cdf_has_a_title(tmp_path: Path, drawn: list[Figure]) -> None:
    assert analysim(["simulate", "--jobs", "150", "--no-progress", "--out", str(tmp_path / "s")]) == 0
    (cdf,) = [f for f in drawn if f.axes[0].get_xscale() == "log"]
    assert cdf.axes[0].get_title() == "fifo/consolidate on demo: job completion time, 150 completed jobs"


def test_report_heatmap_rows_and_scatter_label_are_readable(sweep_dir: Path, drawn: list[Figure]) -> None:  # noqa: F811
    d = SweepData(sweep_dir)
    assert fig_fairness(d) is not None and fig_mechanisms(d) is not None
    fairness, mechanisms = drawn
    bars, heat = fairness.axes[:2]
    rows = [t.get_text() for t in heat.get_yticklabels()]
    assert rows == [t.get_text() for t in bars.get_yticklabels()] and all(rows), rows
    for ax in mechanisms.axes:
        for text in (ax.yaxis.label, ax.xaxis.label):
            if text.get_text():
                assert _inside(mechanisms, text), f"{text.get_text()!r} is cut off"
    ylabel = mechanisms.axes[0].yaxis.label
    assert ylabel.get_text()
    # ... and no longer than its axis, with room to spare: a label that fills its axis (the old
    # one-line label took 97 % of it) is cut off by the first change of font or figure height.
    label, axis = ylabel.get_window_extent(renderers[mechanisms]), mechanisms.axes[0].get_window_extent(
        renderers[mechanisms])
    assert label.height <= 0.85 * axis.height, f"{ylabel.get_text()!r}: {label.height:.0f} px on a {axis.height:.0f} px axis"


def test_monitor_eval_figures_are_readable(tmp_path: Path, drawn: list[Figure]) -> None:
    assert analysim(["monitor-eval", "--dataset", "wine", "--max-leaf-nodes", "4", "--strategies", "random,pathfinding",
                     "--budget", "60", "--no-progress", "--out", str(tmp_path / "m")]) == 0
    *panels, overview = drawn  # status_random.png, status_pathfinding.png, then status_vs_queries.png
    assert len(panels) == 2
    # Every method's panel is legible at a screen's width (they were a 2,520 x 340 strip).
    for fig in panels:
        for ax in (a for a in fig.axes if a.get_visible()):
            for text in [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.get_xticklabels(), *ax.get_yticklabels()]:
                if text.get_text():
                    assert _shown_px(fig, text) >= MIN_TEXT_PX, (
                        f"{text.get_text()!r}: {_shown_px(fig, text):.1f} px when shown {DISPLAY_WIDTH_PX} px wide")
    # The overview's x axis (queries) starts where its data does: no negative queries, no empty left part.
    (ax,) = overview.axes
    lo, hi = ax.get_xlim()
    assert lo > 0, f"x axis from {lo:g} queries"
    shown = [t.get_text() for t in ax.get_xticklabels() if lo <= t.get_position()[0] <= hi]
    assert shown and not [t for t in shown if t.startswith(("−", "-"))], shown
    first = min(min(line.get_xdata()) for line in ax.get_lines() if line.get_transform() == ax.transData)
    left = ax.transAxes.inverted().transform(ax.transData.transform((first, 0)))[0]
    assert left <= 0.1, f"the data starts {left:.0%} of the way along the x axis"
