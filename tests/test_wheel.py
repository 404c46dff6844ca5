"""A wheel others can install: `make dist-pure` (the part of `make dist` that compiles nothing)
writes a pure-Python wheel tagged for any Python and platform, carrying the generated gRPC code,
stating its classifiers and project URLs, and an sdist with the contracts, their generator and
the docs; the wheel, installed into a fresh virtualenv outside the repository, runs `analysim
simulate` on the embedded default trace. Its dependencies come from this environment (nothing is
downloaded)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _make_dist_pure(tmp: Path) -> tuple[Path, Path]:
    """`make dist-pure` in a copy of the checkout (setuptools builds in the source's build/, where
    an earlier build's files would end up in this wheel, and this build's in the checkout), with
    this environment's interpreter instead of the copy's own .venv (-o: not made)."""
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "dist", "out", "*.egg-info",
                                                             "__pycache__", ".pytest_cache", ".ruff_cache", "*.so"))
    env = {k: v for k, v in os.environ.items() if k not in ("ANALYSIM_PURE_PYTHON", "MAKEFLAGS")}
    r = subprocess.run(["make", "-C", str(src), "-o", ".venv/.installed-stamp", "dist-pure",
                        f"BIN={Path(sys.executable).parent}"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    built = sorted((src / "dist").iterdir())
    assert [p.name for p in built] == ["analysim-0.1.0-py3-none-any.whl", "analysim-0.1.0.tar.gz"], built
    return built[0], built[1]


def test_pure_wheel_installs_and_simulates_outside_the_repository(tmp_path: Path) -> None:
    wheel, sdist = _make_dist_pure(tmp_path)
    with tarfile.open(sdist) as t:
        files = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {"buf.yaml", "scripts/gen_protos.py", "protos/analysim/v1/scheduler.proto",
            "README.md", "docs/live.md", "docs/simulation.md"} <= files, sorted(files)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = Parser().parsestr(z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode())
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"analysim", "scheduler_svc", "node_agent", "mlaas_monitor"}, tops  # no generic "protos"
    assert not any(n.endswith((".so", ".c", ".pyd")) for n in names)
    gen = [n for n in names if n.endswith(("_pb2.py", "_pb2_grpc.py"))]
    assert gen and all(n.startswith("analysim/_protos/v1/") for n in gen), gen
    classifiers = meta.get_all("Classifier")
    assert "Programming Language :: Python :: 3 :: Only" in classifiers and meta["License-Expression"] == "Apache-2.0"
    assert {"Topic :: System :: Distributed Computing", "Topic :: Security"} <= set(classifiers)
    # Where PyPI puts the distribution under its name (no public repository yet: pyproject.toml).
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    page = f"https://pypi.org/project/{meta['Name']}/"
    assert urls == {"Homepage": page, "Documentation": page + "#description", "Source": page + "#files"}, urls

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    # The dependencies: this environment's, as a plain path entry (its .pth files, among them the
    # editable install of the checkout, are not read), after the venv's own site-packages.
    site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                        text=True).strip())
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    r = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ANALYSIM_PURE_PYTHON")}
    where = subprocess.run([str(py), "-c", "import analysim, analysim.core.engine as e; print(analysim.__file__, e.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert where.returncode == 0 and str(ROOT) not in where.stdout and str(venv) in where.stdout, where
    r = subprocess.run([str(venv / "bin" / "analysim"), "simulate", "--jobs", "300", "--out", "out", "--no-plots"],
                       cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((work / "out" / "summary.json").read_text())
    assert summary["jobs_total"] == 300 and summary["jobs_completed"] == 300
