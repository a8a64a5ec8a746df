"""Static checks that DJLServing's ``option.entryPoint`` leads to ``lmi_handlers``' ``handle``.

Nothing is imported or executed: ``model.py`` is parsed with ``ast``, so the same check runs on a
model directory and on the members of an artifact (``lmi inspect``) whose code we do not trust.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable

RUNTIME_ENTRY = "lmi_handlers.entrypoint"


@dataclass(frozen=True)
class EntryPoint:
    """Where DJLServing's handler comes from, and whether that resolves inside the model."""

    ok: bool
    detail: str
    hint: str = ""
    #: model.py defines handle() itself: lmi_handlers' option rules do not apply to it.
    own_handle: bool = False
    #: That handle() is ``async def``: DJL's async engine awaits it; the sync engine cannot.
    async_handle: bool = False


def module_files(module: str) -> tuple[str, str]:
    base = module.replace(".", "/")
    return f"{base}.py", f"{base}/__init__.py"


def handle_source(source: str) -> str | None:
    """The module ``handle`` is imported from, ``"<defined>"`` (``"<async>"``: ``async def``) when defined here, else
    None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "handle":
            return "<async>" if isinstance(node, ast.AsyncFunctionDef) else "<defined>"
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if any(alias.name == "handle" and alias.asname in (None, "handle") for alias in node.names):
                return node.module
    return None


def resolve(entry: str | None, exists: Callable[[str], bool], read: Callable[[str], str],
            runtime_vendored: bool) -> EntryPoint:
    """Check ``entry`` (``option.entryPoint``) against the files of a model (``exists``/``read`` by path).

    ``runtime_vendored`` says whether ``lmi_handlers`` must already be present (an artifact) or will
    be added by ``lmi package`` (a model directory).
    """
    if not entry:
        if not exists("model.py"):
            return EntryPoint(False, "no option.entryPoint and no model.py: DJLServing would pick its built-in "
                                     "handler (djl_python.*) instead of lmi_handlers",
                              "set option.entryPoint=model.py and add the two-line model.py shim (lmi render "
                              "writes both)")
        entry = "model.py"
    if entry.startswith("djl_python"):
        return EntryPoint(False, f"option.entryPoint={entry} is DJLServing's built-in handler, not lmi_handlers",
                          f"use option.entryPoint=model.py (the shim) or {RUNTIME_ENTRY}")
    if entry.endswith(".py"):
        return _check_file(entry, exists, read, runtime_vendored)
    return _check_module(entry, exists, runtime_vendored)


def _check_file(entry: str, exists: Callable[[str], bool], read: Callable[[str], str],
                runtime_vendored: bool) -> EntryPoint:
    if entry.startswith("/") or ".." in entry.split("/"):
        return EntryPoint(False, f"option.entryPoint={entry} points outside the model directory",
                          "use a file inside the model directory, e.g. model.py")
    path = entry[2:] if entry.startswith("./") else entry
    if not exists(path):
        return EntryPoint(False, f"option.entryPoint={entry} but there is no {path}",
                          "lmi render writes model.py; or set option.entryPoint to an existing file")
    origin = handle_source(read(path))
    if origin is None:
        return EntryPoint(False, f"{path} neither defines nor imports handle()",
                          f"model.py should contain: from {RUNTIME_ENTRY} import handle")
    if origin in ("<defined>", "<async>"):
        asynchronous = origin == "<async>"
        return EntryPoint(True, f"{path} defines its own {'async ' * asynchronous}handle()", own_handle=True,
                          async_handle=asynchronous)
    return _check_module(origin, exists, runtime_vendored, via=path)


def _check_module(module: str, exists: Callable[[str], bool], runtime_vendored: bool, via: str = "") -> EntryPoint:
    prefix = f"{via} -> " if via else ""
    if any(exists(f) for f in module_files(module)):
        return EntryPoint(True, f"{prefix}{module} (inside the model)")
    if module == RUNTIME_ENTRY and not runtime_vendored:
        return EntryPoint(True, f"{prefix}{module} (vendored by lmi package)")
    if module.startswith("djl_python"):
        return EntryPoint(False, f"{prefix}{module} is DJLServing's built-in handler, not lmi_handlers",
                          f"import handle from {RUNTIME_ENTRY} instead")
    return EntryPoint(False, f"{prefix}{module} is not part of the model, so it must come from the container",
                      "package the model with lmi package, which vendors lmi_handlers beside model.py")
