"""Stand-ins for ``djl_python``'s ``Input``, ``Output`` and ``PairList``, and DJL's socket codec.

Inside an LMI container the real classes are used (see ``djl.py``). Everywhere else - tests,
``lmi serve`` workers, laptops - these implement the same public behaviour, following
``reference/djl-contract.md`` sections 1.10, 2 and 3:

* ``Input.get_batches()`` splits a batched Input by fixed positions (``batch_NNN.`` or ``batch_NNN_``);
* ``Input.get_property`` is case-insensitive, ``get_as_bytes()`` prefers the ``data`` item;
* ``Output.add(..., batch_index=i)`` keys items ``batch_<i>.<key>``; ``Output.binary_encode``
  is the rolling-batch item encoding; ``add_stream_content`` marks a streamed response.

The wire codec (big-endian; strings are an int32 length, -1 for null, then UTF-8) is used by
the local server in both directions: Java -> Python ``Input`` and Python -> Java ``Output``.
"""

from __future__ import annotations

import json
import logging
import struct
from typing import Any, BinaryIO, Callable, Iterable, Iterator

logger = logging.getLogger(__name__)


class PairList:
    """An ordered list of (key, value) pairs; keys may repeat or be None."""

    def __init__(self, pairs: Iterable[tuple[str | None, Any]] = ()):
        self._keys: list[str | None] = []
        self._values: list[Any] = []
        for key, value in pairs:
            self.add(key, value)

    def add(self, key: str | None = None, value: Any = None) -> None:
        self._keys.append(key)
        self._values.append(value)

    def get(self, key: str) -> Any:
        """The value of the first pair with exactly this key, or None."""
        for k, v in zip(self._keys, self._values):
            if k == key:
                return v
        return None

    def key_at(self, index: int) -> str | None:
        return self._keys[index]

    def value_at(self, index: int) -> Any:
        return self._values[index]

    def size(self) -> int:
        return len(self._keys)

    def is_empty(self) -> bool:
        return not self._keys

    def get_keys(self) -> list[str | None]:
        return list(self._keys)

    def get_values(self) -> list[Any]:
        return list(self._values)


class Input:
    """One request (or one batch of requests) as DJLServing hands it to ``handle``."""

    def __init__(self, properties: dict[str, Any] | None = None, content: PairList | None = None):
        self.function_name: str | None = None
        self.properties: dict[str, Any] = dict(properties or {})
        self.content = content if content is not None else PairList()

    def __str__(self) -> str:
        return f"Input(properties={self.properties!r}, content keys={self.content.get_keys()!r})"

    def get_properties(self) -> dict[str, Any]:
        return self.properties

    def get_property(self, key: str) -> Any:
        wanted = key.lower()
        return next((v for k, v in self.properties.items() if k.lower() == wanted), None)

    def get_content(self) -> PairList:
        return self.content

    def get_function_name(self) -> str | None:
        return self.function_name

    def contains_key(self, key: str) -> bool:
        return self.content.get(key) is not None

    def is_empty(self) -> bool:
        return self.content.is_empty()

    def is_batch(self) -> bool:
        return "batch_size" in self.properties

    def get_batch_size(self) -> int:
        return int(self.properties.get("batch_size", "1"))

    def get_batches(self) -> list["Input"]:
        if not self.is_batch():
            return [self]
        batch = [Input() for _ in range(self.get_batch_size())]
        # Fixed-position parsing, exactly like djl_python: "batch_" + 3 digits + one separator.
        for key, value in self.properties.items():
            if key.startswith("batch_") and key != "batch_size":
                batch[int(key[6:9])].properties[key[10:]] = value
        for i in range(self.content.size()):
            key = self.content.key_at(i) or ""
            batch[int(key[6:9])].content.add(key[10:], self.content.value_at(i))
        return batch

    def get_as_bytes(self, key: str | None = None) -> Any:
        if self.content.is_empty():
            return None
        if key:
            value = self.content.get(key)
            if value is None:
                raise KeyError(f"requested data for key:{key} is not found!")
            return value
        value = self.content.get("data")
        return self.content.value_at(0) if value is None else value

    def get_as_string(self, key: str | None = None) -> str:
        return bytes(self.get_as_bytes(key=key)).decode("utf-8")

    def get_as_json(self, key: str | None = None) -> Any:
        return json.loads(self.get_as_string(key=key))

    def get_data(self, key: str | None = None) -> Any:
        content_type = self.get_property("content-type") or ""
        if content_type.startswith("application/json"):
            return self.get_as_json(key)
        if content_type.startswith("text/"):
            return self.get_as_string(key)
        if self.content.is_empty():
            return None
        return self.get_as_bytes(key)


def _default_stream_formatter(value: Any) -> bytes:
    return (json.dumps({"outputs": value}, ensure_ascii=False) + "\n").encode("utf-8")


