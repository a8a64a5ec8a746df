"""Prompts of an exact token length, and token counting, with the model's own tokenizer.

A prompt of N tokens means N ids as the model receives them: ``len(tokenizer(prompt)["input_ids"])``, special
tokens such as BOS included (what LMI reports as ``prompt_tokens``). Output tokens are counted without special
tokens: ``len(tokenizer(text, add_special_tokens=False)["input_ids"])``. Several prompt variants (different
starting points in the filler text) are cycled, so a server's prefix cache does not see one prompt only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..errors import UsageError

FILLER = (
    "A lighthouse keeper kept a notebook of every ship that passed the cape, the hour it was seen, the "
    "colour of its sails and the direction of the wind. Over forty winters the notebook grew into a shelf "
    "of ledgers, and the ledgers into a record that sailors, merchants and map makers came to read. They "
    "learned which months brought fog, which tides carried timber from the northern forests, and how the "
    "harbour filled with grain after a good summer. The keeper wrote in a small steady hand, numbered each "
    "page, and never skipped a day, not even when storms kept the lamp burning from dusk until dawn. When "
    "the railway reached the coast the ships grew fewer, but the keeper still climbed the stairs each "
    "evening, trimmed the wick, polished the lens and opened a fresh page for whatever the sea would bring."
).split()


class TokenCounter:
    """A Hugging Face tokenizer loaded from a local directory (or hub id) with AutoTokenizer."""

    def __init__(self, name: str, tokenizer: Any):
        self.name, self.tokenizer = name, tokenizer

    @classmethod
    def load(cls, path: str | Path) -> "TokenCounter":
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise UsageError("--tokenizer needs transformers", hint="pip install 'lmi-handlers[hf]'") from None
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError) as exc:
            raise UsageError(f"--tokenizer {path}: cannot load a tokenizer there ({exc})",
                             hint="give a model directory with tokenizer.json / tokenizer_config.json") from None
        return cls(str(path), tokenizer)

    def prompt_tokens(self, text: str) -> int:
        return len(self.tokenizer(text)["input_ids"])

    def output_tokens(self, texts: list[str]) -> list[int]:
        if not texts:
            return []
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def exact_prompt(self, tokens: int, offset: int) -> tuple[str, int]:
        """A prompt of ``tokens`` tokens (or the nearest length below it the tokenizer allows), and its count."""
        special = self.prompt_tokens("")
        if tokens <= special:
            raise UsageError(f"--prompt-tokens {tokens} leaves no room for text: this tokenizer adds {special} "
                             "special token(s)", hint=f"use --prompt-tokens {special + 1} or more")
        words = _words(offset, tokens * 2 + 16)
        ids = self.tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]
        while len(ids) < tokens:  # a tokenizer with very long tokens: add words until the text is long enough
            words += _words(offset + len(words), tokens)
            ids = self.tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]
        below: tuple[str, int] | None = None
        take, direction = tokens - special, 0
        for _ in range(64):  # decode/re-encode is not always a round trip: walk towards the exact count
            text = self.tokenizer.decode(ids[:take]).strip()
            count = self.prompt_tokens(text)
            if count == tokens:
                return text, count
            step = 1 if count < tokens else -1
            if count < tokens and (below is None or count > below[1]):
                below = (text, count)
            if direction == -step or take + step < 1:
                break  # crossed the target: no text has exactly that many tokens
            take, direction = take + step, step
        if below is None:
            raise UsageError(f"cannot build a prompt of {tokens} tokens with tokenizer {self.name}")
        return below


def _words(offset: int, count: int) -> list[str]:
    return [FILLER[(offset + i) % len(FILLER)] for i in range(count)]


def _exact_near(counter: TokenCounter, tokens: int, offset: int, tries: int = 6) -> tuple[str, int]:
    """Some starting points cannot make exactly ``tokens`` tokens (a merge jumps over it): try the next words."""
    found = [counter.exact_prompt(tokens, offset + shift) for shift in range(tries)]
    return next((f for f in found if f[1] == tokens), max(found, key=lambda f: f[1]))


@dataclass(frozen=True)
class PromptSet:
    """The prompts a run cycles through, their token counts (when a tokenizer counted them) and how they were made."""

    prompts: tuple[str, ...]
    token_counts: tuple[int | None, ...]
    description: str


def build_prompts(tokens: int | None, counter: TokenCounter | None, text: str | Sequence[str] | None = None,
                  variants: int = 8) -> PromptSet:
    """``text`` as given (one prompt or several, cycled), else ``variants`` prompts of ``tokens`` tokens (words when
    there is no tokenizer)."""
    if isinstance(text, str) or text:  # "" is a prompt too; an empty list (no --prompt given) is not
        texts = (text,) if isinstance(text, str) else tuple(text)
        counts = tuple(counter.prompt_tokens(t) if counter else None for t in texts)
        return PromptSet(texts, counts, "the --prompt text" if len(texts) == 1 else f"{len(texts)} --prompt texts")
    if tokens is None or tokens < 1:
        raise UsageError(f"--prompt-tokens must be a positive integer, got {tokens}")
    if counter is None:
        prompts = tuple(" ".join(_words(v * 13, tokens)) for v in range(variants))
        return PromptSet(prompts, (None,) * variants, f"{tokens} words of filler text (no tokenizer: token "
                                                       "counts come from the server)")
    made = [_exact_near(counter, tokens, v * 13) for v in range(variants)]
    counts = tuple(c for _, c in made)
    note = "" if all(c == tokens for c in counts) else f" (the tokenizer allowed {sorted(set(counts))})"
    return PromptSet(tuple(p for p, _ in made), counts,
                     f"{tokens} tokens of filler text counted with {counter.name}{note}")
