"""The one guard for tests that read ../shared (real traces, datasets, the PAI and Helios references): such a
test is marked ``shared`` and skipped, naming the file, when any file it reads is absent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
TRACES = SHARED / "traces"
DATASETS = SHARED / "datasets"
PAI = SHARED / "reference" / "pai_sim"
HELIOS = SHARED / "reference" / "helios"


def shared_marks(*paths: Path) -> list[pytest.MarkDecorator]:
    """``shared``, and skip unless every one of ``paths`` exists (for ``pytest.param(marks=...)``)."""
    missing = [p for p in paths if not p.exists()]
    return [pytest.mark.shared, pytest.mark.skipif(bool(missing), reason=f"needs {missing[0] if missing else ''}")]


def needs_shared(*paths: Path) -> Callable:
    """Decorator form of ``shared_marks``: ``@needs_shared(TRACES / "philly.csv")``."""

    def apply(test: Callable) -> Callable:
        for mark in shared_marks(*paths):
            test = mark(test)
        return test

    return apply
