"""Parse a request body once, at the edge, into typed, validated generation requests.

Three schemas are accepted:

* LMI: ``{"inputs": str | [str], "parameters": {...}, "stream": bool}``
* OpenAI chat: ``{"messages": [...], "max_tokens": ..., "stream": ...}`` (rendered later with the
  tokenizer's chat template)
* the original inf2 examples: ``{"text": str | [str], "seq_length": N}`` (N counts prompt and
  generated tokens, as ``transformers_neuronx``'s ``sample()`` does)

Anything out of range, of the wrong type or unknown is an ``InvalidRequest`` (HTTP 400) whose
message names the field, the value and what is allowed. The caller's dict is never modified.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import InvalidRequest, invalid_field

MAX_STOP_SEQUENCES = 16
MAX_SEED = 2**63 - 1


class Schema(str, enum.Enum):
    LMI = "lmi"
    CHAT = "chat"
    LEGACY = "legacy"


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. ``do_sample=False`` is greedy decoding."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return not self.do_sample


@dataclass(frozen=True)
class StoppingParams:
    """When generation ends: a token budget, stop sequences, and whether EOS ends it."""

    max_new_tokens: int
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to complete, with everything that shapes the answer."""

    schema: Schema
    prompt: str
    sampling: SamplingParams
    stopping: StoppingParams
    stream: bool = False
    details: bool = False
    return_full_text: bool = False
    #: Chat messages as (role, text) pairs; the prompt is rendered from them by the backend.
    messages: tuple[tuple[str, str], ...] = ()
    #: The legacy schema's total length (prompt + generated); max_new_tokens is derived from it.
    seq_length: int | None = None
    model: str | None = None
    include_usage: bool = False


@dataclass(frozen=True)
class Payload:
    """One HTTP request: one or more prompts, and whether the answer is a JSON list."""

    requests: tuple[GenerationRequest, ...]
    many: bool = False

    @property
    def stream(self) -> bool:
        return any(r.stream for r in self.requests)


LMI_PARAMETERS = ("max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "repetition_penalty",
                  "stop", "stop_sequences", "seed", "details", "return_full_text", "ignore_eos",
                  "ignore_eos_token")
CHAT_FIELDS = ("messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
               "stop", "seed", "stream", "stream_options", "n", "logprobs", "top_logprobs",
               "frequency_penalty", "presence_penalty", "repetition_penalty", "ignore_eos", "user")
CHAT_ROLES = ("system", "developer", "user", "assistant")


def decode_body(body: bytes | bytearray | None, content_type: str | None) -> Any:
    """The request body as a JSON value; ``text/plain`` is taken as the prompt itself."""
    raw = bytes(body or b"")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"request body is not valid UTF-8: {exc}") from None
    if (content_type or "").lower().startswith("text/plain"):
        return {"inputs": text}
    if not text.strip():
        raise InvalidRequest("request body is empty: send a JSON object such as "
                             '{"inputs": "Hello", "parameters": {"max_new_tokens": 16}}')
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None


def parse_payload(data: Any, default_max_new_tokens: int) -> Payload:
    if not isinstance(data, Mapping):
        raise invalid_field("body", data, "expected a JSON object")
    if "messages" in data:
        return Payload((_parse_chat(data, default_max_new_tokens),))
    if "inputs" in data:
        return _parse_lmi(data, default_max_new_tokens)
    if "text" in data:
        return _parse_legacy(data)
    raise InvalidRequest("request must contain 'inputs' (LMI schema), 'messages' (chat schema) or 'text' "
                         f"(inf2 example schema); got keys {sorted(map(str, data))}")


# --- field helpers ------------------------------------------------------------------------------

