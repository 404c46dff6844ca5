"""Plots a reader can read at a glance: every panel says what it shows, every row and axis has
its label inside the image, and one run has one colour across the panels of a figure. The
figures are taken as matplotlib draws them (Figure.savefig, recorded) and measured with the
Agg renderer that writes the PNG."""

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
    assert mechanisms.axes[0].yaxis.label.get_text()
