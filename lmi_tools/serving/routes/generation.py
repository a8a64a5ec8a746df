"""What the routes that speak another API's schema (TGI, OpenAI completions) share.

Such a route translates its client's request into LMI's schema (``{"inputs", "parameters", "stream"}``),
queues it on the model like any other request, and reads the model's answer back as ``Token``s and one
``Result`` per prompt, whichever framing the model answers in (jsonlines, ``data:`` lines or one JSON value;
LMI's or, with ``option.tgi_compat``, TGI's shapes), to render them in its own API's shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Mapping

from fastapi import Request

from lmi_handlers.errors import Cancelled, InvalidRequest
from lmi_handlers.structured.constraint import Constraint, to_guided

from ...answers.messages import error_parts
from ..dispatcher import Chunk, End, PendingRequest, ServedModel
from ..store import ModelStore
from .relay import HttpError, started, submit


@dataclass(frozen=True)
class Token:
    id: int
    text: str
    logprob: float | None
    special: bool
    index: int = 0  # which choice of the request (prompt i's choice j is i * n + j)
    #: The most likely tokens at this position as (id, text, log probability), when the request asked for them.
    top: tuple[tuple[int, str, float], ...] = ()


@dataclass(frozen=True)
class Result:
    text: str
    finish_reason: str
    generated_tokens: int
    prompt_tokens: int
    seed: int | None
    index: int = 0
    #: The last token, when it came on the same line as the result (LMI's last jsonlines line).
    token: Token | None = None


@dataclass(frozen=True)
class Failure:
    """The model failed after the answer started (a mid-stream error)."""

    code: int
    message: str


Item = Token | Result | Failure


def drop_nulls(values: Mapping[str, Any]) -> dict[str, Any]:
    """Clients send every parameter, unset ones as null: null means "the default"."""
    return {k: v for k, v in values.items() if v is not None}


def guided_parameters(parse: Callable[[Any], Constraint | None], value: Any) -> dict[str, Any]:
    """LMI's ``guided_*`` parameters for a route's own constraint field (OpenAI's ``response_format``, TGI's
    ``grammar``), checked here so that a 400 names the field the client sent."""
    try:
        constraint = parse(value)
    except InvalidRequest as exc:
        raise HttpError(400, "BadRequestException", str(exc)) from None
    return to_guided(constraint) if constraint is not None else {}


def refuse_unsupported(values: Mapping[str, Any], neutral: Mapping[str, tuple]) -> None:
    """A 400 for a parameter set to something other than its neutral values (what this server does anyway)."""
    for name, allowed in neutral.items():
        if name in values and values[name] not in allowed:
            shown = " or ".join(json.dumps(a) for a in allowed)
            raise HttpError(400, "BadRequestException", f"{name}={json.dumps(values[name])} is not supported by this "
                                                        f"server: omit it or send {shown}")


async def generate(request: Request, store: ModelStore, model: ServedModel, body: dict[str, Any],
                   stream: bool) -> AsyncIterator[Item]:
    """Queue an LMI request and return its answer's items; an error before the answer starts is an
    ``HttpError`` with the model's status and message."""
    pending = await submit(request, store, model, body=json.dumps(body).encode(),
                           accept="application/jsonlines" if stream else "application/json")
    start = await started(request, pending)
    if start is None:
        raise HttpError(Cancelled.status, "ClientClosed", "the client went away")
    if start.code >= 400:
        text = b"".join([c.data async for c in _chunks(pending)]).decode("utf-8", "replace")
        raise HttpError(start.code, "BadRequestException" if start.code < 500 else "ModelException",
                        error_message(text))
    return _read(pending, lambda result: request.app.state.metrics.tokens(model.name, result.prompt_tokens,
                                                                          result.generated_tokens))


async def _chunks(pending: PendingRequest) -> AsyncIterator[Chunk]:
    while True:
        event = await pending.events.get()
        if isinstance(event, End):
            if event.error:
                yield Chunk(json.dumps({"code": 500, "error": event.error}).encode(), final=True)
            return
        yield event
        if event.final:
            return


