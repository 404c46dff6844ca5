"""The code stays readable and each piece of state has one owner.

Sizes: no function above cyclomatic complexity 25 as radon counts it, no module above 700 lines,
no class above 25 fields (the engine was one class of 1,946 lines with a pass of complexity 104
before its rebuild; these keep it from growing back). Ownership: every field says what it is (a
comment on its line or the line above), and no package imports itself in a circle, imports made
only for type checking included (a circle is two modules that each reach into the other's state).

Each package is held to the checks listed for it in ``HELD``; a package joins a check when it
meets it, and stays held from then on.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from radon.complexity import cc_visit

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "analysim" / "core"
MAX_COMPLEXITY = 25
MAX_LINES = 700
MAX_FIELDS = 25

# package (a folder under the repository) -> the checks it is held to
HELD: dict[str, set[str]] = {
    "analysim/core": {"complexity", "lines", "fields", "comments", "circles"},
    "scheduler_svc": {"complexity", "lines", "fields", "comments", "circles"},
    "mlaas_monitor": {"complexity", "lines", "fields", "comments", "circles"},
}
# Classes allowed more fields than MAX_FIELDS, and why: the engine is the one owner of every state
# change and the one implementation of the plugins' Handle, the recorder's RunView and the pass's
# Actuator; what it holds it delegates to an owner each (the table, the tally, the queue, the
# scheduler, ...), and what is left is those owners and the Handle's own attributes.
FIELD_BOUNDS = {"analysim/core/engine.py:Engine": 30}


def _held(check: str) -> list[str]:
    return sorted(p for p, checks in HELD.items() if check in checks)


def _blocks(blocks: list) -> Iterator:
    """Every function, method and closure radon found, nested ones included."""
    for b in blocks:
        yield b
        yield from _blocks(getattr(b, "methods", []))
        yield from _blocks(getattr(b, "closures", []))


def _modules(package: str) -> list[Path]:
    found = sorted((ROOT / package).rglob("*.py"))
    assert len(found) > 5  # (the package is where this test thinks it is)
    return found


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("package", _held("complexity"))
def test_no_function_is_above_complexity_25(package: str) -> None:
    over = [f"{_name(path)}:{b.lineno} {b.name} ({b.complexity})"
            for path in _modules(package) for b in _blocks(cc_visit(path.read_text()))
            if b.complexity > MAX_COMPLEXITY]
    assert over == []


@pytest.mark.parametrize("package", _held("lines"))
def test_no_module_is_above_700_lines(package: str) -> None:
    over = [f"{_name(path)} ({n})" for path in _modules(package)
            if (n := len(path.read_text().splitlines())) > MAX_LINES]
    assert over == []


def test_the_complexity_count_sees_a_too_complex_function() -> None:
    """The check counts what it should: a function of 26 branches is over the bound."""
    src = "def f(x):\n" + "".join(f"    if x == {i}:\n        return {i}\n" for i in range(MAX_COMPLEXITY)) + "    return -1\n"
    assert [b.complexity for b in _blocks(cc_visit(src))] == [MAX_COMPLEXITY + 1]


# --- fields --------------------------------------------------------------------------------------

def class_fields(cls: ast.ClassDef) -> dict[str, int]:
    """A class's fields and the line each is first declared on: its annotated class-level names
    (dataclass fields, slots classes' declarations) and every ``self.x`` its methods assign,
    in source order. Class constants (upper-case names) and ``ClassVar``s are not fields."""
    fields: dict[str, int] = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
            if not name.isupper() and "ClassVar" not in ast.unparse(node.annotation):
                fields.setdefault(name, node.lineno)
    for fn in cls.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
            for t in targets:
                for leaf in ast.walk(t):
                    if (isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name)
                            and leaf.value.id == "self" and isinstance(leaf.ctx, ast.Store)):
                        fields.setdefault(leaf.attr, leaf.lineno)
    return fields


def _classes(package: str) -> Iterator[tuple[Path, ast.ClassDef, list[str]]]:
    for path in _modules(package):
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                yield path, node, text.splitlines()


def _commented(lines: list[str], lineno: int) -> bool:
    """A comment on the field's line, or on the line(s) just above it."""
    line = lines[lineno - 1]
    if "#" in line:
        return True
    above = lineno - 2
    return above >= 0 and lines[above].strip().startswith("#")


@pytest.mark.parametrize("package", _held("fields"))
def test_no_class_has_more_than_25_fields(package: str) -> None:
    over = [f"{_name(path)}:{cls.lineno} {cls.name} ({n})" for path, cls, _ in _classes(package)
            if (n := len(class_fields(cls))) > FIELD_BOUNDS.get(f"{_name(path)}:{cls.name}", MAX_FIELDS)]
    assert over == []


@pytest.mark.parametrize("package", _held("comments"))
def test_every_field_says_what_it_is(package: str) -> None:
    bare = [f"{_name(path)}:{line} {cls.name}.{name}" for path, cls, lines in _classes(package)
            for name, line in class_fields(cls).items() if not _commented(lines, line)]
    assert bare == []


def test_the_field_count_sees_fields_of_both_kinds() -> None:
    src = ("class C:\n    LIMIT = 3\n    a: int  # x\n    def __init__(self):\n"
           "        self.b = 1\n        self.a = 2\n        self.c, self.d = 3, 4\n"
           "    def grow(self):\n        self.e += 1\n        self.b = 0\n")
    cls = ast.parse(src).body[0]
    assert isinstance(cls, ast.ClassDef)
    assert class_fields(cls) == {"a": 3, "b": 5, "c": 7, "d": 7, "e": 9}
    lines = src.splitlines()
    assert [n for n, line in class_fields(cls).items() if _commented(lines, line)] == ["a"]


# --- import circles ------------------------------------------------------------------------------

def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports, at any depth of its source (so an
    import under ``if TYPE_CHECKING:`` or inside a function counts)."""
    base = package.replace("/", ".")
    paths = {(_name(p)[:-3].replace("/", ".").removesuffix(".__init__")): p for p in _modules(package)}
    graph: dict[str, set[str]] = {}
    for mod, path in paths.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        seen: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                stem = node.module or ""
                if node.level:
                    up = pkg.split(".")
                    stem = ".".join(up[: len(up) - node.level + 1] + ([stem] if stem else []))
                names = [stem] + [f"{stem}.{a.name}" for a in node.names]
            seen |= {n for n in names if n in paths and n != mod and n.startswith(base)}
        graph[mod] = seen
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("package", _held("circles"))
def test_no_import_circle(package: str) -> None:
    assert circles(import_graph(package)) == []


def test_the_circle_check_sees_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


# --- the core ------------------------------------------------------------------------------------

def test_only_the_engine_names_the_engine() -> None:
    """The engine's state is its own: the pass sees a Scheduler and its views, plugins a Handle,
    the recorder a RunView. No module of the core imports Engine (a type-checking import counts),
    and no code anywhere takes the engine as ``eng: Engine``."""
    importers = [f"{_name(p)}:{node.lineno}" for p in _modules("analysim/core") if p.name != "engine.py"
                 for node in ast.walk(ast.parse(p.read_text()))
                 if isinstance(node, ast.ImportFrom) and any(a.name == "Engine" for a in node.names)]
    assert importers == []
    typed = [f"{_name(p)}:{i}" for pkg in ("analysim", "scheduler_svc", "mlaas_monitor", "node_agent")
             for p in sorted((ROOT / pkg).rglob("*.py")) if p.name != "engine.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if "eng: Engine" in line]
    assert typed == []


def test_every_core_module_is_compiled() -> None:
    # The compiled core is what users run: a module left out of setup.py's list runs interpreted,
    # 5-10 times slower, with nothing to show for it but the time (the preemption search's trial
    # did, once). policies.py builds the plugins once per run and is left interpreted.
    setup = ROOT / "setup.py"
    listed = next(node.value for node in ast.walk(ast.parse(setup.read_text()))
                  if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "COMPILED")
    compiled = {ast.literal_eval(e) for e in listed.elts}  # type: ignore[attr-defined]
    modules = {_name(p) for p in _modules("analysim/core")}
    assert modules - compiled == {"analysim/core/policies.py"}
    assert compiled <= modules | {_name(p) for p in CORE.parent.glob("*.py")}
