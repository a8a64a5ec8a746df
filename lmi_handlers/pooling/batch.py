"""A dynamic batch of embedding requests, answered together: each request is parsed and tokenized on its own (a
bad one gets its own 400 and spares its neighbours), then every input of the batch is embedded in one call to the
backend's pooler, and each request gets its own vectors back.

The pooler is the backend (``backends/hf/pooling.py``, ``backends/vllm/pooling.py``): ``tokenizer``,
``max_length``, ``vocab_size``, ``matryoshka`` (the dimensions a Matryoshka model may be cut to; empty: none) and
``embed(rows)``, one vector per ``Row``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from ..config import HandlerConfig
from ..errors import HandlerError, InvalidRequest, invalid_field, status_of
from ..request import decode_body
from .answer import answer_body
from .options import PoolingOptions
from .request import EmbeddingRequest, parse_embedding


@dataclass(frozen=True)
class Row:
    """One input to embed: its token ids, whether its vector is normalized, and how many dimensions it keeps."""

    ids: tuple[int, ...]
    normalize: bool
    dimensions: int | None = None


class Pooler(Protocol):
    name: str
    tokenizer: Any
    pooling: PoolingOptions
    max_length: int
    vocab_size: int
    matryoshka: tuple[int, ...] | bool

    def embed(self, rows: Sequence[Row]) -> list[list[float]]:
        ...


def answer_batch(items: Sequence[Any], pooler: Pooler, config: HandlerConfig) -> list[tuple[int, str]]:
    """Each item's (status, body): its answer, or its own error as ``{"code", "message", "error"}``'s message."""
    prepared: list[tuple[EmbeddingRequest, list[Row]] | HandlerError] = []
    for item in items:
        try:
            prepared.append(_prepare(item, pooler, config))
        except HandlerError as exc:
            prepared.append(exc)
    rows = [row for entry in prepared if not isinstance(entry, HandlerError) for row in entry[1]]
    vectors = iter(pooler.embed(rows) if rows else [])
    model = os.path.basename(config.model_id.rstrip("/"))
    answers = []
    for entry in prepared:
        if isinstance(entry, HandlerError):
            answers.append((status_of(entry), str(entry)))
            continue
        request, own = entry
        mine = [next(vectors) for _ in own]
        answers.append((200, answer_body(request, mine, sum(len(row.ids) for row in own), model)))
    return answers


def _prepare(item: Any, pooler: Pooler, config: HandlerConfig) -> tuple[EmbeddingRequest, list[Row]]:
    data = decode_body(item.get_as_bytes(), item.get_property("Content-Type"), config.limits)
    request = parse_embedding(data, config.limits)
    _check_dimensions(request.dimensions, pooler)
    normalize = pooler.pooling.normalize if request.normalize is None else request.normalize
    field = "input" if request.openai else "inputs"
    rows = []
    for i, text in enumerate(request.inputs):
        where = f"{field}[{i}]" if len(request.inputs) > 1 or request.many else field
        ids = tuple(pooler.tokenizer.encode(text)) if isinstance(text, str) else _known_ids(where, text, pooler)
        if len(ids) > pooler.max_length:
            raise InvalidRequest(f"{where}: the input is {len(ids)} tokens; this model embeds at most "
                                 f"{pooler.max_length} tokens. Shorten it; inputs are never truncated.", field=where,
                                 value=len(ids))
        rows.append(Row(ids, normalize, request.dimensions))
    return request, rows


def _known_ids(field: str, ids: tuple[int, ...], pooler: Pooler) -> tuple[int, ...]:
    outside = [i for i in ids if i >= pooler.vocab_size]
    if outside:
        raise invalid_field(field, outside[0], f"token ids must be below this model's vocabulary size "
                            f"{pooler.vocab_size}")
    return ids


def _check_dimensions(dimensions: int | None, pooler: Pooler) -> None:
    """``dimensions`` is for Matryoshka models only, as vLLM's server rules."""
    if dimensions is None:
        return
    if not pooler.matryoshka:
        raise invalid_field("dimensions", dimensions, "this model was not trained for Matryoshka embeddings, so its "
                            "vectors cannot be shortened; omit dimensions")
    allowed = pooler.matryoshka
    if isinstance(allowed, tuple) and dimensions not in allowed:
        raise invalid_field("dimensions", dimensions, f"this model supports {', '.join(map(str, allowed))}")
