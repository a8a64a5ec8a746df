"""What every router shares: DJL's error shape, the request -> dispatcher hand-off, and the answer relay.

``submit`` turns an HTTP request into the ``Input`` Java would build and queues it on the model's
dispatcher; ``answer`` turns the request's events (``Start``, ``Chunk``, ``End``) back into a response:
a complete answer goes out with content-length, anything else streams as it arrives.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Annotated, Any, AsyncIterator

from fastapi import Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from lmi_handlers.errors import Cancelled

from ..dispatcher import Chunk, End, PendingRequest, QueueFull, ServedModel, Start, Status
from ..store import ModelStore
from ..worker.frontend import request_input

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


def _store(request: Request) -> ModelStore:
    return request.app.state.store


#: The server's model store, as a route parameter.
Store = Annotated[ModelStore, Depends(_store)]


def named(store: ModelStore, name: str, ready: bool = True) -> ServedModel:
    """The model called ``name``; a 503 when it is not ready or (with ``ready``) one of the operator's models that
    is not loaded: a request is never answered by another model than the one it names."""
    model = store.get(name)
    if model is None:
        if ready and name in store.catalog:
            raise HttpError(503, "ServiceUnavailableException", not_loaded(store, name))
        raise HttpError(404, "ModelNotFoundException", f"Model not found: {name}")
    if ready and model.status is not Status.READY:
        # The failure's details (worker output, paths) are for the operator: GET /models/{name} on the management API.
        raise HttpError(503, "ServiceUnavailableException", f"Model {name} is not ready ({model.status.value})")
    return model


def not_loaded(store: ModelStore, name: str) -> str:
    """Why one of the operator's models cannot answer now, and how to load it."""
    loaded = ", ".join(store.models) or "none"
    switch = ", which unloads the others (--one-at-a-time)" if store.one_at_a_time else ""
    return (f"Model {name} is not loaded (UNLOADED; loaded: {loaded}): activate it with POST "
            f"/ui/models/{name}/activate or the chat page's model menu{switch}")


def chosen(store: ModelStore, name: str | None, how: str) -> ServedModel:
    """The model ``name`` names, or the only one served; ``how`` tells the client how to name one."""
    if name is None:
        if len(store.models) != 1:
            served = ", ".join(store.models) or "none"
            raise HttpError(400, "BadRequestException", f"{how} is required: this server has several models "
                                                        f"({served})")
        name = next(iter(store.models))
    return named(store, name)


def json_object(raw: bytes) -> dict[str, Any]:
    """A route's own reading of a JSON body; any malformed body, however deeply nested, is a 400."""
    try:
        body = json.loads(raw or b"null")
    except RecursionError:
        raise HttpError(400, "BadRequestException", "request body is nested too deeply: send a JSON object with "
                                                    "a few levels of objects and lists") from None
    except ValueError as exc:
        raise HttpError(400, "BadRequestException", f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise HttpError(400, "BadRequestException", "request body must be a JSON object")
    return body


def flag(body: dict[str, Any], name: str) -> bool:
    """A boolean field (absent or null: false); any other value is a 400 naming it."""
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise HttpError(400, "BadRequestException", f"{name}={json.dumps(value)[:80]} is invalid: expected true or "
                                                    "false")
    return bool(value)


async def read_body(request: Request, store: ModelStore) -> bytes:
    return await _read_body(request, store.server.max_request_size, store.server.read_timeout)


async def submit(request: Request, store: ModelStore, model: ServedModel, sagemaker: bool = False,
                 body: bytes | None = None, accept: str | None = None,
                 extra: list[tuple[str, str]] = []) -> PendingRequest:
    """Queue the request on ``model``; ``body`` and ``accept`` replace the client's (a route that translates
    another API's schema into LMI's sends its own); ``extra`` headers are those a platform adds (SageMaker's)."""
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw] + extra
    if body is None:
        body = await read_body(request, store)
    else:
        headers = [(k, v) for k, v in headers if k.lower() not in ("content-type", "content-length")]
        headers.append(("Content-Type", "application/json"))
    if any(k.lower() == "handler" for k, _ in headers) and os.environ.get(
            "ALLOW_REQUEST_HANDLER_OVERRIDE", "").lower() != "true":
        raise HttpError(400, "BadRequestException", "The handler can't be overridden in a request")
    if sagemaker:  # the streaming call sends Accept as X-Amzn-SageMaker-Accept
        accept = request.headers.get("x-amzn-sagemaker-accept")
    if accept is not None or sagemaker:
        headers = [(k, v) for k, v in headers if k.lower() != "accept"] + ([("Accept", accept)] if accept else [])
    pending = PendingRequest(request_input(headers, body, list(request.query_params.multi_items())),
                             asyncio.get_running_loop())
    request.state.model = model.name  # for the access log and the request counter
    request.app.state.metrics.watch(pending, model.name)
    try:
        model.submit(pending)
    except QueueFull as exc:
        raise HttpError(503, "ServiceUnavailableException", str(exc)) from None
    return pending


async def _read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The whole body, at most ``limit`` bytes (413), each part arriving within ``timeout`` seconds (408)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HttpError(413, "BadRequestException", f"request body of {declared} bytes exceeds max_request_size "
                                                     f"({limit} bytes)")
    body = bytearray()
    parts = request.stream().__aiter__()
    while True:
        try:
            part = await asyncio.wait_for(parts.__anext__(), timeout)
        except StopAsyncIteration:
            return bytes(body)
        except asyncio.TimeoutError:
            raise HttpError(408, "RequestTimeoutException", f"the request body stopped arriving: nothing for "
                                                            f"{timeout:g} s (--read-timeout)") from None
        body += part
        if len(body) > limit:
            raise HttpError(413, "BadRequestException", f"request body exceeds max_request_size ({limit} bytes)")


async def started(request: Request, pending: PendingRequest) -> Start | None:
    """The answer's ``Start``, or None when the client went away first: the request is then cancelled (a queued
    one is dropped, a rolling-batch one leaves the batch at the next step and frees its slot)."""
    get = asyncio.ensure_future(pending.events.get())
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if get in done:
        start = get.result()
        assert isinstance(start, Start)
        return start
    get.cancel()
    pending.cancelled = True
    return None


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


#: Headers the server sets from the answer itself: a handler's property of that name (one that copies its request's
#: properties into its answer, as DJL's async_echo does) would contradict the body.
FRAMING = frozenset({"content-length", "transfer-encoding", "connection"})


def _response_headers(pending: PendingRequest, start: Start) -> dict[str, str]:
    given = {k: v for k, v in start.headers.items() if k.lower() not in FRAMING}
    headers = {**NO_CACHE, **given, "x-request-id": str(pending.input.get_property("requestId"))}
    if start.code >= 400:
        headers["connection"] = "close"
    return headers


async def answer(request: Request, pending: PendingRequest) -> Response:
    """A complete answer goes out with content-length; anything else streams as it arrives."""
    start = await started(request, pending)
    if start is None:
        return Response(b"", Cancelled.status)  # nobody reads it: the client is gone
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
