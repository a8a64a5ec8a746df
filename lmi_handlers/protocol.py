"""Stand-ins for ``djl_python``'s ``Input``, ``Output`` and ``PairList``.

Inside an LMI container the real classes are used (see ``djl.py``). Everywhere else - tests,
``lmi serve`` workers, laptops - these implement the same public behaviour, following
``reference/djl-contract.md`` sections 1.10, 2 and 3:

* ``Input.get_batches()`` splits a batched Input by fixed positions (``batch_NNN.`` or ``batch_NNN_``);
* ``Input.get_property`` is case-insensitive, ``get_as_bytes()`` prefers the ``data`` item;
* ``Output.add(..., batch_index=i)`` keys items ``batch_<i>.<key>``; ``Output.binary_encode``
  is the rolling-batch item encoding; ``add_stream_content`` marks a streamed response.

DJL's socket wire codec is the server's business and lives with it (``lmi_tools.serving.worker.codec``);
only the rolling-batch item encoding (``Output.binary_encode``) runs in the container.
"""

from __future__ import annotations

import json
import logging
import struct
from typing import Any, Callable, Iterable, Iterator

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
            write_string(buf, key)
            write_string(buf, str(item))
        return bytes(buf)


def write_string(buf: bytearray, value: str | None) -> None:
    """DJL's string encoding: an int32 length (-1 for null), then UTF-8 (the socket codec uses it too)."""
    if value is None:
        buf += struct.pack(">i", -1)
        return
    data = value.encode("utf-8")
    buf += struct.pack(">i", len(data))
    buf += data
