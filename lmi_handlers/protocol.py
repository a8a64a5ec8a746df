"""Stand-ins for ``djl_python``'s ``Input``, ``Output`` and ``PairList``.

Inside an LMI container the real classes are used (see ``djl.py``); ``lmi serve`` workers also offer
these under the name ``djl_python`` so that a custom ``model.py`` runs unchanged. They follow
``djl_python`` method by method (``docs/djl-compat.md`` lists each method, DJL v0.29.0 and the current
release against ours, and the test that pins it). Where the two releases differ they follow v0.29.0,
the LMI release the project targets. The few deliberate differences are listed there too: our
constructors also take properties/content, and ``PairList``'s ``pair_list``/``pair_map``/``add_all``
work where DJL's raise.

The numpy helpers import numpy (and ``get_as_image`` PIL) when called: this module imports only
the standard library. DJL's socket wire codec is the server's business and lives with it
(``lmi_tools.serving.worker.codec``); only the rolling-batch item encoding (``Output.binary_encode``)
runs in the container.
"""

from __future__ import annotations

import io
import json
import logging
import struct
import uuid
from typing import Any, Callable, Iterable, Iterator

from . import ndlist

CUSTOM_ATTRIBUTES = "x-amzn-sagemaker-custom-attributes"


class PairList:
    """An ordered list of (key, value) pairs; keys may repeat or be None, ``add`` drops None values."""

    def __init__(self, keys: list | None = None, values: list | None = None,
                 pair_list: list | None = None, pair_map: dict | None = None):
        self.keys: list = []
        self.values: list = []
        if keys and values:
            if len(keys) != len(values):
                raise ValueError("key value size mismatch.")
            self.keys, self.values = keys, values
        elif pair_list:
            for key, value in pair_list:
                self.keys.append(key)
                self.values.append(value)
        elif pair_map:
            self.keys, self.values = list(pair_map), list(pair_map.values())

    def add(self, key: Any = None, value: Any = None, index: int | None = None,
            pair: tuple | None = None) -> None:
        if index is not None and value is not None:
            self.keys.insert(index, key)
            self.values.insert(index, value)
        elif pair:
            self.keys.append(pair[0])
            self.values.append(pair[1])
        elif value is not None:  # like djl_python: a None value is not added
            self.keys.append(key)
            self.values.append(value)

    def add_all(self, other: "PairList | None") -> None:
        if other:
            self.keys.extend(other.get_keys())
            self.values.extend(other.get_values())

    def size(self) -> int:
        return len(self.keys)

    def is_empty(self) -> bool:
        return self.size() == 0

    def get(self, key: Any) -> Any:
        """The value of the first pair with exactly this key, or None."""
        return self.values[self.keys.index(key)] if key in self.keys else None

    def key_at(self, index: int) -> Any:
        return self.keys[index]

    def value_at(self, index: int) -> Any:
        return self.values[index]

    def get_keys(self) -> list:
        return self.keys

    def get_values(self) -> list:
        return self.values


