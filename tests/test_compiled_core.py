"""The simulation core as built by setup.py: compiled by mypyc, current with its source, and
behaving as plain Python does where compiled classes differ from it (pickling frozen records,
constructor keywords)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import os
import pickle
from pathlib import Path

import pytest

from analysim.core.cluster import ClusterSpec, NodeSpec, VCSpec
from analysim.core.engine import EngineConfig
from analysim.core.fragmentation import TaskClass, WorkloadDistribution
from analysim.core.job import JobSpec
from analysim.core.plugins.queue import QUEUE_SORTS
from analysim.core.policies import build_policy
from analysim.core.records import Decision

ROOT = Path(__file__).resolve().parents[1]


def _compiled_modules() -> list[str]:
    """The module names setup.py compiles, read from its COMPILED list."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    paths = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                 if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "COMPILED")
    return [p.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for p in paths]


@pytest.mark.skipif(os.environ.get("ANALYSIM_PURE_PYTHON", "") not in ("", "0"),
                    reason="installed with ANALYSIM_PURE_PYTHON: the core runs as plain Python")
def test_every_core_module_runs_compiled_and_newer_than_its_source():
    modules = _compiled_modules()
    assert "analysim.core.engine" in modules
    for name in modules:
        origin = Path(importlib.import_module(name).__file__)
        assert origin.suffix == ".so", (
            f"{name} runs from {origin.name}, not compiled: reinstall (make test does), or set "
            "ANALYSIM_PURE_PYTHON=1 for a plain-Python install")
        source = ROOT / (name.replace(".", "/") + ".py")
        if not source.exists():
            source = ROOT / name.replace(".", "/") / "__init__.py"
        assert origin.stat().st_mtime >= source.stat().st_mtime, (
            f"{origin.name} is older than {source.relative_to(ROOT)}: the compiled core is stale; "
            "reinstall (make test does)")


RECORDS = [
    JobSpec("j1", 3.5, 60.0, 2, cpu_milli=100, vc="a", gpu_models=("V100",)),
    JobSpec("j2", 0.0, None, 1, gpu_milli=250),
    NodeSpec("n0", "r0", "V100", 8, 64_000, 512_000),
    VCSpec("a", 8.0, ("n0",)),
    ClusterSpec("c", (NodeSpec("n0", "r0", "V100", 8, 64_000, 512_000),), (VCSpec("a", 4.0),),
                allow_borrowing=False, cross_node_slowdown=0.1),
    EngineConfig(preemption=True, checkpoint_interval_s=None, seed=7),
    Decision(1.0, "launch", "j1", ("n0",)),
    TaskClass(2, 1000, 0, 0, ("V100",)),
    WorkloadDistribution((TaskClass(1, 500),), (3,)),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_frozen_records_survive_pickling(record):
    # Ray and process pools pickle traces and specs; a compiled frozen dataclass cannot be restored
    # attribute by attribute, so each one is rebuilt through its constructor (job.by_fields).
    copy = pickle.loads(pickle.dumps(record))
    assert copy == record and type(copy) is type(record)
    assert dataclasses.astuple(copy) == dataclasses.astuple(record)


def test_each_queue_declares_the_options_its_constructor_takes():
    # build_policy checks options against these names: a compiled class's constructor neither
    # shows its signature nor refuses keywords it does not take.
    source = ast.parse((ROOT / "analysim/core/plugins/queue.py").read_text())
    inits = {cls.name: [a.arg for a in fn.args.args[1:]]
             for cls in source.body if isinstance(cls, ast.ClassDef)
             for fn in cls.body if isinstance(fn, ast.FunctionDef) and fn.name == "__init__"}
    for cls in QUEUE_SORTS.values():
        assert list(cls.options) == inits.get(cls.__name__, []), cls.__name__


def test_an_option_a_queue_does_not_take_is_refused_by_name():
    with pytest.raises(ValueError, match="'fifo' takes no option 'starve_factor'; it takes: none"):
        build_policy("fifo", queue_options={"starve_factor": 2.0})
    with pytest.raises(ValueError, match="'tiresias' takes no option 'window'; it takes: thresholds_gpu_s, starve_factor"):
        build_policy("tiresias", queue_options={"window": 3})
    assert build_policy("tiresias", queue_options={"starve_factor": 2.0}).queue.starve_factor == 2.0
