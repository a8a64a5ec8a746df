"""The handler behind ``handle(inputs)``: load on the init call, then serve every request shape.

* the empty init call: resolve its properties into a ``Deployment`` (``deployment.py``: the settings, DJL's mode, the
  backend and its options, parsed once), load the backend, return None;
* called from an event loop (DJL's async engine, ``option.async_mode=true``): a coroutine, answered by
  ``async_service.py`` (one request per call, joining the backend's step loop);
* rolling batch (``option.rolling_batch=auto|scheduler``): one call per generation step;
* otherwise a single request (a JSON body, or a stream via ``add_stream_content``) or a dynamic
  batch of N requests answered with N items ``batch_<i>.data``, each request on its own: an invalid
  one gets its own error body while its neighbours are answered normally.

This is the only place where errors become responses.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Callable, Iterator

from . import djl
from . import adapters as lora
from . import kv_events, tracing
from .backends.base import Backend
from .config import ConfigError, HandlerConfig
from .deployment import Deployment, resolve
from .pooling.batch import Pooler, answer_batch
from .structured.reasoning import Reasoning, reasoning_for
from .encoding import dumps, error_object, reason_phrase
from .engine import Engine
from .errors import HandlerError, InvalidRequest, capped, log_failure, status_of
from .gauges import DjlMetrics
from .job import Job, compile_grammars, prepare_job
from .rolling import RollingBatch

logger = logging.getLogger(__name__)


class Handler:
    """Holds the configuration, backend and engine of one model; ``handle`` is the entry point."""

    def __init__(self, backend_loader: Callable[[Deployment], Backend] = Deployment.load):
        self.backend_loader = backend_loader
        self.initialized = False
        self.deployment: Deployment | None = None
        self.config: HandlerConfig | None = None
        self.backend: Backend | None = None
        self.engine: Engine | None = None
        self.rolling: RollingBatch | None = None
        self.adapters = lora.Adapters(lora.LoraOptions(), None)
        self.reasoning: Reasoning | None = None
        #: An embedding model's backend (``option.task=text-embedding``): requests are answered by ``pooling/``.
        self.pooler: Pooler | None = None
        self._async: Any = None
        #: Requests carry their trace context to the engine (``tracing.py``).
        self.traced = False
        #: The engine's gauges as DJLServing's ``[METRICS]`` lines (``gauges.py``).
        self.djl_metrics = DjlMetrics()

    def initialize(self, properties: dict[str, Any], awaited: bool = False) -> None:
        """Load; ``awaited`` (DJL's async engine calls): ``async_service.py`` starts the engine requests join."""
        deployment = resolve(properties)  # every option parsed here, once: a bad one refuses the load, not a request
        config = deployment.config
        conflict = config.async_conflict() if awaited else None
        if conflict is not None:
            raise conflict
        if deployment.embedding and config.rolling:
            raise ConfigError("rolling_batch", config.rolling_batch, "option.task=text-embedding answers whole "
                              "requests: set option.rolling_batch=disable (and batch_size, max_batch_delay for "
                              "dynamic batching)")
        logger.info("backend %s (%s)", deployment.backend.name, deployment.why)
        for warning in deployment.warnings:
            logger.warning("%s", warning)
        backend = self.backend_loader(deployment)
        self.reasoning = reasoning_for(config.properties, getattr(backend.tokenizer, "hf", None))
        self.deployment, self.config, self.backend = deployment, config, backend
        if deployment.embedding:  # an embedding model: dynamic batches of vectors, no step loop
            self.pooler = backend  # type: ignore[assignment]
            self.initialized = True
            return
        self.adapters = lora.Adapters(deployment.lora, backend.load_adapter if deployment.backend.adapters else None)
        self.traced = tracing.enabled(config.properties)
        self.djl_metrics = DjlMetrics(str(config.properties.get("metric_dimension") or "model"))
        if deployment.mode.asynchronous != awaited:
            logger.warning("option.async_mode=%s, but DJL's %s engine calls handle: answering as that engine awaits",
                           str(deployment.mode.asynchronous).lower(), "async" if awaited else "sync")
        if not awaited:
            # A backend that brings its own step loop (vllm: the registry's step_loop) runs it; the others run ours.
            step_loop = deployment.backend.step_loop
            self.engine = step_loop(backend) if step_loop is not None else self.new_engine()
            self.rolling = RollingBatch(self.engine, self.prepare, self.admit, djl_metrics=self.djl_metrics,
                                        beside_our_engine=step_loop is None) if config.rolling else None
        self.initialized = True

    def new_engine(self) -> Engine:
        """Our engine over the loaded backend (the backends without a step loop of their own), publishing KV events,
        scheduling by priority and tracing as the options ask (vLLM does all three itself, from its engine
        arguments)."""
        assert self.deployment is not None and self.config is not None and self.backend is not None
        config, deployment = self.config, self.deployment
        kv_events.attach(self.backend, deployment.kv_events, config.properties)
        engine = Engine(self.backend, config.max_rolling_batch_prefill_tokens, config.enable_chunked_prefill,
                        by_priority=deployment.by_priority)
        engine.scheduler.max_adapters = self.adapters.options.max_loras if self.adapters.options.enabled else None
        if self.traced:
            engine.tracer = tracing.Tracer.from_config(os.path.basename(config.model_id.rstrip("/")), config.properties)
        return engine

    def handle(self, inputs: Any) -> Any:
        if _awaited():
            return self._async_service().handle(inputs)
        try:
            if not self.initialized:
                self.initialize(djl.configuration(inputs))
            if inputs.is_empty():
                return None
            if self.rolling is not None:
                return self.rolling.step(inputs)
            return self._inference(inputs)
        except Exception as exc:  # noqa: BLE001 - the one place errors become responses
            return self.error_output(exc)

    def _async_service(self) -> Any:
        if self._async is None:
            from .async_service import AsyncService

            self._async = AsyncService(self)
        return self._async

    # --- non-rolling modes --------------------------------------------------------------------

    def prepare(self, item: Any) -> Job:
        """The request's job; any failure to parse or tokenize it is its own error (``Job.rejected``)."""
        assert self.deployment is not None and self.backend is not None
        try:
            job = prepare_job(item, self.deployment, self.backend, server_seed=item.get_property("seed"),
                              adapters=self.adapters, reasoning=self.reasoning)
            if self.traced:
                headers = tracing.trace_headers(item)
                for seq in job.seqs:
                    seq.trace_headers = headers
            return job
        except Exception as exc:  # noqa: BLE001 - one request's failure is its own answer, never its batch's
            return _rejected("preparing a request", exc)

    def admit(self, job: Job) -> Job:
        """The job with its grammars compiled (slow: the rolling batch and the async path run it off their loops); a
        grammar refused (or failing to compile) is its own error."""
        try:
            return compile_grammars(job, self.backend)
        except Exception as exc:  # noqa: BLE001 - one request's failure is its own answer, never its batch's
            return _rejected("compiling a request's grammar", exc)

    def _ready(self, item: Any) -> Job:
        return self.admit(self.prepare(item))

    def _inference(self, inputs: Any) -> Any:
        items = inputs.get_batches()
        if self.pooler is not None:
            return self._embeddings(inputs, items)
        if not inputs.is_batch():
            job = self._ready(items[0])
            output = djl.new_output()
            if job.streaming:
                output.add_property("content-type", job.content_type)
                return output.add_stream_content(self._stream(job), output_formatter=None)
            body = self._complete([job])[0]
            if job.error is not None:
                return output.error(capped(job.error.message), code=job.error.code,
                                    message=reason_phrase(job.error.code))
            return output.add_property("content-type", job.content_type).add(body)
        jobs = [self._ready(item) for item in items]
        output = djl.new_output()
        types = set()
        for i, (job, body) in enumerate(zip(jobs, self._complete(jobs))):
            if job.error is not None:
                body = job.error_body()
            else:
                types.add(job.content_type)
            output.add(body, key="data", batch_index=i)
        # Headers are shared by the whole batch (DJL's contract); name a type only if all agree.
        output.add_property("content-type", types.pop() if len(types) == 1 else "application/json")
        return output

    def _embeddings(self, inputs: Any, items: list[Any]) -> Any:
        """A dynamic batch (or one request) of embedding requests: each answered, or refused, on its own."""
        assert self.pooler is not None and self.config is not None
        answers = answer_batch(items, self.pooler, self.config)
        output = djl.new_output()
        if not inputs.is_batch():
            code, body = answers[0]
            if code != 200:
                return output.error(capped(body), code=code, message=reason_phrase(code))
            return output.add_property("content-type", "application/json").add(body)
        for i, (code, body) in enumerate(answers):
            output.add(body if code == 200 else dumps(error_object(code, body)), key="data", batch_index=i)
        return output.add_property("content-type", "application/json")

    def _complete(self, jobs: list[Job]) -> list[str]:
        """Run jobs together until all finish; returns each one's whole body."""
        assert self.engine is not None
        bodies = [""] * len(jobs)
        seqs = [seq for job in jobs for seq in job.seqs]
        for events in self.engine.run(seqs):
            for i, job in enumerate(jobs):
                bodies[i] += job.take(events)
        return bodies

    def _stream(self, job: Job) -> Iterator[str]:
        assert self.engine is not None
        try:
            for events in self.engine.run(job.seqs):
                text = job.take(events)
                if text:
                    yield text
        finally:
            for seq in job.seqs:  # the reader went away early: free the slots
                if not seq.finished:
                    self.engine.cancel(seq)

    # --- adapters: DJLServing's register_adapter / update_adapter / unregister_adapter calls ---------------

    def manage_adapter(self, inputs: Any, action: str) -> Any:
        """``action`` (register, update, unregister) on the adapter named by the ``name`` property; ``src`` is its
        folder, the content's items its options. Answers DJL's ``{"status"...}`` message, or the error."""
        if _awaited():
            return self._async_service().manage_adapter(inputs, action)
        try:
            if not self.initialized:
                raise InvalidRequest("the model is not loaded yet: adapters register after it loads")
            return djl.new_output().add_as_json({"status": self.adapter_action(inputs, action)})
        except Exception as exc:  # noqa: BLE001 - a bad adapter is its own answer; the base model keeps serving
            return self.error_output(exc)

    def adapter_action(self, inputs: Any, action: str) -> str:
        """Run the adapter call; its status message (raises for a bad adapter)."""
        name = str(inputs.get_property("name") or "")
        content = inputs.get_content()
        options = {key: inputs.get_as_string(key) for key in content.get_keys() if key and key != "data"}
        if action == "register":
            self.adapters.register(name, str(inputs.get_property("src") or ""), options)
        elif action == "update":
            self.adapters.update(name, options)
        else:
            self.adapters.unregister(name)
        done = {"register": "registered", "update": "updated", "unregister": "unregistered"}[action]
        return f"Adapter {name} {done}"

    # --- errors -------------------------------------------------------------------------------

    def error_output(self, exc: Exception) -> Any:
        if not isinstance(exc, HandlerError):
            log_failure(logger, "handler failed", exc)
        code = status_of(exc)
        message = str(exc) if isinstance(exc, HandlerError) else f"{type(exc).__name__}: {exc}"
        if not self.initialized:
            message = f"model failed to load: {message}"
        return djl.new_output().error(capped(message), code=code, message=reason_phrase(code))


def _rejected(what: str, exc: Exception) -> Job:
    if not isinstance(exc, HandlerError):
        log_failure(logger, f"{what} failed", exc)
    return Job.rejected(exc)


def _awaited() -> bool:
    """Whether the caller is DJL's async engine: it calls ``handle`` from its event loop and awaits the answer."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
