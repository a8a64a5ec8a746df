"""Imports run one way: ``lmi_tools/modeldir/`` (reading and rendering a model directory) never imports
``lmi_tools/validation/`` (which reads model directories through it)."""

from __future__ import annotations

import ast
from pathlib import Path

MODELDIR = Path(__file__).resolve().parents[2] / "lmi_tools" / "modeldir"


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_modeldir_never_imports_validation():
    upward = {path.name: sorted(name for name in imported(path) if "validation" in name)
              for path in sorted(MODELDIR.glob("*.py"))}
    assert not {name: found for name, found in upward.items() if found}
