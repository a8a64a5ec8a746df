"""DJL's socket wire codec: how the Java front end and a Python worker exchange ``Input`` and ``Output``.

Big-endian; strings are an int32 length (-1 for null) and then UTF-8 (reference/djl-contract.md §1.10).
Both directions are here because ``lmi serve`` plays both sides: the front end writes an ``Input`` and
reads the ``Output`` (``client.py``), the worker reads the ``Input`` and writes the ``Output``
(``process.py``). ``binary_decode`` is what Java does with each rolling-batch item the handler encodes
with ``Output.binary_encode``. Only the standard library and ``lmi_handlers.protocol`` are imported: the
worker process imports this module.
"""

from __future__ import annotations

import io
import logging
import struct
from typing import Any, BinaryIO, Iterator

from lmi_handlers.protocol import Input, Output, PairList, write_string

logger = logging.getLogger(__name__)


def _read_exact(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size)
    if data is None or len(data) != size:
        raise EOFError("connection closed in the middle of a message")
    return data


def _read_short(stream: BinaryIO) -> int:
    return struct.unpack(">h", _read_exact(stream, 2))[0]


def _read_int(stream: BinaryIO) -> int:
    return struct.unpack(">i", _read_exact(stream, 4))[0]


def _read_string(stream: BinaryIO) -> str | None:
    length = _read_int(stream)
    return None if length < 0 else _read_exact(stream, length).decode("utf-8")


def binary_decode(data: bytes) -> dict[str, str]:
    """Inverse of ``Output.binary_encode`` (what Java does with each rolling-batch item)."""
    stream = io.BytesIO(data)
    return {_read_string(stream) or "": _read_string(stream) or "" for _ in range(_read_short(stream))}


def encode_input(inputs: Input) -> bytes:
    """Java -> Python: properties, then content items (keys may be null)."""
    buf = bytearray(struct.pack(">h", len(inputs.properties)))
    for key, value in inputs.properties.items():
        write_string(buf, key)
        write_string(buf, None if value is None else str(value))
    buf += struct.pack(">h", inputs.content.size())
    for i in range(inputs.content.size()):
        value = bytes(inputs.content.value_at(i))
        write_string(buf, inputs.content.key_at(i))
        buf += struct.pack(">i", len(value))
        buf += value
    return bytes(buf)


def read_input(stream: BinaryIO) -> Input:
    inputs = Input()
    for _ in range(_read_short(stream)):
        key = _read_string(stream) or ""
        inputs.properties[key] = _read_string(stream)
    for _ in range(_read_short(stream)):
        key = _read_string(stream)
        inputs.content.add(key, bytearray(_read_exact(stream, _read_int(stream))))  # as djl_python reads it
    inputs.function_name = inputs.properties.get("handler")
    return inputs


def _stream_chunk_bytes(value: Any) -> bytes:
    # The engine's rule (djl_python Output.send): exact str as UTF-8, bytes as they are, else its pretty JSON.
    if type(value) is str:
        return value.encode("utf-8")
    if type(value) in (bytes, bytearray):
        return bytes(value)
    return bytes(Output._encode_json(value))


def iter_output_frames(output: Output) -> Iterator[bytes]:
    """Python -> Java: the header (code, message, properties) and then either the content items
    or, for a streamed Output, content count -1 followed by chunks (byte 1 + int32 length + bytes)
    and a terminator (byte 0 + int32 length + the exception text, empty on success)."""
    head = bytearray(struct.pack(">h", output.code))
    write_string(head, output.message)
    head += struct.pack(">h", len(output.properties))
    for key, value in output.properties.items():
        write_string(head, key)
        write_string(head, str(value))
    if output.stream_content is None:
        head += struct.pack(">h", output.content.size())
        for i in range(output.content.size()):
            value = bytes(output.content.value_at(i))
            write_string(head, output.content.key_at(i))
            head += struct.pack(">i", len(value)) + value
        yield bytes(head)
        return
    head += struct.pack(">h", -1)
    yield bytes(head)
    formatter = output.stream_output_formatter
    failure = b""
    try:
        for value in output.stream_content:
            chunk = _stream_chunk_bytes(formatter(value) if formatter else value)
            yield struct.pack(">bi", 1, len(chunk)) + chunk
    except Exception as exc:  # the engine reports a broken stream as the terminator's text
        logger.exception("stream content failed")
        failure = str(exc).encode("utf-8")
    yield struct.pack(">bi", 0, len(failure)) + failure


class OutputHeader:
    """What Java reads first from an Output: status, headers, and the items unless streamed."""

    def __init__(self, code: int, message: str, properties: dict[str, str], content: PairList | None):
        self.code = code
        self.message = message
        self.properties = properties
        self.content = content  # None for a streamed Output: read the chunks with read_stream_chunks

    @property
    def is_stream(self) -> bool:
        return self.content is None


def read_output_header(stream: BinaryIO) -> OutputHeader:
    code = _read_short(stream)
    message = _read_string(stream) or ""
    properties = {}
    for _ in range(_read_short(stream)):
        key = _read_string(stream) or ""
        properties[key] = _read_string(stream) or ""
    count = _read_short(stream)
    if count < 0:
        return OutputHeader(code, message, properties, None)
    content = PairList()
    for _ in range(count):
        key = _read_string(stream)
        content.add(key, _read_exact(stream, _read_int(stream)))
    return OutputHeader(code, message, properties, content)


class StreamBroken(Exception):
    """The handler's stream iterator raised; the message is its exception text."""


def read_stream_chunks(stream: BinaryIO) -> Iterator[bytes]:
    while True:
        more = struct.unpack(">b", _read_exact(stream, 1))[0]
        data = _read_exact(stream, _read_int(stream))
        if not more:
            if data:
                raise StreamBroken(data.decode("utf-8", "replace"))
            return
        yield data
