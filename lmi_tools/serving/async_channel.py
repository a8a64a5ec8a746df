"""The front end's side of DJL's async mode: Java's ``AsyncRequestManager`` (and ``Request.addResponse``).

Every request goes to the worker at once, alone, tagged with a fresh ``request_tracking_id`` (and the ``handler``
property, as ``PyProcess.sendRequest`` adds it); a reader thread takes the answers as they come, interleaved, and
routes each by its tracking id. An answer whose status is 200 carries the binary-encoded map ``{data, last[, code,
error]}`` as its first item: ``data`` is appended to the client's response, ``last`` ends it, ``code`` turns it into
``{"code", "error"}`` with that status. Any other status ends the request with that status and the error
``Async Inference Failure <message>`` (Java writes it as its ``Output`` object's JSON). An answer for an unknown id (a request already ended) is
logged and dropped. There is no per-request timeout, as in Java.

Three things Java does not have: a request whose client went away gets a second message ``lmi_cancel=<its id>`` (the
handler ends it in its engine; the worker's answer to that message is dropped); adapter calls wait here for their
answer (Java's management API answers before the worker does); and while requests run, and once after the last, a
call ``lmi_engine_stats`` every ``STATS_EVERY`` seconds reads the engine's counters for ``/metrics``
(``engine_stats``, as a rolling batch's steps bring them).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from lmi_handlers.protocol import Input
from lmi_handlers.rolling import CANCEL_PROPERTY, STATS_PROPERTY

from .worker.client import Worker, WorkerDied
from .worker.codec import OutputHeader, binary_decode
from .worker.frontend import StepItem, engine_stats

logger = logging.getLogger("lmi.model")
TRACKING_ID = "request_tracking_id"
#: Seconds between two reads of the engine's counters while requests run.
STATS_EVERY = 1.0


@dataclass(eq=False)
class Tracked:
    """One request in flight: the caller's handle on it, and whether its cancellation went out."""

    key: Any
    cancel_sent: bool = False


class Call:
    """A handler call other than inference (an adapter's registration) waiting for its one answer."""

    cancelled = False  # nobody waits on it to go away

    def __init__(self) -> None:
        self.code, self.body = 503, b""
        self.done = threading.Event()

    def answer(self, item: StepItem) -> None:
        self.code, self.body = item.code or 200, (item.error if item.code else item.data).encode()
        self.done.set()

    def fail(self, code: int, message: str) -> None:
        self.answer(StepItem(None, "", True, {}, code, message))


class StatsCall(Call):
    """A read of the engine's counters: the answer goes to ``keep`` (None where it holds none)."""

    def __init__(self, keep: Callable[[dict[str, float | str] | None], None]):
        super().__init__()
        self.keep = keep

    def answer(self, item: StepItem) -> None:
        self.keep(None if item.code else engine_stats(item.data))

    def fail(self, code: int, message: str) -> None:
        pass  # the worker died or stopped before it answered: nothing was read


