"""The handler behind ``handle(inputs)``: load on the init call, then serve every request shape.

* the empty init call: parse ``HandlerConfig`` from its properties, load the backend, return None;
* rolling batch (``option.rolling_batch=auto|scheduler``): one call per generation step;
* otherwise a single request (a JSON body, or a stream via ``add_stream_content``) or a dynamic
  batch of N requests answered with N items ``batch_<i>.data``, each request on its own: an invalid
  one gets its own error body while its neighbours are answered normally.

This is the only place where errors become responses.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterator

from . import djl
from . import adapters as lora
from . import kv_events, tracing
from .backends import BACKENDS, load_backend
from .backends.base import Backend
from .config import HandlerConfig, check_unknown_keys
from .structured.tools import ToolOptions
from .encoding import dumps, error_object, reason_phrase
from .engine import Engine
from .gauges import DjlMetrics
from .errors import HandlerError, InvalidRequest, status_of
from .job import Job, prepare_job
from .rolling import RollingBatch
from .scheduler import priority_scheduling

logger = logging.getLogger(__name__)


class Handler:
    """Holds the configuration, backend and engine of one model; ``handle`` is the entry point."""

    def __init__(self, backend_loader: Callable[[HandlerConfig], Backend] = load_backend):
        self.backend_loader = backend_loader
        self.initialized = False
        self.config: HandlerConfig | None = None
        self.backend: Backend | None = None
        self.engine: Engine | None = None
        self.rolling: RollingBatch | None = None
        self.adapters = lora.Adapters(lora.LoraOptions(), None)
        #: ``option.scheduling_policy=priority``: requests may set ``priority`` (``scheduler.py``).
        self.by_priority = False
        #: Requests carry their trace context to the engine (``tracing.py``).
        self.traced = False

    def initialize(self, properties: dict[str, Any]) -> None:
        config = HandlerConfig.from_properties(properties)
        events = kv_events.KVEventsOptions.from_properties(config.properties)  # refused before the weights load
        backend = self.backend_loader(config)
        check_unknown_keys(config.properties, backend.option_keys)
        ToolOptions.from_properties(config.properties)  # a bad tool-call option refuses the load, not a request
        options = lora.LoraOptions.from_properties(config.properties)
        self.by_priority = priority_scheduling(config.properties)
        self.traced = tracing.enabled(config.properties)
        self.config, self.backend = config, backend
        self.adapters = lora.Adapters(options, getattr(backend, "load_adapter", None))
        # A backend that brings its own step loop (vllm: the registry's step_loop) runs it; the others run ours.
        step_loop = getattr(BACKENDS.get(backend.name), "step_loop", None)
        if step_loop is not None:
            self.engine = step_loop(backend)
        else:
            kv_events.attach(backend, events, config.properties)  # vLLM publishes its own (its kv_events_config)
            self.engine = Engine(backend, config.max_rolling_batch_prefill_tokens, config.enable_chunked_prefill,
                                 by_priority=self.by_priority)
            self.engine.scheduler.max_adapters = options.max_loras if options.enabled else None
            if self.traced:  # vLLM traces its own requests (its otlp_traces_endpoint)
                model = os.path.basename(config.model_id.rstrip("/"))
                self.engine.tracer = tracing.Tracer.from_config(model, config.properties)
        djl_metrics = DjlMetrics(str(config.properties.get("metric_dimension") or "model"))
        self.rolling = RollingBatch(self.engine, self._prepare, djl_metrics=djl_metrics) if config.rolling else None
        self.initialized = True

    def handle(self, inputs: Any) -> Any:
        try:
            if not self.initialized:
                self.initialize(_configuration(inputs))
            if inputs.is_empty():
                return None
            if self.rolling is not None:
                return self.rolling.step(inputs)
            return self._inference(inputs)
        except Exception as exc:  # noqa: BLE001 - the one place errors become responses
            return self._error_output(exc)

    # --- non-rolling modes --------------------------------------------------------------------

    def _prepare(self, item: Any) -> Job:
        """The request's job; any failure to parse or tokenize it is its own error (``Job.rejected``)."""
        assert self.config is not None and self.backend is not None
        try:
            job = prepare_job(item, self.config, self.backend, server_seed=item.get_property("seed"),
                              adapters=self.adapters, by_priority=self.by_priority)
            if self.traced:
                headers = tracing.trace_headers(item)
                for seq in job.seqs:
                    seq.trace_headers = headers
            return job
        except Exception as exc:  # noqa: BLE001 - one request's failure is its own answer, never its batch's
            if not isinstance(exc, HandlerError):
                logger.exception("preparing a request failed")
            return Job.rejected(exc)

    def _inference(self, inputs: Any) -> Any:
        items = inputs.get_batches()
        if not inputs.is_batch():
            job = self._prepare(items[0])
            output = djl.new_output()
            if job.streaming:
                output.add_property("content-type", job.content_type)
                return output.add_stream_content(self._stream(job), output_formatter=None)
            body = self._complete([job])[0]
            if job.error is not None:
                return output.error(job.error.message, code=job.error.code, message=reason_phrase(job.error.code))
            return output.add_property("content-type", job.content_type).add(body)
        jobs = [self._prepare(item) for item in items]
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
        try:
            if not self.initialized:
                raise InvalidRequest("the model is not loaded yet: adapters register after it loads")
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
            return djl.new_output().add_as_json({"status": f"Adapter {name} {done}"})
        except Exception as exc:  # noqa: BLE001 - a bad adapter is its own answer; the base model keeps serving
            return self._error_output(exc)

    # --- errors -------------------------------------------------------------------------------

    def _error_output(self, exc: Exception) -> Any:
        if not isinstance(exc, HandlerError):
            logger.exception("handler failed")
        code = status_of(exc)
        message = str(exc) if isinstance(exc, HandlerError) else f"{type(exc).__name__}: {exc}"
        if not self.initialized:
            message = f"model failed to load: {message}"
        return djl.new_output().error(message, code=code, message=reason_phrase(code))


def _configuration(inputs: Any) -> dict[str, Any]:
    """The properties to load from. DJLServing's init call carries only the model's; a harness that skips it
    (djl_python's ``TestHandler``) loads from the first request, whose batch layout is no configuration:
    its ``batch_size`` would read as dynamic batching (and be refused with rolling batch)."""
    properties = inputs.get_properties()
    if inputs.is_empty():
        return properties
    return {key: value for key, value in properties.items() if not key.startswith("batch_")}
