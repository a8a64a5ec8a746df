"""Pure text helpers for streaming: incremental detokenization and stop-sequence matching."""

from __future__ import annotations

from typing import Callable, Sequence

# Prompt tokens decoded together with the first generated ones, so that tokenizers which drop a
# leading space at the start of a decode (SentencePiece) still produce " Hello", not "Hello".
PROMPT_CONTEXT_TOKENS = 6


class IncrementalDetokenizer:
    """Turns token ids into text pieces whose concatenation is the decoded text.

    Text is released only when the decode of the new tokens grew and does not end in U+FFFD: a
    trailing replacement character may be the first bytes of a multi-byte character that the next
    token completes (the prefix/read-offset method of TGI's ``decode_token``).
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], prompt_ids: Sequence[int] = ()):
        self._decode = decode
        self._ids = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix = 0
        self._read = len(self._ids)

    def add(self, token_id: int) -> str:
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        new_text = self._decode(self._ids[self._prefix:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return new_text[len(prefix_text):]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (at the end of generation)."""
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        new_text = self._decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return new_text[len(prefix_text):]


class StopMatcher:
    """Releases text while guaranteeing that no stop sequence reaches the client, even partly.

    The longest tail of the text that is still the beginning of some stop sequence is held back
    until the next piece decides it. When a stop sequence completes, everything before it is
    released and generation ends; the stop sequence itself is never emitted.
    """

    def __init__(self, stops: Sequence[str]):
        self._stops = [s for s in stops if s]
        self._held = ""
        #: The stop sequence that ended the text, once one has.
        self.matched: str | None = None

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text to release now, whether a stop sequence completed)."""
        if not self._stops:
            return text, False
        buffer = self._held + text
        hits = [(i, stop) for stop in self._stops if (i := buffer.find(stop)) >= 0]
        if hits:
            self._held = ""
            at, self.matched = min(hits)
            return buffer[:at], True
        keep = self._held_tail(buffer)
        self._held = buffer[len(buffer) - keep:] if keep else ""
        return buffer[:len(buffer) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _held_tail(self, buffer: str) -> int:
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if stop.startswith(buffer[len(buffer) - size:]):
                    longest = size
                    break
        return longest
