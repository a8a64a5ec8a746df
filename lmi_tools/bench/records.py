"""The per-request log: every metric of a run is computed from these records and nothing else.

All times are seconds on one monotonic clock (``time.perf_counter``), measured from the start of the run's
measured phase, so a log can be stored, reloaded and summarised again without the run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from ..answers.messages import Answer

#: Where a token count came from, best first.
SOURCES = ("server", "tokenizer", "events")


@dataclass
class RequestRecord:
    """One request: when it was sent, when each token arrived, when it ended and what it cost in tokens."""

    index: int
    send: float
    end: float = 0.0
    #: The first token event; without streaming, the arrival of the whole answer.
    first_token: float | None = None
    #: Arrival time of every token event (an LMI or TGI token line, an OpenAI chunk with text), in order.
    token_times: list[float] = field(default_factory=list)
    #: HTTP status (for SageMaker: 200, or the status of the error); None when no response arrived.
    status: int | None = None
    #: None when the request succeeded; otherwise what went wrong.
    error: str | None = None
    finish_reason: str | None = None
    input_tokens: int | None = None
    input_tokens_source: str | None = None
    output_tokens: int | None = None
    output_tokens_source: str | None = None
    #: The generated text, kept only until output tokens are counted with the tokenizer; never stored.
    text: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("text")
        for key in ("send", "end", "first_token"):
            if data[key] is not None:
                data[key] = round(data[key], 6)
        data["token_times"] = [round(t, 6) for t in self.token_times]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RequestRecord":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "text"}
        return cls(**known)


@dataclass
class RunLog:
    """The records of one measured phase at one concurrency, with what shaped the load."""

    concurrency: int
    records: list[RequestRecord]
    streaming: bool = True
    #: Requests still in flight when the hard time limit ended the run (not in ``records``).
    cancelled: int = 0
    started_at: str = ""

    def header(self) -> dict[str, Any]:
        return {"kind": "run", "concurrency": self.concurrency, "streaming": self.streaming,
                "cancelled": self.cancelled, "started_at": self.started_at, "requests": len(self.records)}

    def to_lines(self) -> Iterable[dict[str, Any]]:
        yield self.header()
        for record in self.records:
            yield record.to_dict()

    @classmethod
    def from_lines(cls, lines: Iterable[dict[str, Any]]) -> "RunLog":
        items = iter(lines)
        head = next(items)
        if head.get("kind") != "run":
            raise ValueError("a request log starts with its run header ({'kind': 'run', ...})")
        records = [RequestRecord.from_dict(item) for item in items]
        return cls(concurrency=int(head["concurrency"]), records=records, streaming=bool(head.get("streaming", True)),
                   cancelled=int(head.get("cancelled", 0)), started_at=str(head.get("started_at", "")))


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