class Input:
    """One request (or one batch of requests) as DJLServing hands it to ``handle``."""

    def __init__(self, properties: dict[str, Any] | None = None, content: PairList | None = None):
        self.function_name: str | None = None
        self.properties: dict[str, Any] = dict(properties or {})
        self.content = content if content is not None else PairList()

    def __str__(self) -> str:
        text = f"properties: {self.get_properties()}"
        for key in self.get_content().get_keys():
            text += f"\n{key}: {self.get_data(key)}"
        return text

    def is_batch(self) -> bool:
        return "batch_size" in self.properties

    def get_batch_size(self) -> int:
        return int(self.properties.get("batch_size", "1"))

    def get_batches(self) -> list["Input"]:
        if not self.is_batch():
            return [self]
        batch = [Input() for _ in range(self.get_batch_size())]
        # Fixed positions, exactly like djl_python: "batch_" + 3 digits + one separator ("." or "_").
        for key, value in self.properties.items():
            if key.startswith("batch_") and key != "batch_size":
                batch[int(key[6:9])].properties[key[10:]] = value
        for i in range(self.content.size()):
            key = self.content.key_at(i)
            batch[int(key[6:9])].content.add(key[10:], self.content.value_at(i))
        return batch

    def get_function_name(self) -> str | None:
        return self.function_name

    def get_properties(self) -> dict[str, Any]:
        return self.properties

    def get_content(self) -> PairList:
        return self.content

    def get_property(self, key: str) -> Any:
        """Case-insensitive, like HTTP headers."""
        wanted = key.lower()
        return next((v for k, v in self.properties.items() if k.lower() == wanted), None)

    def contains_key(self, key: str) -> bool:
        return self.content.get(key) is not None

    def get_data(self, key: str | None = None) -> Any:
        content_type = self.get_property("content-type")
        if content_type == "tensor/ndlist":
            return self.get_as_numpy(key)
        if content_type == "tensor/npz":
            return self.get_as_npz(key)
        if content_type is not None and content_type.startswith("application/json"):
            return self.get_as_json(key)
        if content_type is not None and content_type.startswith("text/"):
            return self.get_as_string(key)
        if content_type is not None and content_type.startswith("image/"):
            return self.get_as_image(key)
        if self.content.is_empty():
            return None
        return self.get_as_bytes(key=key)

    def get_as_bytes(self, key: str | None = None) -> Any:
        """The item ``key`` (KeyError if missing); without a key ``data`` or else the first item."""
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
        # No content: AttributeError on None, as in djl_python.
        return self.get_as_bytes(key=key).decode("utf-8")

    def get_as_json(self, key: str | None = None) -> Any:
        return json.loads(self.get_as_string(key=key))

    def get_as_image(self, key: str | None = None) -> Any:
        from PIL import Image

        return Image.open(io.BytesIO(self.get_as_bytes(key=key)))

    def get_as_numpy(self, key: str | None = None) -> list:
        return ndlist.decode(self.get_as_bytes(key=key))

    def get_as_npz(self, key: str | None = None) -> list:
        import numpy

        archive = numpy.load(io.BytesIO(self.get_as_bytes(key=key)))
        return [archive[name] for name in archive.files]

    def get_as_csv(self, key: str | None = None) -> list:
        import csv

        return list(csv.DictReader(io.StringIO(self.get_as_string(key=key))))

    def is_empty(self) -> bool:
        return self.content.is_empty()


def request_input(headers: Iterable[tuple[str, str]], body: bytes, query: Iterable[tuple[str, str]] = (),
                  request_id: str | None = None) -> Input:
    """One request as DJLServing's Java front end builds its ``Input``: the HTTP headers as properties (original case),
    ``X-Amzn-SageMaker-Custom-Attributes`` split into ``k=v`` properties, ``requestId`` (the client's
    ``X-Request-Id``, else a new one), the query parameters, then the body as ``data``. ``lmi serve`` builds its
    requests with it, and so does the handler in AWS's vLLM container, which has no Java in front of it."""
    properties: dict[str, str] = {}
    for name, value in headers:
        if name.lower() == CUSTOM_ATTRIBUTES:
            for pair in value.split(";"):
                key, sep, val = pair.strip().partition("=")
                if sep and key:
                    properties[key] = val
        else:
            properties[name] = value
    given = next((v for k, v in properties.items() if k.lower() == "x-request-id"), None)
    properties["requestId"] = request_id or given or str(uuid.uuid4())
    content = PairList()
    for name, value in query:
        content.add(name, value.encode("utf-8"))
    content.add("data", body)
    return Input(properties, content)


class _JSONEncoder(json.JSONEncoder):
    """djl_python's encoder: datetimes as ``str``, numpy scalars and arrays as Python values."""

    def default(self, o: Any) -> Any:
        import datetime

        if isinstance(o, datetime.datetime):
            return str(o)
        try:
            import numpy as np
        except ImportError:
            return super().default(o)
        if isinstance(o, np.integer):
            return int(o)
        if isinstance(o, np.floating):
            return float(o)
        if isinstance(o, np.ndarray):
            return o.tolist()
        return super().default(o)


