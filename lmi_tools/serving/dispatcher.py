"""One served model: its worker process, its job queue and the loop that feeds the worker.

A dispatcher thread owns the worker and runs the loop DJLServing runs for the model:

* plain models: DJL's batch aggregator - take one job, drain up to ``batch_size - 1`` more, keep
  polling until the batch is full or ``max_batch_delay`` (ms) is spent - then one call, one item per
  request (a single request is sent unwrapped);
* rolling batch: the step loop of ``RollingBatchLoop``, admitting queued requests while there is room;
* DJL's async mode: each request goes to the worker as it is taken from the queue, and a reader thread routes
  the interleaved answers (``async_channel.py``, Java's ``AsyncRequestManager``).

HTTP handlers submit a ``PendingRequest`` and read its events (``Start``, ``Chunk``, ``End``) from an
asyncio queue; the thread pushes them with ``call_soon_threadsafe``. A full queue (``job_queue_size``)
answers 503 at once. A worker that dies or times out is killed and restarted; the requests it had
get a 503, the others carry on.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import queue
import random
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from lmi_handlers.errors import Cancelled, capped
from lmi_handlers.protocol import Input

from .adapters import AdapterRecord, adapter_input, folder_adapters
from .async_channel import AsyncChannel
from .worker.client import LoadFailed, Worker, WorkerDied, WorkerSettings
from .worker.codec import OutputHeader, StreamBroken
from .worker.frontend import RollingBatchLoop, RollingRequest, StepItem, batch_input

logger = logging.getLogger("lmi.model")
BATCH_KEY = re.compile(r"batch_(\d+)\.(.*)")
JSON = {"content-type": "application/json"}


class Status(str, enum.Enum):
    PENDING = "PENDING"
    READY = "READY"
    FAILED = "FAILED"


@dataclass
class Start:
    code: int
    headers: dict[str, str]


@dataclass
class Chunk:
    data: bytes
    #: The answer ends with this chunk (so it can be sent as one body with content-length).
    final: bool = False


@dataclass
class End:
    #: Set when the response failed after it started (a mid-stream error).
    error: str | None = None


class PendingRequest:
    """One HTTP request waiting for, or receiving, its answer."""

    def __init__(self, inputs: Input, loop: asyncio.AbstractEventLoop):
        self.input = inputs
        self.loop = loop
        self.events: asyncio.Queue[Start | Chunk | End] = asyncio.Queue()
        self.started = False
        #: The answer's framing once it started: a mid-answer error is framed to match (an SSE event, else a line).
        self.sse = False
        self.cancelled = False  # the client went away
        self.enqueued_at = time.monotonic()
        #: Called (on the dispatcher thread) with each event as it is emitted: the metrics' timer.
        self.on_event: Callable[[Start | Chunk | End], None] | None = None

    def emit(self, event: Start | Chunk | End) -> None:
        if isinstance(event, Start):
            self.started = True
            self.sse = any(k.lower() == "content-type" and "text/event-stream" in v for k, v in event.headers.items())
        if self.on_event is not None:
            self.on_event(event)
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def answer(self, code: int, headers: dict[str, str], body: bytes) -> None:
        self.emit(Start(code, headers))
        self.emit(Chunk(body, final=True) if body else End())

    def fail(self, code: int, message: str, kind: str = "ServiceUnavailableException") -> None:
        """End the request with an error: a DJL error body if nothing was sent yet, else a final error line (its
        text ``capped``, as every error a client reads)."""
        message = capped(message)
        if not self.started:
            body = {"code": code, "type": kind, "message": message}
            self.answer(code, dict(JSON), json.dumps(body).encode())
        else:
            line = json.dumps({"code": code, "error": message})
            self.emit(Chunk((f"data: {line}\n\n" if self.sse else line + "\n").encode()))
            self.emit(End(message))


@dataclass
class ModelSettings:
    """The front-end settings of one model (from serving.properties, SERVING_* and defaults)."""

    worker: WorkerSettings
    batch_size: int = 1
    max_batch_delay_ms: int = 100
    job_queue_size: int = 1000
    rolling: bool = False
    max_rolling_batch_size: int = 32
    #: Why the worker runs DJL's sync or async engine (``lmi_handlers/mode.py``), for the log.
    mode_reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class QueueFull(Exception):
    pass


class HandlerCall:
    """A call to one of the handler's other functions (``register_adapter``...), run between two steps."""

    def __init__(self, inputs: Input):
        self.inputs = inputs
        self.code, self.body = 503, b""
        self.done = threading.Event()

    def finish(self, code: int, body: bytes) -> None:
        self.code, self.body = code, body
        self.done.set()