class Output:
    """A handler's answer: status, headers (properties) and content items, or a stream."""

    def __init__(self, code: int = 200, message: str = "OK"):
        self.code = code
        self.message = message
        self.properties: dict[str, Any] = {}
        self.content = PairList()
        self.stream_content: Iterator[Any] | None = None
        self.stream_content_formatter: Callable[[Any], Any] | None = None
        self._finalizers: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def __str__(self) -> str:
        kinds = {str(self.content.key_at(i)): type(self.content.value_at(i)).__name__
                 for i in range(self.content.size())}
        return json.dumps({"code": self.code, "message": self.message,
                           "properties": self.properties, "content": kinds}, indent=2)

    def set_code(self, code: int) -> "Output":
        self.code = code
        return self

    def set_message(self, message: str) -> "Output":
        self.message = message
        return self

    def error(self, error: str, code: int = 424, message: str = "invoke handler failure") -> "Output":
        self.code = code
        self.message = message
        self.add_property("content-type", "application/json")
        self.add_as_json({"code": code, "message": message, "error": error})
        return self

    def add_property(self, key: str, val: Any) -> "Output":
        self.properties[key] = val
        return self

    def get_properties(self) -> dict[str, Any]:
        return self.properties

    def get_property(self, key: str) -> Any:
        return self.properties.get(key)

    def add(self, value: Any, key: str | None = None, batch_index: int | None = None) -> "Output":
        if key is not None and not isinstance(key, str):
            logger.warning("Output key should be str type, got %s", type(key))
            key = str(key)
        if batch_index is not None:
            key = f"batch_{batch_index}.{key or ''}"
        if isinstance(value, str):
            self.content.add(key, value.encode("utf-8"))
        elif isinstance(value, (bytes, bytearray)):
            self.content.add(key, bytes(value))
        else:
            self.add_as_json(value, key=key)
        return self

    def add_as_json(self, val: Any, key: str | None = None, batch_index: int | None = None) -> "Output":
        if batch_index is not None:
            key = f"batch_{batch_index}.{key or ''}"
        body = json.dumps(val, ensure_ascii=False, allow_nan=False, indent=2, separators=(",", ":"))
        self.content.add(key, body.encode("utf-8"))
        return self

    def add_stream_content(self, stream_content: Iterator[Any],
                           output_formatter: Callable[[Any], Any] | None = _default_stream_formatter
                           ) -> "Output":
        self.stream_content = stream_content
        self.stream_content_formatter = output_formatter
        return self

    def finalize(self, function: Callable[..., Any], *args: Any) -> "Output":
        self._finalizers.append((function, args))
        return self

    def execute_finalize(self) -> None:
        for function, args in self._finalizers:
            function(*args)

    @staticmethod
    def binary_encode(value: dict[str, Any]) -> bytes:
        """The per-request item encoding of rolling batch: int16 count, then key/str(value) pairs."""
        buf = bytearray(struct.pack(">h", len(value)))
        for key, item in value.items():
            _write_string(buf, key)
            _write_string(buf, str(item))
        return bytes(buf)


# --- socket wire codec ----------------------------------------------------------------------

def _write_string(buf: bytearray, value: str | None) -> None:
    if value is None:
        buf += struct.pack(">i", -1)
        return
    data = value.encode("utf-8")
    buf += struct.pack(">i", len(data))
    buf += data


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
    import io

    stream = io.BytesIO(data)
    return {_read_string(stream) or "": _read_string(stream) or "" for _ in range(_read_short(stream))}


def encode_input(inputs: Input) -> bytes:
    """Java -> Python: properties, then content items (keys may be null)."""
    buf = bytearray(struct.pack(">h", len(inputs.properties)))
    for key, value in inputs.properties.items():
        _write_string(buf, key)
        _write_string(buf, None if value is None else str(value))
    buf += struct.pack(">h", inputs.content.size())
    for i in range(inputs.content.size()):
        value = bytes(inputs.content.value_at(i))
        _write_string(buf, inputs.content.key_at(i))
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
        inputs.content.add(key, _read_exact(stream, _read_int(stream)))
    inputs.function_name = inputs.properties.get("handler")
    return inputs


def _stream_chunk_bytes(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


def iter_output_frames(output: Output) -> Iterator[bytes]:
    """Python -> Java: the header (code, message, properties) and then either the content items
    or, for a streamed Output, content count -1 followed by chunks (byte 1 + int32 length + bytes)
    and a terminator (byte 0 + int32 length + the exception text, empty on success)."""
    head = bytearray(struct.pack(">h", output.code))
    _write_string(head, output.message)
    head += struct.pack(">h", len(output.properties))
    for key, value in output.properties.items():
        _write_string(head, key)
        _write_string(head, str(value))
    if output.stream_content is None:
        head += struct.pack(">h", output.content.size())
        for i in range(output.content.size()):
            value = bytes(output.content.value_at(i))
            _write_string(head, output.content.key_at(i))
            head += struct.pack(">i", len(value)) + value
        yield bytes(head)
        return
    head += struct.pack(">h", -1)
    yield bytes(head)
    formatter = output.stream_content_formatter
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
