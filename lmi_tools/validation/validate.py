"""``lmi validate``: check a model directory against its model and the instance before deploying it.

``validate_model_dir`` reads ``serving.properties`` (the way DJLServing does), the model's
``config.json`` and the instance table, asks the runtime's own resolver what it makes of them
(``lmi_handlers/deployment.py``, with the instance as its target: ``runtime.py``), then runs the checks of
``checks.py`` and ``fit.py``. Each finding says what is wrong and what to use instead; errors block
``lmi package``. The rules and their sources are listed in ``docs/configuration.md``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lmi_handlers.backends.registry import BACKENDS
from lmi_handlers.config import ConfigError
from lmi_handlers.deployment import Settings, choose
from lmi_handlers.mode import serving_mode

from ..instances import lookup
from ..modeldir.properties import init_properties, instance_type, parse_directives, parse_properties, read_text
from ..errors import UsageError
from ..modeldir.image import model_architectures, target_image
from ..modeldir.resources import known_model_config
from ..models.architecture import load_config, read_architecture
from .checks import entry_point_of, run_checks
from .findings import Finding, Target
from .fit import figures
from ..modeldir.handler_config import settings
from .pooling import embedding_figures, is_embedding
from .runtime import host, model, plan_at


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
                  figures=_figures(target))


def _figures(target: Target) -> dict[str, str]:
    if not (target.arch and target.config and target.positions):
        return {}
    found = figures(target)
    return embedding_figures(found) if is_embedding(target) else found


def _describe(target: Target) -> str:
    if target.backend and not BACKENDS[target.backend].needs_model:
        return f"none ({target.backend} backend)"
    if not target.arch:
        return "unknown (no config.json)"
    a = target.arch
    return (f"{a.model_type}: {a.layers} layers, hidden {a.hidden_size}, {a.heads} heads / {a.kv_heads} KV heads, "
            f"vocab {a.vocab_size}, {a.max_positions} positions (from {target.arch_source})")


def load_target(model_dir: Path, instance: str | None, config_path: str | Path | None) -> tuple[Target, list[Finding]]:
    """Read the inputs; problems that stop individual checks become findings, not exceptions."""
    text = read_text(model_dir / "serving.properties")
    name = instance_type(model_dir, text, instance)
    target = Target(model_dir=model_dir.resolve(), props=init_properties(parse_properties(text)),
                    instance=lookup(name), non_ascii=not text.isascii(), directives=parse_directives(text))
    findings: list[Finding] = []
    try:
        target.image = target_image(target.directives, target.instance.family, target.props)
    except UsageError as exc:
        findings.append(Finding("error", "mode", str(exc), exc.hint or ""))
    try:
        read = settings(target.props, str(target.model_dir))
    except ConfigError as exc:
        if target.image is not None:  # DJL's rule alone: lmi_handlers does not get to read these properties
            target.mode = serving_mode(target.props, target.image, model_architectures(target.model_dir, target.props))
        if entry_point_of(target.model_dir, target.props).own_handle:
            findings.append(Finding("info", "properties", f"{exc} for lmi_handlers, but model.py defines its own "
                                    "handle(), which reads the properties itself; the hardware checks need "
                                    "lmi_handlers' options, so they are skipped"))
        else:
            findings.append(Finding("error", "properties", str(exc),
                                    "fix this first: the handler would refuse to load with it"))
        return target, findings
    target.config = read.config
    try:
        choice = choose(read, host(target.instance, target.image))
    except ConfigError as exc:
        choice = None
        findings.append(Finding("error", "backend", str(exc)))
    if choice is not None and choice.backend.needs_model:  # a backend without weights has nothing to size
        findings.extend(_load_architecture(target, config_path))
    read = _in_mode(target)  # the model's architectures known: the settings as Java passes them on
    target.mode, target.config = read.mode, read.config
    if choice is None:
        return target, findings
    target.choice = choose(read, host(target.instance, target.image))
    target.backend = target.choice.backend.name
    resolve_settings(target)
    return target, findings


def _in_mode(target: Target) -> Settings:
    """The handler's settings under DJL's mode on the target image, as the resolver decides it from the image and the
    model's architectures (the recommender's writes included, as Java passes them on)."""
    config = target.model_config
    architectures = (config.get("architectures") or []) if config is not None else \
        model_architectures(target.model_dir, target.props)
    return settings(target.props, str(target.model_dir), target.image, architectures)


def _load_architecture(target: Target, config_path: str | Path | None) -> list[Finding]:
    """``--config``, else option.model_id's directory, else the model directory, else a bundled config."""
    if config_path:
        _read_architecture(target, Path(config_path), str(config_path))
        return []
    assert target.config is not None
    model_id = target.props.get("model_id", "")
    local = Path(target.config.model_id)
    candidates = [local / "config.json"] if local.is_dir() else []
    candidates.append(target.model_dir / "config.json")
    for path in candidates:
        if path.is_file():
            _read_architecture(target, path, str(path))
            return []
    bundled = known_model_config(model_id) if model_id and not local.is_dir() else None
    if bundled:
        _read_architecture(target, bundled, f"the bundled reference config of {model_id}")
        return []
    if local.is_dir():
        where = f"{local} has no config.json"
    elif local.is_absolute():
        where = f"model_id {model_id} is an absolute path that does not exist here"
    else:
        where = "model_id is a hub id we ship no config for"
    return [Finding("error", "architecture", f"cannot find the model's config.json ({where}), so heads, memory "
                    "and positions cannot be checked", "pass --config PATH/TO/config.json")]


def _read_architecture(target: Target, path: Path, source: str) -> None:
    target.model_config = load_config(path)
    target.arch, target.arch_source = read_architecture(target.model_config), source


def resolve_settings(target: Target) -> None:
    """TP, dtype, batch, sequence length and KV cache as they will be in effect: the deployment the runtime resolves
    for the instance (the backend's options, its checks and its own load plan)."""
    config, instance, entry = target.config, target.instance, BACKENDS[target.backend]
    assert config is not None and target.choice is not None
    target.tp = config.tensor_parallel_degree or instance.cores
    try:
        target.plan = target.choice.deploy(model(target)).plan
    except ConfigError as exc:
        target.refusal = exc
    plan = target.plan or _any_plan(target)  # a refused TP degree: size the ones the hint suggests
    if plan is None:
        return
    target.dtype, target.int8, target.batch = plan.dtype, plan.int8, plan.batch_size
    target.positions, target.kv_tokens = plan.max_sequence_length, plan.kv_tokens
    target.positions_set = bool(target.props.get(entry.length_key, "").strip())


def _any_plan(target: Target) -> Any:
    """A plan at any TP degree of the instance: batch, positions and dtype do not depend on it."""
    if target.refusal is None or target.model_config is None or BACKENDS[target.backend].plan is None:
        return None
    for tp in target.instance.tp_degrees:
        try:
            return plan_at(target, tp)
        except ConfigError:
            continue
    return None
