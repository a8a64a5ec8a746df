"""Lines and server-sent events out of chunks cut anywhere."""

import pytest

from lmi_handlers.encoding import Framing
from lmi_tools.answers.framing import LineSplitter, SseDecoder, framing_for

TEXT = '{"token": {"text": "caf\u00e9 \u2713"}}\r\n{"token": {"text": "\U0001f600"}}\n{"last": true}'


def split_every(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 64])
def test_lines_survive_any_split_even_inside_a_character(size):
    splitter = LineSplitter()
    lines = []
    for part in split_every(TEXT.encode(), size):
        lines += splitter.feed(part)
    assert lines == ['{"token": {"text": "caf\u00e9 \u2713"}}', '{"token": {"text": "\U0001f600"}}']
    assert splitter.flush() == ['{"last": true}']  # the last line had no newline
    assert splitter.flush() == []


def test_an_incomplete_character_at_the_end_is_an_error():
    splitter = LineSplitter()
    splitter.feed("ok\n\u2713".encode()[:-1])
    with pytest.raises(UnicodeDecodeError):
        splitter.flush()


def test_server_sent_events():
    decoder = SseDecoder()
    lines = [": a comment", "event: message", "data: {\"a\": 1}", "", "data:{\"b\": 2}", "id: 7", "",
             "data: first", "data: second", "", "data: [DONE]", ""]
    assert decoder.lines(lines[:5]) == ['{"a": 1}']
    assert decoder.lines(lines[5:]) == ['{"b": 2}', "first\nsecond", "[DONE]"]
    assert decoder.lines(["data: unterminated"]) == []
    assert decoder.flush() == ["unterminated"]


@pytest.mark.parametrize("content_type, framing", [
    ("application/jsonlines", Framing.JSONLINES),
    ("application/jsonlines; charset=utf-8", Framing.JSONLINES),
    ("application/x-ndjson", Framing.JSONLINES),
    ("text/event-stream; charset=utf-8", Framing.SSE),
    ("application/json", Framing.JSON),
    (None, Framing.JSON),
])
def test_framing_follows_the_content_type(content_type, framing):
    assert framing_for(content_type) is framing
