"""Text Generation Inference's API: ``POST /generate``, ``POST /generate_stream``, ``GET /info`` and ``POST /``
(where ``huggingface_hub.InferenceClient(base_url=...)`` posts; ``"stream": true`` streams there).

The request is translated into LMI's schema (``generation.py``); the answer comes back in TGI's shapes:
``{"generated_text", "details"}`` (a one-element list on ``POST /``), server-sent events with ``token``,
``generated_text`` and ``details`` while streaming, and errors as ``{"error", "error_type"}`` (422 for a
request TGI would call invalid). With several models, ``?model_name=`` picks one, as on ``/invocations``.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from lmi_handlers.schemas import MAX_STOP_SEQUENCES
from lmi_handlers.structured.constraint import from_tgi_grammar

from .pooling import embed_root, is_embedding_model
from .generation import Failure, Result, Token, drop_nulls, generate, guided_parameters, refuse_unsupported
from .relay import NO_CACHE, RAW_BODY, HttpError, Store, chosen, flag, json_object, read_body

router = APIRouter(tags=["tgi"])
PATHS = ("/generate", "/generate_stream", "/info", "/")

#: TGI parameters this server has no use for, and the values that mean "off". frequency_penalty is TGI's own
#: (each earlier occurrence, prompt included, takes penalty times the logit off it), not OpenAI's, which
#: ``/v1/completions`` and LMI's ``parameters.frequency_penalty`` take; decoder_input_details asks for the prompt's
#: log probabilities, which the engines here do not compute.
NEUTRAL = {"best_of": (1,), "decoder_input_details": (False,), "watermark": (False,), "typical_p": (1, 1.0),
           "frequency_penalty": (0, 0.0), "truncate": ()}


def error(code: int, message: str) -> JSONResponse:
    """TGI's error body; huggingface_hub raises its ``ValidationError`` for ``error_type`` "validation"."""
    kind = {400: "validation", 422: "validation", 424: "generation", 429: "overloaded"}.get(code, "generation")
    return JSONResponse({"error": message, "error_type": kind}, status_code=422 if code == 400 else code)


@router.post("/generate", openapi_extra=RAW_BODY)
async def generate_route(request: Request, store: Store) -> Response:
    return await _answer(request, store, stream=False, listed=False)


@router.post("/generate_stream", openapi_extra=RAW_BODY)
async def generate_stream(request: Request, store: Store) -> Response:
    return await _answer(request, store, stream=True, listed=False)


@router.post("/", openapi_extra=RAW_BODY)
async def compat(request: Request, store: Store) -> Response:
    return await _answer(request, store, stream=None, listed=True)


@router.get("/info")
async def info(request: Request, store: Store) -> JSONResponse:
    model = chosen(store, request.query_params.get("model_name"), "Parameter model_name")
    return JSONResponse({"model_id": model.name, "model_sha": None, "model_pipeline_tag": "text-generation",
                         "max_concurrent_requests": model.settings.job_queue_size, "max_best_of": 1,
                         "max_stop_sequences": MAX_STOP_SEQUENCES, "validation_workers": 1,
                         "router": "lmi serve", "version": "lmi-handlers"})


async def _answer(request: Request, store: Store, stream: bool | None, listed: bool) -> Response:
    model = chosen(store, request.query_params.get("model_name"), "Parameter model_name")
    if listed and is_embedding_model(model):
        return await embed_root(request, model)  # TEI's POST / (huggingface_hub's feature_extraction)
    body = _parse(await read_body(request, store))
    stream = flag(body, "stream") if stream is None else stream
    params = drop_nulls(body.get("parameters") or {})
    refuse_unsupported(params, NEUTRAL)
    details = bool(params.get("details", False))
    adapter = params.pop("adapter_id", None)  # a LoRA adapter registered on the model: DJL's "adapters" field
    constraint = guided_parameters(from_tgi_grammar, params.pop("grammar", None))  # TGI's name, LMI's parameters
    if "top_n_tokens" in params:  # TGI's alternatives per position: LMI's top_logprobs
        params["top_logprobs"] = params.pop("top_n_tokens")
    lmi = {"inputs": body["inputs"], "stream": stream,
           "parameters": {**{k: v for k, v in params.items() if k not in NEUTRAL}, **constraint, "details": True},
           **({"adapters": adapter} if adapter is not None else {})}
    items = await generate(request, store, model, lmi, stream)
    if stream:
        return StreamingResponse(_events(items), 200, {**NO_CACHE, "content-type": "text/event-stream"})
    tokens: list[dict[str, Any]] = []
    tops: list[list[dict[str, Any]]] = []
    async for item in items:
        if isinstance(item, Failure):
            raise HttpError(item.code, "ModelException", item.message)
        if isinstance(item, Token):
            tokens.append(_token(item))
            tops.append(_top_tokens(item))
        elif isinstance(item, Result):
            answer: dict[str, Any] = {"generated_text": item.text}
            if details:
                tokens += [_token(item.token)] if item.token else []
                answer["details"] = {**_details(item), "prefill": [], "tokens": tokens}
                if "top_logprobs" in params:
                    answer["details"]["top_tokens"] = tops + ([_top_tokens(item.token)] if item.token else [])
            return JSONResponse([answer] if listed else answer, headers=NO_CACHE)
    raise HttpError(502, "ModelException", "the model's answer ended without a result")


def _parse(raw: bytes) -> dict[str, Any]:
    body = json_object(raw)
    if not isinstance(body.get("inputs"), str):
        raise HttpError(400, "BadRequestException", 'expected a JSON object {"inputs": "<prompt>", "parameters": '
                                                    '{...}} with inputs a string')
    if not isinstance(body.get("parameters") or {}, dict):
        raise HttpError(400, "BadRequestException", "parameters must be a JSON object")
    return body


def _token(token: Token) -> dict[str, Any]:
    return {"id": token.id, "text": token.text, "logprob": token.logprob, "special": token.special}


def _top_tokens(token: Token) -> list[dict[str, Any]]:
    return [{"id": i, "text": text, "logprob": p, "special": False} for i, text, p in token.top]


def _details(result: Result) -> dict[str, Any]:
    return {"finish_reason": result.finish_reason, "generated_tokens": result.generated_tokens,
            "seed": result.seed}


async def _events(items: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    index = 0
    async for item in items:
        if isinstance(item, Failure):
            yield _event({"error": item.message, "error_type": "generation"})
            return
        index += 1
        if isinstance(item, Token):
            yield _event({"index": index, "token": _token(item), "top_tokens": _top_tokens(item) or None,
                          "generated_text": None, "details": None})
        elif isinstance(item, Result):
            # TGI's last event carries the last token, the whole text and the details.
            token = item.token or Token(0, "", None, True)
            yield _event({"index": index, "token": _token(token), "top_tokens": _top_tokens(token) or None,
                          "generated_text": item.text,
                          "details": {**_details(item), "input_length": item.prompt_tokens}})
            return


def _event(obj: dict[str, Any]) -> bytes:
    return b"data:" + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"
