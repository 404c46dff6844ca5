"""`analysim report DIR`: one self-contained HTML file whose every figure loads in headless
Chromium; the best value of each metric highlighted; a clear error without matplotlib."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_sweep import analysim

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FIGURES = ["JCT distribution per policy", "Utilization and fragmentation over time",
           "Preemptions and migrations against JCT gain", "Per-VC fairness"]
# Appended to a copy of the report: lists every image once the page has loaded.
PROBE = ("<script>window.addEventListener('load',()=>{const p=document.createElement('pre');p.id='probe';"
         "p.textContent=JSON.stringify([...document.images].map(i=>[i.alt,i.naturalWidth,i.naturalHeight]));"
         "document.body.appendChild(p);});</script>")


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    spec = tmp / "s.yaml"
    spec.write_text("jobs: 150\ncluster: tiny\npolicy: [fifo, srtf]\npreemption: [false, true]\nseed: [1, 2]\n"
                    "placement: random\n")
    r = analysim("sweep", str(spec), "--out", str(tmp / "sweep"), "--workers", "2", cwd=tmp)
    assert r.returncode == 0, r.stderr
    r = analysim("report", str(tmp / "sweep"), cwd=tmp)
    assert r.returncode == 0, r.stderr
    return tmp / "sweep"


def images_in_chromium(page: Path) -> list[list]:
    probe = page.with_name(page.stem + "-probe.html")
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run", "--dump-dom",
                        probe.as_uri()], capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="probe">(.*?)</pre>', r.stdout)
    assert m, r.stderr[-2000:]
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def test_report_is_one_file_with_every_figure(sweep_dir):
    page = (sweep_dir / "report.html").read_text()
    assert re.findall(r"<img alt='([^']+)' src='data:image/png;base64,", page) == FIGURES
    assert not re.search(r"(src|href)=['\"](?!data:)", page)  # nothing fetched from anywhere
    assert page.count("<tr class='ok'>") == 8


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (.ci/run installs Debian's chromium)")
def test_every_figure_loads_in_chromium(sweep_dir, tmp_path):
    images = images_in_chromium(sweep_dir / "report.html")
    assert [alt for alt, _, _ in images] == FIGURES
    assert all(w > 100 and h > 100 for _, w, h in images), images
    # The probe sees a broken figure: the same page with one image cut short.
    broken = tmp_path / "broken.html"
    text = (sweep_dir / "report.html").read_text()
    start = text.index("base64,") + len("base64,")
    broken.write_text(text[:start] + "AAAA" + text[start + 4000:])
    assert images_in_chromium(broken)[0][1] == 0


def test_best_cell_per_metric_is_highlighted(sweep_dir):
    page = (sweep_dir / "report.html").read_text()
    agg = list(csv.DictReader((sweep_dir / "aggregate.csv").open()))
    best_jct = min(float(a["avg_jct_s_mean"]) for a in agg)
    rows = re.findall(r"<tr>(.*?)</tr>", page.split("<h2>JCT distribution")[0])
    highlighted = [r for r in rows if re.search(rf"class='num best'>{best_jct / 3600:.2f} ", r)]
    assert len(highlighted) >= 1
    assert "<th>avg JCT (h) ↓</th>" in page and "± " in page


def test_report_without_matplotlib_writes_its_tables(sweep_dir):
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from analysim.cli import main\n"
            f"sys.exit(main(['report', {str(sweep_dir)!r}, '--out', {str(sweep_dir / 'x.html')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr
    # analysim.report.can_plot's one note for every command whose default plots are skipped
    assert r.stderr.strip() == "plots skipped: matplotlib is not installed (pip install 'analysim[plots]')"
    assert r.stdout.startswith(f"wrote {sweep_dir / 'x.html'} (")
    page = (sweep_dir / "x.html").read_text()
    # The same tables as with matplotlib, and a note where each figure would be.
    full = (sweep_dir / "report.html").read_text()
    assert page.count("<tr class='ok'>") == full.count("<tr class='ok'>") == 8
    assert re.findall(r"<tbody>.*?</tbody>", page)[0] == re.findall(r"<tbody>.*?</tbody>", full)[0]
    assert "<img" not in page
    assert page.count("Figure skipped: matplotlib is not installed") == len(FIGURES)


def test_report_of_a_folder_that_is_no_sweep(tmp_path):
    r = analysim("report", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not a sweep folder" in r.stderr


def test_inflate_sweep_report(tmp_path):
    data = Path(__file__).resolve().parent / "data"
    spec = tmp_path / "s.yaml"
    spec.write_text(f"trace: {data / 'openb_inflate_small.csv'}\ncluster: {data / 'openb_nodes_small.csv'}\n"
                    "mode: inflate\nplacement: [fgd, consolidate]\nseed: [1, 2]\n")
    assert analysim("sweep", str(spec), "--out", str(tmp_path / "s"), cwd=tmp_path).returncode == 0
    r = analysim("report", str(tmp_path / "s"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "s" / "report.html").read_text()
    assert re.findall(r"<img alt='([^']+)'", page) == ["Fragmentation as the cluster fills"]
    assert "<th>tasks placed ↑</th>" in page and page.count("<tr class='ok'>") == 4
