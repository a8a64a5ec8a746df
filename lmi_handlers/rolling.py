"""DJLServing's rolling-batch (continuous batching) step protocol, on the handler side.

Java calls ``handle`` once per generation step with every active request in one batched Input:
requests ``[0, A)`` are the ones already known (A = those still active after the previous step, in
the same order), ``[A, N)`` are new and carry their body and headers; known ones carry an empty
body. The answer has exactly N items, in order, each ``binary_encode({"data", "last"})`` - or with
``code``/``error`` for a request that failed - plus a ``batch_<i>_Content-Type`` header property.
Finished requests leave the list (Java drops them too), so both sides stay in step.
``reset_rollingbatch`` (sent after a failed step) clears everything.

One extension: our local server marks a request whose client disconnected with the property
``lmi_cancel=true`` so that its slot is freed at once; DJLServing never sends it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from . import djl
from .errors import BackendError, HandlerError
from .events import Event
from .job import Job

logger = logging.getLogger(__name__)

CANCEL_PROPERTY = "lmi_cancel"
CANCELLED = 499  # nginx's "client closed request": nobody reads it, but the last item always says why


def _truthy(value: Any) -> bool:
    return str(value).lower() == "true" if value is not None else False


class _Entry:
    """One request as Java sees it: a job, or an error found while parsing it."""

    def __init__(self, job: Job | None = None, error: HandlerError | None = None):
        self.job, self.error = job, error
        self.cancelled = False

    @property
    def done(self) -> bool:
        return self.error is not None or self.cancelled or (self.job is not None and self.job.done)

    @property
    def content_type(self) -> str:
        if self.job is None or self.job.error is not None:
            return "application/json"
        return self.job.content_type

    def item(self, events: dict[int, list[Event]]) -> dict[str, Any]:
        if self.error is not None:
            return {"data": "", "last": True, "code": self.error.status, "error": str(self.error)}
        if self.cancelled or self.job is None:
            return {"data": "", "last": True, "code": CANCELLED, "error": "request cancelled: the client went away"}
        data = self.job.take(events)
        if self.job.error is not None:
            return {"data": "", "last": True, "code": self.job.error.code, "error": self.job.error.message}
        return {"data": data, "last": self.job.done}


class RollingBatch:
    def __init__(self, engine: Any, prepare: Callable[[Any], Job]):
        self.engine = engine
        self.prepare = prepare
        self.active: list[_Entry] = []

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
        for item in items[len(self.active):]:
            self.active.append(self._entry(item))
        for entry, item in zip(self.active, items):
            if entry.job is not None and not entry.done and _truthy(item.get_property(CANCEL_PROPERTY)):
                for seq in entry.job.seqs:
                    self.engine.cancel(seq)
                entry.cancelled = True
        events = {} if self.engine.idle else self.engine.step()
        output = djl.new_output()
        for i, entry in enumerate(self.active):
            output.add(djl.binary_encode(entry.item(events)), key="data", batch_index=i)
            output.add_property(f"batch_{i}_Content-Type", entry.content_type)
        self.active = [entry for entry in self.active if not entry.done]
        return output

    def _entry(self, item: Any) -> _Entry:
        try:
            job = self.prepare(item)
        except HandlerError as exc:
            return _Entry(error=exc)
        for seq in job.seqs:
            self.engine.add(seq)
        return _Entry(job=job)
