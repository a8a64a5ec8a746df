"""Parse a request body once, at the edge, into typed, validated generation requests.

Three schemas are accepted:

* LMI: ``{"inputs": str | [str], "parameters": {...}, "stream": bool}``
* OpenAI chat: ``{"messages": [...], "max_tokens": ..., "stream": ...}`` (rendered later with the
  tokenizer's chat template)
* the original inf2 examples: ``{"text": str | [str], "seq_length": N}`` (N counts prompt and
  generated tokens, as ``transformers_neuronx``'s ``sample()`` does)

The parsers only map each schema's names onto the typed fields of ``schemas.py``, which check their own
types and ranges. Anything out of range, of the wrong type, unknown or beyond ``RequestLimits`` is an
``InvalidRequest`` (HTTP 400) whose message names the field, the value and what is allowed; no body, however
malformed, raises anything else. The caller's dict is never modified.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from .errors import InvalidRequest, invalid_field
from .schemas import (GenerationRequest, Payload, RequestLimits, SamplingParams, Schema, StoppingParams,
                      checked, rule_of)
from .structured import constraint as structured
from .structured import tools as tool_calling

__all__ = ["GenerationRequest", "Payload", "RequestLimits", "SamplingParams", "Schema", "StoppingParams",
           "decode_body", "parse_payload", "parse_stream_options"]

LMI_PARAMETERS = ("max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "repetition_penalty",
                  "stop", "stop_sequences", "seed", "details", "return_full_text", "ignore_eos", "n",
                  "ignore_eos_token", "min_p", "presence_penalty", "frequency_penalty", "logit_bias", "top_logprobs",
                  "priority", *structured.GUIDED_FIELDS)
CHAT_FIELDS = ("messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
               "stop", "seed", "stream", "stream_options", "n", "logprobs", "top_logprobs",
               "frequency_penalty", "presence_penalty", "repetition_penalty", "ignore_eos", "user", "min_p",
               "logit_bias", "response_format", "tools", "tool_choice", "parallel_tool_calls", "priority",
               *structured.GUIDED_FIELDS)
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
SAMPLING_FIELDS = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "seed", "min_p",
                   "presence_penalty", "frequency_penalty", "logit_bias", "top_logprobs")


def decode_body(body: bytes | bytearray | None, content_type: str | None,
                limits: RequestLimits = RequestLimits()) -> Any:
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
        data = json.loads(text)
    except RecursionError:
        raise InvalidRequest(f"request body is nested too deeply: at most {limits.max_json_depth} levels of "
                             "objects and lists are allowed") from None
    except ValueError as exc:  # JSONDecodeError, and integers longer than Python converts (sys.int_info)
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    _check_tree(data, limits.max_json_depth)
    return data


def _check_tree(data: Any, max_depth: int) -> None:
    """Refuse nesting deeper than ``max_depth`` and strings that are not valid Unicode (lone surrogates, which
    JSON's ``\\ud800`` escapes can produce and no tokenizer or encoder accepts)."""
    stack: list[tuple[Any, str, int]] = [(data, "body", 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > max_depth:
                raise InvalidRequest(f"{path}: request body is nested too deeply: at most {max_depth} levels of "
                                     "objects and lists are allowed", field=path)
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, child in items:
                if isinstance(key, str):
                    _check_text(f"{path} key", key)
                child_path = f"{path}[{key}]" if isinstance(value, list) else (
                    key if path == "body" else f"{path}.{key}")
                stack.append((child, child_path, depth + 1))
        elif isinstance(value, str):
            _check_text(path, value)


def _check_text(path: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"{path}: not valid Unicode: a lone surrogate {text[exc.start]!r} at character "
                             f"{exc.start} (send characters, not halves of UTF-16 pairs)", field=path) from None


def parse_payload(data: Any, default_max_new_tokens: int, limits: RequestLimits = RequestLimits()) -> Payload:
    if not isinstance(data, Mapping):
        raise invalid_field("body", data, "expected a JSON object")
    if "messages" in data:
        return Payload((_parse_chat(data, default_max_new_tokens, limits),))
    if "inputs" in data:
        return _parse_lmi(data, default_max_new_tokens, limits)
    if "text" in data:
        return _parse_legacy(data, limits)
    raise InvalidRequest("request must contain 'inputs' (LMI schema), 'messages' (chat schema) or 'text' "
                         f"(inf2 example schema); got keys {sorted(map(str, data))}")


# --- shared pieces ------------------------------------------------------------------------------

def _check_known(data: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        prefix = f"{where}." if where else ""
        raise InvalidRequest(f"unknown field {prefix}{unknown[0]}: allowed fields are {', '.join(allowed)}",
                             field=prefix + unknown[0])


def _object(field: str, value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise invalid_field(field, value, "expected a JSON object")
    return value


def _prompts(field: str, value: Any, limits: RequestLimits) -> tuple[bool, list[str]]:
    """Whether ``value`` is a list, and its prompts: each a string with text in it, within the limits."""
    many = isinstance(value, list)
    prompts = value if many else [value]
    if many and not prompts:
        raise invalid_field(field, value, "expected a non-empty string or a non-empty list of strings")
    if len(prompts) > limits.max_prompts_per_request:
        raise invalid_field(field, f"a list of {len(prompts)} prompts",
                            f"at most {limits.max_prompts_per_request} prompts in one request "
                            "(option.max_prompts_per_request)")
    for i, prompt in enumerate(prompts):
        _prompt(f"{field}[{i}]" if many else field, prompt, limits)
    return many, prompts


def _prompt(field: str, value: Any, limits: RequestLimits) -> str:
    if not isinstance(value, str) or not value.strip():
        raise invalid_field(field, value, "expected a non-empty string with text in it, not only whitespace")
    if len(value) > limits.max_prompt_chars:
        raise invalid_field(field, f"a prompt of {len(value):,} characters",
                            f"at most {limits.max_prompt_chars:,} characters (option.max_prompt_chars)")
    return value


# --- schemas: name mapping only -----------------------------------------------------------------

def _parse_lmi(data: Mapping[str, Any], default_max_new_tokens: int, limits: RequestLimits) -> Payload:
    _check_known(data, ("inputs", "parameters", "stream"), "")
    params = _object("parameters", data.get("parameters"))
    _check_known(params, LMI_PARAMETERS, "parameters")
    stop_key = "stop" if "stop" in params else "stop_sequences"
    eos_key = "ignore_eos" if "ignore_eos" in params else "ignore_eos_token"
    names = {key: f"parameters.{key}" for key in LMI_PARAMETERS}
    names.update(stream="stream", stop=f"parameters.{stop_key}", ignore_eos=f"parameters.{eos_key}")
    sampling = checked(SamplingParams, {key: params.get(key) for key in SAMPLING_FIELDS}, names)
    max_new_tokens = params.get("max_new_tokens")
    stopping = checked(StoppingParams, {"max_new_tokens": default_max_new_tokens if max_new_tokens is None
                                        else max_new_tokens, "stop": params.get(stop_key),
                                        "ignore_eos": params.get(eos_key)}, names)
    many, prompts = _prompts("inputs", data["inputs"], limits)
    response = {"stream": data.get("stream"), "details": params.get("details"),
                "return_full_text": params.get("return_full_text"), "n": params.get("n"),
                "priority": params.get("priority")}
    constraint = structured.from_guided(params, "parameters.")
    return Payload(tuple(_check_choices(checked(GenerationRequest, response, names, schema=Schema.LMI, prompt=prompt,
                                                sampling=sampling, stopping=stopping, constraint=constraint), names)
                         for prompt in prompts), many=many)


def _chat_messages(value: Any, limits: RequestLimits) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise invalid_field("messages", value, "expected a non-empty list of {role, content} objects")
    messages = []
    for i, message in enumerate(value):
        field = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise invalid_field(field, message, "expected an object with 'role' and 'content'")
        _check_known(message, ("role", "content", "name", "tool_calls", "tool_call_id"), field)
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise invalid_field(f"{field}.role", role, f"allowed roles are {', '.join(CHAT_ROLES)}")
        if message.get("name") is not None and not isinstance(message["name"], str):
            raise invalid_field(f"{field}.name", message["name"], "expected a string")
        if role == "tool" and (not isinstance(message.get("tool_call_id"), str) or not message["tool_call_id"]):
            # OpenAI's rule: a tool result answers one call, named by its id
            raise invalid_field(f"{field}.tool_call_id", message.get("tool_call_id"),
                                "a tool message needs the id of the call it answers (a non-empty string)")
        if role == "assistant" and message.get("tool_calls") is not None:
            content = tool_calling.message_text(field, message)
        else:
            content = _chat_content(f"{field}.content", message.get("content"))
        if not content.strip():
            raise invalid_field(f"{field}.content", content, "expected text, not only whitespace")
        messages.append((role, content))
    total = sum(len(content) for _, content in messages)
    if total > limits.max_prompt_chars:
        raise invalid_field("messages", f"messages of {total:,} characters",
                            f"at most {limits.max_prompt_chars:,} characters in all (option.max_prompt_chars)")
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


def _check_choices(request: GenerationRequest, names: Mapping[str, str]) -> GenerationRequest:
    """Several choices are several samples: greedy decoding would give n copies of one answer (vLLM refuses it)."""
    if request.n > 1 and request.sampling.greedy:
        how = "set parameters.do_sample to true" if request.schema is Schema.LMI else "set a temperature above 0"
        raise invalid_field(names.get("n", "n"), request.n, f"more than one choice needs sampling: {how}, or ask "
                            "for n=1 (greedy decoding gives n copies of one answer)")
    return request


def _check_chat_strings(data: Mapping[str, Any]) -> None:
    for name in ("model", "user"):
        if data.get(name) is not None and not isinstance(data[name], str):
            raise invalid_field(name, data[name], "expected a string")


def parse_stream_options(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """OpenAI's ``stream_options`` (chat and completions): an object whose one field, ``include_usage``, is a
    boolean, sent only with ``"stream": true`` (OpenAI and vLLM refuse it otherwise)."""
    options = _object("stream_options", data.get("stream_options"))
    _check_known(options, ("include_usage",), "stream_options")
    if options.get("include_usage") is not None:
        rule_of(GenerationRequest, "include_usage").check("stream_options.include_usage", options["include_usage"])
    if data.get("stream_options") is not None and data.get("stream") is not True:
        raise invalid_field("stream_options", data["stream_options"], 'allowed only with "stream": true')
    return options


def _parse_chat(data: Mapping[str, Any], default_max_new_tokens: int, limits: RequestLimits) -> GenerationRequest:
    _check_known(data, CHAT_FIELDS, "")
    _check_chat_strings(data)
    budget_key = "max_completion_tokens" if "max_completion_tokens" in data else "max_tokens"
    stream_options = parse_stream_options(data)
    names = {"max_new_tokens": budget_key, "details": "logprobs", "include_usage": "stream_options.include_usage"}
    # OpenAI samples unless the temperature is 0.
    sampling = checked(SamplingParams, {key: data.get(key) for key in SAMPLING_FIELDS if key != "do_sample"},
                       names, do_sample=True)
    if sampling.top_logprobs and data.get("logprobs") is not True:
        raise invalid_field("top_logprobs", sampling.top_logprobs, "alternatives come with logprobs: true (as OpenAI "
                            "and vLLM require); send it too")
    max_new_tokens = data.get(budget_key)
    stopping = checked(StoppingParams, {"max_new_tokens": default_max_new_tokens if max_new_tokens is None
                                        else max_new_tokens, "stop": data.get("stop"),
                                        "ignore_eos": data.get("ignore_eos")}, names)
    response = {"stream": data.get("stream"), "details": data.get("logprobs"),
                "include_usage": stream_options.get("include_usage"), "n": data.get("n"),
                "priority": data.get("priority")}
    tools = tool_calling.parse_tools(data)
    constraint = structured.one_of(structured.from_response_format(data.get("response_format")),
                                   structured.from_guided(data), tools.constraint() if tools else None)
    return _check_choices(checked(GenerationRequest, response, names, schema=Schema.CHAT, prompt="",
                                  sampling=sampling, stopping=stopping,
                                  messages=_chat_messages(data.get("messages"), limits), model=data.get("model"),
                                  constraint=constraint, tools=tools, budget_field=budget_key), names)


def _parse_legacy(data: Mapping[str, Any], limits: RequestLimits) -> Payload:
    _check_known(data, ("text", "seq_length"), "")
    _, prompts = _prompts("text", data["text"], limits)
    seq_length = rule_of(GenerationRequest, "seq_length").check("seq_length", data.get("seq_length", 50))
    # max_new_tokens is fixed per prompt once its length is known (job._token_budget).
    stopping = StoppingParams(max_new_tokens=seq_length - 1)
    return Payload(tuple(GenerationRequest(Schema.LEGACY, prompt, SamplingParams(), stopping, return_full_text=True,
                                           seq_length=seq_length) for prompt in prompts),
                   many=True)  # answered {"outputs": [...]} as the examples' own handle() does, whatever "text" is
