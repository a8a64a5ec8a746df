"""The chat page: ``GET /`` and its assets under ``/ui/``, and the model menu it drives.

``GET /ui/models`` lists the models the operator named when starting ``lmi serve`` (and any loaded through
the management API) with their status, each loaded model followed by its LoRA adapters (``parent`` names the
model); ``POST /ui/models/{name}/activate`` loads one of the operator's models,
unloading the others with ``--one-at-a-time``. The page can name no directory of its own: loading by URL
stays on the management listener.
"""

from __future__ import annotations

import asyncio
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse, Response

from .relay import HttpError, Store

router = APIRouter(tags=["page"])
ASSETS = {"chat.js": "text/javascript", "chat.css": "text/css"}


def _asset(name: str) -> str:
    return resources.files("lmi_tools.serving.page").joinpath(name).read_text(encoding="utf-8")


@router.get("/", include_in_schema=False)
async def page() -> HTMLResponse:
    return HTMLResponse(_asset("index.html"))


@router.get("/ui/models")
async def models(store: Store) -> JSONResponse:
    listing = []
    for name, status in store.statuses().items():
        listing.append({"name": name, "status": status})
        # A loaded model's LoRA adapters: the page asks for one by its name, as OpenAI's "model" (openai.py).
        served = store.models.get(name)
        listing += [{"name": a, "status": status, "parent": name} for a in (served.adapters if served else ())]
    return JSONResponse({"models": listing, "one_at_a_time": store.one_at_a_time})


@router.post("/ui/models/{name}/activate")
async def activate(store: Store, name: str) -> JSONResponse:
    if name not in store.catalog:
        raise HttpError(404, "ModelNotFoundException", f"{name} is not one of the models lmi serve was started "
                                                       f"with ({', '.join(store.catalog) or 'none'})")
    model = await asyncio.to_thread(store.activate, name)
    return JSONResponse({"name": name, "status": model.status.value}, status_code=202)


@router.get("/ui/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    if name not in ASSETS:
        raise HttpError(404, "NotFound", f"no asset {name}")
    return Response(_asset(name), media_type=ASSETS[name])
