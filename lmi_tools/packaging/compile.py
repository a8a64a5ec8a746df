"""``lmi compile``: compile a model directory's graphs ahead of time and keep them beside the model, for a backend
that reads ``option.compiled_graph_path`` (neuronx).

The source's flow: compile once on a host of the target instance type, ship the artifacts with the model, and
let every endpoint instance load them instead of compiling (shorter start and scale-out). It validates the
directory for the instance first (errors block), then loads it exactly as the container does - the backend's
``load`` from the registry, with ``option.compiled_graph_path`` pointing at ``OUTPUT`` inside the model directory -
which compiles and saves the graphs with the manifest of the settings they were compiled with
(``lmi_handlers.backends.neuronx.artifacts``). A second load then reuses them and both load times are
reported. ``serving.properties`` gains ``option.compiled_graph_path=OUTPUT``, so ``lmi package`` and
``lmi upload`` carry the artifacts and the container checks the manifest at load: same settings, the graphs
are loaded; another setting, loading stops naming each setting that differs.

transformers-neuronx runs only on inf2/trn1 hosts (or in the LMI neuronx image); here, the tests run this
through the stand-in in ``tests/handlers/standins``, where "compiling" costs nothing, so timings measured
here say nothing about the real saving.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lmi_handlers.backends.registry import BACKENDS
from lmi_handlers.deployment import resolve

from ..errors import UsageError, ValidationFailed
from ..instances import lookup
from ..modeldir.properties import read_serving_properties, read_text
from ..validation.validate import validate_model_dir

KEY = "option.compiled_graph_path"


@dataclass(frozen=True)
class CompileResult:
    """Where the artifacts went, how many files they are, and the two load times (compiling, then reusing)."""

    artifacts: Path
    files: int
    compile_s: float
    reuse_s: float

    def as_json(self) -> dict:
        return {"artifacts": str(self.artifacts), "files": self.files, "compile_load_s": round(self.compile_s, 3),
                "reuse_load_s": round(self.reuse_s, 3)}


def compile_model_dir(model_dir: Path, instance: str | None, output: str = "compiled",
                      on_step: Callable[[str], None] = lambda _: None) -> CompileResult:
    """Validate, compile into ``model_dir/output``, time a reusing load, and record the path in
    serving.properties. Raises ``ValidationFailed``/``UsageError`` before compiling anything."""
    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)*", output) or ".." in output.split("/"):
        raise UsageError(f"--output {output!r} is not a folder name inside the model directory",
                         hint="use letters, digits, '.', '_', '-' and '/', e.g. compiled")
    report = validate_model_dir(model_dir, instance)
    if not report.ok:
        first = report.errors[0]
        raise ValidationFailed(f"{model_dir} does not validate for {report.instance}: {first.message}",
                               hint=first.hint or "run lmi validate for the full report")
    backend = BACKENDS[report.backend]
    if "compiled_graph_path" not in backend.keys:
        compiling = " or ".join(e.name for e in BACKENDS.values() if "compiled_graph_path" in e.keys)
        raise UsageError(f"lmi compile is for a backend that keeps compiled graphs ({compiling}); {model_dir} uses "
                         f"{report.backend} on {report.instance}",
                         hint=f"pick an instance {compiling} runs on, or set option.backend={compiling}")
    props = read_serving_properties(model_dir)
    present = props.get("compiled_graph_path")
    if present and present != output:
        raise UsageError(f"serving.properties already sets {KEY}={present}",
                         hint=f"pass --output {present}, or remove that line")
    artifacts = model_dir / output
    if artifacts.exists() and any(artifacts.iterdir()):
        raise UsageError(f"{artifacts} is not empty", hint="remove it to compile again, or choose --output")
    missing = backend.available()
    if missing is not None:
        raise UsageError(f"lmi compile cannot run here: {missing}",
                         hint="run it on an instance of the target type (or inside its LMI image)")
    cores = lookup(report.instance).cores
    properties = {**props, "model_dir": str(model_dir), "backend": backend.name, "compiled_graph_path": output}
    if props.get("tensor_parallel_degree", "max") == "max":
        properties["tensor_parallel_degree"] = str(cores)  # what "max" becomes on a host with these cores
    on_step(f"compiling {model_dir} for {report.instance} into {artifacts}")
    compile_s = _timed_load(properties)
    on_step(f"compiled and loaded in {compile_s:.1f} s; loading again from the artifacts")
    reuse_s = _timed_load(properties)
    if not present:
        _append_property(model_dir, output)
    return CompileResult(artifacts, sum(1 for _ in artifacts.iterdir()), compile_s, reuse_s)


def _timed_load(properties: dict) -> float:
    started = time.perf_counter()
    resolve(properties).load()
    return time.perf_counter() - started


def _append_property(model_dir: Path, output: str) -> None:
    path = model_dir / "serving.properties"
    text = read_text(path)
    path.write_bytes((text.rstrip("\n") + f"\n{KEY}={output}\n").encode("latin-1"))
