"""The generation engine: admission, one backend step for everything active, results as events.

Every handler mode runs through it - a single request, a dynamic batch, a stream, and each
rolling-batch step - so they all behave the same. Sequences wait in arrival order until the
backend has room; the ones admitted at a step are prefilled together, everything already running
decodes together, and finished sequences leave at once.

A backend failure fails every sequence of that step (with the failure's status) and nothing
else: the engine resets the backend and keeps serving.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Iterator, Sequence

from .backends.base import Backend
from .errors import status_of
from .events import Event
from .sequence import SequenceState

logger = logging.getLogger(__name__)


class Engine:
    def __init__(self, backend: Backend, max_prefill_tokens: int | None = None):
        self.backend = backend
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[SequenceState] = deque()
        self.running: list[SequenceState] = []

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def add(self, seq: SequenceState) -> None:
        self.waiting.append(seq)

    def cancel(self, seq: SequenceState) -> None:
        """Stop a sequence now (its client went away) and free its slot."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.running.remove(seq)
            self.backend.release(seq)
        seq.finished = True

    def reset(self) -> None:
        for seq in self.running:
            self.backend.release(seq)
            seq.finished = True
        for seq in self.waiting:
            seq.finished = True
        self.running, self.waiting = [], deque()
        self.backend.reset()

    def _admit(self) -> list[SequenceState]:
        admitted: list[SequenceState] = []
        budget = self.max_prefill_tokens
        room = self.backend.max_batch_size - len(self.running)
        while self.waiting and len(admitted) < room:
            size = len(self.waiting[0].prompt_ids)
            if budget is not None and admitted and size > budget:
                break  # the rest waits for the next step; one prompt always fits
            admitted.append(self.waiting.popleft())
            if budget is not None:
                budget -= size
        return admitted

    def step(self) -> dict[int, list[Event]]:
        """Advance every active sequence by one token; returns the events of each, by uid."""
        new = self._admit()
        if not new and not self.running:
            return {}
        active = self.running + new
        try:
            chosen = self.backend.step(new, self.running)
        except Exception as exc:  # noqa: BLE001 - every backend failure is reported per sequence
            logger.exception("generation step failed for %d sequences", len(active))
            code, message = status_of(exc), f"generation failed: {exc}"
            events: dict[int, list[Event]] = {seq.uid: [seq.fail(code, message)] for seq in active}
            for seq in active:
                self.backend.release(seq)
            self.running = []
            self.backend.reset()
            return events
        events = {}
        for seq in active:
            token_id, log_prob = chosen[seq.uid]
            try:
                events[seq.uid] = seq.append(token_id, log_prob)
            except Exception as exc:  # noqa: BLE001 - detokenizing one sequence failed: it alone ends
                logger.exception("detokenizing sequence %d failed", seq.uid)
                events[seq.uid] = [seq.fail(status_of(exc), f"generation failed: {type(exc).__name__}: {exc}")]
        self.running = [seq for seq in active if not seq.finished]
        for seq in active:
            if seq.finished:
                self.backend.release(seq)
        return events

    def run(self, seqs: Sequence[SequenceState]) -> Iterator[dict[int, list[Event]]]:
        """Steps until every one of ``seqs`` has finished (the non-rolling modes)."""
        for seq in seqs:
            self.add(seq)
        while not all(seq.finished for seq in seqs):
            yield self.step()
