"""The routes of embedding models (``option.task=text-embedding``), in the shapes vLLM's server answers them:
``POST /v1/embeddings`` (OpenAI's), ``/score`` and ``/v1/score``, ``/rerank``, ``/v1/rerank`` and ``/v2/rerank``
(Jina's and Cohere's), ``/v2/embed`` (Cohere's); and TEI's ``POST /`` where ``huggingface_hub``'s
``InferenceClient(base_url=...).feature_extraction`` posts.

The handler embeds (``lmi_handlers/pooling/``, on every backend): ``/v1/embeddings`` bodies go to it as they are.
Scores are the cosine similarity of two texts' embeddings, as vLLM scores with an embedding model (a bi-encoder);
cross-encoders (a classification head over the pair) are not served. Errors come in OpenAI's shape.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from lmi_handlers.errors import ConfigError
from lmi_handlers.pooling import pooling_task

from ..dispatcher import ServedModel
from ..store import ModelStore
from .chat_answers import answer_start, collected
from .openai import model_for, submit_openai
from .relay import NO_CACHE, RAW_BODY, HttpError, Store, answer, json_object, read_body, submit

router = APIRouter(tags=["embeddings"])
#: The paths whose errors come in OpenAI's shape, as vLLM's server sends them.
PATHS = ("/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/v2/embed")
#: Each score request's pair of fields, as vLLM reads them (the first of each pair is the query side).
PAIRS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2"))


def is_embedding_model(model: ServedModel) -> bool:
    try:
        return pooling_task(model.settings.worker.init_properties)
    except ConfigError:
        return False  # the model's own load names the bad option


@router.post("/v1/embeddings", openapi_extra=RAW_BODY)
async def embeddings(request: Request, store: Store) -> Response:
    body = json_object(await read_body(request, store))
    _embedding_model(store, request, body)
    _, pending = await submit_openai(request, store, body)
    return JSONResponse(await _answer(request, pending), headers=NO_CACHE)


async def embed_root(request: Request, model: ServedModel) -> Response:
    """TEI's ``POST /`` on an embedding model: the body goes to the handler as it is (LMI's embedding shape)."""
    return await answer(request, await submit(request, request.app.state.store, model))


@router.post("/score", openapi_extra=RAW_BODY)
@router.post("/v1/score", openapi_extra=RAW_BODY)
async def score(request: Request, store: Store) -> JSONResponse:
    body = json_object(await read_body(request, store))
    fields = next((pair for pair in PAIRS if pair[0] in body), PAIRS[-1])
    left, right = (_texts(body.get(name), name) for name in fields)
    if len(left) != 1 and len(left) != len(right):
        raise HttpError(400, "BadRequestException", f"{fields[0]} has {len(left)} texts and {fields[1]} {len(right)}: "
                                                    f"send one {fields[0]} text, or as many as {fields[1]}")
    vectors, tokens, model = await _embed(request, store, body, left + right)
    queries, others = vectors[:len(left)], vectors[len(left):]
    scores = [_cosine(queries[0 if len(left) == 1 else i], other) for i, other in enumerate(others)]
    return JSONResponse({"id": f"score-{os.urandom(12).hex()}", "object": "list", "created": int(time.time()),
                         "model": model, "data": [{"index": i, "object": "score", "score": s}
                                                  for i, s in enumerate(scores)],
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}},
                        headers=NO_CACHE)


@router.post("/rerank", openapi_extra=RAW_BODY)
@router.post("/v1/rerank", openapi_extra=RAW_BODY)
@router.post("/v2/rerank", openapi_extra=RAW_BODY)
async def rerank(request: Request, store: Store) -> JSONResponse:
    body = json_object(await read_body(request, store))
    [query] = _texts(body.get("query"), "query", one=True)
    documents = [document.get("text") if isinstance(document, dict) else document
                 for document in (body.get("documents") if isinstance(body.get("documents"), list) else [None])]
    documents = _texts(documents, "documents")
    top_n = body.get("top_n", 0)
    if type(top_n) is not int or top_n < 0:
        raise HttpError(400, "BadRequestException", f"top_n={json.dumps(top_n)[:40]} is invalid: expected an integer "
                                                    ">= 0 (0: every document)")
    vectors, tokens, model = await _embed(request, store, body, [query] + documents)
    results = sorted(({"index": i, "document": {"text": text}, "relevance_score": _cosine(vectors[0], vector)}
                      for i, (text, vector) in enumerate(zip(documents, vectors[1:]))),
                     key=lambda result: -result["relevance_score"])
    if body.get("return_documents") is False:
        results = [{k: v for k, v in result.items() if k != "document"} for result in results]
    return JSONResponse({"id": f"rerank-{os.urandom(12).hex()}", "model": model,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                         "results": results[:top_n or len(results)]}, headers=NO_CACHE)


@router.post("/v2/embed", openapi_extra=RAW_BODY)
async def cohere_embed(request: Request, store: Store) -> JSONResponse:
    """Cohere's embed v2: ``texts``, answered ``embeddings_by_type`` with float vectors."""
    body = json_object(await read_body(request, store))
    kinds = body.get("embedding_types") or ["float"]
    if kinds != ["float"]:
        raise HttpError(400, "BadRequestException", f"embedding_types={json.dumps(kinds)[:80]} is not supported: "
                                                    'send ["float"] or omit it')
    texts = _texts(body.get("texts"), "texts")
    dimensions = {"dimensions": body["output_dimension"]} if body.get("output_dimension") is not None else {}
    vectors, tokens, _ = await _embed(request, store, body, texts, **dimensions)
    return JSONResponse({"id": f"embed-{os.urandom(12).hex()}", "embeddings": {"float": vectors}, "texts": texts,
                         "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}},
                         "response_type": "embeddings_by_type"}, headers=NO_CACHE)


