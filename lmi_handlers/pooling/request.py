"""An embedding request, in either shape its clients send:

* LMI's (``/invocations``, ``/predictions``; ``huggingface_hub``'s ``feature_extraction``): ``{"inputs": str | [str]}``
  with TEI's optional ``normalize`` (a boolean) and ``truncate`` (false only: inputs are never truncated), and
  ``stream`` false (LMI's clients send it; a vector is answered whole);
* OpenAI's (``/v1/embeddings``): ``{"input": str | [str] | [int] | [[int]], "model", "encoding_format": "float" |
  "base64", "dimensions", "user"}``.

Each input is checked before anything is tokenized; errors name the client's field, the value and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import InvalidRequest, invalid_field
from ..schemas import RequestLimits

#: OpenAI's bound on the inputs of one request (clients batch up to it).
MAX_INPUTS = 2048
LMI_FIELDS = ("inputs", "normalize", "truncate", "dimensions", "stream")
OPENAI_FIELDS = ("input", "model", "encoding_format", "dimensions", "user")
ENCODINGS = ("float", "base64")


@dataclass(frozen=True)
class EmbeddingRequest:
    """The texts (or token ids) to embed, and how the answer is shaped."""

    inputs: tuple[str | tuple[int, ...], ...]
    #: OpenAI's answer (``data`` and ``usage``) rather than LMI's (the vectors themselves).
    openai: bool = False
    #: LMI's ``inputs`` was a list: the answer is a list of vectors, else one vector.
    many: bool = True
    encoding_format: str = "float"
    #: Matryoshka: the leading dimensions to keep (the model must have been trained for it).
    dimensions: int | None = None
    #: The request's own ``normalize``; None: the server's (``option.normalize``).
    normalize: bool | None = None
    model: str | None = None


def is_embedding_body(data: Any) -> bool:
    return isinstance(data, Mapping) and ("input" in data or "inputs" in data)


def parse_embedding(data: Any, limits: RequestLimits = RequestLimits()) -> EmbeddingRequest:
    if not isinstance(data, Mapping):
        raise invalid_field("body", data, "expected a JSON object")
    openai = "input" in data and "inputs" not in data
    allowed = OPENAI_FIELDS if openai else LMI_FIELDS
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise InvalidRequest(f"unknown field {unknown[0]}: allowed fields are {', '.join(allowed)}",
                             field=unknown[0])
    if "inputs" not in data and "input" not in data:
        raise InvalidRequest('request must contain "inputs" (LMI schema) or "input" (OpenAI embeddings)',
                             field="inputs")
    field = "input" if openai else "inputs"
    value = data[field]
    inputs = _inputs(field, value, limits, token_ids=openai)
    encoding = data.get("encoding_format", "float")
    if encoding not in ENCODINGS:
        raise invalid_field("encoding_format", encoding, f"allowed values are {', '.join(ENCODINGS)}")
    dimensions = data.get("dimensions")
    if dimensions is not None and (type(dimensions) is not int or dimensions < 1):
        raise invalid_field("dimensions", dimensions, "expected an integer >= 1")
    normalize = data.get("normalize")
    if normalize is not None and not isinstance(normalize, bool):
        raise invalid_field("normalize", normalize, "expected true or false")
    if data.get("stream") not in (None, False):
        raise invalid_field("stream", data["stream"], "embeddings are answered whole: send false or omit it")
    if data.get("truncate") not in (None, False):
        raise invalid_field("truncate", data["truncate"], "inputs are never truncated here: send false or omit it "
                            "(a longer input is refused with its length)")
    for name in ("model", "user"):
        if data.get(name) is not None and not isinstance(data[name], str):
            raise invalid_field(name, data[name], "expected a string")
    many = isinstance(value, list) and not (openai and value and all(type(v) is int for v in value))
    return EmbeddingRequest(inputs, openai, many, encoding, dimensions, normalize, data.get("model"))


def _inputs(field: str, value: Any, limits: RequestLimits, token_ids: bool) -> tuple[str | tuple[int, ...], ...]:
    """The inputs: a string, a list of strings, and (OpenAI) a list of token ids or a list of such lists."""
    if token_ids and isinstance(value, list) and value and all(type(v) is int for v in value):
        return (_ids(field, value),)
    items = value if isinstance(value, list) else [value]
    if not items or len(items) > MAX_INPUTS:
        raise invalid_field(field, f"a list of {len(items)} inputs", f"expected 1 to {MAX_INPUTS} inputs")
    out: list[str | tuple[int, ...]] = []
    for i, item in enumerate(items):
        where = f"{field}[{i}]" if isinstance(value, list) else field
        if token_ids and isinstance(item, list):
            out.append(_ids(where, item))
        elif not isinstance(item, str) or not item:
            kinds = "a non-empty string or a list of token ids" if token_ids else "a non-empty string"
            raise invalid_field(where, item, f"expected {kinds}")
        elif len(item) > limits.max_prompt_chars:
            raise invalid_field(where, f"a text of {len(item):,} characters",
                                f"at most {limits.max_prompt_chars:,} characters (option.max_prompt_chars)")
        else:
            out.append(item)
    return tuple(out)


def _ids(field: str, value: list[Any]) -> tuple[int, ...]:
    if not value or not all(type(v) is int and v >= 0 for v in value):
        raise invalid_field(field, value, "expected a non-empty list of token ids (integers >= 0)")
    return tuple(value)
