"""The contract every backend implements, sized for continuous batching.

A backend owns the model and its KV cache slots. ``step`` admits new sequences (prefill) and
advances every running one by one token, in one call; the engine decides who is admitted and
turns the chosen tokens into events. Backends never format anything.
"""

from __future__ import annotations

from typing import Collection, Protocol, Sequence

from ..sequence import SequenceState


class Tokenizer(Protocol):
    eos_ids: frozenset[int]
    special_ids: frozenset[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def render_chat(self, messages: Sequence[tuple[str, str]]) -> str:
        """The prompt text for chat messages (the tokenizer's chat template, generation prompt added)."""
        ...

    def encode_chat(self, messages: Sequence[tuple[str, str]]) -> list[int]: ...


class Backend(Protocol):
    name: str
    tokenizer: Tokenizer
    #: Longest sequence (prompt + generated tokens) the backend can hold.
    max_sequence_length: int
    #: How many sequences can be active at once.
    max_batch_size: int
    #: Backend-specific option keys it reads from the init properties.
    option_keys: Collection[str]

    def step(self, new: Sequence[SequenceState], running: Sequence[SequenceState]) -> dict[int, tuple[int, float]]:
        """Prefill ``new`` and decode one token for each of ``running``.

        Returns ``{sequence uid: (token id, log probability)}`` for every sequence of both lists.
        """
        ...

    def release(self, seq: SequenceState) -> None:
        """Free whatever the sequence holds (its cache slot)."""
        ...

    def reset(self) -> None:
        """Drop every sequence (after a failed step)."""
        ...