class AsyncChannel:
    """One worker's requests in flight. ``deliver(key, item)`` is called on the reader thread with each answer of a
    request (``call`` waits for its own)."""

    def __init__(self, worker: Worker, deliver: Callable[[Any, StepItem], None]):
        self.worker = worker
        self.deliver = deliver
        self.active: dict[str, Tracked] = {}
        self._lock = threading.Lock()  # the dispatcher thread sends, the reader thread receives
        #: Set by the reader when the worker died; the dispatcher restarts it.
        self.dead = threading.Event()
        #: The engine's latest counters and when (``time.time()``) they came; a handler that answers none (not ours)
        #: is not asked again.
        self.engine_stats: dict[str, float | str] = {}
        self.engine_stats_at = 0.0
        self._stats_read_at = 0.0  # when the counters were last asked for
        #: Requests ran since that read: one more read is due (a short request may start and end between two).
        self._stats_due = False
        self._stats_answered = True

    def start(self) -> None:
        """After the worker's init call: read its answers from now on."""
        self.dead.clear()
        threading.Thread(target=self._read, name=f"async-read-{self.worker.name}", daemon=True).start()

    def send(self, inputs: Input, key: Any, handler: str = "handle") -> None:
        """Send a request now; raises ``WorkerDied``."""
        tracking_id = str(uuid.uuid4())
        properties = {**inputs.properties, TRACKING_ID: tracking_id}
        properties.setdefault("handler", handler)
        with self._lock:
            self.active[tracking_id] = Tracked(key)
            self.worker.send(Input(properties, inputs.content))
            self._stats_due = self._stats_due or not isinstance(key, Call)

    def call(self, inputs: Input, timeout: float) -> tuple[int, bytes]:
        """Send a handler call (``inputs`` name its ``handler``) and wait for its answer: its status and body."""
        call = Call()
        self.send(inputs, call, handler=str(inputs.properties.get("handler", "handle")))
        if not call.done.wait(timeout):
            return 503, f'{{"error": "no answer to the call within {timeout:g} s"}}'.encode()
        return call.code, call.body

    def cancel_gone(self, gone: Callable[[Any], bool]) -> None:
        """Tell the handler about requests whose client went away (``gone(key)``), once each."""
        with self._lock:
            for tracking_id, tracked in self.active.items():
                if not tracked.cancel_sent and gone(tracked.key):
                    tracked.cancel_sent = True
                    cancel = Input({CANCEL_PROPERTY: tracking_id, TRACKING_ID: str(uuid.uuid4()), "handler": "handle"})
                    self.worker.send(cancel)

    def requests(self) -> int:
        """How many requests are in flight (handler calls, such as a read of the counters, are not requests)."""
        with self._lock:
            return sum(not isinstance(tracked.key, Call) for tracked in self.active.values())

    def read_stats(self) -> None:
        """Ask for the engine's counters, every ``STATS_EVERY`` seconds while requests are in flight and once after
        the last; raises ``WorkerDied``."""
        if self._stats_answered and self._stats_due and time.monotonic() - self._stats_read_at >= STATS_EVERY:
            self._stats_read_at, self._stats_due = time.monotonic(), self.requests() > 0
            self.send(Input({STATS_PROPERTY: "true"}), StatsCall(self._keep_stats))

    def _keep_stats(self, stats: dict[str, float | str] | None) -> None:
        if stats is None:
            self._stats_answered = False
        else:
            self.engine_stats, self.engine_stats_at = stats, time.time()

    def fail_all(self) -> list[Any]:
        """Forget every request in flight (the worker died or stopped); their keys."""
        with self._lock:
            keys = [tracked.key for tracked in self.active.values()]
            self.active = {}
        return keys

    def _read(self) -> None:
        while True:
            try:
                header = self.worker.receive()
            except WorkerDied:
                self.dead.set()
                return
            tracking_id = header.properties.get(TRACKING_ID, "")
            item = answer_item(header)
            with self._lock:
                tracked = self.active.get(tracking_id)
                if tracked is not None and item.last:
                    del self.active[tracking_id]
            if tracked is None:
                logger.debug("[%s] an answer for no request in flight (%s) is dropped", self.worker.name, tracking_id)
            elif isinstance(tracked.key, Call):
                tracked.key.answer(item)
            else:
                self.deliver(tracked.key, item)


def answer_item(header: OutputHeader) -> StepItem:
    """What one answer of the async engine means for its request (``AsyncRequestManager.addOutput``)."""
    headers = {key: str(value) for key, value in header.properties.items()}
    if header.code != 200:
        return StepItem(None, "", True, headers, header.code, f"Async Inference Failure {header.message}")
    try:
        item = binary_decode(bytes(header.content.value_at(0))) if header.content and header.content.size() else {}
    except (EOFError, ValueError, UnicodeDecodeError):
        item = {}
    if "data" not in item and "last" not in item:
        return StepItem(None, "", True, headers, 500, "the handler's answer is not DJL's {data, last} map")
    code = item.get("code")
    return StepItem(None, item.get("data", ""), item.get("last", "").lower() == "true", headers,
                    int(code) if code else None, item.get("error"))
