"""A chat answer as a Responses API answer: the ``response`` object with its output items, whole or as events.

Output items come in the order the answer wrote them: a ``reasoning`` item (a reasoning model's reasoning, as
``reasoning_text`` content), a ``message`` with one ``output_text`` part, then one ``function_call`` per tool call.
A stream sends the documented events: ``response.created``, ``response.in_progress``, then per item
``response.output_item.added``, its content part's ``response.content_part.added``, the deltas
(``response.reasoning_text.delta``, ``response.output_text.delta``, ``response.function_call_arguments.delta``),
their ``.done`` events and ``response.output_item.done``, and last ``response.completed`` (``response.incomplete``
when ``max_output_tokens`` cut the answer, ``response.failed`` after an ``error`` event). Each event has its
``sequence_number``.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any, AsyncIterator, Callable

from fastapi import Request

from ..dispatcher import Chunk, End, PendingRequest
from .chat_answers import Call, Delta, Turn, deltas
from .generation import Failure

#: The request fields a response object repeats, with the value each has when the request left it out.
ECHOED = {"instructions": None, "max_output_tokens": None, "metadata": {}, "parallel_tool_calls": True,
          "previous_response_id": None, "temperature": 1.0, "top_p": 1.0, "tool_choice": "auto", "tools": [],
          "text": {"format": {"type": "text"}}, "truncation": "disabled", "user": None, "store": True,
          "reasoning": {"effort": None, "summary": None}}


def _id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(12).hex()}"


class Rendering:
    """One response: its id, the request it answers, and its output as it grows."""

    def __init__(self, response_id: str, model: str, body: dict[str, Any], created: int):
        self.id, self.model, self.body, self.created = response_id, model, body, created
        self.output: list[dict[str, Any]] = []
        self._sequence = 0

    def response(self, status: str, usage: dict[str, Any] | None = None, error: dict[str, Any] | None = None,
                 ) -> dict[str, Any]:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": list(self.output), "error": error, "incomplete_details": incomplete,
                "usage": usage, **{key: self.body.get(key, default) for key, default in ECHOED.items()}}

    # --- whole --------------------------------------------------------------------------------

    def whole(self, turn: Turn | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The response and the chat messages it adds to the conversation; ``turn`` None: it was cancelled."""
        if turn is None:
            return self.response("cancelled"), []
        status = "incomplete" if turn.finish == "length" else "completed"
        item_status = "incomplete" if status != "completed" else "completed"
        if turn.reasoning:
            self.output.append(_reasoning_item(_id("rs"), turn.reasoning, item_status))
        if turn.content:
            self.output.append(_message_item(_id("msg"), turn.content, item_status))
        self.output += [_call_item(_id("fc"), call, item_status) for call in turn.calls]
        usage = _usage(turn.prompt_tokens, turn.completion_tokens)
        return self.response(status, usage), _assistant(turn.content, turn.calls)

    # --- streamed -----------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> bytes:
        self._sequence += 1
        data = json.dumps({"type": kind, "sequence_number": self._sequence - 1, **fields}, ensure_ascii=False)
        return f"event: {kind}\ndata: {data}\n\n".encode()

    async def events(self, request: Request, pending: PendingRequest, first: Chunk | End, stop: asyncio.Event,
                     finished: Callable[[dict[str, Any], list[dict[str, Any]]], None]) -> AsyncIterator[bytes]:
        """The answer as events, until ``stop`` (a cancel); ``finished(response, messages)`` stores it at the end,
        however it ends (a client that goes away cancels it)."""
        stream, final = _Items(self), self.response("cancelled")
        try:
            yield self._event("response.created", response=self.response("in_progress"))
            yield self._event("response.in_progress", response=self.response("in_progress"))
            usage, finish = {}, None
            async for delta in deltas(request, pending, first, stop):
                if isinstance(delta, Failure):
                    for event in stream.close("incomplete"):
                        yield event
                    code = "server_error" if delta.code >= 500 else "invalid_request"
                    final = self.response("failed", error={"code": code, "message": delta.message})
                    yield self._event("error", code=code, message=delta.message, param=None)
                    yield self._event("response.failed", response=final)
                    return
                for event in stream.feed(delta):
                    yield event
                usage, finish = delta.usage or usage, delta.finish or finish
            status = "cancelled" if stop.is_set() else "incomplete" if finish == "length" else "completed"
            for event in stream.close("completed" if status == "completed" else "incomplete"):
                yield event
            final = self.response(status, _usage(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)))
            yield self._event(f"response.{status}", response=final)
        finally:
            finished(final, _assistant(stream.content or None, stream.calls) if final["status"] != "failed" else [])


