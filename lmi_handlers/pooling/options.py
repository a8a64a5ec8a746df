"""``option.task`` and how an embedding model's token states become one vector.

``option.task`` takes LMI's names: ``text-generation`` (the default) generates; ``text-embedding`` and
``feature-extraction`` embed. ``option.normalize`` (LMI's, default true) scales each vector to length one, as
vLLM's pooling runner does by default. How tokens are pooled comes from the model directory, as sentence-transformers
reads it: ``modules.json`` names a ``Pooling`` module whose ``config.json`` sets the mode (mean, cls, max or
lasttoken), and a ``Normalize`` module normalizes. Without them an encoder takes its first token (``[CLS]``) and a
decoder its last, as vLLM's embedding models do.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import ConfigError
from ..values import parse_bool, parse_choice

#: The options this package reads (``option.<key>``).
KEYS = ("task", "normalize")
GENERATION_TASKS = ("text-generation",)
EMBEDDING_TASKS = ("text-embedding", "feature-extraction")
#: sentence-transformers' pooling keys and the modes they name.
MODE_KEYS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
             "pooling_mode_lasttoken": "lasttoken"}


def pooling_task(props: Mapping[str, Any]) -> bool:
    """Whether ``option.task`` asks for embeddings; a ``ConfigError`` for a task this handler does not serve."""
    return parse_choice(props, "task", "text-generation", GENERATION_TASKS + EMBEDDING_TASKS) in EMBEDDING_TASKS


@dataclass(frozen=True)
class PoolingOptions:
    """How vectors are made: ``mode`` (mean, cls, max, lasttoken), ``normalize``, and the longest input
    (``max_length``, None: the model's positions)."""

    mode: str
    normalize: bool
    max_length: int | None = None

    @classmethod
    def from_model(cls, model_dir: str, props: Mapping[str, Any], decoder: bool) -> "PoolingOptions":
        """From the model directory's sentence-transformers files, ``option.normalize`` overriding theirs."""
        modules = _json(model_dir, "modules.json") or []
        pooling = next((m for m in modules if str(m.get("type", "")).endswith(".Pooling")), None)
        mode, normalize = ("lasttoken" if decoder else "cls"), True
        if pooling is not None:
            config = _json(os.path.join(model_dir, pooling.get("path", "")), "config.json") or {}
            chosen = [key for key, value in config.items() if key.startswith("pooling_mode_") and value is True]
            if len(chosen) != 1 or chosen[0] not in MODE_KEYS:
                where = f"{pooling.get('path')}/config.json"
                raise ConfigError("model_id", model_dir, f"its pooling configuration ({where}) sets "
                                  f"{chosen or 'no mode'}; this handler pools with exactly one of "
                                  f"{', '.join(MODE_KEYS)}")
            mode = MODE_KEYS[chosen[0]]
            normalize = any(str(m.get("type", "")).endswith(".Normalize") for m in modules)
        max_length = (_json(model_dir, "sentence_bert_config.json") or {}).get("max_seq_length")
        return cls(mode, parse_bool(props, "normalize", normalize),
                   int(max_length) if isinstance(max_length, int) else None)


def _json(folder: str, name: str) -> Any:
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as file:
        return json.load(file)