def _check_known(data: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        prefix = f"{where}." if where else ""
        raise InvalidRequest(f"unknown field {prefix}{unknown[0]}: allowed fields are {', '.join(allowed)}",
                             field=prefix + unknown[0])


def _bool(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise invalid_field(field, value, "expected true or false")
    return value


def _int(field: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (
            maximum is not None and value > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise invalid_field(field, value, f"expected an integer >= {minimum}{upper}")
    return value


def _float(field: str, value: Any, allowed: str, ok) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
        raise invalid_field(field, value, allowed)
    return float(value)


def _stop(field: str, value: Any) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if (not isinstance(stops, list) or len(stops) > MAX_STOP_SEQUENCES
            or not all(isinstance(s, str) and s for s in stops)):
        raise invalid_field(field, value, f"expected a non-empty string or a list of at most "
                                          f"{MAX_STOP_SEQUENCES} non-empty strings")
    return tuple(stops)


def _prompt(field: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise invalid_field(field, value, "expected a non-empty string")
    return value


# --- schemas ------------------------------------------------------------------------------------

def _parse_lmi(data: Mapping[str, Any], default_max_new_tokens: int) -> Payload:
    _check_known(data, ("inputs", "parameters", "stream"), "")
    params = data.get("parameters")
    params = {} if params is None else params
    if not isinstance(params, Mapping):
        raise invalid_field("parameters", params, "expected a JSON object")
    _check_known(params, LMI_PARAMETERS, "parameters")
    stream = _bool("stream", data["stream"]) if "stream" in data else False

    def p(name: str) -> str:
        return f"parameters.{name}"

    temperature = _float(p("temperature"), params.get("temperature", 1.0), "expected a number >= 0",
                         lambda v: v >= 0)
    do_sample = _bool(p("do_sample"), params["do_sample"]) if "do_sample" in params else False
    sampling = SamplingParams(
        do_sample=do_sample and temperature > 0,
        temperature=temperature if temperature > 0 else 1.0,
        top_k=_int(p("top_k"), params.get("top_k", 0), 0),
        top_p=_float(p("top_p"), params.get("top_p", 1.0), "expected a number in (0, 1]", lambda v: 0 < v <= 1),
        repetition_penalty=_float(p("repetition_penalty"), params.get("repetition_penalty", 1.0),
                                  "expected a number > 0", lambda v: v > 0),
        seed=_int(p("seed"), params["seed"], 0, MAX_SEED) if params.get("seed") is not None else None,
    )
    stop_key = "stop" if "stop" in params else "stop_sequences"
    eos_key = "ignore_eos" if "ignore_eos" in params else "ignore_eos_token"
    stopping = StoppingParams(
        max_new_tokens=_int(p("max_new_tokens"), params.get("max_new_tokens", default_max_new_tokens), 1),
        stop=_stop(p(stop_key), params[stop_key]) if params.get(stop_key) is not None else (),
        ignore_eos=_bool(p(eos_key), params[eos_key]) if eos_key in params else False,
    )
    details = _bool(p("details"), params["details"]) if "details" in params else False
    full_text = _bool(p("return_full_text"), params["return_full_text"]) if "return_full_text" in params else False

    inputs = data["inputs"]
    many = isinstance(inputs, list)
    prompts = inputs if many else [inputs]
    if many and not prompts:
        raise invalid_field("inputs", inputs, "expected a non-empty string or a non-empty list of strings")
    if many and stream:
        raise invalid_field("stream", stream, "streaming needs a single prompt; send 'inputs' as a string")
    requests = tuple(
        GenerationRequest(Schema.LMI, _prompt("inputs" if not many else f"inputs[{i}]", prompt), sampling,
                          stopping, stream=stream, details=details, return_full_text=full_text)
        for i, prompt in enumerate(prompts))
    return Payload(requests, many=many)


def _chat_messages(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise invalid_field("messages", value, "expected a non-empty list of {role, content} objects")
    messages = []
    for i, message in enumerate(value):
        field = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise invalid_field(field, message, "expected an object with 'role' and 'content'")
        _check_known(message, ("role", "content", "name"), field)
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise invalid_field(f"{field}.role", role, f"allowed roles are {', '.join(CHAT_ROLES)}")
        messages.append((role, _chat_content(f"{field}.content", message.get("content"))))
    return tuple(messages)


def _chat_content(field: str, content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid_field(f"{field}[{j}]", part, 'only text parts ({"type": "text", "text": ...}) '
                                                           "are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise invalid_field(field, content, "expected a string or a list of text parts")


def _parse_chat(data: Mapping[str, Any], default_max_new_tokens: int) -> GenerationRequest:
    _check_known(data, CHAT_FIELDS, "")
    if data.get("n", 1) != 1:
        raise invalid_field("n", data["n"], "only n=1 is supported")
    for name in ("frequency_penalty", "presence_penalty"):
        if data.get(name, 0) not in (0, 0.0, None):
            raise invalid_field(name, data[name], "not supported by this model server; omit it or send 0")
    if data.get("top_logprobs") not in (None, 0):
        raise invalid_field("top_logprobs", data["top_logprobs"], "not supported; use logprobs=true")
    budget_key = "max_completion_tokens" if "max_completion_tokens" in data else "max_tokens"
    temperature = _float("temperature", data.get("temperature", 1.0), "expected a number in [0, 2]",
                         lambda v: 0 <= v <= 2) if data.get("temperature") is not None else 1.0
    stream_options = data.get("stream_options")
    stream_options = {} if stream_options is None else stream_options
    if not isinstance(stream_options, Mapping):
        raise invalid_field("stream_options", stream_options, "expected an object")
    _check_known(stream_options, ("include_usage",), "stream_options")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid_field("model", model, "expected a string")
    sampling = SamplingParams(
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else 1.0,
        top_k=_int("top_k", data.get("top_k", 0), 0),
        top_p=_float("top_p", data.get("top_p", 1.0), "expected a number in (0, 1]", lambda v: 0 < v <= 1)
        if data.get("top_p") is not None else 1.0,
        repetition_penalty=_float("repetition_penalty", data.get("repetition_penalty", 1.0),
                                  "expected a number > 0", lambda v: v > 0),
        seed=_int("seed", data["seed"], 0, MAX_SEED) if data.get("seed") is not None else None,
    )
    stopping = StoppingParams(
        max_new_tokens=_int(budget_key, data[budget_key], 1) if data.get(budget_key) is not None
        else default_max_new_tokens,
        stop=_stop("stop", data["stop"]) if data.get("stop") is not None else (),
        ignore_eos=_bool("ignore_eos", data["ignore_eos"]) if "ignore_eos" in data else False,
    )
    return GenerationRequest(
        Schema.CHAT, "", sampling, stopping,
        stream=_bool("stream", data["stream"]) if data.get("stream") is not None else False,
        details=_bool("logprobs", data["logprobs"]) if data.get("logprobs") is not None else False,
        messages=_chat_messages(data.get("messages")), model=model,
        include_usage=_bool("stream_options.include_usage", stream_options.get("include_usage", False)),
    )


def _parse_legacy(data: Mapping[str, Any]) -> Payload:
    _check_known(data, ("text", "seq_length"), "")
    text = data["text"]
    many = isinstance(text, list)
    prompts = text if many else [text]
    if many and not prompts:
        raise invalid_field("text", text, "expected a non-empty string or a non-empty list of strings")
    seq_length = _int("seq_length", data.get("seq_length", 50), 2)
    # max_new_tokens is fixed per prompt once its length is known (see Handler._prepare).
    requests = tuple(
        GenerationRequest(Schema.LEGACY, _prompt("text" if not many else f"text[{i}]", prompt),
                          SamplingParams(), StoppingParams(max_new_tokens=seq_length - 1),
                          return_full_text=True, seq_length=seq_length)
        for i, prompt in enumerate(prompts))
    return Payload(requests, many=many)
