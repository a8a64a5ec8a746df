"""DJLServing's management API: ``GET/POST /models``, ``GET/DELETE /models/{name}``, and its adapters API:
``GET/POST /models/{name}/adapters``, ``GET/DELETE /models/{name}/adapters/{adapter}``,
``POST /models/{name}/adapters/{adapter}/update`` (with one model, ``/adapters...`` without the prefix, as DJL's).

It is served on its own listener (loopback by default, ``lmi serve --management-host/--management-port``):
loading a model directory runs its code, so ``POST /models`` only loads directories that match
``--model-url-pattern`` (403 otherwise); so does an adapter's ``src``. Adapter calls reach the handler over the
worker socket between two steps (``ServedModel.call_handler``), as Java's ``PyAdapter`` sends them.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ..adapters import AdapterRecord, adapter_input
from ..dispatcher import ServedModel, Status
from ..store import ModelExists, ModelStore, NotAllowed, model_name_for
from .relay import HttpError, Store, chosen, named

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


# --- adapters -----------------------------------------------------------------------------------

@router.get("/models/{name}/adapters")
@router.get("/adapters")
async def list_adapters(request: Request, store: Store, name: str = "") -> JSONResponse:
    name = name or _only(store)
    records = list(named(store, name, ready=False).adapters.values())
    start, limit = _page(request.query_params.get("next_page_token", "0"), request.query_params.get("limit", "100"))
    body: dict = {"adapters": [r.describe() for r in records[start:start + limit]]}
    if start + limit < len(records):
        body["nextPageToken"] = str(start + limit)
    return JSONResponse(body)


@router.get("/models/{name}/adapters/{adapter}")
@router.get("/adapters/{adapter}")
async def describe_adapter(store: Store, adapter: str, name: str = "") -> JSONResponse:
    name = name or _only(store)
    return JSONResponse([_adapter(named(store, name, ready=False), adapter).describe()])


@router.post("/models/{name}/adapters")
@router.post("/adapters")
async def register_adapter(request: Request, store: Store, name: str = "") -> JSONResponse:
    name = name or _only(store)
    model = named(store, name)
    query = dict(request.query_params)
    adapter, src = query.pop("name", ""), query.pop("src", "")
    if not adapter or not src:
        raise HttpError(400, "BadRequestException", "Parameters name and src are required.")
    if adapter in model.adapters:
        raise HttpError(409, "BadRequestException", f"Adapter {adapter} is already registered on model {name}")
    try:
        src = store.allowed(src, "adapter")
    except NotAllowed as exc:
        raise HttpError(403, "ForbiddenException", str(exc)) from None
    except ValueError as exc:
        raise HttpError(400, "BadRequestException", f"adapter {adapter}: {exc}") from None
    record = AdapterRecord(adapter, src, query)
    await _call(model, "register", record)
    model.adapters[adapter] = record
    return JSONResponse({"status": f"Adapter {adapter} registered"})


@router.post("/models/{name}/adapters/{adapter}/update")
@router.post("/adapters/{adapter}/update")
async def update_adapter(request: Request, store: Store, adapter: str, name: str = "") -> JSONResponse:
    model = named(store, name or _only(store))
    record = _adapter(model, adapter)
    options = {k: v for k, v in request.query_params.items() if k not in ("name", "src")}
    updated = AdapterRecord(record.name, record.src, {**record.options, **options})
    await _call(model, "update", updated)
    model.adapters[adapter] = updated
    return JSONResponse({"status": f"Adapter {adapter} updated"})


@router.delete("/models/{name}/adapters/{adapter}")
@router.delete("/adapters/{adapter}")
async def unregister_adapter(store: Store, adapter: str, name: str = "") -> JSONResponse:
    model = named(store, name or _only(store))
    record = _adapter(model, adapter)
    await _call(model, "unregister", record)  # requests running with it finish; new ones get a 404
    model.adapters.pop(adapter, None)
    return JSONResponse({"status": f"Adapter {adapter} unregistered"})


def _only(store: ModelStore) -> str:
    """The served model, for DJL's ``/adapters`` routes without the ``/models/{name}`` prefix."""
    return chosen(store, None, "the /models/{name} prefix").name


def _adapter(model: ServedModel, adapter: str) -> AdapterRecord:
    record = model.adapters.get(adapter)
    if record is None:
        known = ", ".join(model.adapters) or "none"
        raise HttpError(404, "AdapterNotFoundException", f"Adapter {adapter} not found on model {model.name} "
                                                         f"(registered: {known})")
    return record


async def _call(model: ServedModel, action: str, record: AdapterRecord) -> None:
    """The handler's answer to an adapter call; its error (naming the adapter) as this request's."""
    timeout = model.settings.worker.model_loading_timeout
    code, body = await asyncio.to_thread(model.call_handler, adapter_input(action, record), timeout)
    if code >= 300:
        try:
            detail = json.loads(body)
            message = detail.get("error") or detail.get("message") if isinstance(detail, dict) else str(detail)
        except ValueError:
            message = body.decode("utf-8", "replace")
        raise HttpError(code, "BadRequestException" if code < 500 else "ModelException",
                        str(message or f"adapter {record.name}: {action} failed"))


def _page(token: str, limit: str) -> tuple[int, int]:
    if not token.isdigit() or not limit.isdigit() or int(limit) < 1:
        raise HttpError(400, "BadRequestException", f"next_page_token={token!r} and limit={limit!r} must be "
                                                    "integers (limit >= 1)")
    return int(token), int(limit)