class ServedModel:
    """One model's job queue and the dispatcher thread that feeds its worker (``worker``: tests pass a fake)."""

    def __init__(self, name: str, url: str, settings: ModelSettings, worker: Worker | None = None):
        self.name, self.url, self.settings = name, url, settings
        self.status = Status.PENDING
        self.failure: str | None = None
        self.worker = worker or Worker(name, settings.worker)
        self.jobs: queue.Queue[PendingRequest] = queue.Queue(maxsize=settings.job_queue_size)
        self.restarts = 0
        #: Requests of the dynamic batch the worker is running now (a rolling batch counts its own).
        self.in_flight = 0
        self.rolling_batch = RollingBatchLoop(settings.max_rolling_batch_size)
        #: DJL's async mode: the requests in flight on the worker.
        # (With rolling batch on too, Java's rolling batch steps the async engine: no channel then.)
        self.channel = AsyncChannel(self.worker, self._deliver_item) if settings.worker.async_mode and \
            not settings.rolling else None
        #: The adapters registered on this model (as Java keeps them): re-registered whenever a worker starts.
        self.adapters: dict[str, AdapterRecord] = folder_adapters(settings.worker.model_dir,
                                                                   settings.worker.init_properties)
        self._calls: queue.Queue[HandlerCall] = queue.Queue()
        self._stop = threading.Event()
        self._stop_reason = ""
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"model-{name}", daemon=True)

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def wait_loaded(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    def stop(self, reason: str | None = None) -> None:
        """Stop the worker; the requests queued or running end at once with a 503 that says ``reason``."""
        self._stop_reason = reason or self._stop_reason or f"model {self.name} was unloaded"
        self._stop.set()
        self._thread.join(timeout=10)
        self.worker.stop()
        self._fail_active(self._stop_reason)
        while not self.jobs.empty():
            self.jobs.get_nowait().fail(503, self._stop_reason)

    def halt(self, reason: str) -> None:
        """Kill the worker now (``stop`` ends the requests); no restart follows."""
        self._stop_reason = reason
        self._stop.set()
        self.worker.kill()

    def submit(self, pending: PendingRequest) -> None:
        try:
            self.jobs.put_nowait(pending)
        except queue.Full:
            raise QueueFull(f"model {self.name}: job queue is full ({self.settings.job_queue_size} requests); "
                            "retry later") from None

    def call_handler(self, inputs: Input, timeout: float) -> tuple[int, bytes]:
        """Run ``inputs`` (a handler call other than inference) on the worker between two steps, and return its
        status and body: 503 when the model cannot run it."""
        call = HandlerCall(inputs)
        self._calls.put(call)
        if not call.done.wait(timeout):
            return 503, json.dumps({"error": f"model {self.name} did not answer within {timeout:g} s"}).encode()
        return call.code, call.body

    def describe(self) -> dict[str, Any]:
        worker = {"id": self.worker.pid, "status": "READY" if self.status is Status.READY else self.status.value,
                  "restarts": self.restarts}
        info = {"modelName": self.name, "modelUrl": self.url, "status": self.status.value,
                "batchSize": self.settings.batch_size, "maxBatchDelayMillis": self.settings.max_batch_delay_ms,
                "queueSize": self.settings.job_queue_size, "queueLength": self.jobs.qsize(),
                "rollingBatch": self.settings.rolling, "maxRollingBatchSize": self.settings.max_rolling_batch_size,
                "activeRequests": self.channel.requests() if self.channel else len(self.rolling_batch.active),
                "workerGroups": [{"workers": [worker]}]}
        if self.failure:
            info["error"] = self.failure
        return info

    def _load(self) -> bool:
        self.status = Status.PENDING
        if self.settings.mode_reason:
            logger.info("[%s] DJL's %s engine: %s", self.name, "async" if self.settings.worker.async_mode else "sync",
                        self.settings.mode_reason)
        try:
            self.worker.start()
        except LoadFailed as exc:
            self.status, self.failure = Status.FAILED, str(exc)
            logger.error("[%s] %s", self.name, exc)
            return False
        if self.channel is not None:
            self.channel.start()
        try:
            self._register_adapters()
        except WorkerDied as exc:
            self.status, self.failure = Status.FAILED, f"the worker died registering adapters: {exc}"
            return False
        self.status, self.failure = Status.READY, None
        return True

    def _register_adapters(self) -> None:
        """Register every adapter this model has (at start: those of its ``adapters/`` folder) on the new worker;
        one that fails is logged and dropped, and the base model serves on."""
        for record in list(self.adapters.values()):
            code, body = self._call_worker(adapter_input("register", record))
            if code >= 300:
                logger.error("[%s] adapter %s from %s was not registered: %s", self.name, record.name, record.src,
                             body.decode("utf-8", "replace"))
                self.adapters.pop(record.name, None)

    def _call_worker(self, inputs: Input) -> tuple[int, bytes]:
        if self.channel is not None:  # its answer comes through the channel's reader
            return self.channel.call(inputs, self.settings.worker.predict_timeout)
        header = self.worker.predict(inputs)
        if header.is_stream:
            for _ in self.worker.stream():
                pass
            return 500, b'{"error": "the handler streamed its answer to an adapter call"}'
        return header.code, _body(header) if header.content is not None and header.content.size() else b""

    def _run_calls(self) -> None:
        while True:
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                call.finish(*self._call_worker(call.inputs))
            except WorkerDied as exc:
                call.finish(503, json.dumps({"error": f"model {self.name}: {exc}"}).encode())
                self._recover(str(exc))

    def _run(self) -> None:
        loaded = self._load()
        self._ready.set()
        if not loaded:
            self._drain_failed()
            return
        step = self._async_step if self.channel else self._rolling_step if self.settings.rolling else self._plain_step
        while not self._stop.is_set():
            if self.worker.exit_code is not None:
                self._exited()
            self._run_calls()
            step()

    def _drain_failed(self) -> None:
        while not self._stop.is_set():
            while not self._calls.empty():
                self._calls.get_nowait().finish(503, json.dumps({"error": f"model {self.name} failed to load"}).encode())
            try:
                self.jobs.get(timeout=0.2).fail(503, f"model {self.name} failed to load (details in the server log)")
            except queue.Empty:
                pass

    def _died(self, exc: WorkerDied) -> str:
        """What the requests of a worker that died are told: why it was stopped, if it was."""
        return self._stop_reason if self._stop.is_set() else f"model {self.name}: {exc}"

    def _exited(self) -> None:
        """A worker that ended by itself between two calls (the vllm backend's does once vLLM's engine stopped) is
        started again before it gets more requests, as Java restarts a Python process that died."""
        reason = f"model {self.name}: the worker process exited with code {self.worker.exit_code}"
        self._fail_active(reason)
        self.worker.kill()  # what it left behind: processes it started, its socket
        self._recover(reason)

    def _fail_active(self, reason: str) -> None:
        """The requests the worker holds (a rolling batch's, or those in flight in async mode) end with a 503."""
        for item in self.rolling_batch.fail_all(503, reason):
            item.request.key.fail(503, item.error or reason)
        for key in self.channel.fail_all() if self.channel else ():
            key.fail(503, reason)

    def _recover(self, reason: str) -> None:
        if self._stop.is_set():  # the worker was stopped on purpose: no restart
            return
        logger.warning("[%s] %s", self.name, reason)
        self.restarts += 1
        if not self._load():
            self._drain_failed()

    def _next_job(self, timeout: float) -> PendingRequest | None:
        try:
            job = self.jobs.get(timeout=timeout)
        except queue.Empty:
            return None
        if job.cancelled:
            job.answer(Cancelled.status, dict(JSON), b"")
            return None
        return job

    # --- plain models: dynamic batching -----------------------------------------------------

    def _plain_step(self) -> None:
        first = self._next_job(0.2)
        if first is None:
            return
        batch = [first]
        deadline = time.monotonic() + self.settings.max_batch_delay_ms / 1000
        while len(batch) < self.settings.batch_size:
            job = self._next_job(max(0.0, deadline - time.monotonic()))
            if job is not None:
                batch.append(job)
            elif time.monotonic() >= deadline:
                break
        self.in_flight = len(batch)
        try:
            header = self.worker.predict(batch_input([job.input for job in batch]))
            self._deliver(batch, header)
        except WorkerDied as exc:
            for job in batch:
                job.fail(503, self._died(exc))
            self._recover(str(exc))
        finally:
            self.in_flight = 0

    def _deliver(self, batch: list[PendingRequest], header: OutputHeader) -> None:
        headers = {k: str(v) for k, v in header.properties.items()}
        if header.is_stream:
            if len(batch) != 1:
                for _ in self.worker.stream():
                    pass
                for job in batch:
                    job.fail(400, "Batch output size mismatch: a streamed output answers one request", "TranslateException")
                return
            self._relay_stream(batch[0], header.code, headers)
            return
        assert header.content is not None
        if len(batch) == 1 or header.code >= 300:
            body = bytes(_body(header)) if header.content.size() else b""
            for job in batch:
                job.answer(header.code, headers, body)
            return
        items = _batch_items(header, len(batch))
        if items is None:
            for job in batch:
                job.fail(400, f"Batch output size mismatch: {header.content.size()} items for {len(batch)} "
                              "requests", "TranslateException")
            return
        for job, body in zip(batch, items):
            job.answer(header.code, headers, body)

    def _relay_stream(self, job: PendingRequest, code: int, headers: dict[str, str]) -> None:
        job.emit(Start(code, headers))
        try:
            for chunk in self.worker.stream():
                if self._stop.is_set():  # unloaded mid-answer: end it now rather than when the worker is gone
                    job.fail(503, self._stop_reason)
                    return
                if not job.cancelled:
                    job.emit(Chunk(chunk))
        except StreamBroken as exc:
            job.fail(424, str(exc))
            return
        except WorkerDied as exc:
            job.fail(503, self._died(exc))
            self._recover(str(exc))
            return
        job.emit(End())

    # --- rolling batch ----------------------------------------------------------------------

    def _rolling_step(self) -> None:
        loop = self.rolling_batch
        while loop.room:
            job = self._next_job(0.0 if loop.active else 0.2)
            if job is None:
                break
            loop.add(RollingRequest(job.input, seed=random.randrange(2**31), key=job))
        # A request that was never sent can simply leave; a running one is cancelled in the handler.
        loop.active = [r for r in loop.active if r.started or not r.key.cancelled]
        for request in loop.active:
            request.cancelled = request.key.cancelled
        if not loop.active:
            return
        try:
            header = self.worker.predict(loop.next_input())
            if header.is_stream:
                raise WorkerDied("the handler streamed an answer to a rolling-batch step")
            assert header.content is not None
            items = loop.apply(header.code, header.properties,
                               [header.content.value_at(i) for i in range(header.content.size())])
        except WorkerDied as exc:
            for item in loop.fail_all(503, self._died(exc)):
                item.request.key.fail(503, item.error or "worker died")
            self._recover(str(exc))
            return
        for item in items:
            self._deliver_step(item)

    # --- DJL's async mode -------------------------------------------------------------------

    def _async_step(self) -> None:
        channel = self.channel
        assert channel is not None
        if channel.dead.is_set():
            reason = f"model {self.name}: the worker process died"
            self._fail_active(reason)
            self.worker.kill()
            self._recover(reason)
            return
        job = self._next_job(0.2)
        try:
            if job is not None:
                channel.send(job.input, job)
            channel.cancel_gone(lambda key: key.cancelled)
            channel.read_stats()
        except WorkerDied:
            channel.dead.set()  # the reader sees it too; the next turn restarts the worker

    def _deliver_step(self, item: StepItem) -> None:
        self._deliver_item(item.request.key, item)

    def _deliver_item(self, job: PendingRequest, item: StepItem) -> None:
        """One answer (a rolling-batch step's item, or an async answer) for its request, as Java's ``Request``
        appends it."""
        if item.code is not None:
            # Java sets this status if nothing was sent yet, and appends the error as the last chunk.
            if not job.started:
                job.emit(Start(item.code, {"content-type": "application/json"}))
                job.emit(Chunk(json.dumps({"code": item.code, "error": capped(item.error or "")}).encode(),
                               final=True))
            else:
                job.fail(item.code, item.error or "")
            return
        if not job.started and (item.data or item.last):
            job.emit(Start(200, dict(item.headers)))
        if item.data:
            job.emit(Chunk(item.data.encode("utf-8"), final=item.last))
        elif item.last:
            job.emit(End())


def _body(header: OutputHeader) -> bytes:
    """DJL sends the item named ``data``, else the first one."""
    assert header.content is not None
    body = header.content.get("data")
    return bytes(body if body is not None else header.content.value_at(0))


def _batch_items(header: OutputHeader, size: int) -> list[bytes] | None:
    assert header.content is not None
    items: dict[int, bytes] = {}
    for i in range(header.content.size()):
        match = BATCH_KEY.fullmatch(header.content.key_at(i) or "")
        if match is None:
            return None
        items[int(match.group(1))] = bytes(header.content.value_at(i))
    if sorted(items) != list(range(size)):
        return None
    return [items[i] for i in range(size)]
