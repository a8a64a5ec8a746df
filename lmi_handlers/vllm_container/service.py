"""LMI's requests inside AWS's vLLM container, answered in DJLServing's bytes by the engine vLLM's server runs.

``ContainerService`` loads once, on the first ``/ping`` or request, from what the container holds:

- the handler's settings from ``serving.properties`` beside ``model.py`` (and DJL's ``OPTION_*`` variables), with
  vLLM's server as the engine, resolved as on DJLServing (``container_deployment``: ``deployment.resolve``): vLLM
  batches continuously, as DJL's ``rolling_batch=vllm``;
- the engine: ``ServedVllm`` over ``app.state.engine_client``, driven one ``generate`` per sequence
  (``backends/vllm/async_engine.py``); the adapters: the ones vLLM's server holds (``ServedAdapters``).

``answer`` parses and tokenizes a request as DJLServing's handler does (``job.py``) and returns what DJLServing's
rolling batch sends for it: the texts ``Job.take`` gives as vLLM generates (a JSON answer in pieces as DJL's json
formatter sends it, jsonlines, SSE, chat chunks, TGI's shapes), and a failure as ``{"code", "error"}`` with its
status when nothing was sent yet, else as the answer's last line (``lmi_tools/serving/dispatcher.py`` does the same
for ``lmi serve``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping

from ..async_service import AsyncService
from ..deployment import HERE, Deployment, Host, resolve
from ..errors import ConfigError, HandlerError, log_failure
from ..events import ErrorEvent
from ..job import Job, compile_grammars, prepare_job
from ..properties import init_properties, parse_properties, with_environment
from ..structured.reasoning import Reasoning, reasoning_for

logger = logging.getLogger(__name__)

#: DJLServing's batching settings: vLLM's server batches by itself.
DJL_BATCHING = ("async_mode", "batch_size", "max_batch_delay")
_ids = itertools.count(1)


@dataclass(frozen=True)
class Answer:
    """A request's answer: its status and type, the text due before it starts, then the rest (None: complete)."""

    status: int
    content_type: str
    first: str
    rest: AsyncIterator[str] | None = None


