"""What ``lmi validate`` looks at (``Target``) and what it reports (``Finding``), shared by its check modules."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from lmi_handlers.config import NEURONX_KEYS, TRUE_WORDS, HandlerConfig

from ..models.architecture import Architecture
from ..instances import Instance

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
    arch: Architecture | None = None
    arch_source: str = ""
    #: hf, neuronx or scripted (``auto`` resolved for the instance).
    backend: str = "hf"
    tp: int = 1
    #: The dtype the weights and KV cache will have (``auto`` resolved).
    dtype: str = "fp16"
    int8: bool = False
    #: Sequences one copy holds at once: max_rolling_batch_size, or batch_size without rolling batch.
    batch: int = 1
    #: Tokens per sequence the KV cache is sized for, and whether the properties set it.
    positions: int = 0
    positions_set: bool = False
    non_ascii: bool = False


def backend_option_keys(backend: str) -> frozenset[str]:
    """Options only ``backend`` reads (beyond the handler's own), as ``check_unknown_keys`` wants them."""
    if backend == "neuronx":
        return NEURONX_KEYS
    if backend == "scripted":
        from lmi_handlers.backends.scripted import ScriptedBackend  # standard library only

        return frozenset(ScriptedBackend.option_keys)
    return frozenset()


def flag(props: Mapping[str, str], key: str) -> bool:
    """A boolean option as the runtime parses it; unparsable values count as false (check_keys reports them)."""
    return str(props.get(key, "")).strip().lower() in TRUE_WORDS


@contextmanager
def quiet(logger_name: str) -> Iterator[None]:
    """Silence a runtime logger whose warnings we report as findings instead."""
    logger = logging.getLogger(logger_name)
    previous, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = previous