class Output:
    """A handler's answer: status, headers (properties) and content items, or a stream."""

    def __init__(self, code: int = 200, message: str = "OK"):
        self.code = code
        self.message = message
        self.properties: dict[str, Any] = {}
        self.content = PairList()
        self.stream_content: Iterator[Any] | None = None
        self.stream_output_formatter: Callable[[Any], Any] | None = None
        self.finalize_function: Callable[..., Any] | None = None
        self.finalize_args: tuple[Any, ...] | None = None

    def __str__(self) -> str:
        kinds = {self.content.key_at(i): f"type: {type(self.content.value_at(i))}"
                 for i in range(self.content.size())}
        return json.dumps({"code": self.code, "message": self.message, "properties": self.properties,
                           "content": kinds}, indent=2)

    def set_code(self, code: int) -> "Output":
        self.code = code
        return self

    def set_message(self, message: str) -> "Output":
        self.message = message
        return self

    def error(self, error: str, code: int = 424, message: str = "prediction failure") -> "Output":
        # v0.29.0's default message; DJL 0.35.0+ says "invoke handler failure".
        self.code = code
        self.message = message
        self.add_property("content-type", "application/json")
        return self.add_as_json({"code": code, "message": message, "error": error})

    def add_property(self, key: str, val: Any) -> "Output":
        self.properties[key] = val
        return self

    def get_properties(self) -> dict[str, Any]:
        return self.properties

    def get_property(self, key: str) -> Any:
        return self.properties.get(key)

    def add(self, value: Any, key: Any = None, batch_index: int | None = None) -> "Output":
        """``str`` as UTF-8, ``bytes``/``bytearray`` as they are, anything else as JSON (exact types:
        a ``str`` subclass is JSON-encoded, as in djl_python)."""
        if key is not None and type(key) is not str:
            logging.warning("Output key should be str type, got %s", type(key))
            key = str(key)
        if batch_index is not None:
            key = f"batch_{batch_index}.{'' if key is None else key}"
        if type(value) is str:
            self.content.add(key=key, value=value.encode("utf-8"))
        elif type(value) is bytearray:
            self.content.add(key=key, value=value)
        elif type(value) is bytes:
            self.content.add(key=key, value=bytearray(value))
        else:
            self.content.add(key=key, value=self._encode_json(value))
        return self

    def add_as_numpy(self, np_list: Any, key: Any = None, batch_index: int | None = None) -> "Output":
        return self.add(ndlist.encode(np_list), key=key, batch_index=batch_index)

    def add_as_npz(self, np_list: list, key: Any = None, batch_index: int | None = None) -> "Output":
        import numpy

        buffer = io.BytesIO()
        numpy.savez(buffer, *np_list)
        return self.add(buffer.getvalue(), key=key, batch_index=batch_index)

    def add_as_json(self, val: Any, key: Any = None, batch_index: int | None = None) -> "Output":
        return self.add(self._encode_json(val), key=key, batch_index=batch_index)

    def _default_stream_output_formatter(token_texts: Any) -> bytearray:  # type: ignore[misc]
        # A plain function in the class body, as in djl_python (the default of add_stream_content).
        return bytearray((json.dumps({"outputs": token_texts}) + "\n").encode("utf-8"))

    def add_stream_content(self, stream_content: Iterator[Any],
                           output_formatter: Callable[[Any], Any] | None = _default_stream_output_formatter
                           ) -> "Output":
        self.stream_content = stream_content
        self.stream_output_formatter = output_formatter
        return self

    @staticmethod
    def _encode_json(val: Any) -> bytearray:
        """Pretty JSON (indent 2, no spaces after ':'), UTF-8 kept, NaN refused."""
        return bytearray(json.dumps(val, ensure_ascii=False, allow_nan=False, indent=2, cls=_JSONEncoder,
                                    separators=(",", ":")).encode("utf-8"))

    @staticmethod
    def binary_encode(data: dict[str, Any]) -> bytes:
        """The per-request item encoding of rolling batch: int16 count, then key/str(value) pairs."""
        buf = bytearray(struct.pack(">h", len(data)))
        for key, item in data.items():
            write_string(buf, key)
            write_string(buf, str(item))
        return bytes(buf)

    @staticmethod
    def write_utf8(msg: bytearray, val: str | None) -> None:
        write_string(msg, val)

    def finalize(self, finalize_function: Callable[..., Any], *args: Any) -> "Output":
        """One function (a later call replaces it) run after the answer was sent."""
        self.finalize_function = finalize_function
        self.finalize_args = args
        return self

    def execute_finalize(self) -> Any:
        if self.finalize_function:
            return self.finalize_function(*(self.finalize_args or ()))
        return None


def write_string(buf: bytearray, value: str | None) -> None:
    """DJL's string encoding: an int32 length (-1 for null), then UTF-8 (the socket codec uses it too)."""
    if value is None:
        buf += struct.pack(">i", -1)
        return
    data = value.encode("utf-8")
    buf += struct.pack(">i", len(data))
    buf += data
