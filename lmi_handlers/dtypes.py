"""dtype names, one table: the handler's names (``fp32``, ``fp16``, ``bf16``: LMI's), the names torch, vLLM and
``config.json`` use (``float32``...), and the bytes one element takes. ``option.dtype`` takes either name, or
``auto`` (``model_config.resolve_dtype`` says what ``auto`` loads). Standard library only.
"""

from __future__ import annotations

from typing import Any, Mapping

from .values import parse_choice

AUTO = "auto"
#: The handler's name -> torch's, vLLM's and ``config.json``'s.
LONG = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
#: Bytes one element takes.
BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
#: What ``option.dtype`` accepts: ``auto`` and each dtype under either name.
OPTION_VALUES = (AUTO, *(name for pair in LONG.items() for name in pair))
#: ``option.dtype``'s values as the handler names them.
NAMES = (AUTO, *LONG)


def short(name: Any) -> str | None:
    """The handler's name for ``name`` (``fp16``, ``float16`` or ``torch.float16``; ``auto`` stays), else None."""
    text = str(name or "").strip().lower().removeprefix("torch.")
    if text == AUTO or text in LONG:
        return text
    return next((key for key, value in LONG.items() if value == text), None)


def option(props: Mapping[str, Any]) -> str:
    """``option.dtype`` as the handler names it (``auto`` when unset); ``ConfigError`` for another value."""
    return short(parse_choice(props, "dtype", AUTO, OPTION_VALUES)) or AUTO
