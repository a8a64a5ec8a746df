"""``lmi validate``: check a model directory against its model and the instance before deploying it.

``validate_model_dir`` reads ``serving.properties`` (the way DJLServing does), the model's
``config.json`` and the instance table, then runs the checks of ``checks.py`` and ``fit.py``. Each
finding says what is wrong and what to use instead; errors block ``lmi package``. The rules and
their sources are listed in ``docs/configuration.md``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lmi_handlers.config import ConfigError, HandlerConfig

from ..models.architecture import load_config, read_architecture
from .checks import run_checks
from ..errors import UsageError
from .fit import figures
from ..instances import lookup
from ..modeldir.properties import init_properties, parse_directives, parse_properties, read_text
from ..modeldir.resources import known_model_config
from .findings import Finding, Target, flag, quiet


@dataclass
class Report:
    """The findings plus the figures behind them."""

    model_dir: str
    instance: str
    backend: str
    architecture: str
    findings: list[Finding] = field(default_factory=list)
    figures: dict[str, str] = field(default_factory=dict)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        return data


def validate_model_dir(model_dir: str | Path, instance: str | None = None,
                       config_path: str | Path | None = None) -> Report:
    """Validate ``model_dir``; ``instance`` defaults to the ``# lmi: instance_type=`` line of its properties."""
    target, findings = load_target(Path(model_dir), instance, config_path)
    findings.extend(run_checks(target))
    return Report(model_dir=str(target.model_dir), instance=target.instance.name, backend=target.backend,
                  architecture=_describe(target), findings=findings,
                  figures=figures(target) if target.arch and target.config else {})


def _describe(target: Target) -> str:
    if target.backend == "scripted":
        return "none (scripted backend)"
    if not target.arch:
        return "unknown (no config.json)"
    a = target.arch
    return (f"{a.model_type}: {a.layers} layers, hidden {a.hidden_size}, {a.heads} heads / {a.kv_heads} KV heads, "
            f"vocab {a.vocab_size}, {a.max_positions} positions (from {target.arch_source})")


def load_target(model_dir: Path, instance: str | None, config_path: str | Path | None) -> tuple[Target, list[Finding]]:
    """Read the inputs; problems that stop individual checks become findings, not exceptions."""
    text = read_text(model_dir / "serving.properties")
    directives = parse_directives(text)
    name = instance or directives.get("instance_type")
    if not name:
        raise UsageError(f"no instance type for {model_dir}",
                         hint="pass --instance TYPE (e.g. inf2.xlarge), or add a line "
                              "'# lmi: instance_type=TYPE' to serving.properties (lmi render writes it)")
    target = Target(model_dir=model_dir.resolve(), props=init_properties(parse_properties(text)),
                    instance=lookup(name), non_ascii=not text.isascii())
    findings: list[Finding] = []
    try:
        target.config = parse_config(target)
    except ConfigError as exc:
        findings.append(Finding("error", "properties", str(exc),
                                "fix this first: the handler would refuse to load with it"))
        return target, findings
    if target.config.backend != "scripted":  # the scripted backend has no weights to size
        findings.extend(_load_architecture(target, config_path))
    resolve_settings(target)
    return target, findings


def parse_config(target: Target) -> HandlerConfig:
    """``HandlerConfig`` as the handler will build it inside the container."""
    props = dict(target.props)
    props["model_dir"] = str(target.model_dir)
    if props.get("model_id", "").startswith("s3://"):
        # DJLServing downloads an s3:// model_id and hands the handler the local directory instead.
        props["model_id"] = str(target.model_dir)
    with quiet("lmi_handlers.config"):
        return HandlerConfig.from_properties(props)


def _load_architecture(target: Target, config_path: str | Path | None) -> list[Finding]:
    """``--config``, else option.model_id's directory, else the model directory, else a bundled config."""
    if config_path:
        target.arch, target.arch_source = read_architecture(load_config(config_path)), str(config_path)
        return []
    assert target.config is not None
    model_id = target.props.get("model_id", "")
    local = Path(target.config.model_id)
    candidates = [local / "config.json"] if local.is_dir() else []
    candidates.append(target.model_dir / "config.json")
    for path in candidates:
        if path.is_file():
            target.arch, target.arch_source = read_architecture(load_config(path)), str(path)
            return []
    bundled = known_model_config(model_id) if model_id and not local.is_dir() else None
    if bundled:
        target.arch = read_architecture(load_config(bundled))
        target.arch_source = f"the bundled reference config of {model_id}"
        return []
    where = "model_id is a hub id we ship no config for" if model_id else "the model directory has no config.json"
    return [Finding("error", "architecture", f"cannot find the model's config.json ({where}), so heads, memory "
                    "and positions cannot be checked", "pass --config PATH/TO/config.json")]


def resolve_settings(target: Target) -> None:
    """Backend, TP, dtype, batch and sequence length as they will be in effect."""
    config, arch, instance = target.config, target.arch, target.instance
    assert config is not None
    target.backend = config.backend if config.backend != "auto" else (
        "neuronx" if instance.kind == "neuron" else "hf")
    target.tp = config.tensor_parallel_degree or instance.cores
    if config.dtype != "auto":
        target.dtype = config.dtype
    elif arch and arch.checkpoint_dtype in ("fp16", "bf16"):
        target.dtype = arch.checkpoint_dtype
    target.int8 = target.backend == "neuronx" and (
        target.props.get("quantize", "").strip().lower() == "static_int8" or flag(target.props, "load_in_8bit"))
    target.batch = config.max_rolling_batch_size if config.rolling else config.batch_size
    key = "n_positions" if target.backend == "neuronx" else "max_model_len"
    value = target.props.get(key, "").strip()
    target.positions_set = value.isdigit() and int(value) > 0
    if target.positions_set:
        target.positions = int(value)
    elif arch:
        target.positions = arch.max_positions
