"""DJLServing's rolling-batch (continuous batching) step protocol, on the handler side.

Java calls ``handle`` once per generation step with every active request in one batched Input:
requests ``[0, A)`` are the ones already known (A = those still active after the previous step, in
the same order), ``[A, N)`` are new and carry their body and headers; known ones carry an empty
body. The answer has exactly N items, in order, each ``binary_encode({"data", "last"})`` - or with
``code``/``error`` for a request that failed - plus a ``batch_<i>_Content-Type`` header property.
Finished requests leave the list (Java drops them too), so both sides stay in step.
``reset_rollingbatch`` (sent after a failed step) clears everything.

A new request whose body is large is parsed and tokenized on a thread while the others keep stepping, and so is a
burst's beyond its first ``INLINE_REQUESTS``, and so is the grammar of a constrained one compiled
(``job.compile_grammars``: it may take up to the grammar budget's time); until its job is ready its items are empty
(Java skips empty data). A request that fails to parse,
tokenize, compile, decode or encode ends alone, with its own status.

Two extensions of our local server's: it marks a request whose client disconnected with the property
``lmi_cancel=true`` so that its slot is freed at once (DJLServing never sends it), and it reads the engine's
counters (KV blocks, prefix cache, preemptions) from the step answer's ``lmi_engine_stats`` property (JSON) for
its ``/metrics``. Java drops properties without the ``batch_`` prefix, so DJLServing ignores it; there the same
numbers go out as DJL's ``[METRICS]`` lines (``gauges.DjlMetrics``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Callable

from . import djl
from .errors import BackendError, Cancelled, capped, log_failure
from .events import Event
from .gauges import DjlMetrics
from .job import Job

logger = logging.getLogger(__name__)

CANCEL_PROPERTY = "lmi_cancel"
STATS_PROPERTY = "lmi_engine_stats"
#: How long an idle step waits for a request being tokenized before answering "nothing yet".
IDLE_WAIT = 0.05
#: Bodies up to this size are prepared within the step (a few milliseconds); larger ones on the pool.
INLINE_BODY_BYTES = 32 * 1024
#: New requests prepared within one step: the rest of a burst (a hundred arriving at once) goes to the pool too.
INLINE_REQUESTS = 16
#: How much nicer than the process the preparing threads are beside vLLM's engine (``preparation_pool``).
PREPARE_NICENESS = 10


def preparation_pool(beside_our_engine: bool, workers: int = 2) -> ThreadPoolExecutor:
    """The threads requests are prepared on (parsed, tokenized, their grammars compiled) beside the step loop (the
    rolling batch's, and the async path's), each yielding the CPU to it.

    Beside our engine (torch's workers in this process) a thread runs in Linux's idle class: a long prompt being
    tokenized or a grammar being compiled runs while the step loop leaves a CPU free (between its products) instead of
    preempting a torch worker in the middle of one, which holds up the whole step; a nice value alone still took its
    share of the CPU from torch's workers, and a stream beside hostile grammars waited several times longer
    (docs/serving.md). vLLM's engine runs in processes of its own that keep their CPUs busy while they wait for work,
    so beside it a thread in the idle class would hardly ever run: there it is only ``PREPARE_NICENESS`` nicer."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lmi-prepare",
                              initializer=_idle_class if beside_our_engine else _nicer)


def _idle_class() -> None:
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux: a nice value instead, where the OS allows one
        _nicer()


def _nicer() -> None:
    try:
        base = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, base + PREPARE_NICENESS))
    except (AttributeError, OSError):  # not allowed: the threads keep the process's priority
        pass


def _truthy(value: Any) -> bool:
    return str(value).lower() == "true" if value is not None else False


class _Entry:
    """One request as Java sees it: its job once parsed and tokenized (off the step loop, in ``pending``)."""

    def __init__(self, pending: Future[Job]):
        self.pending = pending
        self.job: Job | None = None
        self.cancelled = False

    @property
    def done(self) -> bool:
        return self.cancelled or (self.job is not None and self.job.done)

    @property
    def content_type(self) -> str:
        return self.job.content_type if self.job is not None else "application/json"

    def item(self, events: dict[int, list[Event]]) -> dict[str, Any]:
        if self.cancelled:
            return {"data": "", "last": True, "code": Cancelled.status, "error": "request cancelled: the client went away"}
        if self.job is None:
            return {"data": "", "last": False}  # still being tokenized; Java skips empty data
        data = self.job.take(events)
        if self.job.error is not None:
            return {"data": "", "last": True, "code": self.job.error.code, "error": capped(self.job.error.message)}
        return {"data": data, "last": self.job.done}


