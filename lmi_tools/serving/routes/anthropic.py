"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``, where
``anthropic.Anthropic(base_url=...)`` posts.

A request becomes one chat body (``chat_answers.py``): ``system`` the system message; each message's text blocks its
content; an assistant's ``tool_use`` blocks its tool calls and a user's ``tool_result`` blocks tool messages;
``max_tokens``, ``stop_sequences``, ``temperature``, ``top_p``, ``top_k`` the chat's sampling; ``tools``
(``input_schema``) and ``tool_choice`` (auto, any, tool, none) the chat's tool calling. The answer comes back as
content blocks (``thinking`` for a reasoning model's reasoning, ``text``, ``tool_use``) with Anthropic's stop reasons,
or streamed with its events (``message_start``, ``content_block_start``/``_delta``/``_stop``, ``message_delta``,
``message_stop``, a ``ping`` after the start). ``count_tokens`` counts the prompt the chat route renders, by asking
the model for one token. Errors come as ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import json
import os
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..dispatcher import Chunk, End, PendingRequest
from .chat_answers import Call, Turn, answer_start, chat_start, deltas, required_string, text_of, whole
from .generation import Failure, drop_nulls
from .openai import submit_openai
from .relay import NO_CACHE, RAW_BODY, HttpError, Store, flag, json_object, read_body

router = APIRouter(tags=["anthropic"])
PREFIX = "/v1/messages"

#: What the ``anthropic`` client sends. temperature, top_p and top_k are older clients' (newer ones send them in
#: ``extra_body``); the settings of Anthropic's own service (cache_control, inference_geo, speed, service_tier...)
#: change nothing here and are accepted as they are.
FIELDS = ("model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_p", "top_k",
          "tools", "tool_choice", "metadata", "thinking", "output_config", "service_tier", "cache_control",
          "diagnostics", "inference_geo", "speed", "user_profile_id", "workspace_id")
COUNT_FIELDS = ("model", "messages", "system", "tools", "tool_choice", "thinking", "output_config", "cache_control")
THINKING = ("enabled", "disabled", "adaptive", "between_tools")
RENAME = {"stop": "stop_sequences", r"response_format\.json_schema\.schema": "output_config.format.schema",
          r"tools\[(\d+)\]\.function\.parameters": r"tools[\1].input_schema", r"tools\[(\d+)\]\.function": r"tools[\1]"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error"}
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


def error(code: int, message: str) -> JSONResponse:
    """Anthropic's error body; the ``anthropic`` client raises the exception class of the status."""
    kind = ERROR_TYPES.get(code, "api_error" if code >= 500 else "invalid_request_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=code)


@router.post("/v1/messages", openapi_extra=RAW_BODY)
async def messages(request: Request, store: Store) -> Response:
    body = drop_nulls(json_object(await read_body(request, store)))
    _check_known(body, FIELDS)
    if "max_tokens" not in body:
        raise HttpError(400, "BadRequestException", "max_tokens: Field required")
    stream = flag(body, "stream")
    chat = _chat_body(body, stream)
    model, pending = await submit_openai(request, store, chat)
    first = await answer_start(request, pending, RENAME)
    message_id = f"msg_{os.urandom(12).hex()}"
    if stream:
        return StreamingResponse(_events(request, message_id, model.name, pending, first), 200,
                                 {**NO_CACHE, "content-type": "text/event-stream"})
    turn = await whole(request, pending, first)
    reason, sequence = _stop(turn.finish, turn.stop_reason)
    return JSONResponse({"id": message_id, "type": "message", "role": "assistant", "model": model.name,
                         "content": _blocks(turn), "stop_reason": reason, "stop_sequence": sequence,
                         "usage": {"input_tokens": turn.prompt_tokens, "output_tokens": turn.completion_tokens}},
                        headers=NO_CACHE)


@router.post("/v1/messages/count_tokens", openapi_extra=RAW_BODY)
async def count_tokens(request: Request, store: Store) -> JSONResponse:
    """The prompt's tokens, as the model's chat template renders it, counted by asking the model for one token (the
    handler reports the prompt's length with every answer)."""
    body = drop_nulls(json_object(await read_body(request, store)))
    _check_known(body, COUNT_FIELDS)
    chat = _chat_body({**body, "max_tokens": 1}, stream=False)
    if chat.get("tool_choice", "auto") == "auto" and "tools" in chat:
        chat["tool_choice"] = "required"  # the tools render as they would with auto, without a tool-call parser
    _, pending = await submit_openai(request, store, chat)
    turn = await whole(request, pending, await answer_start(request, pending, RENAME))
    return JSONResponse({"input_tokens": turn.prompt_tokens}, headers=NO_CACHE)


def _check_known(body: dict[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise HttpError(400, "BadRequestException", f"{unknown[0]}: Extra inputs are not permitted (allowed fields are "
                                                    f"{', '.join(allowed)})")
    thinking = body.get("thinking")
    if thinking is not None and (not isinstance(thinking, dict) or thinking.get("type") not in THINKING):
        raise HttpError(400, "BadRequestException", f"thinking={json.dumps(thinking)[:80]} is invalid: expected "
                                                    f"an object whose type is one of {', '.join(THINKING)}")


def _chat_body(body: dict[str, Any], stream: bool) -> dict[str, Any]:
    system = body.get("system")
    messages = ([{"role": "system", "content": text_of(system, "system", ("text",))}] if system is not None else [])
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise HttpError(400, "BadRequestException", f"messages={json.dumps(body.get('messages'))[:80]} is invalid: "
                                                    "expected a non-empty list of messages")
    for i, message in enumerate(body["messages"]):
        messages += _message(message, f"messages[{i}]")
    chat = chat_start(messages, stream)
    for own, chat_name in (("model", "model"), ("max_tokens", "max_tokens"), ("stop_sequences", "stop"),
                           ("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k")):
        if own in body:
            chat[chat_name] = body[own]
    if "tools" in body:
        chat["tools"] = _tools(body["tools"])
    if "tool_choice" in body:
        chat.update(_tool_choice(body["tool_choice"]))
    fmt = _output_format(body.get("output_config"))
    if fmt is not None:
        chat["response_format"] = fmt
    return chat


def _output_format(config: Any) -> dict[str, Any] | None:
    """``output_config.format`` (``{"type": "json_schema", "schema"}``) as the chat's ``response_format``;
    ``effort`` changes nothing here."""
    if config is None:
        return None
    fmt = config.get("format") if isinstance(config, dict) else None
    if not isinstance(config, dict) or set(config) - {"format", "effort"} or (
            fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "json_schema")):
        raise HttpError(400, "BadRequestException", f"output_config={json.dumps(config)[:80]} is invalid: expected "
                                                    '{"format": {"type": "json_schema", "schema": {...}}}')
    return None if fmt is None else {"type": "json_schema", "json_schema": {"name": "output",
                                                                            "schema": fmt.get("schema")}}


def _message(message: Any, field: str) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: tool results become tool messages, tool uses tool calls."""
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise HttpError(400, "BadRequestException", f"{field}={json.dumps(message)[:80]} is invalid: expected "
                                                    '{"role": "user" or "assistant", "content": ...}')
    role, content = message["role"], message.get("content")
    if isinstance(content, str) or not isinstance(content, list):
        return [{"role": role, "content": text_of(content, f"{field}.content", ("text",))}]
    texts, calls, results = [], [], []
    for j, block in enumerate(content):
        where = f"{field}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            calls.append({"id": required_string(block, "id", where), "type": "function", "function": {
                "name": required_string(block, "name", where), "arguments": json.dumps(block.get("input", {}))}})
        elif kind == "tool_result" and role == "user":
            result = block.get("content", "")
            results.append({"role": "tool", "tool_call_id": required_string(block, "tool_use_id", where),
                            "content": result if isinstance(result, str) else text_of(result, f"{where}.content",
                                                                                        ("text",))})
        elif kind not in ("thinking", "redacted_thinking"):  # earlier reasoning is not part of the prompt
            raise HttpError(400, "BadRequestException", f"{where}.type={json.dumps(kind)[:40]} is not supported: "
                                                        "send text, tool_use (assistant) or tool_result (user) blocks")
    out = list(results)
    if calls:
        out.append({"role": "assistant", "content": "".join(texts) or None, "tool_calls": calls})
    elif texts or not results:
        out.append({"role": role, "content": "".join(texts)})
    return out


def _tools(tools: Any) -> Any:
    if not isinstance(tools, list):
        return tools  # the chat's own check names the field
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            raise HttpError(400, "BadRequestException", f"tools[{i}]={json.dumps(tool)[:80]} is not supported: only "
                                                        'client tools are ({"name", "description", "input_schema"})')
        function = {"name": tool.get("name"), "parameters": tool.get("input_schema")}
        if "description" in tool:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, dict) else None
    chosen = {"auto": "auto", "any": "required", "none": "none"}.get(kind or "")
    if kind == "tool":
        chosen = {"type": "function", "function": {"name": choice.get("name")}}
    if chosen is None:
        raise HttpError(400, "BadRequestException", f"tool_choice={json.dumps(choice)[:80]} is invalid: expected "
                                                    '{"type": "auto", "any", "tool" (with "name") or "none"}')
    parallel = {"parallel_tool_calls": False} if choice.get("disable_parallel_tool_use") else {}
    return {"tool_choice": chosen, **parallel}


def _stop(finish: str | None, stop_reason: Any) -> tuple[str, str | None]:
    if finish == "stop" and isinstance(stop_reason, str):
        return "stop_sequence", stop_reason
    return STOP_REASONS.get(finish or "", "end_turn"), None


def _input(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return {}  # arguments cut short by max_tokens


def _blocks(turn: Turn) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if turn.reasoning:
        blocks.append({"type": "thinking", "thinking": turn.reasoning, "signature": ""})
    if turn.content:
        blocks.append({"type": "text", "text": turn.content})
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c.arguments)} for c in turn.calls]
    return blocks


def _event(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n".encode()


async def _events(request: Request, message_id: str, model: str, pending: PendingRequest,
                  first: Chunk | End) -> AsyncIterator[bytes]:
    yield _event("message_start", message={"id": message_id, "type": "message", "role": "assistant", "content": [],
                                           "model": model, "stop_reason": None, "stop_sequence": None,
                                           "usage": {"input_tokens": 0, "output_tokens": 0}})
    yield _event("ping")
    index, kind = -1, None  # the open block
    finish, stop_reason, usage = None, None, {}
    async for delta in deltas(request, pending, first):
        if isinstance(delta, Failure):
            kind_name = ERROR_TYPES.get(delta.code, "api_error")
            yield _event("error", error={"type": kind_name, "message": delta.message})
            return
        for block, start, piece in _pieces(delta):
            if block != kind or start is not None:
                if kind is not None:
                    yield _event("content_block_stop", index=index)
                index, kind = index + 1, block
                yield _event("content_block_start", index=index, content_block=start or _empty(block))
            if piece:
                yield _event("content_block_delta", index=index, delta=piece)
        finish, stop_reason, usage = delta.finish or finish, delta.stop_reason or stop_reason, delta.usage or usage
    if kind is not None:
        yield _event("content_block_stop", index=index)
    reason, sequence = _stop(finish, stop_reason)
    yield _event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                 usage={"input_tokens": usage.get("prompt_tokens", 0),
                        "output_tokens": usage.get("completion_tokens", 0)})
    yield _event("message_stop")


def _pieces(delta: Any) -> list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]]:
    """(block type, the start of a new block or None, the delta) for one chat delta."""
    out: list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]] = []
    if delta.reasoning:
        out.append(("thinking", None, {"type": "thinking_delta", "thinking": delta.reasoning}))
    if delta.content:
        out.append(("text", None, {"type": "text_delta", "text": delta.content}))
    if delta.call is not None:
        call: Call = delta.call
        out.append(("tool_use", {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}, None))
    if delta.arguments:
        out.append(("tool_use", None, {"type": "input_json_delta", "partial_json": delta.arguments}))
    return out


def _empty(block: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": "", "signature": ""} if block == "thinking" else {"type": block,
                                                                                              "text": ""}