class _Items:
    """The output items of a streamed answer: the one being written, and the events each delta adds."""

    def __init__(self, rendering: Rendering):
        self.rendering = rendering
        self.open: dict[str, Any] | None = None
        self.content = ""
        self.calls: list[Call] = []

    def _event(self, kind: str, **fields: Any) -> bytes:
        return self.rendering._event(kind, **fields)

    @property
    def _index(self) -> int:
        return len(self.rendering.output) - 1

    def feed(self, delta: Delta) -> list[bytes]:
        out = []
        if delta.reasoning:
            out += self._text("reasoning", delta.reasoning)
        if delta.content:
            self.content += delta.content
            out += self._text("message", delta.content)
        if delta.call is not None:
            out += self.close("completed")
            self.calls.append(delta.call)
            self.open = _call_item(_id("fc"), delta.call, "in_progress")
            self.rendering.output.append(self.open)
            out.append(self._event("response.output_item.added", output_index=self._index, item=self.open))
        if delta.arguments and self.open is not None and self.open["type"] == "function_call":
            self.calls[-1].arguments += delta.arguments
            self.open["arguments"] += delta.arguments
            out.append(self._event("response.function_call_arguments.delta", item_id=self.open["id"],
                                   output_index=self._index, delta=delta.arguments))
        return out

    def _text(self, kind: str, text: str) -> list[bytes]:
        out = []
        if self.open is None or self.open["type"] != kind:
            out += self.close("completed")
            self.open = (_reasoning_item(_id("rs"), "", "in_progress") if kind == "reasoning"
                         else _message_item(_id("msg"), "", "in_progress"))
            self.rendering.output.append(self.open)
            out.append(self._event("response.output_item.added", output_index=self._index,
                                   item={**self.open, "content": []}))
            out.append(self._event("response.content_part.added", item_id=self.open["id"], output_index=self._index,
                                   content_index=0, part={**self.open["content"][0]}))
        self.open["content"][0]["text"] += text
        name = "reasoning_text" if kind == "reasoning" else "output_text"
        extra = {"logprobs": []} if kind == "message" else {}
        out.append(self._event(f"response.{name}.delta", item_id=self.open["id"], output_index=self._index,
                               content_index=0, delta=text, **extra))
        return out

    def close(self, status: str) -> list[bytes]:
        """The ``.done`` events of the open item, which is finished with ``status``."""
        item, self.open = self.open, None
        if item is None:
            return []
        item["status"] = status
        ids = {"item_id": item["id"], "output_index": self._index}
        if item["type"] == "function_call":
            out = [self._event("response.function_call_arguments.done", **ids, name=item["name"],
                               arguments=item["arguments"])]
        else:
            part = item["content"][0]
            name = "reasoning_text" if item["type"] == "reasoning" else "output_text"
            extra = {"logprobs": []} if item["type"] == "message" else {}
            out = [self._event(f"response.{name}.done", **ids, content_index=0, text=part["text"], **extra),
                   self._event("response.content_part.done", **ids, content_index=0, part=part)]
        return out + [self._event("response.output_item.done", output_index=self._index, item=item)]


def _reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}],
            "status": status}


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _call_item(item_id: str, call: Call, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + completion}


def _assistant(content: str | None, calls: list[Call]) -> list[dict[str, Any]]:
    """The answer as the chat messages a follow-up's conversation holds (none for an empty answer)."""
    if not (content or "").strip() and not calls:
        return []
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name,
                                                                                "arguments": c.arguments}}
                                 for c in calls]
    return [message]
