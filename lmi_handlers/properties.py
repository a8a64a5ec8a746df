"""``serving.properties`` as DJLServing reads it: the key/value pairs, and the handler's init properties.

DJLServing loads the file with ``java.util.Properties.load`` (``ModelInfo.loadServingProperties``), so
this parser follows Java's rules: ``#`` and ``!`` start comment lines, a key ends at the first ``=``,
``:`` or whitespace, backslash escapes and line continuations are honoured, and the file is read as
ISO-8859-1. Keys starting with ``option.`` become init properties with the prefix stripped; other
keys (``engine``, ``batch_size``, ...) pass through unchanged (reference ``djl-contract.md`` §1.7).

Environment overrides (§1.8) are opt-in: ``OPTION_<KEY>`` becomes ``option.<key>`` (lower-cased when
the name is all-caps snake case; ``OPTION_ENTRYPOINT`` -> ``option.entryPoint``, ``OPTION_ENGINE`` ->
``engine``) and ``ARGS_<KEY>`` a non-option key; the file always wins over the environment, and
empty values are ignored.

The tooling reads model directories with these functions (``lmi_tools/modeldir/properties.py``), and so does the
handler where no DJLServing hands it the init properties (AWS's vLLM container, ``vllm_container/``).
"""

from __future__ import annotations

import re
from typing import Mapping

OPTION_PREFIX = "option."
# DJL's ModelInfo.SNAKE_CASE: only such names are lower-cased.
SNAKE_CASE = re.compile(r"[A-Z_\d]+")
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _logical_lines(text: str) -> list[str]:
    """Physical lines joined where a line ends in an odd number of backslashes (Java continuation)."""
    lines: list[str] = []
    pending: str | None = None
    for raw in text.splitlines():
        line = raw.lstrip() if pending is not None else raw
        if pending is None and line.lstrip()[:1] in ("#", "!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending = (pending or "") + line[:-1]
            continue
        lines.append((pending or "") + line)
        pending = None
    if pending is not None:
        lines.append(pending)
    return lines


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch != "\\" or i + 1 == len(text):
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2:i + 6]):
            out.append(chr(int(text[i + 2:i + 6], 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def _split(line: str) -> tuple[str, str]:
    """Java's rule: the key ends at the first unescaped ``=``, ``:`` or whitespace."""
    line = line.lstrip()
    i = 0
    while i < len(line) and line[i] not in "=: \t\f":
        i += 2 if line[i] == "\\" else 1
    key, rest = line[:i], line[i:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return _unescape(key), _unescape(rest)


def parse_properties(text: str) -> dict[str, str]:
    """The raw key/value pairs of a properties text (keys keep their ``option.`` prefix)."""
    props: dict[str, str] = {}
    for line in _logical_lines(text):
        if line.strip():
            key, value = _split(line)
            props[key] = value
    return props


def init_properties(raw: Mapping[str, str]) -> dict[str, str]:
    """The init-property view: ``option.`` stripped, other keys unchanged (an option wins a clash)."""
    plain = {k: v for k, v in raw.items() if not k.startswith(OPTION_PREFIX)}
    options = {k[len(OPTION_PREFIX):]: v for k, v in raw.items() if k.startswith(OPTION_PREFIX)}
    return {**plain, **options}


def with_environment(raw: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """``raw`` plus the ``OPTION_*`` / ``ARGS_*`` variables it does not already set (DJL's putIfAbsent)."""
    merged = dict(raw)
    for name, value in sorted(environ.items()):
        if not value:
            continue
        if name.startswith("OPTION_"):
            key = _env_key(name[len("OPTION_"):])
            if key == "entrypoint":
                key = "entryPoint"
            target = "engine" if key == "engine" else OPTION_PREFIX + key
        elif name.startswith("ARGS_"):
            target = _env_key(name[len("ARGS_"):])
        else:
            continue
        merged.setdefault(target, value)
    return merged


def _env_key(name: str) -> str:
    return name.lower() if SNAKE_CASE.fullmatch(name) else name
