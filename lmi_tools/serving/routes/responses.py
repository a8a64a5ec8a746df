"""OpenAI's Responses API: ``POST /v1/responses``, ``GET /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel``,
``DELETE /v1/responses/{id}``.

A request becomes one chat body (``chat_answers.py``): ``instructions`` a system message, ``input`` (a string, or
messages, ``function_call`` and ``function_call_output`` items) the conversation after the stored one that
``previous_response_id`` names, ``max_output_tokens`` ``max_tokens``, function ``tools`` and ``tool_choice`` the
chat's, ``text.format`` the chat's ``response_format`` (enforced by structured output). The chat answer comes back as
output items (``responses_output.py``): a ``reasoning`` item for a reasoning model's reasoning, a ``message``, and a
``function_call`` per tool call; streamed as Responses' events. Responses are kept in a bounded in-memory store
(``response_store.py``) unless ``"store": false``.

vLLM's server has a Responses implementation of its own (``OpenAIServingResponses``); it drives vLLM's engine client
directly, which in LMI's process layout lives behind the handler, so every backend takes this one path instead and
answers as its chat route does.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..response_store import ResponseStore, Stored
from .chat_answers import answer_start, chat_start, required_string, text_of, whole
from .generation import drop_nulls, refuse_unsupported
from .openai import submit_openai
from .relay import NO_CACHE, RAW_BODY, HttpError, Store, flag, json_object, read_body
from .responses_output import Rendering

router = APIRouter(tags=["openai"])

FIELDS = ("model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
          "parallel_tool_calls", "text", "stream", "store", "previous_response_id", "metadata", "user", "reasoning",
          "truncation", "include", "background", "service_tier", "prompt_cache_key", "safety_identifier",
          "top_logprobs", "stream_options",
          # vLLM's extensions of the schema
          "top_k", "seed", "repetition_penalty")
NEUTRAL = {"truncation": ("disabled",), "background": (False,), "include": ([],), "top_logprobs": (0,),
           "service_tier": ("auto", "default")}
#: The chat fields a handler's error may name, and the Responses fields the client sent.
RENAME = {"max_tokens": "max_output_tokens", r"response_format\.json_schema\.schema": "text.format.schema",
          r"response_format\.json_schema": "text.format", "response_format": "text.format", "messages": "input",
          r"tools\[(\d+)\]\.function": r"tools[\1]"}
INPUT_ROLES = ("user", "system", "developer", "assistant")


@router.post("/v1/responses", openapi_extra=RAW_BODY)
async def create(request: Request, store: Store) -> Response:
    body = drop_nulls(json_object(await read_body(request, store)))
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise HttpError(400, "BadRequestException", f"unknown field {unknown[0]}: allowed fields are "
                                                    f"{', '.join(FIELDS)}")
    refuse_unsupported(body, NEUTRAL)
    _check_reasoning(body.get("reasoning"))
    stream, keep = flag(body, "stream"), flag(body, "store") if "store" in body else True
    responses: ResponseStore = request.app.state.responses
    history = _previous(responses, body.get("previous_response_id"))
    turn = _input(body.get("input"))
    system = ([{"role": "system", "content": text_of(body["instructions"], "instructions", ("input_text",))}]
              if "instructions" in body else [])
    chat = _chat_body(body, system + history + turn, stream)
    model, pending = await submit_openai(request, store, chat)
    rendering = Rendering(f"resp_{os.urandom(12).hex()}", model.name, body, int(time.time()))
    stop = asyncio.Event()
    if keep:
        responses.put(rendering.id, Stored(rendering.response("in_progress"), history + turn, stop))
    try:
        first = await answer_start(request, pending, RENAME, stop)
    except HttpError:
        responses.delete(rendering.id)
        raise

    def finished(response: dict[str, Any], output: list[dict[str, Any]]) -> None:
        if keep:
            responses.put(rendering.id, Stored(response, history + turn + output))

    if stream:
        events = rendering.events(request, pending, first, stop, finished)
        return StreamingResponse(events, 200, {**NO_CACHE, "content-type": "text/event-stream"})
    try:
        response, output = rendering.whole(await whole(request, pending, first, stop))
    except HttpError as exc:
        finished(rendering.response("failed", error={"code": "server_error", "message": exc.message}), [])
        raise
    finished(response, output)
    return JSONResponse(response, headers=NO_CACHE)


@router.get("/v1/responses/{response_id}")
async def retrieve(request: Request, response_id: str) -> JSONResponse:
    return JSONResponse(_stored(request, response_id).response, headers=NO_CACHE)


@router.delete("/v1/responses/{response_id}")
async def delete(request: Request, response_id: str) -> JSONResponse:
    _stored(request, response_id)
    request.app.state.responses.delete(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


@router.post("/v1/responses/{response_id}/cancel")
async def cancel(request: Request, response_id: str) -> JSONResponse:
    """Stops a response that is still being generated (a stream, or a call waiting for its answer); its answer so far
    ends with status ``cancelled``. A finished response cannot be cancelled (400), as on vLLM's server."""
    stored = _stored(request, response_id)
    if stored.stop is None or stored.response.get("status") != "in_progress":
        raise HttpError(400, "BadRequestException", f"Cannot cancel response {response_id}: its status is "
                                                    f"{stored.response.get('status')}, and only a response in "
                                                    "progress can be cancelled")
    stored.stop.set()
    response = {**stored.response, "status": "cancelled"}
    request.app.state.responses.put(response_id, Stored(response, stored.history))
    return JSONResponse(response, headers=NO_CACHE)


