"""What the routes that speak another chat API share (OpenAI's Responses, Anthropic's Messages).

Such a route translates its client's request into one OpenAI chat body, queues it like the chat route does
(``openai.submit_openai``: the same model choice, adapters, structured output and tool calling on every backend), and
reads the chat answer back: whole, as one ``Turn``, or streamed, as ``Delta``s, to render them in its own API's
shape. One translation keeps every API equal on every backend: a greedy answer is the chat route's answer.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Mapping, TypeVar

from fastapi import Request

from lmi_handlers.errors import Cancelled

from ..dispatcher import Chunk, End, PendingRequest
from .generation import Failure, error_message, line_value
from .relay import HttpError, started

T = TypeVar("T")


@dataclass
class Call:
    """A tool call as the chat answer gives it; ``arguments`` grow while it streams."""

    id: str
    name: str
    arguments: str = ""


@dataclass
class Turn:
    """A finished chat answer."""

    content: str | None
    reasoning: str | None
    calls: list[Call]
    #: OpenAI's finish reason (stop, length, tool_calls) and the stop sequence that ended the text, if one did.
    finish: str
    stop_reason: str | None
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Delta:
    """One streamed piece: reasoning or content text, a call's start (``call`` with its id and name) or more of
    its arguments (``call_index`` and ``arguments``), or the end (``finish``, then ``usage``)."""

    reasoning: str = ""
    content: str = ""
    call: Call | None = None
    call_index: int | None = None
    arguments: str = ""
    finish: str | None = None
    stop_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)


async def answer_start(request: Request, pending: PendingRequest, rename: Mapping[str, str],
                       stop: asyncio.Event | None = None) -> Chunk | End:
    """The answer's first event once it started; an ``HttpError`` with the model's status and message (its chat
    field names turned into the client's, ``rename``) when it failed before starting. ``stop`` set (a cancel) ends
    the wait: the answer is then an empty ``End``."""
    start = await until(started(request, pending), stop)
    if stop is not None and stop.is_set():
        pending.cancelled = True
        return End()
    if start is None:
        raise HttpError(Cancelled.status, "ClientClosed", "the client went away")
    first = await pending.events.get()
    if start.code >= 400:
        body = first.data if isinstance(first, Chunk) else b""
        message = renamed(error_message(body.decode("utf-8", "replace")), rename)
        raise HttpError(start.code, "BadRequestException" if start.code < 500 else "ModelException", message)
    return first


def renamed(message: str, rename: Mapping[str, str]) -> str:
    """An error message that begins with a chat field's name, with the name the client sent instead: ``rename``
    maps regular expressions (matched at the start) to their replacements."""
    for pattern, own in rename.items():
        changed, count = re.subn(f"^{pattern}(?=$|[:.\\[ =])", own, message)
        if count:
            return changed
    return message


async def until(awaitable: Awaitable[T], stop: asyncio.Event | None) -> T | None:
    """``awaitable``'s result, or None once ``stop`` is set first."""
    if stop is None:
        return await awaitable
    task, stopped = asyncio.ensure_future(awaitable), asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task in done:
        return task.result()
    task.cancel()
    return None


async def whole(request: Request, pending: PendingRequest, first: Chunk | End,
                stop: asyncio.Event | None = None) -> Turn | None:
    """The chat answer as one ``Turn`` (a JSON answer comes in one or more chunks); None when ``stop`` ended it.
    Its tokens count in ``/metrics`` as the chat route's do."""
    data = await collected(pending, first, stop)
    if stop is not None and stop.is_set():
        return None
    try:
        answer = json.loads(data)
        if isinstance(answer, dict) and "error" in answer:
            raise HttpError(int(answer.get("code") or 500), "ModelException", error_message(answer))
        choice = answer["choices"][0]
        message, usage = choice["message"], answer["usage"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise HttpError(502, "ModelException", error_message(data.decode("utf-8", "replace"))) from None
    calls = [Call(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    _count(request, usage)
    return Turn(message.get("content"), message.get("reasoning_content"), calls, choice["finish_reason"],
                choice.get("stop_reason"), usage["prompt_tokens"], usage["completion_tokens"])


async def collected(pending: PendingRequest, first: Chunk | End, stop: asyncio.Event | None = None) -> bytes:
    """The whole answer's bytes (a JSON answer comes in one or more chunks)."""
    data = b""
    async for chunk in _chunks(pending, first, stop):
        data += chunk.data
    return data


async def deltas(request: Request, pending: PendingRequest, first: Chunk | End,
                 stop: asyncio.Event | None = None) -> AsyncIterator[Delta | Failure]:
    """The streamed chat answer (server-sent events), piece by piece; a ``Failure`` ends it early, and so does
    ``stop``. Its tokens count in ``/metrics``."""
    buffer = b""
    finished = False
    try:
        async for chunk in _chunks(pending, first, stop):
            *lines, buffer = (buffer + chunk.data).split(b"\n")
            for line in lines:
                for item in _line_deltas(line):
                    if isinstance(item, Delta) and item.usage:
                        _count(request, item.usage)
                    yield item
                    if isinstance(item, Failure):
                        finished = True
                        return
        for item in _line_deltas(buffer):  # an answer whose last line has no newline
            yield item
        finished = True
    finally:
        if not finished:
            pending.cancelled = True  # the client went away: free the sequence's slot at the next step


def _count(request: Request, usage: Mapping[str, Any]) -> None:
    request.app.state.metrics.tokens(request.state.model, int(usage.get("prompt_tokens") or 0),
                                     int(usage.get("completion_tokens") or 0))


async def _chunks(pending: PendingRequest, first: Chunk | End,
                  stop: asyncio.Event | None = None) -> AsyncIterator[Chunk]:
    event: Chunk | End | None = first
    while isinstance(event, Chunk):
        yield event
        if event.final:
            return
        event = await until(pending.events.get(), stop)
    if event is None:  # stopped: the handler drops the sequence at its next step
        pending.cancelled = True
    elif event.error:
        yield Chunk(json.dumps({"code": 500, "error": event.error}).encode(), final=True)


def _line_deltas(line: bytes) -> list[Delta | Failure]:
    obj = line_value(line)
    if obj is None or isinstance(obj, Failure):
        return [obj] if obj is not None else []
    if not isinstance(obj, dict) or "error" in obj:
        return [Failure(int(obj.get("code") or 500) if isinstance(obj, dict) else 502, error_message(obj))]
    if obj.get("usage"):
        return [Delta(usage=obj["usage"])]
    out: list[Delta | Failure] = []
    for choice in obj.get("choices") or []:
        out += _choice_deltas(choice)
    return out


def _choice_deltas(choice: dict[str, Any]) -> list[Delta | Failure]:
    delta = choice.get("delta") or {}
    out: list[Delta | Failure] = []
    if delta.get("reasoning_content") or delta.get("content"):
        out.append(Delta(reasoning=delta.get("reasoning_content") or "", content=delta.get("content") or ""))
    for call in delta.get("tool_calls") or []:
        function = call.get("function") or {}
        if call.get("id"):
            out.append(Delta(call=Call(call["id"], function.get("name", "")), call_index=call.get("index", 0)))
        if function.get("arguments"):
            out.append(Delta(call_index=call.get("index", 0), arguments=function["arguments"]))
    if choice.get("finish_reason"):
        out.append(Delta(finish=choice["finish_reason"], stop_reason=choice.get("stop_reason")))
    return out


def required_string(item: dict[str, Any], key: str, field: str) -> str:
    """``item[key]`` (an id, a name), a non-empty string; else a 400 naming ``field.key``."""
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise HttpError(400, "BadRequestException", f"{field}.{key}={json.dumps(value)[:80]} is invalid: expected "
                                                    "a non-empty string")
    return value


def chat_start(messages: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    """A chat body's start: its messages, and when streaming the usage chunk at the end (the token counts)."""
    return {"messages": messages, "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}


def text_of(content: Any, field: str, kinds: tuple[str, ...]) -> str:
    """The text of a message's content: a string, or a list of text parts whose ``type`` is one of ``kinds``;
    anything else is a 400 naming ``field``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in kinds or not isinstance(part.get("text"), str):
                raise HttpError(400, "BadRequestException", f"{field}[{i}]={json.dumps(part)[:80]} is not supported: "
                                f"only text parts ({{\"type\": \"{kinds[0]}\", \"text\": ...}}) are")
            texts.append(part["text"])
        return "".join(texts)
    raise HttpError(400, "BadRequestException", f"{field}={json.dumps(content)[:80]} is invalid: expected a string "
                                                "or a non-empty list of text parts")
