"""Packaging a container build relies on: the declared minimums of grpcio and protobuf admit
the committed generated code (each *_pb2*.py checks its generator's version at import), the
build backend's minimum understands the SPDX license string, the license file is there, and
the services need no plotting library."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirements() -> dict[str, Requirement]:
    return {Requirement(r).name: Requirement(r) for r in PYPROJECT["project"]["dependencies"]}


def minimum(req: Requirement) -> Version:
    lows = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
    assert lows, f"{req} states no minimum"
    return max(lows)


def generated_versions() -> tuple[set[Version], set[Version]]:
    grpc, pb = set(), set()
    for f in (ROOT / "analysim" / "_protos").rglob("*_pb2_grpc.py"):
        grpc |= {Version(v) for v in re.findall(r"GRPC_GENERATED_VERSION = '([\d.]+)'", f.read_text())}
    for f in (ROOT / "analysim" / "_protos").rglob("*_pb2.py"):
        m = re.search(r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),",
                      f.read_text())  # fmt: skip
        assert m, f"{f}: no runtime version check"
        pb.add(Version(".".join(m.groups())))
    return grpc, pb


def test_minimums_admit_the_generated_code() -> None:
    grpc, pb = generated_versions()
    assert grpc and pb
    reqs = requirements()
    for name in ("grpcio", "grpcio-health-checking", "grpcio-reflection", "grpcio-status"):
        assert minimum(reqs[name]) >= max(grpc), f"{name}: the stubs need >= {max(grpc)}"
    need = max(pb)
    assert minimum(reqs["protobuf"]) >= need, f"protobuf: the stubs need >= {need}"
    # The runtime refuses gencode of another major version.
    assert Version(f"{need.major + 1}") not in reqs["protobuf"].specifier
    assert Version(str(need)) in reqs["protobuf"].specifier


def test_build_backend_and_license() -> None:
    (setuptools,) = [Requirement(r) for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    assert minimum(setuptools) >= Version("77"), "setuptools < 77 rejects license = 'Apache-2.0'"
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_plots_are_optional() -> None:
    assert "matplotlib" not in requirements()
    assert any(Requirement(r).name == "matplotlib" for r in PYPROJECT["project"]["optional-dependencies"]["plots"])
    assert "analysim[plots]" in PYPROJECT["project"]["optional-dependencies"]["dev"]
    for pkg in ("scheduler_svc", "node_agent", "mlaas_monitor", "analysim"):
        for f in (ROOT / pkg).rglob("*.py"):
            assert not re.search(r"^(import|from) matplotlib", f.read_text(), re.M), f"{f} imports matplotlib at load"
