"""Model directories' ``serving.properties`` for the tooling: the file as Java reads it, and what ``lmi`` adds.

The parsing rules (Java's ``Properties.load``, the ``option.`` prefix, DJL's ``OPTION_*`` overrides) are the
runtime's, in ``lmi_handlers/properties.py``, re-exported here. ``# lmi: key=value`` comment lines carry metadata
for ``lmi`` itself (the target instance type); DJLServing skips them like any other comment.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

from lmi_handlers.properties import OPTION_PREFIX, init_properties, parse_properties, with_environment

from ..errors import UsageError

__all__ = ["OPTION_PREFIX", "format_value", "init_properties", "instance_type", "parse_directives",
           "parse_properties", "read_serving_properties", "read_text", "with_environment"]

DIRECTIVE = re.compile(r"^\s*#\s*lmi:\s*([A-Za-z0-9_.-]+)\s*=\s*(.*?)\s*$")


def parse_directives(text: str) -> dict[str, str]:
    """``# lmi: key=value`` comment lines (metadata for the ``lmi`` tooling only)."""
    found = {}
    for line in text.splitlines():
        match = DIRECTIVE.match(line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def instance_type(model_dir: Path, text: str, given: str | None) -> str:
    """``given`` (``--instance``), else the ``# lmi: instance_type=`` line that ``lmi render`` writes."""
    name = given or parse_directives(text).get("instance_type")
    if not name:
        raise UsageError(f"no instance type for {model_dir}",
                         hint="pass --instance TYPE (e.g. inf2.xlarge), or add a line "
                              "'# lmi: instance_type=TYPE' to serving.properties (lmi render writes it)")
    return name


def read_text(path: str | Path) -> str:
    """The file as Java reads it (ISO-8859-1); a missing file is a ``UsageError``."""
    path = Path(path)
    if path.is_dir():
        path = path / "serving.properties"
    if not path.is_file():
        raise UsageError(f"{path} does not exist",
                         hint="a model directory needs a serving.properties (lmi new / lmi render write one)")
    return path.read_bytes().decode("latin-1")


def read_serving_properties(path: str | Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Init properties from ``path`` (a file or a model directory); ``environ`` adds DJL's env overrides."""
    raw = parse_properties(read_text(path))
    if environ is not None:
        raw = with_environment(raw, environ)
    return init_properties(raw)


def format_value(value: object) -> str:
    """A value as one properties line: booleans lower-case, lists comma-joined; no escapes needed."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (list, tuple)):
        text = ",".join(format_value(v) for v in value)
    else:
        text = str(value)
    if any(ch in text for ch in "\\\n\r") or text != text.strip() or not text.isascii():
        raise ValueError(f"{text!r} cannot be written to serving.properties as it is: use ASCII without "
                         "backslashes, line breaks or surrounding spaces")
    return text
