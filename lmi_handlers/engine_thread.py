"""Our engine's step loop on a thread of its own, for callers on an event loop (DJL's async engine).

``engine.Engine`` is not thread-safe, so only this thread touches it: requests, cancellations and other calls (an
adapter's registration) arrive on a queue and run between two steps. After each step the events go back to the event
loop in one callback, which hands each request its own. The thread sleeps on the queue while nothing runs, and the
event loop never waits for a step: its coroutines only wait on their own queues. Requests that arrive together join
the same steps, so the scheduler batches across concurrent requests as it does in a rolling batch.

The surface (``submit``, ``cancel``, ``call``, ``stats``) is what ``async_service.py`` drives; vLLM's async engine
offers the same one (``backends/vllm/async_engine.py``).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Any, Callable, Sequence

from .errors import log_failure, status_of, step_failure
from .events import ErrorEvent, Event, GenerationResult
from .sequence import SequenceState

logger = logging.getLogger(__name__)

#: Receives a request's events (``{uid: [event, ...]}``) on the event loop's thread.
Deliver = Callable[[dict[int, list[Event]]], None]


class EngineThread:
    """``engine`` (our ``Engine``) stepped on a daemon thread; ``loop`` is the event loop the answers go back to."""

    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop):
        self.engine = engine
        self.loop = loop
        self._inbox: queue.SimpleQueue[tuple[str, Any, Any]] = queue.SimpleQueue()
        self._sinks: dict[int, Deliver] = {}  # the engine thread's own: which request each sequence belongs to
        #: The engine's counters, taken on its thread after each change (the engine is not thread-safe).
        self._stats = engine.stats()
        self._thread = threading.Thread(target=self._run, name="lmi-engine", daemon=True)
        self._thread.start()

    # --- the event loop's side ---------------------------------------------------------------------------------

    def submit(self, seqs: Sequence[SequenceState], deliver: Deliver) -> None:
        """Start ``seqs``; their events reach ``deliver`` on the event loop until each has its terminal event."""
        self._inbox.put(("add", list(seqs), deliver))

    def cancel(self, seqs: Sequence[SequenceState]) -> None:
        """Stop ``seqs`` (their client went away) and free their slots; nothing more is delivered for them."""
        self._inbox.put(("cancel", list(seqs), None))

    async def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` on the engine's thread, between two steps (it may touch the model)."""
        future = self.loop.create_future()
        self._inbox.put(("call", (function, args), future))
        return await future

    def stats(self) -> dict[str, int | float | str]:
        """The engine's counters as of its latest step (or request added or cancelled while it was idle)."""
        return self._stats

    # --- the engine's thread -----------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._take(block=self.engine.idle)  # asleep while nothing runs
            if self.engine.idle:
                self._stats = self.engine.stats()
                continue
            try:
                events = self.engine.step()
            except Exception as exc:  # noqa: BLE001 - the engine reports a backend's failure itself; anything else
                # fails what ran, never the thread, and tells them only what failed (``errors.step_failure``)
                log_failure(logger, "an engine step failed", exc)
                events = {seq.uid: [seq.fail(status_of(exc), step_failure(exc))] for seq in self.engine.running}
                self.engine.reset()
            self._stats = self.engine.stats()  # before the answers go: a request that ended no longer counts
            if events and not self._send(events):
                return

    def _take(self, block: bool) -> None:
        """Everything on the queue (waiting for the first item when ``block``)."""
        while True:
            try:
                kind, what, reply = self._inbox.get(block=block)
            except queue.Empty:
                return
            block = False
            if kind == "add":
                for seq in what:
                    self._sinks[seq.uid] = reply
                    self.engine.add(seq)
            elif kind == "cancel":
                for seq in what:
                    if self._sinks.pop(seq.uid, None) is not None and not seq.finished:
                        self.engine.cancel(seq)
            else:
                self._answer(reply, *what)

    def _answer(self, future: asyncio.Future, function: Callable[..., Any], args: tuple) -> None:
        try:
            result, failure = function(*args), None
        except Exception as exc:  # noqa: BLE001 - the caller's await raises it
            result, failure = None, exc
        self.loop.call_soon_threadsafe(_settle, future, result, failure)

    def _send(self, events: dict[int, list[Event]]) -> bool:
        """Hand this step's events to their requests, in one callback; False once the event loop is gone."""
        routed: dict[int, tuple[Deliver, dict[int, list[Event]]]] = {}
        for uid, mine in events.items():
            sink = self._sinks.get(uid)
            if sink is None:
                continue  # cancelled meanwhile
            routed.setdefault(id(sink), (sink, {}))[1][uid] = mine
            if _terminal(mine):
                del self._sinks[uid]
        try:
            self.loop.call_soon_threadsafe(_deliver_all, list(routed.values()))
        except RuntimeError:  # the event loop closed: the worker is shutting down
            return False
        return True


def _terminal(events: list[Event]) -> bool:
    return any(isinstance(event, (GenerationResult, ErrorEvent)) for event in events)


def _deliver_all(routed: list[tuple[Deliver, dict[int, list[Event]]]]) -> None:
    for deliver, events in routed:
        deliver(events)


def _settle(future: asyncio.Future, result: Any, failure: BaseException | None) -> None:
    if future.cancelled():
        return
    if failure is not None:
        future.set_exception(failure)
    else:
        future.set_result(result)
