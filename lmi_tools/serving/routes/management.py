"""DJLServing's management API: ``GET/POST /models``, ``GET/DELETE /models/{name}``.

It is served on its own listener (loopback by default, ``lmi serve --management-host/--management-port``):
loading a model directory runs its code, so ``POST /models`` only loads directories that match
``--model-url-pattern`` (403 otherwise).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ..dispatcher import Status
from ..store import ModelExists, NotAllowed, model_name_for
from .relay import HttpError, Store, named

router = APIRouter(tags=["management"])


@router.get("/models")
async def list_models(store: Store) -> JSONResponse:
    return JSONResponse({"models": [{"modelName": m.name, "modelUrl": m.url, "status": m.status.value}
                                    for m in store.models.values()]})


@router.get("/models/{name}")
async def describe_model(store: Store, name: str) -> JSONResponse:
    return JSONResponse([named(store, name, ready=False).describe()])


@router.post("/models")
async def register_model(request: Request, store: Store) -> JSONResponse:
    query = request.query_params
    url = query.get("url")
    if not url:
        raise HttpError(400, "BadRequestException", "Parameter url is required.")
    name = query.get("model_name") or model_name_for(url)
    overrides = {k: query[k] for k in ("batch_size", "max_batch_delay", "job_queue_size") if k in query}
    try:
        model = store.register_url(name, url, overrides)
    except NotAllowed as exc:
        raise HttpError(403, "ForbiddenException", str(exc)) from None
    except ModelExists as exc:
        raise HttpError(409, "BadRequestException", str(exc)) from None
    except (FileNotFoundError, ValueError) as exc:
        raise HttpError(400, "BadRequestException", str(exc)) from None
    if query.get("synchronous", "true").lower() == "false":
        return JSONResponse({"status": f'Model "{name}" registration scheduled.'}, status_code=202)
    await asyncio.to_thread(model.wait_loaded)
    if model.status is Status.FAILED:
        store.unregister(name)
        raise HttpError(500, "ModelException", f"model {name} failed to load: {model.failure}")
    return JSONResponse({"status": f'Model "{name}" registered.'})


@router.delete("/models/{name}")
async def unregister_model(store: Store, name: str) -> JSONResponse:
    if not await asyncio.to_thread(store.remove, name):
        raise HttpError(404, "ModelNotFoundException", f"Model not found: {name}")
    return JSONResponse({"status": f'Model "{name}" unregistered'})