def _embedding_model(store: ModelStore, request: Request, body: dict[str, Any]) -> ServedModel:
    model = model_for(store, request, body.get("model"))
    if not is_embedding_model(model):
        raise HttpError(400, "BadRequestException", f"model {model.name} generates text: {request.url.path} needs a "
                                                    "model served with option.task=text-embedding")
    return model


def _texts(value: Any, field: str, one: bool = False) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts) or (
            one and len(texts) != 1):
        kinds = "a non-empty string" if one else "a non-empty string or a non-empty list of them"
        raise HttpError(400, "BadRequestException", f"{field}={json.dumps(value)[:80]} is invalid: expected {kinds}")
    return texts


async def _embed(request: Request, store: ModelStore, body: dict[str, Any], texts: list[str],
                 **extra: Any) -> tuple[list[list[float]], int, str]:
    """The texts' embeddings (one OpenAI embeddings request to the handler), its token count and the model's name."""
    openai = {"input": texts, **({"model": body["model"]} if isinstance(body.get("model"), str) else {}), **extra}
    _embedding_model(store, request, openai)
    _, pending = await submit_openai(request, store, openai)
    answer_body = await _answer(request, pending, {r"input\[(\d+)\]": "texts[\\1]"})
    return ([item["embedding"] for item in answer_body["data"]], answer_body["usage"]["prompt_tokens"],
            answer_body["model"])


async def _answer(request: Request, pending: Any, rename: dict[str, str] | None = None) -> dict[str, Any]:
    first = await answer_start(request, pending, rename or {})
    data = await collected(pending, first)
    try:
        return json.loads(data)
    except ValueError:
        raise HttpError(502, "ModelException", f"the model answered in a form this route cannot read: "
                                               f"{data[:200]!r}") from None


def _cosine(a: list[float], b: list[float]) -> float:
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return sum(x * y for x, y in zip(a, b)) / norm if norm else 0.0