async def _read(pending: PendingRequest, count: Callable[[Result], None]) -> AsyncIterator[Item]:
    seen_tokens: set[int] = set()
    buffer = b""
    finished = False
    try:
        async for chunk in _chunks(pending):
            *lines, buffer = (buffer + chunk.data).split(b"\n")
            for line in lines:
                for item in line_items(line, seen_tokens, count):
                    yield item
        for item in line_items(buffer, seen_tokens, count):  # a JSON answer has no newline at its end
            yield item
        finished = True
    finally:
        if not finished:
            pending.cancelled = True  # the client went away: free the sequence's slot at the next step


def line_items(line: bytes, seen_tokens: set[int], count: Callable[[Result], None]) -> list[Item]:
    """The items of one line of a model's answer (``seen_tokens``: the prompts whose tokens came one by one, so
    that a final ``details.tokens`` is not read twice; ``count`` sees each ``Result``)."""
    value = line_value(line)
    if value is None or isinstance(value, Failure):
        return [value] if value is not None else []
    text = line.decode("utf-8", "replace")
    objects = value if isinstance(value, list) else [value]
    items: list[Item] = []
    for index, obj in enumerate(objects):
        if not isinstance(obj, dict):
            return [Failure(502, f"the model answered in a form this route cannot read: {text[:200]!r}")]
        items += _object_items(obj, index, seen_tokens)
    for item in items:
        if isinstance(item, Result):
            count(item)  # the token counters of /metrics
    return items


def line_value(line: bytes) -> Any:
    """The JSON value of one line of an answer (a JSON line or a ``data:`` event); None for an empty line or
    ``[DONE]``; a ``Failure`` for a line that is not JSON."""
    text = line.decode("utf-8", "replace").strip()
    if text.startswith("data:"):
        text = text[5:].strip()
    if not text or text == "[DONE]":
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return Failure(502, f"the model answered in a form this route cannot read: {text[:200]!r}")


def _object_items(obj: dict[str, Any], index: int, seen_tokens: set[int]) -> list[Item]:
    """The items of one answer object: prompt ``index``'s whole answer (a JSON list's element: its choices are
    the answer and ``details.best_of_sequences``), or one streamed line (a choice's own ``index`` when there are
    several)."""
    if "error" in obj:
        return [Failure(int(obj.get("code") or 500), error_message(obj))]
    details = obj.get("details") or {}
    if "token" in obj or "index" in obj:
        index = obj.get("index", index)
    others = details.get("best_of_sequences") or []
    items = _sequence_items(obj, details, index * (1 + len(others)), seen_tokens)
    for j, other in enumerate(others, 1):
        items += _sequence_items(other, other, index * (1 + len(others)) + j, seen_tokens)
    return items


def _sequence_items(obj: dict[str, Any], details: dict[str, Any], index: int, seen_tokens: set[int]) -> list[Item]:
    tops = [obj["top_tokens"]] if "top_tokens" in obj else details.get("top_tokens") or []  # TGI's shapes
    tokens = [obj["token"]] if "token" in obj else ([] if index in seen_tokens else details.get("tokens", []))
    items: list[Item] = [_token(t, index, tops[i] if i < len(tops) else ()) for i, t in enumerate(tokens)]
    seen_tokens.add(index)
    if obj.get("generated_text") is None:
        return items
    last = items.pop() if "token" in obj else None
    return items + [Result(obj["generated_text"], details.get("finish_reason", "eos_token"),
                           details.get("generated_tokens", len(tokens)), details.get("prompt_tokens", 0),
                           details.get("seed"), index, last)]


def _token(token: dict[str, Any], index: int, top: Any = ()) -> Token:
    top = token.get("top_logprobs", top)  # LMI's alternatives ride in the token, TGI's beside it
    return Token(token.get("id", 0), token.get("text", ""), token.get("logprob", token.get("log_prob")),
                 bool(token.get("special", token.get("special_token", False))), index,
                 tuple((t.get("id", 0), t.get("text", ""), t.get("logprob", t.get("log_prob"))) for t in top))


def error_message(body: str | dict[str, Any]) -> str:
    """The sentence in any error body a model or the server sends, by the one rule of ``answers.messages``
    (the exception type travels on its own in ``HttpError``)."""
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except json.JSONDecodeError:
            return body.strip() or "the model failed without a message"
    if isinstance(body, list) and body:
        body = body[0]
    parts = error_parts(body)
    return parts[1] if parts is not None else str(body)
