"""The generation engine: admission, one backend step for everything active, results as events.

Every handler mode runs through it - a single request, a dynamic batch, a stream, and each
rolling-batch step - so they all behave the same. The scheduler (``scheduler.py``) decides what each
step feeds the backend (admission by free KV blocks, chunked prefill, preemption); the backend runs
those chunks in one step; finished sequences leave at once.

One sequence's own failure - its grammar, its sampling, its adapter's rows (the backend answers its
``SequenceFailed`` in place of a token, ``backends/rows.py``), its detokenizing or stop checks - ends that sequence
alone, with its own status and message; the others continue unchanged. A failure of the step as a whole (the
model's) fails every sequence of that step, telling them only what failed, never any request's content: the engine
resets the backend and keeps serving.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Iterator, Sequence

from .backends.base import Backend
from .errors import SequenceFailed, log_failure, status_of, step_failure
from .events import Event
from .gauges import adapter_names
from .scheduler import Scheduler
from .sequence import Chunk, SequenceState

logger = logging.getLogger(__name__)
STATS_EVERY = 30.0  # seconds between two counter lines in the log while requests run


class Engine:
    def __init__(self, backend: Backend, max_prefill_tokens: int | None = None, chunked_prefill: bool = False,
                 by_priority: bool = False):
        self.backend = backend
        self.scheduler = Scheduler(backend, max_prefill_tokens, chunked_prefill, by_priority)
        self._logged = time.monotonic()
        self.waiting: deque[SequenceState] = deque()
        self.running: list[SequenceState] = []
        #: OpenTelemetry spans per sequence (``tracing.Tracer``), when tracing is on.
        self.tracer: Any = None

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def add(self, seq: SequenceState) -> None:
        if self.tracer is not None:
            self.tracer.begin(seq)
        self.scheduler.enqueue(self.waiting, seq)

    def cancel(self, seq: SequenceState) -> None:
        """Stop a sequence now (its client went away) and free its slot."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.running.remove(seq)
            self.backend.release(seq)
        seq.finished = True
        self._traced_end(seq, "cancelled: the client went away")

    def reset(self) -> None:
        for seq in self.running:
            self.backend.release(seq)
            seq.finished = True
        for seq in self.waiting:
            seq.finished = True
        for seq in (*self.running, *self.waiting):
            self._traced_end(seq, "the engine was reset")
        self.running, self.waiting = [], deque()
        self.backend.reset()

    def stats(self) -> dict[str, int | float | str]:
        """Counters for the server's log and metrics: sequences, KV blocks and their use (``gauges.py``: what
        gateways read), prefix hits, preemptions, the adapters running and waiting where LoRA is on, and the draft
        acceptance rate when the backend speculates. Plain numbers and strings, read from this engine alone."""
        out: dict[str, int | float | str] = {"running": len(self.running), "waiting": len(self.waiting),
                                             "preemptions": self.scheduler.preemptions}
        kv = getattr(self.backend, "kv", None)
        if kv is not None:
            out.update(kv.stats())
            out["kv_cache_usage"] = round(kv.used / kv.num_blocks, 4)
        else:  # a slot per sequence, each sized for a whole sequence
            out["kv_cache_usage"] = round(len(self.running) / max(self.backend.max_batch_size, 1), 4)
        if self.scheduler.max_adapters is not None:
            out.update(max_lora=self.scheduler.max_adapters, running_lora_adapters=adapter_names(self.running),
                       waiting_lora_adapters=adapter_names(self.waiting))
        speculation = getattr(self.backend, "speculation_stats", None)
        if speculation is not None:
            out.update(speculation())
        return out

    def step(self) -> dict[int, list[Event]]:
        """Run one step for everything scheduled; returns the events of each sequence that got a token, by uid."""
        chunks = self.scheduler.schedule(self.waiting, self.running)
        if not chunks:
            return {}
        if self.tracer is not None:
            self._traced(chunks, admitted=True)
        try:
            chosen = self.backend.step(chunks)
        except Exception as exc:  # noqa: BLE001 - every backend failure is reported per sequence
            active = self.running
            log_failure(logger, f"generation step failed for {len(active)} sequences", exc)
            code, message = status_of(exc), step_failure(exc)
            events: dict[int, list[Event]] = {seq.uid: [seq.fail(code, message)] for seq in active}
            for seq in active:
                self.backend.release(seq)
                self._traced_end(seq, message)
            self.running = []
            self.backend.reset()
            return events
        events = {}
        kv = getattr(self.backend, "kv", None)
        for chunk in chunks:
            seq = chunk.seq
            emitted = 0
            choice = chosen.get(seq.uid)
            if isinstance(choice, SequenceFailed):  # its keys may not be written: nothing of it is cached
                events[seq.uid] = [fail_alone(seq, choice)]
                self.backend.release(seq)
                continue
            if chunk.sample:
                emitted, events[seq.uid] = self._append(seq, choice)
            # A speculating backend returns several tokens: all but the last were verified inside this
            # step's forward, so their keys are cached; a rejected draft's slots are simply written over.
            seq.num_cached = chunk.end + max(emitted - 1, 0)
            if kv is not None:
                kv.computed(seq)
            if seq.finished:
                self.backend.release(seq)
        self.running = [seq for seq in self.running if not seq.finished]
        if self.tracer is not None:
            self._traced(chunks)
        if kv is not None and kv.events is not None:
            kv.events.flush()  # this step's KV events, as one batch
        if time.monotonic() - self._logged >= STATS_EVERY:
            self._logged = time.monotonic()
            logger.info("engine: %s", " ".join(f"{k}={v}" for k, v in self.stats().items()))
        return events

    def _traced(self, chunks: list[Chunk], admitted: bool = False) -> None:
        """Span times: a sequence's first chunk is its admission; after the step, its first token and its end."""
        now = time.time_ns()
        for chunk in chunks:
            times = chunk.seq.trace
            if times is None:
                continue
            if admitted:
                times.admitted = times.admitted or now
            else:
                self.tracer.progress(chunk.seq, now)

    def _traced_end(self, seq: SequenceState, error: str) -> None:
        if self.tracer is not None:
            self.tracer.end(seq, error)

    @staticmethod
    def _append(seq: SequenceState, picks: tuple | list[tuple]) -> tuple[int, list[Event]]:
        """Append one step's token(s) until the sequence finishes; returns (tokens appended, events). A pick is
        (token id, log probability), or with the most likely alternatives (``Backend.step``)."""
        events: list[Event] = []
        appended = 0
        for pick in picks if isinstance(picks, list) else [picks]:
            appended += 1
            try:
                events += seq.append(*pick)
            except Exception as exc:  # noqa: BLE001 - detokenizing one sequence failed: it alone ends
                events.append(fail_alone(seq, SequenceFailed("detokenizing", exc)))
            if seq.finished:
                break
        return appended, events

    def run(self, seqs: Sequence[SequenceState]) -> Iterator[dict[int, list[Event]]]:
        """Steps until every one of ``seqs`` has finished (the non-rolling modes)."""
        for seq in seqs:
            self.add(seq)
        while not all(seq.finished for seq in seqs):
            yield self.step()


def fail_alone(seq: SequenceState, failure: SequenceFailed) -> Event:
    """``seq`` ends alone with its own failure (logged with the request's own uid, bounded)."""
    log_failure(logger, f"sequence {seq.uid} failed alone in {failure.stage}", failure.cause)
    return seq.fail(failure.status, str(failure))
