"""The contract every backend implements, sized for continuous batching.

A backend owns the model and its KV cache. ``step`` runs one batch of chunks (``sequence.Chunk``:
prompts or pieces of prompts to prefill, last tokens to decode) in one call and chooses the next token
of every chunk that reaches its sequence's end; the scheduler decides what goes in a step and the engine
turns the chosen tokens into events. Backends never format anything.

A backend with a paged KV pool exposes it as ``kv`` (``paged_cache.BlockManager``: admission by free
blocks, preemption, prefix reuse) and may take chunks that start mid-prompt (``chunked_prefill``);
one without (``kv = None``) holds one slot per sequence and always gets whole prompts from 0.

A backend whose engine brings its own scheduler and step loop (vllm, ``STEP_LOOP`` in the registry) has
``make_engine()``, which returns an object with ``engine.Engine``'s surface (``add``, ``cancel``, ``reset``,
``idle``, ``step``, ``run``, ``stats``); the handler runs that instead of our engine, and ``step`` below is never
called. A backend that honours
sampling fields beyond the common ones lists them in ``request_fields`` (``schemas.OFF_VALUES`` names them); the
others refuse a request that sets one. One that enforces structured output says so (``structured_output``), and one
with tool-call parsers of its own offers them as ``tool_call_parser(name, calling)`` (vllm: vLLM's parsers read an
``auto`` answer; the others get ``structured.tools``'s).

``DeviceMemory`` is what a backend's load plan (``plan`` in its package, see ``registry.py``) is told about the
device: the runtime measures it after the weights load, ``lmi validate`` states it for an instance.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from ..errors import ConfigError

from ..sequence import Chunk, SequenceState


class Tokenizer(Protocol):
    eos_ids: frozenset[int]
    special_ids: frozenset[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def render_chat(self, messages: Sequence[tuple[str, str]], tools: Any = None) -> str:
        """The prompt text for chat messages (the tokenizer's chat template, generation prompt added), with the
        request's tools (``structured.tools.ToolCalling``) when it has any."""
        ...

    def encode_chat(self, messages: Sequence[tuple[str, str]], tools: Any = None) -> list[int]: ...


class Backend(Protocol):
    name: str
    tokenizer: Tokenizer
    #: Longest sequence (prompt + generated tokens) the backend can hold.
    max_sequence_length: int
    #: How many sequences can be active at once.
    max_batch_size: int
    #: The paged KV pool's block manager, or None (one slot per sequence, sized by max_batch_size).
    kv: Any
    #: Whether ``step`` takes chunks that start after 0 (chunked prefill, prefix hits, recompute).
    chunked_prefill: bool

    def step(self, batch: Sequence[Chunk]) -> dict[int, tuple[int, float] | list[tuple[int, float]]]:
        """Run ``batch``; returns ``{sequence uid: (token id, log probability)}`` for every chunk whose
        ``sample`` is true; for a sequence that asks for ``top_logprobs``, (token id, log probability, the most
        likely (token id, log probability) pairs, most likely first). A backend that speculates may answer a list of them for a sequence (the tokens it
        verified in this step, in order): the engine appends them until the sequence finishes."""
        ...

    def release(self, seq: SequenceState) -> None:
        """Free whatever the sequence holds (its cache slot)."""
        ...

    def reset(self) -> None:
        """Drop every sequence (after a failed step)."""
        ...


#: In a package's ``INSTANCE_FAMILIES``: it runs on any instance.
ANY_FAMILY = "*"


@dataclass(frozen=True)
class DeviceMemory:
    """The device a model runs on: ``kind`` (``cpu``, ``cuda`` or ``neuron``), the bytes of one device (None: not
    bounded by one, as on the CPU) and the bytes the weights already hold there."""

    kind: str
    total: int | None = None
    used: int = 0


def check_model_files(model_id: str) -> None:
    """A local model without config.json would otherwise fail deep inside transformers with a misleading hint
    (about sentencepiece, for a missing tokenizer); name the real cause instead."""
    if os.path.isdir(model_id) and not os.path.isfile(os.path.join(model_id, "config.json")):
        raise ConfigError("model_id", model_id, "this directory has no config.json; it needs the model's "
                          "config.json, tokenizer and weights (set option.model_id to where they are; lmi validate "
                          "checks this before deploying)")


def split_batch(batch: Sequence[Chunk]) -> tuple[list[SequenceState], list[SequenceState]]:
    """(new, running) for a slot backend: whole prompts from 0 are new, the rest decode one token."""
    new = [chunk.seq for chunk in batch if chunk.start == 0]
    running = [chunk.seq for chunk in batch if chunk.start > 0]
    return new, running
