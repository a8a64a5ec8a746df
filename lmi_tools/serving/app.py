"""The HTTP surface of ``lmi serve``: DJLServing's inference and management APIs, and SageMaker Runtime's paths.

``create_app`` only assembles: one router per API surface (``routes/``), the access log, the header-size limit
and DJL's error shape ``{"code", "type", "message"}``; the routes hand requests to each model's dispatcher.
``HeadTimeout`` gives each request's headers a deadline to arrive. The management API gets an app (and a listener)
of its own: ``INFERENCE`` and ``MANAGEMENT`` name the routers of each; ``serve`` runs one uvicorn server per
listener in one event loop, and stops them all with a drain on SIGTERM or SIGINT (``drain.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
import time
from typing import Any, AsyncIterator, Sequence


import h11
import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..errors import UsageError
from .drain import DrainGate, on_signals
from .metrics import Metrics
from .routes import (anthropic, inference, management, metrics, openai, page, pooling, responses, sagemaker_runtime,
                     tgi)
from .routes.relay import HttpError, djl_error
from .response_store import ResponseStore
from .store import ModelStore

access_log = logging.getLogger("lmi.access")
INFERENCE = (inference.router, openai.router, responses.router, anthropic.router, pooling.router, tgi.router,
             sagemaker_runtime.router, metrics.router, page.router)
MANAGEMENT = (management.router,)
#: What uvicorn buffers of a request's head before refusing it outright; the 431 limit is checked below it.
MAX_BUFFERED_HEAD = 1024 * 1024


async def _on_http_error(request: Request, exc: HttpError) -> JSONResponse:
    """Each API's clients read errors in its own shape: Anthropic's, OpenAI's, TGI's, else DJL's."""
    path = request.url.path
    if path.startswith(anthropic.PREFIX):
        return anthropic.error(exc.code, exc.message)
    if path.startswith(openai.PREFIX) or path in pooling.PATHS:
        return openai.error(exc.code, exc.message)
    if path == "/info" or (path in tgi.PATHS and request.method == "POST"):
        return tgi.error(exc.code, exc.message)
    return djl_error(exc.code, exc.kind, exc.message)


async def _refusal(scope: dict, code: int, message: str) -> JSONResponse:
    """A request refused before any route ran (the drain's), in its API's error shape."""
    return await _on_http_error(Request(scope), HttpError(code, "ServiceUnavailableException", message))


async def _log_request(request: Request, call_next):
    began = time.perf_counter()
    response = await call_next(request)
    model = (getattr(request.state, "model", None) or request.path_params.get("model_name")
             or request.path_params.get("name") or "-")
    route = request.scope.get("route")
    # Labels only what the server knows (its models, its routes' templates): names copied from URLs would add a
    # series per request.
    store = request.app.state.store
    label = model if model in store.models or model in store.catalog else "-"
    request.app.state.metrics.requests.labels(label, getattr(route, "path", "unmatched"),
                                              str(response.status_code)).inc()
    access_log.info("%s %s model=%s status=%d latency=%.1fms", request.method, request.url.path, model,
                    response.status_code, (time.perf_counter() - began) * 1000)
    return response


