"""DJLServing's inference API: ``GET /ping``, ``POST /predictions/{model}[/{version}]``,
``POST /models/{model}/invoke`` and ``POST /invocations`` (OpenAI's and TGI's routes: ``openai.py``, ``tgi.py``),
and ``GET /health``, which TGI and vLLM clients probe."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..dispatcher import Status
from .relay import RAW_BODY, HttpError, Store, answer, named, submit

router = APIRouter(tags=["inference"])


@router.get("/ping")
async def ping(store: Store) -> JSONResponse:
    statuses = {name: m.status for name, m in store.models.items()}
    healthy = all(s is Status.READY for s in statuses.values())
    body = {name: {"status": "Healthy" if s is Status.READY else s.value} for name, s in statuses.items()}
    return JSONResponse(body, status_code=200 if healthy else 503)


@router.get("/health")
async def health(store: Store) -> Response:
    """TGI's and vLLM's probe: 200 with an empty body when every loaded model answers, else 503."""
    waiting = {name: m.status.value for name, m in store.models.items() if m.status is not Status.READY}
    if store.models and not waiting:
        return Response(b"", 200)
    reason = "no model is loaded" if not store.models else ", ".join(f"{n} is {s}" for n, s in waiting.items())
    return JSONResponse({"error": f"not healthy: {reason}", "error_type": "unhealthy"}, status_code=503)


@router.post("/predictions/{model_name}", openapi_extra=RAW_BODY)
@router.post("/predictions/{model_name}/{version}", openapi_extra=RAW_BODY)
@router.post("/models/{model_name}/invoke", openapi_extra=RAW_BODY)
async def predictions(request: Request, store: Store, model_name: str) -> Response:
    return await answer(request, await submit(request, store, named(store, model_name)))


@router.post("/invocations", openapi_extra=RAW_BODY)
async def invocations(request: Request, store: Store) -> Response:
    name = request.query_params.get("model_name") or request.headers.get("model_name")
    if name is None:
        if len(store.models) != 1:
            raise HttpError(400, "BadRequestException", "Parameter model_name is required.")
        name = next(iter(store.models))
    return await answer(request, await submit(request, store, named(store, name)))
