"""DJL's ``tensor/ndlist`` bytes: a list of arrays as DJL's Java ``NDList.encode`` writes them.

Used by the stand-ins' numpy helpers (``Input.get_as_numpy``, ``Output.add_as_numpy``). The layout,
big-endian, read from ``djl_python/np_util.py`` (v0.29.0 and later):

* int32 array count, then per array: the magic ``NDAR`` (int16-length string), int32 version 3,
  one byte "has a name" (then the name), the sparse format (``default``), the data type upper-cased
  (``FLOAT32``), the shape (int32 rank, int64 per dimension, then an int32-counted layout of int16
  characters), one byte for the byte order (``<`` or ``>``), and int32 length + the raw data.
* Bytes that start with ``PK`` are an npz archive instead (what DJL also accepts).

numpy is imported inside the functions: ``lmi_handlers`` imports only the standard library.
"""

from __future__ import annotations

import io
import struct
from typing import Any

MAGIC = "NDAR"
VERSION = 3


def _short_string(value: str) -> bytes:
    data = value.encode("utf-8")
    return struct.pack(">h", len(data)) + data


class _Reader:
    def __init__(self, data: bytes):
        self.data = bytes(data)
        self.pos = 0

    def take(self, size: int) -> bytes:
        if self.pos + size > len(self.data):
            raise ValueError(f"ndlist bytes end at {len(self.data)}, expected {size} more at {self.pos}")
        chunk = self.data[self.pos:self.pos + size]
        self.pos += size
        return chunk

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.unpack(">h")).decode("utf-8")


def decode(data: bytes) -> list[Any]:
    """The arrays in ndlist (or npz) bytes."""
    import numpy as np

    if bytes(data[:2]) == b"PK":
        archive = np.load(io.BytesIO(bytes(data)))
        return [archive[name] for name in archive.files]
    reader = _Reader(data)
    arrays = []
    for _ in range(reader.unpack(">i")):
        magic = reader.string()
        if magic != MAGIC:
            raise AssertionError(f"magic number is not {MAGIC}, actual {magic}")
        version = reader.unpack(">i")
        if version != VERSION:
            raise AssertionError(f"require version {VERSION}, actual {version}")
        if reader.unpack(">b") == 1:
            reader.string()  # the array's name: numpy arrays have none
        reader.string()  # sparse format
        dtype = np.dtype(reader.string().lower())
        shape = tuple(reader.unpack(">q") for _ in range(reader.unpack(">i")))
        reader.take(2 * reader.unpack(">i"))  # layout characters
        order = chr(reader.unpack(">b"))
        raw = reader.take(reader.unpack(">i"))
        arrays.append(np.frombuffer(bytearray(raw), dtype=dtype.newbyteorder(order)).reshape(shape))
    return arrays


def encode(arrays: Any) -> bytearray:
    """ndlist bytes of one array or a list of arrays (little-endian data, as DJL writes it)."""
    if not isinstance(arrays, list):
        arrays = [arrays]
    out = bytearray(struct.pack(">i", len(arrays)))
    for array in arrays:
        out += _short_string(MAGIC) + struct.pack(">i", VERSION) + b"\x00"
        out += _short_string("default") + _short_string(str(array.dtype).upper())
        out += struct.pack(">i", array.ndim) + b"".join(struct.pack(">q", d) for d in array.shape)
        out += struct.pack(">i", array.ndim) + b"".join(struct.pack(">h", ord("?")) for _ in array.shape)
        data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes("C")
        out += b"<" + struct.pack(">i", len(data)) + data
    return out
