"""Reasoning models: the ``<think>...</think>`` part of an answer, read apart from the answer itself.

``option.reasoning_parser`` names the convention, as vLLM names its parsers:

* ``deepseek_r1``: the answer starts inside the reasoning (DeepSeek-R1's template opens it in the prompt, and the
  model may or may not write ``<think>`` again); ``</think>`` ends it. An answer cut short before ``</think>`` is
  all reasoning.
* ``qwen3``: the answer reasons only inside ``<think>...</think>``: when the prompt leaves a ``<think>`` open (a
  template that starts the thinking) or the answer opens one itself. Otherwise it is all content (a template that
  turned thinking off writes ``<think></think>`` into the prompt).

Both tags must be single tokens of the model's vocabulary (vLLM's parsers ask the same), which the load checks.
Chat answers carry the reasoning in ``reasoning_content`` (and ``reasoning``, vLLM's newer name), streamed or not;
tool calls are read from the content only.

Structured output applies after the reasoning: the grammar a constraint compiles to is prefixed by "any text, then
the end token" (``lead``), so the model reasons freely and the constraint holds from ``</think>`` on. On the vllm
backend vLLM's own structured outputs wait for the end of the reasoning instead (its ``reasoning_parser``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import ConfigError
from ..values import parse_choice

#: The conventions, by vLLM's parser names: (start tag, end tag, an answer starts inside the reasoning).
PARSERS = {"deepseek_r1": ("<think>", "</think>", True), "qwen3": ("<think>", "</think>", False)}
#: The options this module reads (``option.<key>``).
KEYS = ("reasoning_parser",)


@dataclass(frozen=True)
class Reasoning:
    """One model's reasoning convention, with its tags' token ids; ``started`` for one request: its prompt left
    the reasoning open, so the answer starts inside it."""

    name: str
    start: str
    end: str
    start_id: int
    end_id: int
    started: bool

    def for_prompt(self, prompt: str) -> "Reasoning":
        """This convention for a request whose rendered prompt is ``prompt``."""
        opened = prompt.rfind(self.start) > prompt.rfind(self.end)
        return dataclasses.replace(self, started=self.started or opened)

    def split(self, text: str) -> tuple[str | None, str | None]:
        """A whole answer as (reasoning, content): the reasoning is "" when it ended at once and None when the
        answer did not reason; the content is None when empty."""
        reader = ReasoningReader(self)
        reasoning, content = reader.feed(text)
        tail_reasoning, tail_content = reader.flush()
        return (reasoning + tail_reasoning) if reader.reasoned else None, (content + tail_content) or None

    def lead(self) -> str:
        """The Lark rule body a constrained answer's grammar starts with: the reasoning, then the end token."""
        reasoning = f"<[{self.start_id}]>? REASONING <[{self.end_id}]> WS"
        return reasoning if self.started else f"(<[{self.start_id}]> REASONING <[{self.end_id}]> WS)?"


class ReasoningReader:
    """Splits an answer as it streams: ``feed`` takes the next text and returns (reasoning, content) due now,
    holding back what may be the start of a tag; ``flush`` returns the rest at the end."""

    def __init__(self, reasoning: Reasoning):
        self.reasoning = reasoning
        #: "start": nothing decided yet; "reasoning", "content".
        self.state = "start"
        self.held = ""
        #: Whether the answer reasoned at all (an empty reasoning included).
        self.reasoned = reasoning.started

    def feed(self, text: str) -> tuple[str, str]:
        reasoning, content = [], []
        text = self.held + text
        self.held = ""
        while text:
            if self.state == "content":
                content.append(text)
                break
            if self.state == "start":
                start = self.reasoning.start
                stripped = text.lstrip()
                if not stripped or (len(stripped) < len(start) and start.startswith(stripped)):
                    self.held = text  # whitespace, or what may become the start tag
                    break
                if stripped.startswith(start):
                    self.state, text, self.reasoned = "reasoning", stripped[len(start):], True
                else:
                    self.state = "reasoning" if self.reasoning.started else "content"
                continue
            end = self.reasoning.end
            at = text.find(end)
            if at >= 0:
                reasoning.append(text[:at])
                self.state, text = "content", text[at + len(end):]
                continue
            keep = _partial_suffix(text, end)
            reasoning.append(text[:len(text) - keep])
            self.held = text[len(text) - keep:]
            break
        return "".join(reasoning), "".join(content)

    def flush(self) -> tuple[str, str]:
        held, self.held = self.held, ""
        if self.state == "reasoning" or (self.state == "start" and self.reasoning.started):
            return held, ""
        return "", held


def _partial_suffix(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` could begin ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


def reasoning_for(props: Mapping[str, Any], tokenizer: Any) -> Reasoning | None:
    """``option.reasoning_parser`` for a model whose HF tokenizer is ``tokenizer``; a ``ConfigError`` when its
    vocabulary lacks the tags as single tokens."""
    name = parse_choice(props, "reasoning_parser", "", PARSERS)
    if not name:
        return None
    start, end, started = PARSERS[name]
    ids = []
    for tag in (start, end):
        found = tokenizer.convert_tokens_to_ids(tag) if tokenizer is not None else None
        if not isinstance(found, int) or found == getattr(tokenizer, "unk_token_id", None):
            raise ConfigError("reasoning_parser", name, f"this model's vocabulary has no {tag} token; the {name} "
                              "parser reads reasoning between single <think> and </think> tokens")
        ids.append(found)
    return Reasoning(name, start, end, ids[0], ids[1], started)


def after_reasoning(grammar: str, lead: str) -> str:
    """The llguidance grammar ``grammar`` (a ``{"grammars": [...]}`` document) preceded by ``lead``."""
    document = json.loads(grammar)
    inner = document["grammars"]
    name = inner[0].get("name") or "constraint"
    inner[0] = {**inner[0], "name": name}
    lark = (f"start: {lead} @{name}\nREASONING: /(?s:.*)/\n"
            # a few newlines after </think>, as reasoning models write them
            "WS: /[ \\t\\r\\n]{0,4}/\n")
    return json.dumps({**document, "grammars": [{"lark_grammar": lark}, *inner]})
