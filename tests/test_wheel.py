"""A wheel others can install: the pure-Python wheel (ANALYSIM_PURE_PYTHON=1) is tagged for any
Python and platform, carries the generated gRPC code and its contracts, states its classifiers,
and, installed into a fresh virtualenv outside the repository, runs `analysim simulate` on the
embedded default trace. Its dependencies come from this environment (nothing is downloaded)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _build_pure_wheel(out: Path) -> Path:
    """From a copy of the checkout: setuptools builds in the source's build/, where an earlier
    build's files would end up in this wheel (and this build's in the checkout)."""
    src = out.parent / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "dist", "out", "*.egg-info",
                                                             "__pycache__", ".pytest_cache", ".ruff_cache", "*.so"))
    env = {**os.environ, "ANALYSIM_PURE_PYTHON": "1"}
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                        "-w", str(out), str(src)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = out.glob("analysim-*.whl")
    return wheel


def test_pure_wheel_installs_and_simulates_outside_the_repository(tmp_path: Path) -> None:
    wheel = _build_pure_wheel(tmp_path / "dist")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
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
