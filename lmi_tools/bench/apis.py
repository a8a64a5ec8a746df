"""The request bodies a bench sends, per API (the answers are read by ``lmi_tools.answers``).

* ``lmi`` / ``sagemaker``: ``{"inputs", "parameters", "stream"}``, with ``details`` for the token counts;
* ``tgi``: the same without ``ignore_eos``; the path (``/generate`` or ``/generate_stream``) chooses streaming;
* ``openai-completions`` / ``openai-chat``: ``prompt`` or ``messages``, ``max_tokens``, and
  ``stream_options.include_usage`` when streaming;
* ``openai-embeddings``: ``input`` (one text per request: requests per second are embeddings per second).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..answers.messages import Api


#: APIs whose request schema has an ignore-EOS switch (vLLM-style OpenAI servers accept ``ignore_eos``).
IGNORE_EOS = frozenset({Api.LMI, Api.SAGEMAKER, Api.OPENAI_COMPLETIONS, Api.OPENAI_CHAT})


@dataclass(frozen=True)
class RequestShape:
    """What every request of a run asks for, whatever the API."""

    max_new_tokens: int
    stream: bool = True
    ignore_eos: bool = True
    #: OpenAI's ``model`` field (omitted when None).
    model: str | None = None
    #: Merged into every body last (nested objects merge key by key), e.g. sampling parameters.
    extra: Mapping[str, Any] = field(default_factory=dict)


def merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
    return out


def build_body(api: Api, prompt: str, shape: RequestShape) -> dict[str, Any]:
    eos = {"ignore_eos": True} if shape.ignore_eos and api in IGNORE_EOS else {}
    if api in (Api.LMI, Api.SAGEMAKER):
        body: dict[str, Any] = {"inputs": prompt,
                                "parameters": {"max_new_tokens": shape.max_new_tokens, "details": True, **eos}}
        if shape.stream:
            body["stream"] = True
    elif api is Api.OPENAI_EMBEDDINGS:
        body = {"input": prompt, **({"model": shape.model} if shape.model else {})}
    elif api is Api.TGI:  # the path (/generate or /generate_stream) chooses streaming
        body = {"inputs": prompt, "parameters": {"max_new_tokens": shape.max_new_tokens, "details": True}}
    else:
        body = {"prompt": prompt} if api is Api.OPENAI_COMPLETIONS else {
            "messages": [{"role": "user", "content": prompt}]}
        if shape.model:
            body["model"] = shape.model
        body.update({"max_tokens": shape.max_new_tokens, "stream": shape.stream, **eos})
        if shape.stream:
            body["stream_options"] = {"include_usage": True}
    return merge(body, shape.extra)
