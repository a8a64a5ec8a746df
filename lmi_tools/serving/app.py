"""The HTTP surface of ``lmi serve``: DJLServing's inference and management APIs, and SageMaker Runtime's paths.

Inference: ``GET /ping``, ``POST /predictions/{model}[/{version}]``, ``POST /invocations``,
``POST /v1/chat/completions``, ``POST /models/{model}/invoke``. Management: ``GET/POST /models``,
``GET/DELETE /models/{name}``. SageMaker Runtime: ``POST /endpoints/{name}/invocations`` and
``/invocations-response-stream`` (AWS event-stream framing), so an unmodified boto3
``sagemaker-runtime`` client works with ``endpoint_url``. Errors use DJLServing's JSON shape
``{"code", "type", "message"}``; SageMaker paths use rest-json errors (``x-amzn-ErrorType``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from lmi_tools.djl_frontend import request_input

from . import eventstream
from .model import Chunk, End, PendingRequest, QueueFull, ServedModel, Start, Status
from .store import ModelExists, ModelStore, model_name_for

access_log = logging.getLogger("lmi.access")
NO_CACHE = {"Pragma": "no-cache", "Cache-Control": "no-cache; no-store, must-revalidate, private",
            "Expires": "Thu, 01 Jan 1970 00:00:00 UTC"}
RAW_BODY = {"requestBody": {"content": {"application/json": {"schema": {"type": "object"}},
                                        "text/plain": {"schema": {"type": "string"}}}}}


class HttpError(Exception):
    def __init__(self, code: int, kind: str, message: str):
        super().__init__(message)
        self.code, self.kind, self.message = code, kind, message


def djl_error(code: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "type": kind, "message": message}, status_code=code)


def create_app(store: ModelStore) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(store.close)  # stop every worker process on shutdown

    app = FastAPI(title="lmi serve", description="A local DJLServing-compatible server for lmi_handlers models.",
                  lifespan=lifespan)
    app.state.store = store

    @app.exception_handler(HttpError)
    async def on_http_error(_: Request, exc: HttpError) -> JSONResponse:
        return djl_error(exc.code, exc.kind, exc.message)

    @app.middleware("http")
    async def log_requests(request: Request, call_next):
        began = time.perf_counter()
        response = await call_next(request)
        model = request.path_params.get("model_name") or request.path_params.get("name") or "-"
        access_log.info("%s %s model=%s status=%d latency=%.1fms", request.method, request.url.path, model,
                        response.status_code, (time.perf_counter() - began) * 1000)
        return response

    @app.get("/ping", tags=["inference"])
    async def ping() -> JSONResponse:
        statuses = {name: m.status for name, m in store.models.items()}
        healthy = all(s is Status.READY for s in statuses.values())
        body = {name: {"status": "Healthy" if s is Status.READY else s.value} for name, s in statuses.items()}
        return JSONResponse(body, status_code=200 if healthy else 503)

    @app.post("/predictions/{model_name}", tags=["inference"], openapi_extra=RAW_BODY)
    @app.post("/predictions/{model_name}/{version}", tags=["inference"], openapi_extra=RAW_BODY)
    @app.post("/models/{model_name}/invoke", tags=["inference"], openapi_extra=RAW_BODY)
    async def predictions(request: Request, model_name: str) -> Response:
        return await answer(await submit(request, _named(store, model_name)), request)

    @app.post("/invocations", tags=["inference"], openapi_extra=RAW_BODY)
    @app.post("/v1/chat/completions", tags=["inference"], openapi_extra=RAW_BODY)
    async def invocations(request: Request) -> Response:
        name = request.query_params.get("model_name") or request.headers.get("model_name")
        if name is None:
            if len(store.models) != 1:
                raise HttpError(400, "BadRequestException", "Parameter model_name is required.")
            name = next(iter(store.models))
        return await answer(await submit(request, _named(store, name)), request)

    @app.post("/endpoints/{endpoint}/invocations", tags=["sagemaker-runtime"], openapi_extra=RAW_BODY)
    async def sagemaker_invoke(request: Request, endpoint: str) -> Response:
        model = _endpoint(store, endpoint)
        if isinstance(model, Response):
            return model
        return await sagemaker_answer(await submit(request, model, sagemaker=True), endpoint)

    @app.post("/endpoints/{endpoint}/invocations-response-stream", tags=["sagemaker-runtime"],
              openapi_extra=RAW_BODY)
    async def sagemaker_stream(request: Request, endpoint: str) -> Response:
        model = _endpoint(store, endpoint)
        if isinstance(model, Response):
            return model
        pending = await submit(request, model, sagemaker=True)
        return await sagemaker_event_stream(pending, endpoint, store.server.sagemaker_part_size)

    @app.get("/models", tags=["management"])
    async def list_models() -> JSONResponse:
        return JSONResponse({"models": [{"modelName": m.name, "modelUrl": m.url, "status": m.status.value}
                                        for m in store.models.values()]})

    @app.get("/models/{name}", tags=["management"])
    async def describe_model(name: str) -> JSONResponse:
        return JSONResponse([_named(store, name, ready=False).describe()])

    @app.post("/models", tags=["management"])
    async def register_model(request: Request) -> JSONResponse:
        query = request.query_params
        url = query.get("url")
        if not url:
            raise HttpError(400, "BadRequestException", "Parameter url is required.")
        name = query.get("model_name") or model_name_for(url)
        overrides = {k: query[k] for k in ("batch_size", "max_batch_delay", "job_queue_size") if k in query}
        try:
            model = store.register(name, url, overrides)
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

    @app.delete("/models/{name}", tags=["management"])
    async def unregister_model(name: str) -> JSONResponse:
        if not await asyncio.to_thread(store.unregister, name):
            raise HttpError(404, "ModelNotFoundException", f"Model not found: {name}")
        return JSONResponse({"status": f'Model "{name}" unregistered'})

    async def submit(request: Request, model: ServedModel, sagemaker: bool = False) -> PendingRequest:
        body = await _read_body(request, store.server.max_request_size)
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        if any(k.lower() == "handler" for k, _ in headers) and os.environ.get(
                "ALLOW_REQUEST_HANDLER_OVERRIDE", "").lower() != "true":
            raise HttpError(400, "BadRequestException", "The handler can't be overridden in a request")
        if sagemaker:  # the streaming call sends Accept as X-Amzn-SageMaker-Accept
            accept = request.headers.get("x-amzn-sagemaker-accept")
            headers = [(k, v) for k, v in headers if k.lower() != "accept"] + ([("Accept", accept)] if accept else [])
        pending = PendingRequest(request_input(headers, body, list(request.query_params.multi_items())),
                                 asyncio.get_running_loop())
        try:
            model.submit(pending)
        except QueueFull as exc:
            raise HttpError(503, "ServiceUnavailableException", str(exc)) from None
        return pending

    return app


def _named(store: ModelStore, name: str, ready: bool = True) -> ServedModel:
    model = store.get(name)
    if model is None:
        raise HttpError(404, "ModelNotFoundException", f"Model not found: {name}")
    if ready and model.status is not Status.READY:
        detail = f": {model.failure}" if model.failure else ""
        raise HttpError(503, "ServiceUnavailableException", f"Model {name} is not ready ({model.status.value}{detail})")
    return model


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HttpError(413, "BadRequestException", f"request body of {declared} bytes exceeds max_request_size "
                                                     f"({limit} bytes)")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise HttpError(413, "BadRequestException", f"request body exceeds max_request_size ({limit} bytes)")
    return bytes(body)


def _response_headers(pending: PendingRequest, start: Start) -> dict[str, str]:
    headers = {**NO_CACHE, **start.headers, "x-request-id": str(pending.input.get_property("requestId"))}
    if start.code >= 400:
        headers["connection"] = "close"
    return headers


async def answer(pending: PendingRequest, request: Request) -> Response:
    """A complete answer goes out with content-length; anything else streams as it arrives."""
    start = await pending.events.get()
    assert isinstance(start, Start)
    headers = _response_headers(pending, start)
    first = await pending.events.get()
    if isinstance(first, End):
        return Response(b"", start.code, headers)
    if first.final:
        return Response(first.data, start.code, headers)
    return StreamingResponse(_relay(pending, first), start.code, headers)


async def _relay(pending: PendingRequest, first: Chunk) -> AsyncIterator[bytes]:
    finished = False
    try:
        yield first.data
        while True:
            event = await pending.events.get()
            if isinstance(event, Chunk):
                yield event.data
                if event.final:
                    break
            else:
                break
        finished = True
    finally:
        if not finished:
            pending.cancelled = True  # the client went away: free its slot at the next step


# --- SageMaker Runtime ------------------------------------------------------------------------

def _endpoint(store: ModelStore, endpoint: str) -> ServedModel | Response:
    model = store.get(endpoint) or (next(iter(store.models.values())) if len(store.models) == 1 else None)
    if model is None:
        return _aws_error(400, "ValidationError", f"Endpoint {endpoint} of account 123456789012 not found.")
    if model.status is not Status.READY:
        return _aws_error(429, "ModelNotReadyException", f"Model for endpoint {endpoint} is not ready "
                                                         f"({model.status.value}).")
    return model


def _aws_error(status: int, code: str, message: str, **fields: object) -> Response:
    body = {"message": message, **fields}
    return Response(json.dumps(body), status, {"x-amzn-ErrorType": f"{code}:http://internal.amazon.com/coral/",
                                               "content-type": "application/json"})


def _model_error(endpoint: str, code: int, body: bytes) -> Response:
    kind = "client" if code < 500 else "server"
    text = body.decode("utf-8", "replace")
    return _aws_error(424, "ModelError",
                      f'Received {kind} error ({code}) from primary with message "{text}". See the model logs.',
                      ErrorCode=f"{kind.upper()}_ERROR_FROM_MODEL", OriginalStatusCode=code, OriginalMessage=text,
                      LogStreamArn=f"arn:aws:logs:us-east-1:123456789012:log-group:/aws/sagemaker/Endpoints/{endpoint}")


def _sagemaker_headers(start: Start) -> dict[str, str]:
    content_type = next((v for k, v in start.headers.items() if k.lower() == "content-type"), "application/json")
    headers = {"X-Amzn-Invoked-Production-Variant": "AllTraffic", "x-amzn-RequestId": str(time.time_ns())}
    custom = next((v for k, v in start.headers.items() if k.lower() == "x-amzn-sagemaker-custom-attributes"), None)
    if custom:
        headers["X-Amzn-SageMaker-Custom-Attributes"] = custom
    return {**headers, "content-type": content_type}


async def _collect(pending: PendingRequest) -> bytes:
    body = bytearray()
    while True:
        event = await pending.events.get()
        if isinstance(event, Chunk):
            body += event.data
            if event.final:
                return bytes(body)
        elif isinstance(event, End):
            return bytes(body)


async def sagemaker_answer(pending: PendingRequest, endpoint: str) -> Response:
    start = await pending.events.get()
    assert isinstance(start, Start)
    body = await _collect(pending)
    if start.code >= 400:
        return _model_error(endpoint, start.code, body)
    return Response(body, 200, _sagemaker_headers(start))


async def sagemaker_event_stream(pending: PendingRequest, endpoint: str, part_size: int) -> Response:
    start = await pending.events.get()
    assert isinstance(start, Start)
    if start.code >= 400:
        return _model_error(endpoint, start.code, await _collect(pending))
    headers = _sagemaker_headers(start)
    headers["X-Amzn-SageMaker-Content-Type"] = headers.pop("content-type")
    headers["content-type"] = "application/vnd.amazon.eventstream"

    async def frames() -> AsyncIterator[bytes]:
        finished = False
        try:
            while True:
                event = await pending.events.get()
                if isinstance(event, Chunk):
                    data = event.data
                    step = part_size or len(data) or 1
                    for i in range(0, len(data), step):
                        yield eventstream.payload_part(data[i:i + step])
                    if event.final:
                        break
                else:
                    if event.error:
                        yield eventstream.model_stream_error(f"Model failed mid-stream: {event.error}")
                    break
            finished = True
        finally:
            if not finished:
                pending.cancelled = True

    return StreamingResponse(frames(), 200, headers)
