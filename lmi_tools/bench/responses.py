"""Reading one response, chunk by chunk, into a ``RequestRecord`` (sans-IO: the clients feed the bytes)."""

from __future__ import annotations

import json

from .apis import READERS, Answer, Api, error_message
from .records import RequestRecord
from .wire import Framing, LineSplitter, SseDecoder, framing_for


class ResponseReader:
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
            try:
                lines = self._lines.flush()
            except UnicodeDecodeError as exc:
                lines = []
                self.answer.fail(f"the stream is not UTF-8: {exc}")
            self._messages(lines, now)
            if self._sse is not None:
                self._objects(self._sse.flush(), now)
        return self.answer

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


def complete(record: RequestRecord, answer: Answer, end: float) -> RequestRecord:
    """Fill the record from what the response said; server-reported token counts win."""
    record.end = end
    record.token_times = answer.token_times
    record.error = answer.error if record.error is None else record.error
    record.finish_reason = answer.finish_reason
    if record.ok:
        record.first_token = answer.token_times[0] if answer.token_times else end
        record.text = answer.text if answer.text is not None else "".join(answer.pieces)
    if answer.input_tokens is not None:
        record.input_tokens, record.input_tokens_source = answer.input_tokens, "server"
    if answer.output_tokens is not None:
        record.output_tokens, record.output_tokens_source = answer.output_tokens, "server"
    elif answer.token_times:
        record.output_tokens, record.output_tokens_source = len(answer.token_times), "events"
    return record
