"""The runtime/tooling boundary of DESIGN.md §2, enforced on the source and at run time."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_FILES = sorted((ROOT / "lmi_handlers").rglob("*.py"))
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def module_level_imports(tree):
    """Imports that run when the module is imported: top level, and inside top-level if/try blocks."""
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try)):
            pending.extend(node.body + node.orelse + getattr(node, "finalbody", [])
                           + [h for handler in getattr(node, "handlers", []) for h in handler.body])


def imported_roots(node):
    if isinstance(node, ast.ImportFrom):
        return [] if node.level else [(node.module or "").split(".")[0]]
    return [alias.name.split(".")[0] for alias in node.names]


def test_there_is_runtime_code_to_check():
    assert len(RUNTIME_FILES) > 10


@pytest.mark.parametrize("path", RUNTIME_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_runtime_imports_only_the_standard_library_at_module_level(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in module_level_imports(tree):
        for root in imported_roots(node):
            assert root in STDLIB or root == "lmi_handlers", (
                f"{path.name}:{node.lineno} imports {root} at module level; import it inside the function that needs it")


@pytest.mark.parametrize("path", RUNTIME_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_runtime_never_imports_tooling_and_only_djl_py_imports_djl_python(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            roots = imported_roots(node)
            assert "lmi_tools" not in roots, f"{path.name}:{node.lineno} imports lmi_tools"
            if "djl_python" in roots:
                assert path.name == "djl.py", f"{path.name}:{node.lineno}: only djl.py may import djl_python"


def test_importing_the_entry_point_loads_no_third_party_module():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import lmi_handlers.entrypoint, lmi_handlers.backends.hf.backend, "
            "lmi_handlers.backends.sampler, lmi_handlers.backends.hf.paged_cache; third = {m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names)"
            " - {'lmi_handlers', '__main__', '_distutils_hack', 'sitecustomize'}; "
            # pip's editable-install finder is installation machinery, not an import of ours
            "print(sorted(m for m in third if not m.startswith('__editable__')))")
    result = subprocess.run([sys.executable, "-I", "-c", code, str(ROOT)], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
