"""Layers point one way: analysim.core (pure) <- services <- CLI. Each package is imported, with
every one of its modules, in a fresh interpreter, and what else got imported is checked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scheduler_svc.launcher import ROOT

# Every module of the package but its ``__main__`` (an entry point, run as ``python -m``).
PROBE = """
import importlib, json, pkgutil, sys
pkg = importlib.import_module(sys.argv[1])
for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
    if m.name.rsplit(".", 1)[-1] != "__main__":
        importlib.import_module(m.name)
print(json.dumps(sorted(sys.modules)))
"""


def imported_by(package: str) -> list[str]:
    r = subprocess.run([sys.executable, "-c", PROBE, package], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def under(modules: list[str], *packages: str) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)]


@pytest.mark.parametrize("service", ["scheduler_svc", "node_agent", "mlaas_monitor", "mlaas_monitor.monitor"])
def test_a_service_never_imports_the_cli(service: str) -> None:
    assert under(imported_by(service), "analysim.cli") == []


def test_the_core_imports_no_service_and_no_cli() -> None:
    assert under(imported_by("analysim.core"), "analysim.cli", "scheduler_svc", "node_agent", "mlaas_monitor") == []
