"""The HTTP surface of ``lmi serve``: DJLServing's inference and management APIs, and SageMaker Runtime's paths.

``create_app`` only assembles: one router per API surface (``routes/``), the access log and DJL's error
shape ``{"code", "type", "message"}``; the routes hand requests to each model's dispatcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .routes import inference, management, sagemaker_runtime
from .routes.relay import HttpError, djl_error
from .store import ModelStore

access_log = logging.getLogger("lmi.access")


async def _on_http_error(_: Request, exc: HttpError) -> JSONResponse:
    return djl_error(exc.code, exc.kind, exc.message)


async def _log_request(request: Request, call_next):
    began = time.perf_counter()
    response = await call_next(request)
    model = request.path_params.get("model_name") or request.path_params.get("name") or "-"
    access_log.info("%s %s model=%s status=%d latency=%.1fms", request.method, request.url.path, model,
                    response.status_code, (time.perf_counter() - began) * 1000)
    return response


def create_app(store: ModelStore) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(store.close)  # stop every worker process on shutdown

    app = FastAPI(title="lmi serve", description="A local DJLServing-compatible server for lmi_handlers models.",
                  lifespan=lifespan)
    app.state.store = store
    app.add_exception_handler(HttpError, _on_http_error)
    app.middleware("http")(_log_request)
    for router in (inference.router, sagemaker_runtime.router, management.router):
        app.include_router(router)
    return app
