"""SageMaker Runtime's paths: ``POST /endpoints/{name}/invocations`` and ``/invocations-response-stream``.

An unmodified boto3 ``sagemaker-runtime`` client works against them with ``endpoint_url``: rest-json
errors (``x-amzn-ErrorType``), a model's own error as SageMaker's 424 ``ModelError``, and the stream
in AWS event-stream framing (``eventstream.py``).

Inference components: boto3 sends ``InferenceComponentName`` as the ``X-Amzn-SageMaker-Inference-Component``
header, which picks the model of that name; an adapter component's name (a LoRA adapter registered on a served
model) picks its model, and reaches the handler as SageMaker sends it, in ``X-Amzn-SageMaker-Adapter-Identifier``. With ``lmi serve --endpoint NAME`` the server plays an endpoint of
inference components called NAME: other endpoint names are not found, and a request without the header is
refused, as on SageMaker, where an endpoint's name is never one of its components' names.
"""

from __future__ import annotations

import json
import time
from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from lmi_handlers.adapters import SAGEMAKER_HEADER
from lmi_handlers.errors import Cancelled

from .. import eventstream
from ..dispatcher import Chunk, End, PendingRequest, ServedModel, Start, Status
from ..store import ModelStore
from .relay import RAW_BODY, Store, not_loaded, started, submit

router = APIRouter(tags=["sagemaker-runtime"])
COMPONENT_HEADER = "x-amzn-sagemaker-inference-component"


@router.post("/endpoints/{endpoint}/invocations", openapi_extra=RAW_BODY)
async def sagemaker_invoke(request: Request, store: Store, endpoint: str) -> Response:
    model = _endpoint(store, endpoint, request.headers.get(COMPONENT_HEADER))
    if isinstance(model, Response):
        return model
    pending = await submit(request, store, model, sagemaker=True, extra=_adapter(model, request))
    return await sagemaker_answer(request, pending, endpoint)


@router.post("/endpoints/{endpoint}/invocations-response-stream", openapi_extra=RAW_BODY)
async def sagemaker_stream(request: Request, store: Store, endpoint: str) -> Response:
    model = _endpoint(store, endpoint, request.headers.get(COMPONENT_HEADER))
    if isinstance(model, Response):
        return model
    pending = await submit(request, store, model, sagemaker=True, extra=_adapter(model, request))
    return await sagemaker_event_stream(request, pending, endpoint, store.server.sagemaker_part_size)


def _endpoint(store: ModelStore, endpoint: str, component: str | None) -> ServedModel | Response:
    served = store.server.sagemaker_endpoint
    missing = _aws_error(400, "ValidationError", f"Endpoint {endpoint} of account 123456789012 not found.")
    if served and endpoint != served:
        return missing
    if component:
        owner = next((m for m in store.models.values() if component in m.adapters), None)
        if owner is None and not _known(store, component):
            return _aws_error(400, "ValidationError", f"Inference component {component} not found on endpoint "
                                                      f"{endpoint}.")
        name: str | None = owner.name if owner is not None else component  # an adapter is served by its model
    elif served:
        return _aws_error(400, "ValidationError", f"Endpoint {endpoint} hosts inference components: name one "
                                                  "with InferenceComponentName.")
    else:  # an endpoint name the server does not know reaches its one loaded model
        name = endpoint if _known(store, endpoint) else next(iter(store.models)) if len(store.models) == 1 else None
    if name is None:
        return missing
    model = store.get(name)
    if model is None:  # one of the operator's models, not loaded: never answered by another
        return _aws_error(503, "ServiceUnavailable", not_loaded(store, name))
    if model.status is not Status.READY:
        return _aws_error(429, "ModelNotReadyException", f"Model for endpoint {endpoint} is not ready "
                                                         f"({model.status.value}).")
    return model


def _known(store: ModelStore, name: str) -> bool:
    return name in store.models or name in store.catalog


def _adapter(model: ServedModel, request: Request) -> list[tuple[str, str]]:
    """SageMaker's adapter header when the inference component named is one of ``model``'s adapters."""
    component = request.headers.get(COMPONENT_HEADER)
    return [(SAGEMAKER_HEADER, component)] if component and component in model.adapters else []


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


async def sagemaker_answer(request: Request, pending: PendingRequest, endpoint: str) -> Response:
    start = await started(request, pending)
    if start is None:
        return Response(b"", Cancelled.status)
    body = await _collect(pending)
    if start.code >= 400:
        return _model_error(endpoint, start.code, body)
    return Response(body, 200, _sagemaker_headers(start))


async def sagemaker_event_stream(request: Request, pending: PendingRequest, endpoint: str,
                                 part_size: int) -> Response:
    start = await started(request, pending)
    if start is None:
        return Response(b"", Cancelled.status)
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
