#!/usr/bin/env python3
"""Regenerate the Python code for every ``protos/**/*.proto`` with grpc_tools.protoc.

The include root is ``protos/`` (as buf.yaml's module root), so a proto imports another as
``analysim/v1/<file>.proto`` and its descriptor is named so. The ``.proto`` files stay in
``protos/``; the generated ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` go to the package
``analysim._protos`` (``protos/analysim/v1/x.proto`` -> ``analysim/_protos/v1/x_pb2.py``), under
the project's own name rather than a generic top-level ``protos``. protoc writes their imports of
each other as ``analysim.v1...``, which would be our ``analysim`` package, so they are rewritten
to ``analysim._protos.v1...``. Files are processed in sorted order and written only when they
differ, so a run is deterministic and a no-op when nothing changed.

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
# The proto package root (the first folder under protos/) -> the Python package its code goes to.
PACKAGES = {"analysim": "analysim._protos"}
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files(root: Path = ROOT) -> list[Path]:
    """Every .proto under protos/, relative to ``root``, sorted for a stable order."""
    return sorted(p.relative_to(root) for p in (root / PROTO_DIR).rglob("*.proto"))


def _rewrite_imports(text: str) -> str:
    """``from analysim.v1 import x_pb2`` -> ``from analysim._protos.v1 import x_pb2``."""
    pattern = re.compile(rf"^(from|import) ({'|'.join(map(re.escape, sorted(PACKAGES)))})\.", re.M)
    return pattern.sub(lambda m: f"{m.group(1)} {PACKAGES[m.group(2)]}.", text)


def _package_dir(proto: Path) -> Path:
    """Where ``protos/<root>/<rest>/x.proto``'s code goes: ``<PACKAGES[root] as a path>/<rest>``."""
    root, *rest = proto.relative_to(PROTO_DIR).parent.parts
    if root not in PACKAGES:
        raise SystemExit(f"gen_protos: {proto}: no Python package for protos/{root}/ (scripts/gen_protos.py PACKAGES)")
    return Path(*PACKAGES[root].split("."), *rest)


def generated_names(proto: Path) -> list[Path]:
    """The generated files of ``proto`` (``protos/...``), relative to the repository root."""
    return [_package_dir(proto) / (proto.stem + suffix) for suffix in GENERATED_SUFFIXES]


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
    generated: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{include}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *[str(root / p) for p in protos],
        ]
        if protoc.main(args) != 0:
            raise SystemExit("gen_protos: protoc failed")
        for p in protos:
            # protoc mirrors the include-relative path (analysim/v1/x_pb2.py); move it to the package
            for suffix, target in zip(GENERATED_SUFFIXES, generated_names(p), strict=True):
                written = Path(tmp) / p.relative_to(PROTO_DIR).parent / (p.stem + suffix)
                (out_dir / target).parent.mkdir(parents=True, exist_ok=True)
                (out_dir / target).write_text(_rewrite_imports(written.read_text()))
                generated.append(target)
    return generated


def ensure_packages(root: Path) -> None:
    """Every directory holding generated code must be a package for the imports to work."""
    for proto in proto_files(root):
        d = root / _package_dir(proto)
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
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists() or not filecmp.cmp(Path(tmp) / rel, target, shallow=False):
                target.write_bytes((Path(tmp) / rel).read_bytes())
                print(f"wrote {rel}")
    ensure_packages(ROOT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
