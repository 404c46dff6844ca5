"""The analysim.v1 contracts under buf (pip buf-bin, the dev extra): lint with the STANDARD
rules is clean, and nothing breaks the committed baseline (protos/baseline.binpb). Offline:
buf.yaml has no remote dependencies."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_gateway_helpers import ROOT

BASELINE = ROOT / "protos" / "baseline.binpb"


def buf_binary() -> str:
    found = shutil.which("buf", path=str(Path(sys.executable).parent)) or shutil.which("buf")
    if found is None:
        pytest.skip("buf is not installed (pip install buf-bin, in the dev extra)")
    return found


def buf(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([buf_binary(), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_buf_lint_standard_is_clean() -> None:
    r = buf("lint")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "STANDARD" in (ROOT / "buf.yaml").read_text()


def test_no_breaking_change_against_the_baseline() -> None:
    r = buf("breaking", "--against", str(BASELINE))
    assert r.returncode == 0, f"{r.stdout}{r.stderr}\n(an intended change: `make protos-baseline`)"


def test_breaking_catches_a_removed_field(tmp_path: Path) -> None:
    """The check above can fail: a copy of the contracts without Job.end_s breaks the baseline."""
    shutil.copy(ROOT / "buf.yaml", tmp_path / "buf.yaml")
    for proto in (ROOT / "protos").rglob("*.proto"):
        target = tmp_path / proto.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(proto.read_text())
    scheduler = tmp_path / "protos" / "analysim" / "v1" / "scheduler.proto"
    text = scheduler.read_text()
    line = next(ln for ln in text.splitlines() if "optional double end_s = 10;" in ln)
    scheduler.write_text(text.replace(line + "\n", ""))
    r = buf("breaking", "--against", str(BASELINE), cwd=tmp_path)
    assert r.returncode != 0 and "end_s" in r.stdout + r.stderr, r.stdout + r.stderr
