"""``handle`` as DJL's async engine awaits it (``option.async_mode=true``, ``PythonAsyncEngine``).

Java sends each request alone, tagged with a ``request_tracking_id`` property, and many are in flight at once. Each
call here parses and tokenizes its request and compiles its grammar as the sync path does (``job.py``; a large body
and any grammar on the preparation pool, off the event loop) and joins the backend's own step loop: our engine on
its thread (``engine_thread.py``), or vLLM's async engine (``backends/vllm/async_engine.py``), so the scheduler
batches concurrent requests as a rolling batch would. The answer is an ``Output`` (a whole body) or an
async generator of ``Output``s (a stream), each written as ``djl_python.async_utils`` writes it
(``djl.async_output``): the same text as in sync mode, one line ending per output (a stream's pieces already end
with theirs; a whole body gains one, as every LMI async answer does). A request that fails, before or during
generation, answers ``{"data": "", "last": true, "error", "code"}`` alone.

Calls beside requests: adapters register, update and unregister between two engine steps; and two of our local
server's (DJLServing never sends them): a call carrying ``lmi_cancel=<its tracking id>`` marks a request whose client
went away, which ends it in the engine at once, and a call carrying ``lmi_engine_stats`` is answered with the
engine's counters (``gauges.py``: what gateways read), as a rolling batch sends them with each step. For DJLServing
the same counters go out as its ``[METRICS]`` lines (``gauges.DjlMetrics``) while requests run, and once more when
the last one ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, AsyncIterator

from . import djl
from .encoding import dumps
from .errors import Cancelled, HandlerError, InvalidRequest, log_failure, status_of
from .events import ErrorEvent, Event
from .gauges import DJL_INTERVAL
from .job import Job
from .pooling.batch import answer_batch
from .rolling import CANCEL_PROPERTY, INLINE_BODY_BYTES, STATS_PROPERTY, preparation_pool

logger = logging.getLogger(__name__)

TRACKING_ID = "request_tracking_id"
JSON = "application/json"
CANCELLED = "request cancelled: the client went away"


class AsyncService:
    """The async path of one ``Handler``: its configuration and backend, and the engine requests join."""

    def __init__(self, handler: Any):
        self.handler = handler
        self.engine: Any = None
        #: The queue of each request in flight, by tracking id: a cancellation is put there.
        self.running: dict[str, asyncio.Queue] = {}
        #: An embedding model pools one request at a time, on a thread beside the event loop.
        self._pooling = asyncio.Lock()
        #: Where a large body is parsed and tokenized, and a grammar compiled, beside the event loop and the engine
        #: (made at the load: how its threads yield depends on whose engine they run beside).
        self._pool: Any = None
        #: Prints the engine's gauges for DJLServing while requests run (``_publish``).
        self._publisher: asyncio.Task | None = None

    async def handle(self, inputs: Any) -> Any:
        if self.engine is None:
            failure = self._load(inputs)
            if failure is not None or inputs.is_empty():
                return failure
        if inputs.get_property(CANCEL_PROPERTY):
            self.cancel(str(inputs.get_property(CANCEL_PROPERTY)))
            return None
        if inputs.get_property(STATS_PROPERTY):
            return djl.async_output(json.dumps(self.stats(), separators=(",", ":")), True, JSON)
        if inputs.is_empty():
            return None
        if inputs.is_batch():
            return _failed(InvalidRequest(f"async mode answers one request per call; this call holds "
                                          f"{inputs.get_batch_size()} (set batch_size=1)"))
        if self.handler.pooler is not None:
            return await self._embed(inputs)
        job = await self.prepare(inputs.get_batches()[0])
        if job.error is not None:
            return djl.async_output("", True, JSON, job.error.message, job.error.code)
        tracking_id = str(inputs.get_property(TRACKING_ID))
        if job.streaming:
            return self._stream(job, tracking_id)
        return await self._complete(job, tracking_id)

    def _load(self, inputs: Any) -> Any:
        """Load the model (the init call, or a first request without one) and start its engine; None, or the
        error ``Output`` that fails the load."""
        try:
            if not self.handler.initialized:
                self.handler.initialize(djl.configuration(inputs), awaited=True)
            backend = self.handler.backend
            if self.handler.pooler is not None:  # an embedding model: no step loop, requests pool on a thread
                self.engine = self.handler.pooler
                return None
            make = getattr(backend, "make_async_engine", None)
            self._pool = preparation_pool(beside_our_engine=make is None)
            self.engine = make() if make is not None else _engine_thread(self.handler)
        except Exception as exc:  # noqa: BLE001 - the init call's failure is the load's answer
            return self.handler.error_output(exc)
        return None

    def stats(self) -> dict[str, Any]:
        """The engine's counters (an embedding model's pooler has none)."""
        stats = getattr(self.engine, "stats", None)
        return stats() if stats is not None else {}

    async def _publish(self) -> None:
        """DJL's ``[METRICS]`` lines, every ``DJL_INTERVAL`` seconds while requests run, then the idle engine's."""
        while self.running:
            self.handler.djl_metrics.publish(self.stats())
            await asyncio.sleep(DJL_INTERVAL)
        self.handler.djl_metrics.publish(self.stats())
        self._publisher = None

    def cancel(self, tracking_id: str) -> None:
        """End the request ``tracking_id`` now (its client went away); unknown ids (already done) are ignored."""
        queue = self.running.get(tracking_id)
        if queue is not None:
            queue.put_nowait(None)

    async def prepare(self, item: Any) -> Job:
        """The request's job; a large body is parsed and tokenized, and a grammar compiled (within the grammar budgets,
        ``Handler.admit``), off the event loop."""
        loop = asyncio.get_running_loop()
        if len(item.get_as_bytes() or b"") > INLINE_BODY_BYTES:
            job = await loop.run_in_executor(self._pool, self.handler.prepare, item)
        else:
            job = self.handler.prepare(item)
        if job.compiles:
            job = await loop.run_in_executor(self._pool, self.handler.admit, job)
        return job

    async def _embed(self, inputs: Any) -> Any:
        """An embedding request (``option.task=text-embedding``): its vectors, or its own error, as in sync mode."""
        async with self._pooling:
            [(code, body)] = await asyncio.to_thread(answer_batch, inputs.get_batches(), self.handler.pooler,
                                                     self.handler.config)
        if code != 200:
            return djl.async_output("", True, JSON, body, code)
        return djl.async_output(body, True, JSON)

    async def _complete(self, job: Job, tracking_id: str) -> Any:
        body = ""
        async for text in self.texts(job, tracking_id):
            body += text
        if job.error is not None:
            return djl.async_output("", True, JSON, job.error.message, job.error.code)
        return djl.async_output(body, True, job.content_type)

    async def _stream(self, job: Job, tracking_id: str) -> AsyncIterator[Any]:
        async for text in self.texts(job, tracking_id):
            if job.error is not None:
                break
            yield djl.async_output(text[:-1] if text.endswith("\n") else text, job.done, job.content_type)
        if job.error is not None:
            yield djl.async_output("", True, JSON, job.error.message, job.error.code)

    async def texts(self, job: Job, tracking_id: str) -> AsyncIterator[str]:
        """The request's text as it becomes due, until its job is done (an error included). The handler in AWS's vLLM
        container answers its HTTP requests with these texts (``vllm_container/service.py``)."""
        async for events in self._events(job, tracking_id):
            try:
                text = job.take(events)
            except Exception as exc:  # noqa: BLE001 - encoding this request's answer failed: it alone ends
                log_failure(logger, "encoding an async answer failed", exc)
                job.error = ErrorEvent(status_of(exc), f"{type(exc).__name__}: {exc}")
                return
            if text or job.done:
                yield text

    async def _events(self, job: Job, tracking_id: str) -> AsyncIterator[dict[int, list[Event]]]:
        """The engine's events for the job's sequences; a cancellation ends them with a 499. Leaving early (the
        consumer went away, or was cancelled) stops the sequences in the engine."""
        queue: asyncio.Queue = asyncio.Queue()
        self.running[tracking_id] = queue
        self.engine.submit(job.seqs, queue.put_nowait)
        # DJLServing reads [METRICS] lines from its worker; in the vLLM container (no djl_metrics) vLLM's server
        # has its own /metrics.
        if self._publisher is None and getattr(self.handler, "djl_metrics", None) is not None:
            self._publisher = asyncio.get_running_loop().create_task(self._publish(), name="lmi-djl-metrics")
        try:
            while not job.done:
                events = await queue.get()
                if events is None:
                    yield {seq.uid: [ErrorEvent(Cancelled.status, CANCELLED)] for seq in job.seqs}
                    return
                yield events
        finally:
            self.running.pop(tracking_id, None)
            if len(job.results) < len(job.seqs):  # cancelled, failed or left early: nothing more runs for it
                self.engine.cancel(job.seqs)

    async def manage_adapter(self, inputs: Any, action: str) -> Any:
        """DJL's adapter calls, run between two engine steps; the status message as a whole answer."""
        try:
            if self.engine is None:
                raise InvalidRequest("the model is not loaded yet: adapters register after it loads")
            message = await self.engine.call(self.handler.adapter_action, inputs, action)
        except Exception as exc:  # noqa: BLE001 - a bad adapter is its own answer; the base model keeps serving
            return _failed(exc)
        return djl.async_output(dumps({"status": message}), True, JSON)


def _engine_thread(handler: Any) -> Any:
    from .engine_thread import EngineThread

    return EngineThread(handler.new_engine(), asyncio.get_running_loop())


def _failed(exc: Exception) -> Any:
    if not isinstance(exc, HandlerError):
        log_failure(logger, "an async call failed", exc)
    message = str(exc) if isinstance(exc, HandlerError) else f"{type(exc).__name__}: {exc}"
    return djl.async_output("", True, JSON, message, status_of(exc))