class RollingBatch:
    """The handler's ordered active list. ``prepare`` (parse, tokenize) and ``compile_job`` (grammars) never raise
    (a failure is a rejected job); a large body, and any grammar, is prepared on a small thread pool, so a long
    prompt is tokenized and a grammar compiled while the other requests keep stepping."""

    def __init__(self, engine: Any, prepare: Callable[[Any], Job], compile_job: Callable[[Job], Job] = lambda job: job,
                 workers: int = 2, djl_metrics: DjlMetrics | None = None, beside_our_engine: bool = True):
        self.engine = engine
        self.prepare = prepare
        self.compile_job = compile_job
        self.djl_metrics = djl_metrics
        self.active: list[_Entry] = []
        self.pool = preparation_pool(beside_our_engine, workers)

    def reset(self) -> None:
        self.engine.reset()
        self.active = []

    def step(self, inputs: Any) -> Any:
        if _truthy(inputs.get_property("reset_rollingbatch")):
            self.reset()
        items = inputs.get_batches()
        if len(items) < len(self.active):
            known = len(self.active)
            self.reset()
            raise BackendError(f"rolling batch out of step: {len(items)} requests sent but {known} were active")
        for n, item in enumerate(items[len(self.active):]):
            self.active.append(_Entry(self._submit(item, inline=n < INLINE_REQUESTS)))
        for entry, item in zip(self.active, items):
            if not entry.done and _truthy(item.get_property(CANCEL_PROPERTY)):
                for seq in entry.job.seqs if entry.job is not None else ():
                    self.engine.cancel(seq)
                entry.cancelled = True
        self._admit_prepared()
        events = {} if self.engine.idle else self.engine.step()
        output = djl.new_output()
        for i, entry in enumerate(self.active):
            output.add(djl.binary_encode(self._item(entry, events)), key="data", batch_index=i)
            output.add_property(f"batch_{i}_Content-Type", entry.content_type)
        stats = self.engine.stats()
        output.add_property(STATS_PROPERTY, json.dumps(stats, separators=(",", ":")))
        if self.djl_metrics is not None:
            self.djl_metrics.publish(stats)
        self.active = [entry for entry in self.active if not entry.done]
        return output

    def _submit(self, item: Any, inline: bool) -> Future[Job]:
        if not inline or len(item.get_as_bytes() or b"") > INLINE_BODY_BYTES:
            return self.pool.submit(lambda: self.compile_job(self.prepare(item)))
        job = self.prepare(item)
        if job.compiles:
            return self.pool.submit(self.compile_job, job)
        done: Future[Job] = Future()
        done.set_result(job)
        return done

    def _admit_prepared(self) -> None:
        """Jobs whose preparation finished join the engine; with nothing to generate, wait a moment for one."""
        waiting = [entry.pending for entry in self.active if entry.job is None and not entry.cancelled]
        if waiting and self.engine.idle:
            wait(waiting, timeout=IDLE_WAIT, return_when=FIRST_COMPLETED)
        for entry in self.active:
            if entry.job is None and not entry.cancelled and entry.pending.done():
                entry.job = entry.pending.result()
                for seq in entry.job.seqs if entry.job.error is None else ():
                    self.engine.add(seq)

    def _item(self, entry: _Entry, events: dict[int, list[Event]]) -> dict[str, Any]:
        try:
            return entry.item(events)
        except Exception as exc:  # noqa: BLE001 - encoding one request's answer failed: that request alone ends
            log_failure(logger, "encoding a rolling-batch answer failed", exc)
            for seq in entry.job.seqs if entry.job is not None else ():
                if not seq.finished:
                    self.engine.cancel(seq)
            entry.job = Job.rejected(exc)
            return entry.item({})
