"""A backend with no weights: deterministic tokens, delays and failures on demand.

Used by tests, demos and server load tests. Its tokenizer is byte-level (token = byte + 3, so
multi-byte characters span several tokens, exercising incremental detokenization), and every
sequence generates the bytes of ``option.scripted_text`` in a cycle.

A prompt can steer its own sequence with directives:

* ``[[eos@N]]``: the N-th generated token is EOS;
* ``[[fail@N]]``, ``[[oom@N]]``: the step that would produce the N-th token raises (a backend failure,
  or ``MemoryError``), which fails every sequence of that step;
* ``[[crash@N]]``: the worker process exits; ``[[hang@N]]``: the step never returns;
* ``[[delay=MS]]``: each step that includes this sequence sleeps MS milliseconds.

It has the shape of a backend package for the registry (``Options``, ``KEYS``, ``available``,
``INSTANCE_FAMILIES``, ``load``); it has no load plan and no model to size (``NEEDS_MODEL``).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..config import HandlerConfig, parse_bool, parse_int
from ..errors import BackendError
from ..sequence import Chunk, SequenceState
from .base import ANY_FAMILY
from ..structured.tools import with_tool_prompt

PAD, BOS, EOS = 0, 1, 2
OFFSET = 3
DEFAULT_TEXT = " The quick brown fox jumps over the lazy dog \u2014 \u00fcn\u00efc\u00f6d\u00e9 \u2713."
DIRECTIVE = re.compile(r"\[\[(eos|fail|oom|crash|hang)@(\d+)\]\]|\[\[delay=(\d+)\]\]")
KEYS = frozenset({"scripted_text", "scripted_step_delay_ms", "scripted_load_seconds", "scripted_fail_load",
                  "scripted_max_sequence_length"})
#: It runs on any host's CPU.
INSTANCE_FAMILIES = (ANY_FAMILY,)
#: No weights: nothing for lmi validate to size.
NEEDS_MODEL = False


@dataclass(frozen=True)
class Options:
    text: str = DEFAULT_TEXT
    step_delay_ms: int = 0
    load_seconds: int = 0
    fail_load: bool = False
    max_sequence_length: int = 4096

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> "Options":
        return cls(text=str(props.get("scripted_text") or DEFAULT_TEXT),
                   step_delay_ms=parse_int(props, "scripted_step_delay_ms", 0, minimum=0) or 0,
                   load_seconds=parse_int(props, "scripted_load_seconds", 0, minimum=0) or 0,
                   fail_load=parse_bool(props, "scripted_fail_load", False),
                   max_sequence_length=parse_int(props, "scripted_max_sequence_length", 4096, minimum=2) or 4096)


def available() -> str | None:
    return None


def load(deployment: Any) -> "ScriptedBackend":
    return ScriptedBackend(deployment.config, deployment.options)


class ScriptedTokenizer:
    eos_ids = frozenset({EOS})
    special_ids = frozenset({PAD, BOS, EOS})

    def encode(self, text: str) -> list[int]:
        return [BOS] + [b + OFFSET for b in text.encode("utf-8")]

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i - OFFSET for i in ids if i >= OFFSET).decode("utf-8", errors="replace")

    def render_chat(self, messages: Sequence[tuple[str, str]], tools: Any = None) -> str:
        turns = [{"role": r, "content": c} for r, c in messages]
        if tools is not None and tools.active:
            turns = with_tool_prompt(turns, tools)
        return "".join(f"<|{t['role']}|>{t['content']}\n" for t in turns) + "<|assistant|>"

    def encode_chat(self, messages: Sequence[tuple[str, str]], tools: Any = None) -> list[int]:
        return self.encode(self.render_chat(messages, tools))


class ScriptedBackend:
    name = "scripted"
    kv = None
    chunked_prefill = False

    def __init__(self, config: HandlerConfig, options: Options):
        self.tokenizer = ScriptedTokenizer()
        self.script = [b + OFFSET for b in options.text.encode("utf-8")]
        self.step_delay = options.step_delay_ms / 1000
        self.max_sequence_length = options.max_sequence_length
        self.max_batch_size = config.max_rolling_batch_size if config.rolling else max(
            config.batch_size, config.max_rolling_batch_size)
        time.sleep(options.load_seconds)
        if options.fail_load:
            raise BackendError("scripted backend asked to fail while loading (option.scripted_fail_load=true)")

    def step(self, batch: Sequence[Chunk]) -> dict[int, tuple[int, float]]:
        delay = self.step_delay
        chosen = {}
        for seq in (chunk.seq for chunk in batch):
            directives = self._directives(seq)
            index = len(seq.generated) + 1  # the token this step produces
            delay = max(delay, directives.get("delay", 0) / 1000)
            action = next((name for name in ("fail", "oom", "crash", "hang") if directives.get(name) == index), None)
            if action == "fail":
                raise BackendError(f"scripted failure at token {index} (prompt directive [[fail@{index}]])")
            if action == "oom":
                raise MemoryError(f"scripted out-of-memory at token {index}")
            if action == "crash":
                os._exit(3)
            if action == "hang":
                time.sleep(10**6)
            token = EOS if directives.get("eos") == index else self.script[(index - 1) % len(self.script)]
            chosen[seq.uid] = (token, -1.0)
        if delay:
            time.sleep(delay)
        return chosen

    def _directives(self, seq: SequenceState) -> dict[str, int]:
        if seq.backend_state is None:
            found = {}
            for match in DIRECTIVE.finditer(self.tokenizer.decode(seq.prompt_ids)):
                name, at, delay = match.groups()
                if name:
                    found[name] = int(at)
                else:
                    found["delay"] = int(delay)
            seq.backend_state = found
        return seq.backend_state

    def release(self, seq: SequenceState) -> None:
        seq.backend_state = None

    def reset(self) -> None:
        pass
