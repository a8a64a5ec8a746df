"""Reading one answer, chunk by chunk, into an ``Answer`` (sans-IO: the caller feeds the bytes and the times)."""

from __future__ import annotations

import json
from typing import Iterable, Iterator, Mapping

from .framing import Framing, LineSplitter, SseDecoder, framing_for
from .messages import READERS, Answer, Api, error_message


class AnswerReader:
    """Feed it the body as it arrives (``feed(bytes, now)``), then ``finish(now)``; times are the caller's."""

    def __init__(self, api: Api, content_type: str | None, status: int = 200):
        self.on_object, self.on_body = READERS[api]
        self.status = status
        self.framing = framing_for(content_type)
        self.answer = Answer()
        self._body = bytearray()
        self._lines = LineSplitter()
        self._sse = SseDecoder() if self.framing is Framing.SSE else None

    @property
    def whole_body(self) -> bool:
        return self.framing is Framing.JSON or not 200 <= self.status < 300

    def feed(self, data: bytes, now: float) -> None:
        if self.whole_body:
            self._body += data
            return
        try:
            lines = self._lines.feed(data)
        except UnicodeDecodeError as exc:
            self.answer.fail(f"the stream is not UTF-8: {exc}")
            return
        self._messages(lines, now)

    def finish(self, now: float) -> Answer:
        if not 200 <= self.status < 300:
            self.answer.fail(f"HTTP {self.status}: {self._body_message()}")
        elif self.framing is Framing.JSON:
            try:
                obj = json.loads(bytes(self._body).decode("utf-8"))
            except ValueError:
                self.answer.fail(f"the answer is not JSON: {bytes(self._body[:200])!r}")
            else:
                self.on_body(self.answer, obj, now)
        else:
            self._messages(self._last_line(), now)
            if self._sse is not None:
                self._objects(self._sse.flush(), now)
        return self.answer

    def _last_line(self) -> list[str]:
        """A last line without its newline counts only when it is whole: a stream cut inside a line (or a
        character) failed, whatever it says."""
        try:
            lines = self._lines.flush()
            payload = lines[0].strip().removeprefix("data:").strip() if lines else ""
            if payload and payload != "[DONE]" and not payload.startswith(":"):
                json.loads(payload)
            return lines
        except ValueError:  # UnicodeDecodeError included
            self.answer.fail("the stream ended in the middle of a line (truncated line)")
            return []

    def _messages(self, lines: list[str], now: float) -> None:
        payloads = self._sse.lines(lines) if self._sse is not None else lines
        self._objects(payloads, now)

    def _objects(self, payloads: list[str], now: float) -> None:
        for payload in payloads:
            payload = payload.strip()
            if not payload or payload == "[DONE]":
                continue
            try:
                obj = json.loads(payload)
            except ValueError:
                self.answer.fail(f"a message is not JSON: {payload[:100]!r}")
                continue
            self.on_object(self.answer, obj, now)

    def _body_message(self) -> str:
        text = bytes(self._body).decode("utf-8", "replace")
        try:
            message = error_message(json.loads(text))
        except ValueError:
            message = None
        return message or text.strip()[:200] or "(empty body)"


def payload_parts(events: Iterable[Mapping]) -> Iterator[bytes]:
    """The bytes of a SageMaker response stream's ``PayloadPart`` events (other events are skipped)."""
    for event in events:
        part = event.get("PayloadPart")
        if part:
            yield part.get("Bytes", b"")
