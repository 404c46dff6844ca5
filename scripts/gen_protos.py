#!/usr/bin/env python3
"""Regenerate the Python code for every ``protos/**/*.proto`` with grpc_tools.protoc.

The include root is ``protos/`` (as buf.yaml's module root), so a proto imports another as
``analysim/v1/<file>.proto`` and its descriptor is named so. The generated ``*_pb2.py``,
``*_pb2.pyi`` and ``*_pb2_grpc.py`` files land next to each ``.proto``; protoc writes their
imports of each other as ``analysim.v1...``, which would be our ``analysim`` package, so they
are rewritten to ``protos.analysim.v1...``. The packages are importable from a checkout or an
installed wheel. Files are
processed in sorted order and written only when they differ, so a run is deterministic
and a no-op when nothing changed.

    python scripts/gen_protos.py                 # regenerate in place
    python scripts/gen_protos.py --out DIR       # write the tree under DIR instead
    python scripts/gen_protos.py --check         # exit 1 if the committed code is stale
"""

from __future__ import annotations

import argparse
import filecmp
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = "protos"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files(root: Path = ROOT) -> list[Path]:
    """Every .proto under protos/, relative to ``root``, sorted for a stable order."""
    return sorted(p.relative_to(root) for p in (root / PROTO_DIR).rglob("*.proto"))


def _rewrite_imports(path: Path, packages: set[str]) -> None:
    """``from analysim.v1 import x_pb2`` -> ``from protos.analysim.v1 import x_pb2``."""
    pattern = re.compile(rf"^(from|import) ({'|'.join(map(re.escape, sorted(packages)))})\.", re.M)
    text = path.read_text()
    new = pattern.sub(rf"\1 {PROTO_DIR}.\2.", text)
    if new != text:
        path.write_text(new)


def generated_names(proto: Path) -> list[Path]:
    stem = proto.with_suffix("")
    return [stem.parent / (stem.name + suffix) for suffix in GENERATED_SUFFIXES]


def generate(out_dir: Path, root: Path = ROOT) -> list[Path]:
    """Compile every proto into ``out_dir`` (mirroring the tree); return generated paths."""
    # Imported here so ``--help`` works without grpcio-tools installed.
    import grpc_tools
    from grpc_tools import protoc

    protos = proto_files(root)
    if not protos:
        return []
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    include = root / PROTO_DIR
    gen_dir = out_dir / PROTO_DIR
    gen_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{include}",
        f"-I{well_known}",
        f"--python_out={gen_dir}",
        f"--pyi_out={gen_dir}",
        f"--grpc_python_out={gen_dir}",
        *[str(root / p) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("gen_protos: protoc failed")
    generated = [g for p in protos for g in generated_names(p)]
    packages = {p.relative_to(PROTO_DIR).parts[0] for p in protos}
    for g in generated:
        _rewrite_imports(out_dir / g, packages)
    return generated


def ensure_packages(root: Path) -> None:
    """Every directory holding generated code must be a package for the imports to work."""
    for proto in proto_files(root):
        d = root / proto.parent
        while d != root:
            init = d / "__init__.py"
            if not init.exists():
                init.write_text("")
            d = d.parent


def stale_files(root: Path = ROOT) -> list[Path]:
    """Generated files that are missing or differ from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp), root)
        return [g for g in fresh if not (root / g).exists() or not filecmp.cmp(Path(tmp) / g, root / g, shallow=False)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the generated tree here instead of in place")
    parser.add_argument("--check", action="store_true", help="only report stale generated files")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for path in stale:
            print(f"stale: {path}", file=sys.stderr)
        return 1 if stale else 0
    if args.out is not None:
        generate(args.out)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for rel in generate(Path(tmp)):
            target = ROOT / rel
            if not target.exists() or not filecmp.cmp(Path(tmp) / rel, target, shallow=False):
                target.write_bytes((Path(tmp) / rel).read_bytes())
                print(f"wrote {rel}")
    ensure_packages(ROOT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
