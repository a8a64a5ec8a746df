"""``lmi validate --container vllm`` and ``lmi package --container vllm``: what AWS's vLLM container will run.

``validate_container`` sizes the model as vLLM's engine loads it on the instance (the vllm backend's own plan:
tensor parallelism against the heads, weights and KV cache per GPU, the sequence length), then adds what only the
container has: its ``SM_VLLM_*`` environment (an option with no vLLM equivalent is an error naming it; DJLServing's
own settings are named in notes), the server's flags through the installed vLLM's own parser, and whether
``model.py`` answers LMI's requests there.
"""

from __future__ import annotations

import ast
from pathlib import Path

from lmi_handlers.config import ConfigError

from ...instances import Instance, lookup
from ...modeldir.resources import TEMPLATES, resource_dir
from ...validation.findings import Finding
from ...validation.validate import Report, validate_model_dir
from .environment import check_with_vllm
from .launch import directory_environment

#: How the container's engine runs, whatever serving.properties says about DJLServing's batching.
VLLM_ENGINE = {"backend": "vllm", "rolling_batch": "vllm", "async_mode": "false", "batch_size": "1"}
#: lmi validate's checks of how DJLServing loads the handler (its entry point, its sync or async engine).
DJL_ONLY = ("entry point", "mode")
#: Our handlers for the vLLM container, as ``model.py`` imports them.
INSTALLER = "lmi_handlers.vllm_container"
STANDARDS = "model_hosting_container_standards"
#: Functions the standards package finds in ``model.py`` by name.
STANDARD_NAMES = ("custom_sagemaker_invocation_handler", "custom_sagemaker_ping_handler")


def validate_container(model_dir: Path, instance: str | None = None, config: Path | None = None) -> Report:
    """``lmi validate``'s report for ``model_dir`` on ``instance`` in AWS's vLLM container."""
    report = validate_model_dir(model_dir, instance, config, overrides=VLLM_ENGINE)
    report.backend = "vllm (AWS's vLLM container)"
    # How DJLServing would load and call the handler does not apply: the container loads model.py (checked below).
    report.findings = [f for f in report.findings if f.check not in DJL_ONLY]
    host = lookup(report.instance)
    report.findings += container_findings(model_dir, host, report.figures)
    return report


def container_findings(model_dir: Path, host: Instance, figures: dict[str, str]) -> list[Finding]:
    """The container's own checks; its environment goes into ``figures``."""
    findings = [_script_finding(model_dir)]
    if host.kind != "gpu":
        findings.append(Finding("error", "container", f"{host.name} has no NVIDIA GPU; AWS's vLLM container runs "
                                "on GPU instances", "serve it on inf2/trn1 with LMI's Neuron image (no --container)"))
    try:
        environment = directory_environment(model_dir, gpus=host.cores)
        checked = check_with_vllm(environment)
    except ConfigError as exc:
        return findings + [Finding("error", "container", str(exc), "remove or change it to serve this directory "
                                   "in the vLLM container (docs/vllm-container.md lists what maps to what)")]
    figures.update(environment.env)
    findings += [Finding("info", "container", note) for note in environment.notes]
    findings.append(Finding("ok", "container", "vLLM's own parser accepts the server's flags") if checked else
                    Finding("info", "container", "the server's flags were not checked: vLLM is not installed here",
                            "lmi validate from the vLLM environment checks them (scripts/setup.sh --vllm)"))
    return findings


def script_kind(model_dir: Path) -> str:
    """What ``model.py`` does in the vLLM container: ``lmi`` (installs our handlers), ``own`` (the standards
    package's hooks of its own), ``djl`` (DJLServing's handle only) or ``none``."""
    path = model_dir / "model.py"
    if not path.is_file():
        return "none"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return "own"  # not ours to judge: the container reports its own error
    modules = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    modules |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    if INSTALLER in modules:
        return "lmi"
    functions = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if any(m.split(".")[0] == STANDARDS for m in modules) or functions & set(STANDARD_NAMES):
        return "own"
    return "djl"


def container_script(model_dir: Path) -> Path | None:
    """The ``model.py`` the artifact needs instead of the directory's: ``lmi render``'s, which serves both
    containers, where the directory has none or DJLServing's alone; None to ship the directory's."""
    if script_kind(model_dir) in ("lmi", "own"):
        return None
    return resource_dir(TEMPLATES) / "model.py.j2"  # no template syntax in it: the file is its own rendering


def _script_finding(model_dir: Path) -> Finding:
    kind = script_kind(model_dir)
    if kind == "lmi":
        return Finding("ok", "model.py", "model.py installs LMI's /invocations and /ping in the vLLM container")
    if kind == "own":
        return Finding("info", "model.py", "model.py registers its own hooks with model-hosting-container-standards: "
                       "the container runs it as it is (LMI's request shapes only if it installs them)")
    return Finding("warning", "model.py", "model.py " + ("is missing" if kind == "none" else "serves DJLServing "
                   "alone") + ": without LMI's handler the container answers OpenAI's request shapes only",
                   "lmi package --container vllm ships the model.py of both containers (lmi render writes it)")
