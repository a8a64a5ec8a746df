"""One request's progress through generation: token ids in, typed events out.

Backends only choose token ids; everything that decides what the client sees - incremental
detokenization, stop sequences, EOS, the token budget - happens here, identically for every
backend and every handler mode.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Collection, Sequence

from .detokenize import IncrementalDetokenizer, StopMatcher
from .events import ErrorEvent, Event, FinishReason, GenerationResult, Token, TokenEvent
from .request import GenerationRequest

_uids = itertools.count(1)


class SequenceState:
    """A prompt being completed. ``backend_state`` and ``sampler_state`` belong to the backend;
    ``num_cached`` (how many of ``all_ids`` the backend's KV cache holds) to the scheduler."""

    def __init__(self, request: GenerationRequest, prompt_ids: Sequence[int], *,
                 decode: Callable[[Sequence[int]], str], eos_ids: Collection[int] = (),
                 special_ids: Collection[int] = (), max_new_tokens: int | None = None, seed: int | None = None):
        self.uid = next(_uids)
        self.request = request
        self.prompt_ids = list(prompt_ids)
        self.max_new_tokens = max_new_tokens or request.stopping.max_new_tokens
        self.seed = seed
        self.generated: list[int] = []
        self.tokens: list[Token] = []
        self.text = ""
        self.finished = False
        self.backend_state: Any = None
        self.sampler_state: Any = None
        #: The grammar matcher of a constrained sequence (``structured/masks.py``), made at its first step.
        self.grammar: Any = None
        self.num_cached = 0
        #: (draft tokens proposed, of which accepted) when the backend speculates for this sequence, else None.
        self.speculation: tuple[int, int] | None = None
        #: The LoRA adapter this sequence runs with (``adapters.Adapter``), None for the base model.
        self.adapter: Any = None
        #: Another choice of the same request (``n`` > 1) whose prompt's KV blocks this one shares, if it can.
        self.fork_of: SequenceState | None = None
        #: The client's W3C trace context headers (``traceparent``...) where tracing is on, and this sequence's span
        #: times while the engine traces it (``tracing.py``).
        self.trace_headers: dict[str, str] | None = None
        self.trace: Any = None
        self._eos_ids = frozenset(eos_ids)
        self._special_ids = frozenset(special_ids) | self._eos_ids
        self._decode = decode
        self._detokenizer = IncrementalDetokenizer(decode, self.prompt_ids)
        self._stops = StopMatcher(request.stopping.stop)

    def __repr__(self) -> str:
        return f"SequenceState(uid={self.uid}, prompt={len(self.prompt_ids)}, generated={len(self.generated)})"

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.generated

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.generated)

    def ids_between(self, start: int, end: int) -> list[int]:
        """``all_ids[start:end]`` without building ``all_ids`` (a decode step needs one token of it)."""
        prompt = len(self.prompt_ids)
        if start >= prompt:
            return self.generated[start - prompt:end - prompt]
        return self.prompt_ids[start:end] + self.generated[:max(0, end - prompt)]

    def append(self, token_id: int, log_prob: float, top: Sequence[tuple[int, float]] = ()) -> list[Event]:
        """Record the next generated token (and ``top``, the most likely alternatives as (id, log probability));
        returns its ``TokenEvent``, plus the result if it was the last."""
        assert not self.finished, "token appended to a finished sequence"
        self.generated.append(token_id)
        is_eos = token_id in self._eos_ids and not self.request.stopping.ignore_eos
        released, reason = "", None
        if is_eos:
            reason = FinishReason.EOS
        else:
            released, stopped = self._stops.feed(self._detokenizer.add(token_id))
            if stopped:
                reason = FinishReason.STOP
            elif len(self.generated) >= self.max_new_tokens:
                reason = FinishReason.LENGTH
        if reason is not None and reason is not FinishReason.STOP:
            tail, stopped = self._stops.feed(self._detokenizer.flush())
            released += tail if stopped else tail + self._stops.flush()
            reason = FinishReason.STOP if stopped else reason
        token = Token(token_id, released, log_prob, special=token_id in self._special_ids,
                      top=tuple((i, self._decode([i]), p) for i, p in top))
        self.tokens.append(token)
        self.text += released
        events: list[Event] = [TokenEvent(token, len(self.generated))]
        if reason is not None:
            self.finished = True
            events.append(self.result(reason))
        return events

    def result(self, reason: FinishReason) -> GenerationResult:
        return GenerationResult(self.text, reason, len(self.generated), len(self.prompt_ids),
                                tuple(self.tokens), self.seed, self.speculation,
                                self._stops.matched if reason is FinishReason.STOP else None)

    def fail(self, code: int, message: str) -> ErrorEvent:
        self.finished = True
        return ErrorEvent(code, message)


@dataclass(frozen=True)
class Chunk:
    """What one step feeds the backend for one sequence: ``seq.all_ids[start:start + len(tokens)]``.

    A new prompt is one chunk from 0 (or from the end of its cached prefix), or several when prefill is
    chunked; a decode step is the last generated token. Only a chunk that reaches the end of the sequence
    (``sample``) gets a next token chosen.
    """

    seq: SequenceState
    start: int
    tokens: Sequence[int]

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    @property
    def sample(self) -> bool:
        return self.end == self.seq.length