def _stored(request: Request, response_id: str) -> Stored:
    stored = request.app.state.responses.get(response_id)
    if stored is None:
        raise HttpError(404, "NotFoundException", f"Response with id '{response_id}' not found (this server keeps "
                                                  "the latest responses in memory; see docs/serving.md)")
    return stored


def _previous(responses: ResponseStore, response_id: Any) -> list[dict[str, Any]]:
    if response_id is None:
        return []
    stored = responses.get(response_id) if isinstance(response_id, str) else None
    if stored is None:
        raise HttpError(404, "NotFoundException", f"previous_response_id={json.dumps(response_id)[:80]} is not a "
                                                  "stored response of this server (responses sent with store=false, "
                                                  "deleted, or beyond the store's bounds are not kept)")
    if stored.response.get("status") == "in_progress":
        raise HttpError(400, "BadRequestException", f"previous_response_id={response_id} is still in progress")
    return list(stored.history)


def _check_reasoning(value: Any) -> None:
    """``reasoning`` as a client sends it; this server does not change how much a model reasons (a reasoning
    model's reasoning comes back as a ``reasoning`` item whatever it says)."""
    if value is not None and not isinstance(value, dict):
        raise HttpError(400, "BadRequestException", f"reasoning={json.dumps(value)[:80]} is invalid: expected an "
                                                    "object")
    for key, setting in (value or {}).items():
        if key not in ("effort", "summary", "generate_summary") or setting is not None:
            raise HttpError(400, "BadRequestException", f"reasoning.{key}={json.dumps(setting)[:80]} is not "
                                                        "supported by this server: omit it")


def _input(value: Any) -> list[dict[str, Any]]:
    """``input`` as chat messages: a string is one user message; a list holds messages and tool-call items."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise HttpError(400, "BadRequestException", f"input={json.dumps(value)[:80]} is invalid: expected a string or "
                                                    "a non-empty list of input items")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        field = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            role = item.get("role")
            if role not in INPUT_ROLES:
                raise HttpError(400, "BadRequestException", f"{field}.role={json.dumps(role)[:40]} is invalid: "
                                                            f"allowed roles are {', '.join(INPUT_ROLES)}")
            messages.append({"role": role, "content": text_of(item.get("content"), f"{field}.content",
                                                              ("input_text", "output_text", "text"))})
        elif kind == "function_call":
            call = {"id": required_string(item, "call_id", field), "type": "function",
                    "function": {"name": required_string(item, "name", field),
                                 "arguments": required_string(item, "arguments", field)}}
            if messages and messages[-1]["role"] == "assistant" and "tool_calls" in messages[-1]:
                messages[-1]["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": required_string(item, "call_id", field),
                             "content": text_of(output, f"{field}.output", ("input_text", "output_text"))})
        elif kind != "reasoning":  # earlier reasoning is not part of the prompt, as chat templates drop it
            raise HttpError(400, "BadRequestException", f"{field}.type={json.dumps(kind)[:40]} is not supported: "
                                                        "send message, function_call or function_call_output items")
    return messages


def _chat_body(body: dict[str, Any], messages: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    chat = chat_start(messages, stream)
    for own, chat_name in (("model", "model"), ("max_output_tokens", "max_tokens"), ("temperature", "temperature"),
                           ("top_p", "top_p"), ("top_k", "top_k"), ("seed", "seed"),
                           ("repetition_penalty", "repetition_penalty"), ("parallel_tool_calls", "parallel_tool_calls"),
                           ("user", "user")):
        if own in body:
            chat[chat_name] = body[own]
    if "tools" in body:
        chat["tools"] = _tools(body["tools"])
    if "tool_choice" in body:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    text = body.get("text", {})
    if not isinstance(text, dict) or sorted(set(text) - {"format", "verbosity"}):
        raise HttpError(400, "BadRequestException", f"text={json.dumps(text)[:80]} is invalid: expected an object "
                                                    "with format")
    if "format" in text:
        chat["response_format"] = _format(text["format"])
    return chat


def _tools(tools: Any) -> Any:
    """Responses' function tools (``{"type": "function", "name", "parameters"...}``) in the chat's shape."""
    if not isinstance(tools, list):
        return tools  # the chat's own check names the field
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise HttpError(400, "BadRequestException", f"tools[{i}]={json.dumps(tool)[:80]} is not supported: "
                                                        "only function tools are ({\"type\": \"function\", \"name\", "
                                                        "\"parameters\"})")
        out.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _format(fmt: Any) -> Any:
    """``text.format`` as the chat's ``response_format`` (whose checks name ``text.format`` through ``RENAME``)."""
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = {k: v for k, v in fmt.items() if k != "type"}
        return {"type": "json_schema", "json_schema": schema}
    return fmt
