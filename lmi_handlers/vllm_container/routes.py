"""The vLLM container's ``/invocations`` and ``/ping`` with LMI's handler, as model-hosting-container-standards mounts
them in place of vLLM's own (``register``).

``/invocations`` sends each body where its shape belongs:

- OpenAI's (``messages``: chat, ``prompt``: completions, ``input``: pooling) and the container's session requests
  (``requestType``) to vLLM's own handler, unchanged: it validates them with vLLM's request types, keeps the
  container's sticky sessions (``@stateful_session_manager``) and puts the adapter header's name into ``model``
  (``@inject_adapter_id``);
- every other body is LMI's (``inputs``: LMI and TGI; ``text``: the original inf2 example; ``text/plain``: the
  prompt itself) and goes to ``service.py``; a JSON one first through the same session manager, so a session
  header is checked as on vLLM's path.

``/ping`` loads the handler (so that a bad ``serving.properties`` keeps the container from going InService, with
the reason in its log) and then answers as vLLM's own check does.

FastAPI reads each handler's annotations to pass it the request, so the handlers are defined where ``Request`` is
imported, inside ``register`` (``lmi_handlers`` imports only the standard library at module level), in a module
without postponed annotations.
"""

import asyncio
import contextlib
import json
import logging
from typing import Any

from ..errors import HandlerError
from ..protocol import request_input
from .service import Answer, ContainerService

logger = logging.getLogger(__name__)

#: Top-level fields of the bodies vLLM's own ``/invocations`` answers (its request types, the session requests).
VLLM_FIELDS = ("messages", "prompt", "prompt_embeds", "input", "requestType")


def register(model_dir: str) -> ContainerService:
    """Hand ``/invocations`` and ``/ping`` for the model in ``model_dir`` to the standards package."""
    import model_hosting_container_standards.sagemaker as standards
    from fastapi import Request
    from model_hosting_container_standards.common.handler.registry import handler_registry

    service = ContainerService(model_dir)

    async def lmi(request: Request) -> Any:
        return await _lmi_answer(service, request)

    lmi_in_session = standards.stateful_session_manager()(lmi)

    @standards.custom_invocation_handler
    async def invocations(request: Request) -> Any:
        shape = body_shape(await request.body(), request.headers.get("content-type"))
        vllms = handler_registry.get_framework_default("invoke")  # None: a vLLM without SageMaker's routes
        if shape == "vllm" and vllms is not None:
            return await vllms(request)
        return await (lmi_in_session if shape == "json" else lmi)(request)

    @standards.custom_ping_handler
    async def ping(request: Request) -> Any:
        try:
            await service.load(request.app.state)
        except Exception as exc:  # noqa: BLE001 - not healthy, saying why
            return _load_failure(exc)
        vllms = handler_registry.get_framework_default("ping")
        return await vllms(request) if vllms is not None else _response(Answer(200, "application/json", "{}"))

    logger.info("LMI's handler answers /invocations and /ping for %s", model_dir)
    return service


def body_shape(body: bytes, content_type: str | None) -> str:
    """``vllm`` for the bodies vLLM's own handler answers, ``json`` for LMI's JSON objects, ``other`` for the rest
    (a text prompt; a body that is no JSON object, which LMI's parser refuses with a 400)."""
    if (content_type or "").lower().startswith("text/plain"):
        return "other"
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return "other"
    if not isinstance(data, dict):
        return "other"
    return "vllm" if any(field in data for field in VLLM_FIELDS) else "json"


async def _lmi_answer(service: ContainerService, request: Any) -> Any:
    try:
        await service.load(request.app.state)
    except Exception as exc:  # noqa: BLE001 - every request gets the load's failure
        return _load_failure(exc)
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
    item = request_input(headers, await request.body(), list(request.query_params.multi_items()))
    work = asyncio.ensure_future(service.answer(item))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        left = not work.done()
        if left:  # the client went away (or the server stops) before the answer started: it stops in vLLM
            work.cancel()
    return _response(Answer(499, "application/json", "") if left else work.result())


async def _disconnected(request: Any) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _response(answer: Answer) -> Any:
    from starlette.responses import Response, StreamingResponse

    headers = {"content-type": answer.content_type}
    if answer.rest is None:
        return Response(answer.first.encode("utf-8"), answer.status, headers)
    return StreamingResponse(_chunks(answer), answer.status, headers)


async def _chunks(answer: Answer) -> Any:
    assert answer.rest is not None
    yield answer.first.encode("utf-8")
    async with contextlib.aclosing(answer.rest):
        async for text in answer.rest:
            yield text.encode("utf-8")


def _load_failure(exc: Exception) -> Any:
    """A 503 saying why the handler could not load (a ``serving.properties`` value, the tokenizer...)."""
    message = str(exc) if isinstance(exc, HandlerError) else f"{type(exc).__name__}: {exc}"
    return _response(Answer(503, "application/json", json.dumps({"code": 503,
                                                                  "error": f"model failed to load: {message}"})))
