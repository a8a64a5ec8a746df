"""What ``lmi validate`` looks at (``Target``) and what it reports (``Finding``), shared by its check modules."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from lmi_handlers.config import ConfigError, HandlerConfig, parse_bool
from lmi_handlers.deployment import Choice
from lmi_handlers.mode import Image, Mode

from ..instances import Instance
from ..models.architecture import Architecture

LEVELS = ("error", "warning", "info", "ok")


@dataclass(frozen=True)
class Finding:
    """One result: ``level`` is error, warning, info or ok; ``hint`` says what to do instead."""

    level: str
    check: str
    message: str
    hint: str = ""


@dataclass
class Target:
    """Everything the checks look at, resolved once."""

    model_dir: Path
    #: Init properties: ``option.`` stripped, as the handler receives them.
    props: dict[str, str]
    instance: Instance
    config: HandlerConfig | None = None
    #: The settings and the backend they resolve to on the instance (``deployment.choose``).
    choice: Choice | None = None
    arch: Architecture | None = None
    arch_source: str = ""
    #: The model's ``config.json``, as the runtime's planner reads it.
    model_config: dict[str, Any] | None = None
    #: A backend of the registry (``auto`` resolved for the instance; empty until the properties parse).
    backend: str = ""
    tp: int = 1
    #: The backend's load plan at ``tp`` (None: a backend without one, no config.json, or the runtime refused).
    plan: Any = None
    #: Why the runtime would refuse to load (its options' or its load plan's ``ConfigError``).
    refusal: ConfigError | None = None
    #: The dtype the weights and KV cache will have (``auto`` resolved).
    dtype: str = "fp16"
    int8: bool = False
    #: Sequences one copy holds at once: max_rolling_batch_size, or batch_size without rolling batch.
    batch: int = 1
    #: Tokens per sequence the KV cache is sized for, and whether the properties set it.
    positions: int = 0
    positions_set: bool = False
    #: Tokens the KV cache holds, as the load plan sizes it (0: one full-length row per sequence).
    kv_tokens: int = 0
    non_ascii: bool = False
    #: The ``# lmi: key=value`` lines of serving.properties (``instance_type``, ``image``).
    directives: dict[str, str] = field(default_factory=dict)
    #: The LMI image the directory targets (``# lmi: image=``, else the instance's default).
    image: Image | None = None
    #: Which of DJL's Python engines that image runs the model with: the resolver's (``Settings.mode``), or DJL's
    #: rule alone where lmi_handlers cannot read the properties (a model.py of its own reads them).
    mode: Mode | None = None


def flag(props: Mapping[str, str], key: str) -> bool:
    """A boolean option as the runtime parses it; an unparsable value counts as false (reported elsewhere)."""
    try:
        return parse_bool(props, key, False)
    except ConfigError:
        return False
