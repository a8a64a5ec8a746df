"""Reading one value of the init properties (``serving.properties`` without ``option.``), which DJLServing sends
as strings: each parser returns the default for an unset (or empty) key and raises ``ConfigError`` naming the key,
the value and what is allowed. The handler's settings, every backend's options and the tooling read values with
these, so a value means the same everywhere. Standard library only.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from .errors import ConfigError


def as_text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else str(value)


TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes"), ("false", "0", "no")


def parse_bool(props: Mapping[str, Any], key: str, default: bool) -> bool:
    if key not in props:
        return default
    text = as_text(props[key]).lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise ConfigError(key, props[key], "expected true or false")


def parse_int(props: Mapping[str, Any], key: str, default: int | None, minimum: int = 1,
              maximum: int | None = None) -> int | None:
    if key not in props or as_text(props[key]) == "":
        return default
    try:
        value = int(as_text(props[key]))
    except ValueError:
        raise ConfigError(key, props[key], "expected an integer") from None
    if value < minimum or (maximum is not None and value > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise ConfigError(key, props[key], f"expected an integer >= {minimum}{upper}")
    return value


def parse_float(props: Mapping[str, Any], key: str, default: float, low: float, high: float) -> float:
    """A number in ``(low, high]``."""
    if key not in props or as_text(props[key]) == "":
        return default
    try:
        value = float(as_text(props[key]))
    except ValueError:
        raise ConfigError(key, props[key], f"expected a number in ({low:g}, {high:g}]") from None
    if not low < value <= high:
        raise ConfigError(key, props[key], f"expected a number in ({low:g}, {high:g}]")
    return value


def parse_choice(props: Mapping[str, Any], key: str, default: str, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if key not in props or as_text(props[key]) == "":
        return default
    value = as_text(props[key])
    if value.lower() not in allowed:
        raise ConfigError(key, props[key], f"allowed values are {', '.join(allowed)}")
    return value.lower()
