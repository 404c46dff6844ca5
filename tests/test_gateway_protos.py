"""The committed generated gRPC code must match a fresh generation from the .proto files."""

from __future__ import annotations

import ast
import filecmp
import importlib
import re
import subprocess
import sys
from pathlib import Path

from tests.test_gateway_helpers import ROOT

GEN = ROOT / "scripts" / "gen_protos.py"


def generate(out: Path) -> list[Path]:
    subprocess.run([sys.executable, str(GEN), "--out", str(out)], check=True, cwd=ROOT)
    return sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())


def header_version(text: str) -> str | None:
    m = re.search(r"^# Protobuf Python Version: (\S+)$", text, re.M)
    return m.group(1) if m else None


def without_grpc_stamp(text: str) -> str:
    """A ``_pb2_grpc.py`` without the grpcio-tools version it stamps (GRPC_GENERATED_VERSION, the
    least grpcio it accepts at import): a later grpcio-tools writes its own version there and
    nothing else differs. The committed stamp stays at pyproject's floor, so that the code imports
    under every grpcio pyproject allows."""
    return re.sub(r"^GRPC_GENERATED_VERSION = '[^']*'$", "GRPC_GENERATED_VERSION = ...", text, flags=re.M)


def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    fresh = generate(tmp_path)
    protos = sorted(p.relative_to(ROOT) for p in (ROOT / "protos").rglob("*.proto"))
    assert protos, "no .proto files found"
    # Every proto yields its three files, and each is committed.
    assert len(fresh) == 3 * len(protos)
    for rel in fresh:
        committed = ROOT / rel
        assert committed.exists(), f"{rel} is not committed: run `make protos`"
        new_text = (tmp_path / rel).read_text()
        if rel.name.endswith("_pb2.py") and header_version(new_text) != header_version(committed.read_text()):
            # A different protoc writes different (equivalent) code; compare what matters,
            # the serialised descriptor, below.
            continue
        if rel.name.endswith("_pb2_grpc.py"):
            assert without_grpc_stamp(new_text) == without_grpc_stamp(committed.read_text()), \
                f"{rel} is stale: run `make protos`"
            continue
        assert filecmp.cmp(tmp_path / rel, committed, shallow=False), f"{rel} is stale: run `make protos`"


def test_the_committed_grpc_stamp_is_pyproject_s_floor() -> None:
    floor = re.search(r'"grpcio>=([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert floor, "pyproject.toml names no grpcio floor"
    for path in sorted((ROOT / "analysim" / "_protos").rglob("*_pb2_grpc.py")):
        stamp = re.search(r"^GRPC_GENERATED_VERSION = '([^']*)'$", path.read_text(), re.M)
        assert stamp and stamp[1] == floor[1], f"{path.name} accepts grpcio >= {stamp and stamp[1]}, pyproject >= {floor[1]}"


def test_committed_descriptors_match_the_protos(tmp_path: Path) -> None:
    generate(tmp_path)
    for proto in sorted((ROOT / "protos").rglob("*.proto")):
        # protos/analysim/v1/x.proto -> analysim/_protos/v1/x_pb2.py (scripts/gen_protos.py)
        rel = Path("analysim", "_protos", *proto.relative_to(ROOT / "protos" / "analysim").parent.parts, proto.stem)
        module = ".".join(rel.parts) + "_pb2"
        committed = importlib.import_module(module).DESCRIPTOR.serialized_pb
        sys.path.insert(0, str(tmp_path))
        try:
            code = (tmp_path / rel.parent / f"{rel.name}_pb2.py").read_text()
            m = re.search(r"AddSerializedFile\((b'.*?')\)\n", code, re.S)
            assert m, "unexpected generated code layout"
            fresh = ast.literal_eval(m.group(1))
        finally:
            sys.path.remove(str(tmp_path))
        assert committed == fresh, f"{proto.name}: committed code does not match the .proto: run `make protos`"

