"""lmi_handlers' modules import one another in one direction: the graph of what each file imports (at module level,
under ``TYPE_CHECKING``, or inside a function: every ``import`` statement it has) has no circle.

A circle, even through a lazy import, means two modules that cannot be understood (or moved) one without the other;
it is how ``config.py`` came to import the backend registry that imports it. An edge goes from a file to each module
it names; importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``, which is not counted, since a package
that imports its own modules to export them would otherwise be a circle of its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "lmi_handlers"


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> set[str]:
    """The package's modules ``node`` (in module ``name``) names: for ``from X import Y``, ``X.Y`` where that is a
    module, else ``X``."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    found = set()
    for target in targets:
        while target and target not in known:  # a name inside a module: the module
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= imported(name, path, node, known)
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of ``graph`` as the modules along it (the first repeated at the end), or [] when it has none."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once every path from it is explored
    path: list[str] = []

    def visit(module: str) -> list[str]:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state:
                circle = visit(target)
                if circle:
                    return circle
        state[module] = "done"
        path.pop()
        return []

    for module in sorted(graph):
        if module not in state:
            circle = visit(module)
            if circle:
                return circle
    return []


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_graph_holds_every_module_and_its_imports(graph):
    assert len(graph) > 60
    assert "lmi_handlers.backends.registry" in graph["lmi_handlers.deployment"]
    assert "lmi_handlers.structured.tools" in graph["lmi_handlers.backends.tokenizer"]  # a module-level import
    assert "lmi_handlers.backends.hf.cpu.compiled_linear" in graph["lmi_handlers.backends.hf.cpu.kernels"]  # lazy


def test_the_finder_finds_a_circle_through_a_lazy_import():
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) == []


def test_lmi_handlers_imports_in_one_direction(graph):
    circle = find_circle(graph)
    assert not circle, "import circle: " + " -> ".join(circle)