def read_properties(model_dir: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The init properties DJLServing would give the handler for ``model_dir``: its ``serving.properties`` (none:
    every default) and DJL's ``OPTION_*`` variables."""
    path = os.path.join(model_dir, "serving.properties")
    text = ""
    if os.path.isfile(path):
        with open(path, "rb") as file:
            text = file.read().decode("latin-1")
    return init_properties(with_environment(parse_properties(text), environ))


def container_deployment(properties: Mapping[str, str], model: str, model_dir: str,
                         target: Host = HERE) -> Deployment:
    """The handler's deployment in the container, resolved as DJLServing's init call resolves it: ``properties``
    with vLLM's server as the engine (``model``, the weights it serves) and its continuous batching as DJL's
    ``rolling_batch=vllm``. ``target``: the container itself (``HERE``), or the GPU host lmi's tools write its
    environment for (``lmi_tools/containers/vllm``). Raises ``ConfigError``."""
    props = {key: value for key, value in properties.items() if key not in DJL_BATCHING}
    props.update(model_dir=model_dir, model_id=model, backend="vllm", rolling_batch="vllm")
    deployment = resolve(props, target)
    if deployment.embedding:
        raise ConfigError("task", props["task"], "LMI's handler in AWS's vLLM container serves text generation; "
                          "for embeddings, serve the model with LMI's image, or with vLLM's own pooling runner in "
                          "the vLLM container (OpenAI's /v1/embeddings shape) without option.task")
    return deployment


def failed(error: ErrorEvent) -> Answer:
    """A request that failed before anything was sent: its status, and DJLServing's ``{"code", "error"}``."""
    return Answer(error.code, "application/json", json.dumps({"code": error.code, "error": error.message}))


class ContainerService:
    """LMI's side of one vLLM server; ``model_dir`` holds ``model.py`` and ``serving.properties``."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        self.deployment: Deployment | None = None
        self.backend: Any = None
        self.adapters: Any = None
        self.reasoning: Reasoning | None = None
        #: The async path of DJL's async mode, whose engine is the server's (``AsyncService.prepare``, ``texts``).
        self.requests: AsyncService | None = None
        self.failure: Exception | None = None
        self._loading = asyncio.Lock()

    async def load(self, state: Any) -> None:
        """Load once from the server's ``app.state``; raises the load's failure (on every call after it too)."""
        async with self._loading:
            if self.requests is None and self.failure is None:
                try:
                    await self._load(state)
                except Exception as exc:  # noqa: BLE001 - the load's failure is every later answer's
                    if not isinstance(exc, HandlerError):
                        logger.exception("loading LMI's handler failed")
                    self.failure = exc
        if self.failure is not None:
            raise self.failure

    async def _load(self, state: Any) -> None:
        from ..backends.vllm.served import ServedAdapters, ServedVllm

        client = state.engine_client
        deployment = container_deployment(read_properties(self.model_dir), client.vllm_config.model_config.model,
                                          self.model_dir)
        for warning in deployment.warnings:
            logger.warning("%s", warning)
        # the tokenizer loads beside the running server
        backend = await asyncio.to_thread(ServedVllm, deployment.options, deployment.tools, client, deployment.grammar)
        self.reasoning = reasoning_for(deployment.config.properties, backend.tokenizer.hf)
        self.deployment, self.backend = deployment, backend
        self.adapters = ServedAdapters(state.openai_serving_models, deployment.lora, client.vllm_config.lora_config)
        requests = AsyncService(self)
        requests.engine = backend.make_async_engine()
        self.requests = requests
        config = deployment.config
        logger.info("LMI's handler serves %s on vLLM's engine (max_new_tokens=%d, output_formatter=%s)",
                    self.model_dir, config.max_new_tokens, config.output_formatter or "per request")

    def prepare(self, item: Any) -> Job:
        """``item``'s job; a request that fails to parse or tokenize is its own answer (``Job.rejected``)."""
        try:
            return prepare_job(item, self.deployment, self.backend, server_seed=item.get_property("seed"),
                               adapters=self.adapters, reasoning=self.reasoning)
        except Exception as exc:  # noqa: BLE001 - one request's failure is its own answer
            if not isinstance(exc, HandlerError):
                log_failure(logger, "preparing a request failed", exc)
            return Job.rejected(exc)

    def admit(self, job: Job) -> Job:
        """``job`` with its grammars compiled within the grammar budgets (``AsyncService.prepare`` runs it off the
        event loop); a grammar refused is that request's own answer."""
        try:
            return compile_grammars(job, self.backend)
        except Exception as exc:  # noqa: BLE001 - one request's failure is its own answer
            if not isinstance(exc, HandlerError):
                log_failure(logger, "compiling a request's grammar failed", exc)
            return Job.rejected(exc)

    async def answer(self, item: Any) -> Answer:
        """``item``'s answer once its first text is due (or it failed); the rest follows as vLLM generates."""
        assert self.requests is not None
        job = await self.requests.prepare(item)
        if job.error is not None:
            return failed(job.error)
        texts = self.requests.texts(job, f"vllm-container-{next(_ids)}")
        first = await anext(texts)  # an exception or a cancellation here has ended the generator already
        if job.error is not None or job.done:
            await texts.aclose()
            return failed(job.error) if job.error is not None else Answer(200, job.content_type, first)
        return Answer(200, job.content_type, first, _rest(job, texts))


async def _rest(job: Job, texts: AsyncIterator[str]) -> AsyncIterator[str]:
    """The answer after its first text; a failure ends it with ``{"code", "error"}`` as its last line. Leaving early
    (the client went away) stops its sequences in vLLM."""
    async with contextlib.aclosing(texts):
        async for text in texts:
            if job.error is not None:
                yield json.dumps({"code": job.error.code, "error": job.error.message}) + "\n"
                return
            yield text
