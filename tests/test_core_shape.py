"""The core stays readable (issue 29's bounds): no function in analysim/core above cyclomatic
complexity 25 as radon counts it, and no module above 700 lines. The engine was one class of
1,946 lines with a pass of complexity 104 before its rebuild; these keep it from growing back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from radon.complexity import cc_visit

CORE = Path(__file__).resolve().parent.parent / "analysim" / "core"
MAX_COMPLEXITY = 25
MAX_LINES = 700


def _blocks(blocks: list) -> Iterator:
    """Every function, method and closure radon found, nested ones included."""
    for b in blocks:
        yield b
        yield from _blocks(getattr(b, "methods", []))
        yield from _blocks(getattr(b, "closures", []))


def _modules() -> list[Path]:
    found = sorted(CORE.rglob("*.py"))
    assert len(found) > 20  # (the core is where this test thinks it is)
    return found


def test_no_function_in_the_core_is_above_complexity_25() -> None:
    over = [f"{path.relative_to(CORE)}:{b.lineno} {b.name} ({b.complexity})"
            for path in _modules() for b in _blocks(cc_visit(path.read_text()))
            if b.complexity > MAX_COMPLEXITY]
    assert over == []


def test_no_module_in_the_core_is_above_700_lines() -> None:
    over = [f"{path.relative_to(CORE)} ({n})" for path in _modules()
            if (n := len(path.read_text().splitlines())) > MAX_LINES]
    assert over == []


def test_the_complexity_count_sees_a_too_complex_function() -> None:
    """The check counts what it should: a function of 26 branches is over the bound."""
    src = "def f(x):\n" + "".join(f"    if x == {i}:\n        return {i}\n" for i in range(MAX_COMPLEXITY)) + "    return -1\n"
    assert [b.complexity for b in _blocks(cc_visit(src))] == [MAX_COMPLEXITY + 1]


def test_every_core_module_is_compiled() -> None:
    # The compiled core is what users run: a module left out of setup.py's list runs interpreted,
    # 5-10 times slower, with nothing to show for it but the time (the preemption search's trial
    # did, once). policies.py builds the plugins once per run and is left interpreted.
    import ast

    setup = CORE.parent.parent / "setup.py"
    listed = next(node.value for node in ast.walk(ast.parse(setup.read_text()))
                  if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "COMPILED")
    compiled = {ast.literal_eval(e) for e in listed.elts}  # type: ignore[attr-defined]
    modules = {str(p.relative_to(CORE.parent.parent)) for p in _modules()}
    assert modules - compiled == {"analysim/core/policies.py"}
    assert compiled <= modules | {str(p.relative_to(CORE.parent.parent)) for p in CORE.parent.glob("*.py")}
