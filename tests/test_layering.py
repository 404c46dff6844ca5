"""Layers point one way: analysim.core (pure) <- services <- CLI, and no service reaches into
another's modules (what they share is a library module under analysim/). Each package is imported,
with every one of its modules, in a fresh interpreter, and what else got imported is checked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scheduler_svc.launcher import ROOT

# Every module of the package, its ``__main__`` entry points included: imported under their own
# name they only define ``main`` (it runs under ``if __name__ == "__main__"``), but their imports
# are what ``python -m`` loads.
PROBE = """
import importlib, json, pkgutil, sys
pkg = importlib.import_module(sys.argv[1])
for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
    importlib.import_module(m.name)
print(json.dumps(sorted(sys.modules)))
"""

# What each service package, with all of its modules, must not load.
SERVICES = ("scheduler_svc", "node_agent", "mlaas_monitor")
FORBIDDEN = {
    "scheduler_svc": ("analysim.cli", "node_agent", "mlaas_monitor"),
    "node_agent": ("analysim.cli", "scheduler_svc", "mlaas_monitor"),
    "mlaas_monitor": ("analysim.cli", "scheduler_svc", "node_agent"),
}


def imported_by(package: str) -> list[str]:
    r = subprocess.run([sys.executable, "-c", PROBE, package], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def under(modules: list[str], *packages: str) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)]


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_imports_neither_the_cli_nor_another_service(service: str) -> None:
    modules = imported_by(service)
    assert f"{service}.__main__" in modules  # the entry points were probed too
    assert under(modules, *FORBIDDEN[service]) == []


def test_the_core_imports_no_service_and_no_cli() -> None:
    assert under(imported_by("analysim.core"), "analysim.cli", *SERVICES) == []
