"""Bytes to messages: whole JSON bodies, JSON lines, server-sent events. Sans-IO, fed chunk by chunk.

Chunks can split a line (and a multi-byte character) anywhere: the SageMaker event stream cuts PayloadParts
at arbitrary byte offsets. So bytes are buffered, only complete ``\\n``-terminated lines are decoded (as
UTF-8, per line, never per chunk), and the remainder is flushed when the stream ends
(reference/sagemaker.md §5.1). The framings are the runtime's own (``lmi_handlers.encoding.Framing``).
"""

from __future__ import annotations

from lmi_handlers.encoding import Framing


def framing_for(content_type: str | None) -> Framing:
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind == "text/event-stream":
        return Framing.SSE
    if kind in ("application/jsonlines", "application/jsonl", "application/x-ndjson", "application/x-jsonlines",
                "application/json-lines"):
        return Framing.JSONLINES
    return Framing.JSON


class LineSplitter:
    """Complete lines out of arbitrary chunks; ``\\r\\n`` and ``\\n`` both end a line."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[str]:
        self._buffer += data
        end = self._buffer.rfind(b"\n")
        if end < 0:
            return []
        complete = bytes(self._buffer[:end])
        del self._buffer[:end + 1]
        return [line.decode("utf-8").rstrip("\r") for line in complete.split(b"\n")]

    def flush(self) -> list[str]:
        """What is left when the stream ends: a last line without its newline, if any."""
        rest = bytes(self._buffer).decode("utf-8").rstrip("\r")
        self._buffer.clear()
        return [rest] if rest.strip() else []


class SseDecoder:
    """Server-sent events (the WHATWG format): ``data:`` lines up to a blank line make one event's data.

    ``event:``, ``id:``, ``retry:`` fields and ``:`` comments are read and dropped: the APIs benchmarked here
    put everything in ``data``.
    """

    def __init__(self) -> None:
        self._data: list[str] = []

    def lines(self, lines: list[str]) -> list[str]:
        """The data of every event these lines complete."""
        events = []
        for line in lines:
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            if name == "data":
                self._data.append(value[1:] if value.startswith(" ") else value)
        return events

    def flush(self) -> list[str]:
        events, self._data = (["\n".join(self._data)] if self._data else []), []
        return events