class HeaderLimit:
    """431 for a request whose headers exceed ``limit`` bytes (an ASGI middleware, ahead of any route)."""

    def __init__(self, app: Any, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            size = sum(len(name) + len(value) + 4 for name, value in scope["headers"])
            if size > self.limit:
                response = djl_error(431, "BadRequestException", f"request headers of {size} bytes exceed the "
                                                                 f"limit of {self.limit} bytes (--max-header-bytes)")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class HeadTimeout(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for each request's head: a client that sends its request line and
    headers slowly (or nothing at all) gets a 408 and loses the connection after ``head_timeout`` seconds, as a
    front end with a header read timeout does. uvicorn bounds only the wait between requests."""

    def __init__(self, *args: Any, head_timeout: float, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.head_timeout = head_timeout
        self.head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # still reading a head: the deadline set at its first byte holds
            if self.head_deadline is None:
                self._arm()
        elif self.head_deadline is not None:
            self.head_deadline.cancel()
            self.head_deadline = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.head_deadline is not None:
            self.head_deadline.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self.head_deadline = self.loop.call_later(self.head_timeout, self._expire)

    def _expire(self) -> None:
        self.head_deadline = None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return
        if self.conn.our_state is h11.IDLE:  # an answer to a pipelined request may still be going out
            body = json.dumps({"code": 408, "type": "RequestTimeoutException", "message":
                               f"the request's headers did not arrive within {self.head_timeout:g} s (--read-timeout)"})
            self.transport.write(f"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                                 f"content-length: {len(body)}\r\nconnection: close\r\n\r\n{body}".encode())
        self.transport.close()


def create_app(store: ModelStore, routers: Sequence[APIRouter] = INFERENCE + MANAGEMENT,
               owns_store: bool = True) -> FastAPI:
    """One listener's app; the one that ``owns_store`` stops every worker process on shutdown."""
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if owns_store:
            await asyncio.to_thread(store.close)

    # FastAPIOffline serves the /docs and /redoc pages' scripts itself: FastAPI's load them from a CDN, which leaves
    # the page blank on a machine without internet.
    app = FastAPIOffline(title="lmi serve", lifespan=lifespan,
                         description="A local DJLServing-compatible server for lmi_handlers models.")
    app.state.store = store
    app.state.metrics = Metrics(store)
    app.state.responses = ResponseStore()  # the Responses API's stored responses (routes/responses.py)
    app.add_exception_handler(HttpError, _on_http_error)
    app.middleware("http")(_log_request)
    app.add_middleware(HeaderLimit, limit=store.server.max_header_bytes)
    app.add_middleware(DrainGate, drain=store.drain, error=_refusal)
    for router in routers:
        app.include_router(router)
    return app


class _Listener(uvicorn.Server):
    """One listener's uvicorn server; ``serve`` handles the signals (a drain) instead of uvicorn."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def listen(host: str, port: int) -> socket.socket:
    """Bind ``host:port`` now, before any model loads, so that a port in use is a usage error at once."""
    # Named IPPROTO_TCP, not left 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on connections whose
    # socket names it, and with Nagle on, a stream's first token waited for the client's delayed ACK of the answer's
    # head on every kept-alive connection (40-90 ms more to the first token).
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: restarts reuse the port at once
    try:
        sock.bind((host, port))
        # Listen now too: two addresses on one port (0.0.0.0 and 127.0.0.1) both bind with SO_REUSEADDR, and only
        # the second listen fails.
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                         hint="another server may be using it: pass --port N (and --management-port M), or stop "
                              "that server") from None
    return sock


def serve(listeners: Sequence[tuple[FastAPI, socket.socket]], log_level: str) -> None:
    """Run one uvicorn server per (app, bound socket) until a signal: the first drains, then stops them all
    (``drain.py``); a second stops them at once."""
    configs = [uvicorn.Config(app, log_level=log_level, access_log=False,
                              h11_max_incomplete_event_size=MAX_BUFFERED_HEAD,
                              http=functools.partial(HeadTimeout, head_timeout=app.state.store.server.read_timeout))
               for app, _ in listeners]
    servers = [_Listener(config) for config in configs]
    sockets = [sock for _, sock in listeners]
    store: ModelStore = listeners[0][0].state.store

    def stop(now: bool = False) -> None:
        for server in servers:
            server.should_exit = True
            server.force_exit = server.force_exit or now

    def drain() -> None:
        store.drain.draining = True
        asyncio.get_running_loop().create_task(store.drain.run(
            lambda reason: asyncio.to_thread(store.close, reason), stop))

    def halt() -> None:
        store.drain.forced = True
        store.halt()
        stop(now=True)

    async def main() -> None:
        on_signals(asyncio.get_running_loop(), drain, halt)
        await asyncio.gather(*(server.serve(sockets=[sock]) for server, sock in zip(servers, sockets)))

    asyncio.run(main())
