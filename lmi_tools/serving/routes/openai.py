"""OpenAI's API: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models[/{id}]``.

The body's ``model`` picks among the served models (with one model loaded, a name the server does not know
reaches it, as clients send names of their own; a model it knows but has not loaded is a 503), and a LoRA adapter's
name calls that adapter on its model, as vLLM's server does (``GET /v1/models`` lists adapters with their
``parent``); errors come in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}`` so the ``openai``
client shows the message. Chat bodies go to the handler as they are (it speaks OpenAI's chat); completions are
translated into LMI's schema (``generation.py``) and answered as ``text_completion`` objects, streamed as
server-sent events ending with ``data: [DONE]``.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from typing import Any, AsyncIterator, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from lmi_handlers.errors import Cancelled, InvalidRequest
from lmi_handlers.request import parse_stream_options
from lmi_handlers.schemas import GenerationRequest, SamplingParams, StoppingParams, checked, rule_of
from lmi_handlers.structured.constraint import from_response_format

from ..dispatcher import Chunk, End, PendingRequest, ServedModel
from ..store import ModelStore
from .generation import (Failure, Result, Token, drop_nulls, error_message, generate, guided_parameters,
                         refuse_unsupported)
from .relay import (NO_CACHE, RAW_BODY, HttpError, Store, flag, json_object, named, not_loaded, read_body, started,
                    submit)

router = APIRouter(tags=["openai"])
PREFIX = "/v1/"

COMPLETION_FIELDS = ("model", "prompt", "max_tokens", "temperature", "top_p", "stop", "stream", "stream_options",
                     "seed", "echo", "logprobs", "n", "best_of", "user", "frequency_penalty", "presence_penalty",
                     "suffix", "logit_bias", "response_format",
                     # vLLM's extensions, which benchmark clients send (the chat schema takes them too)
                     "top_k", "min_p", "repetition_penalty", "ignore_eos", "priority")
#: best_of (ranking candidates by likelihood) is gone from vLLM's API too; suffix (insertion) no model here does.
NEUTRAL = {"best_of": (1,), "suffix": ()}
FINISH = {"eos_token": "stop", "stop_sequence": "stop", "length": "length"}
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "presence_penalty",
            "frequency_penalty", "logit_bias", "top_logprobs")
#: The LMI parameters a completions field becomes, where the names differ.
LMI_NAMES = {"max_new_tokens": "max_tokens", "return_full_text": "echo", "guided_json": "response_format",
             "guided_whitespace_pattern": "response_format", "top_logprobs": "logprobs"}
_ids = itertools.count(1)


def error(code: int, message: str) -> JSONResponse:
    kind = "invalid_request_error" if code < 500 else "server_error"
    code_name = {404: "model_not_found", 429: "rate_limit_exceeded", 503: "service_unavailable"}.get(code)
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code_name}},
                        status_code=code)


@router.get("/v1/models")
async def models(store: Store) -> JSONResponse:
    data = []
    for m in store.models.values():
        data.append(_model_object(m))
        # LoRA adapters are models of their own, as vLLM's server lists them: "model": "<adapter>" calls one.
        data += [{**_model_object(m), "id": a, "parent": m.name} for a in m.adapters]
    return JSONResponse({"object": "list", "data": data})


@router.get("/v1/models/{model_id:path}")
async def model(store: Store, model_id: str) -> JSONResponse:
    """One model of the list (``openai``'s ``models.retrieve``); ids may hold slashes, as Hugging Face ids do."""
    found = store.get(model_id)
    if found is None and model_id in store.catalog:  # known but not loaded: a 503 naming it, as on every route
        raise HttpError(503, "ServiceUnavailableException", not_loaded(store, model_id))
    if found is None:
        raise HttpError(404, "ModelNotFoundException", f"The model `{model_id}` does not exist: this server has "
                                                       f"{', '.join(store.models) or 'none'}")
    return JSONResponse(_model_object(found))


def _model_object(model: ServedModel) -> dict[str, Any]:
    return {"id": model.name, "object": "model", "created": 0, "owned_by": "lmi-handlers",
            "status": model.status.value}


@router.post("/v1/chat/completions", openapi_extra=RAW_BODY)
async def chat(request: Request, store: Store) -> Response:
    raw = await read_body(request, store)
    body = json_object(raw) if raw.strip() else {}
    model, pending = await submit_openai(request, store, body, raw)
    start = await started(request, pending)
    if start is None:
        return Response(b"", Cancelled.status)
    first = await pending.events.get()
    if start.code >= 400:
        body = first.data if isinstance(first, Chunk) else b""
        raise HttpError(start.code, "ModelException", error_message(body.decode("utf-8", "replace")))
    headers = {**NO_CACHE, **start.headers}
    if isinstance(first, End):
        return Response(b"", start.code, headers)

    def count(data: bytes) -> None:
        for usage in _usages(data):
            request.app.state.metrics.tokens(model.name, usage["prompt_tokens"], usage["completion_tokens"])

    if first.final:
        count(first.data)
        return Response(first.data, start.code, headers)
    return StreamingResponse(_chat_stream(pending, first, count), start.code, headers)


async def submit_openai(request: Request, store: ModelStore, body: dict[str, Any],
                        raw: bytes | None = None) -> tuple[ServedModel, PendingRequest]:
    """Queue an OpenAI body (chat, embeddings; ``raw``: as the client sent it) on the model its ``model`` names: a
    LoRA adapter's name calls that adapter, a name of the client's own is answered by the one loaded model."""
    model = model_for(store, request, body.get("model"))
    adapter = _adapter(model, body.get("model"))
    if adapter is not None:
        raw = None
        body = {**body, "adapters": adapter}
    elif isinstance(body.get("model"), str) and body["model"] != model.name:
        # a name of the client's own, answered by the one loaded model: the answer names the model that answered
        raw = None
        body = {**body, "model": model.name}
    payload = raw if raw is not None else json.dumps(body).encode()
    return model, await submit(request, store, model, body=payload)


@router.post("/v1/completions", openapi_extra=RAW_BODY)
async def completions(request: Request, store: Store) -> Response:
    body = json_object(await read_body(request, store))
    unknown = sorted(set(body) - set(COMPLETION_FIELDS))
    if unknown:
        raise HttpError(400, "BadRequestException", f"unknown field {unknown[0]}: allowed fields are "
                                                    f"{', '.join(COMPLETION_FIELDS)}")
    body = drop_nulls(body)
    refuse_unsupported(body, NEUTRAL)
    model = model_for(store, request, body.get("model"))
    prompt = body.get("prompt")
    if not (isinstance(prompt, str) or (isinstance(prompt, list) and prompt and
                                        all(isinstance(p, str) for p in prompt))):
        raise HttpError(400, "BadRequestException", f"prompt={json.dumps(prompt)[:80]} is invalid: expected a "
                                                    "string or a non-empty list of strings (token ids are not "
                                                    "supported)")
    stream = flag(body, "stream")
    parameters = {**_parameters(body), **guided_parameters(from_response_format, body.get("response_format"))}
    adapter = _adapter(model, body.get("model"))
    lmi = {"inputs": prompt, "parameters": parameters, "stream": stream,
           **({"adapters": adapter} if adapter is not None else {})}
    try:
        items = await generate(request, store, model, lmi, stream=stream)
    except HttpError as exc:
        raise HttpError(exc.code, exc.kind, _as_sent(exc.message)) from None
    completion = _Completion(model.name, body)
    if stream:
        return StreamingResponse(completion.events(items), 200, {**NO_CACHE, "content-type": "text/event-stream"})
    return JSONResponse(await completion.whole(items), headers=NO_CACHE)


def _as_sent(message: str) -> str:
    """The handler's error about the LMI body this route made, naming the field as the completions body has it
    (errors name their field first): the prompt travels as ``inputs``, ``max_tokens`` as
    ``parameters.max_new_tokens``."""
    match = re.match(r"inputs|parameters\.(\w+)", message)
    if match is None:
        return message
    name = "prompt" if match.group(1) is None else LMI_NAMES.get(match.group(1), match.group(1))
    return name + message[match.end():]


def _parameters(body: dict[str, Any]) -> dict[str, Any]:
    """LMI's parameters for a completions body, checked here by the runtime's own rules so that an error names the
    field the client sent (``max_tokens``, not ``parameters.max_new_tokens``)."""
    values = {"max_new_tokens": body.get("max_tokens", 16), "temperature": body.get("temperature", 1.0),
              "return_full_text": body.get("echo", False), "n": body.get("n", 1),
              **{k: body[k] for k in ("top_p", "stop", "seed", "top_k", "min_p", "repetition_penalty", "ignore_eos",
                                      "presence_penalty", "frequency_penalty", "logit_bias", "priority") if k in body}}
    if body.get("logprobs"):  # completions' logprobs is the number of alternatives (0: the chosen token's only)
        values["top_logprobs"] = body["logprobs"]
    names = {"max_new_tokens": "max_tokens", "top_logprobs": "logprobs"}
    try:
        parse_stream_options(body)
        rule_of(SamplingParams, "top_logprobs").check("logprobs", body.get("logprobs", 0))
        checked(SamplingParams, {k: values.get(k) for k in SAMPLING}, names)
        checked(StoppingParams, {k: values.get(k) for k in ("max_new_tokens", "stop", "ignore_eos")}, names)
        rule_of(GenerationRequest, "return_full_text").check("echo", values["return_full_text"])
        rule_of(GenerationRequest, "n").check("n", values["n"])
    except InvalidRequest as exc:
        raise HttpError(400, "BadRequestException", str(exc)) from None
    if values["n"] > 1 and values["temperature"] == 0:
        raise HttpError(400, "BadRequestException", f"n: more than one choice needs sampling: set a temperature "
                                                    f"above 0, or ask for n=1, got {values['n']}")
    return {**values, "details": True, "do_sample": values["temperature"] > 0}


def model_for(store: ModelStore, request: Request, name: Any) -> ServedModel:
    """The model an OpenAI body's ``model`` names (or the one loaded, for a name of the client's own)."""
    name = name or request.query_params.get("model_name")
    if isinstance(name, str) and (name in store.models or name in store.catalog):
        return named(store, name)  # a model this server knows answers for itself, or not at all
    owner = next((m for m in store.models.values() if isinstance(name, str) and name in m.adapters), None)
    if owner is not None:
        return named(store, owner.name)
    if len(store.models) == 1:  # clients send model names of their own; the one loaded model answers them
        return named(store, next(iter(store.models)))
    served = ", ".join(store.models) or "none"
    if not name:
        raise HttpError(400, "BadRequestException", f"model is required: this server has several models ({served})")
    raise HttpError(404, "ModelNotFoundException", f"The model `{name}` does not exist: this server has {served}")


def _adapter(model: ServedModel, name: Any) -> str | None:
    """The adapter that ``model`` (the body's field) names on ``model``, as vLLM's server serves LoRA modules."""
    return name if isinstance(name, str) and name != model.name and name in model.adapters else None


async def _chat_stream(pending: PendingRequest, first: Chunk, count: Callable[[bytes], None]) -> AsyncIterator[bytes]:
    event: Chunk | End = first
    finished = False
    try:
        while isinstance(event, Chunk):
            count(event.data)
            yield _openai_error_frames(event.data)
            if event.final:
                break
            event = await pending.events.get()
        finished = True
    finally:
        if not finished:
            pending.cancelled = True  # the client went away (the page's stop button): free the slot


def _usages(data: bytes) -> list[dict[str, int]]:
    """The ``usage`` objects in a chat answer or stream chunk (for the token counters of /metrics)."""
    if b'"usage"' not in data:
        return []
    found = []
    for line in data.split(b"\n"):
        text = line.decode("utf-8", "replace")
        try:
            obj = json.loads(text[5:] if text.startswith("data:") else text)
        except ValueError:
            continue
        usage = obj.get("usage") if isinstance(obj, dict) else None
        if isinstance(usage, dict) and {"prompt_tokens", "completion_tokens"} <= usage.keys():
            found.append(usage)
    return found


def _openai_error_frames(data: bytes) -> bytes:
    """LMI's mid-stream error frame ``{"code", "error": "..."}`` in OpenAI's shape, which the client raises."""
    if b'"error"' not in data:
        return data
    lines = []
    for line in data.split(b"\n"):
        text = line.decode("utf-8", "replace")
        payload = text[5:].strip() if text.startswith("data:") else text
        try:
            obj = json.loads(payload)
        except ValueError:
            lines.append(line)
            continue
        if isinstance(obj, dict) and isinstance(obj.get("error"), str):
            body = json.loads(error(int(obj.get("code") or 500), obj["error"]).body)
            line = (b"data: " if text.startswith("data:") else b"") + json.dumps(body).encode()
        lines.append(line)
    return b"\n".join(lines)


class _Completion:
    """One ``text_completion`` answer: whole, or as chunks; ``n`` choices per prompt, choice j of prompt i at index
    i * n + j, as vLLM numbers them."""

    def __init__(self, model: str, body: dict[str, Any]):
        self.model, self.body = model, body
        self.id, self.created = f"cmpl-{next(_ids)}", int(time.time())
        self.logprobs = body.get("logprobs") is not None
        self.n = body.get("n", 1)

    def _object(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": choices, **extra}

    def _choice(self, index: int, text: str, tokens: list[Token], finish: str | None) -> dict[str, Any]:
        # top_logprobs: one map per position, the chosen token and its alternatives (logprobs of them)
        logprobs = ({"tokens": [t.text for t in tokens], "token_logprobs": [t.logprob for t in tokens],
                     "top_logprobs": [{t.text: t.logprob, **{text: p for _, text, p in t.top}} for t in tokens],
                     "text_offset": list(itertools.accumulate([0] + [len(t.text) for t in tokens[:-1]]))}
                    if self.logprobs else None)
        return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish}

    def _usage(self, results: list[Result]) -> dict[str, int]:
        """vLLM's count: each prompt once, every choice's tokens."""
        prompt = sum(r.prompt_tokens for r in results if r.index % self.n == 0)
        completion = sum(r.generated_tokens for r in results)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    async def whole(self, items: AsyncIterator[Any]) -> dict[str, Any]:
        tokens: dict[int, list[Token]] = {}
        results: list[Result] = []
        async for item in items:
            if isinstance(item, Failure):
                raise HttpError(item.code, "ModelException", item.message)
            if isinstance(item, Token):
                tokens.setdefault(item.index, []).append(item)
            elif isinstance(item, Result):
                results.append(item)
        results.sort(key=lambda r: r.index)
        choices = [self._choice(r.index, r.text, tokens.get(r.index, []) + ([r.token] if r.token else []),
                                FINISH.get(r.finish_reason, "stop")) for r in results]
        return self._object(choices, usage=self._usage(results))

    async def events(self, items: AsyncIterator[Any]) -> AsyncIterator[bytes]:
        if self.body.get("echo"):
            for index in range(self.n):
                yield _sse(self._object([self._choice(index, self.body["prompt"], [], None)]))
        results: list[Result] = []
        async for item in items:
            if isinstance(item, Failure):
                yield _sse(json.loads(error(item.code, item.message).body))
                break
            if isinstance(item, Token):
                yield _sse(self._object([self._choice(item.index, item.text, [item], None)]))
            elif isinstance(item, Result):
                last = [item.token] if item.token else []
                yield _sse(self._object([self._choice(item.index, "".join(t.text for t in last), last,
                                                      FINISH.get(item.finish_reason, "stop"))]))
                results.append(item)
                if len(results) < self.n:
                    continue
                if (self.body.get("stream_options") or {}).get("include_usage"):
                    yield _sse(self._object([], usage=self._usage(results)))
                break
        yield b"data: [DONE]\n\n"


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"
