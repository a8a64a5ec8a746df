"""A safetensors file's header, read and checked with the standard library alone (no torch, no weights read).

The format (huggingface/safetensors, ``docs/safetensors.md``): 8 bytes, the header's length N as a little-endian
unsigned 64-bit integer; N bytes of UTF-8 JSON, an object mapping each tensor's name to ``{"dtype", "shape",
"data_offsets": [begin, end]}`` (offsets into the bytes after the header) and an optional ``__metadata__`` of
strings; then the tensors' bytes. A header that breaks any of this, or whose tensors reach past the end of the
file, is a ``ValueError`` saying what is wrong: a garbage or truncated file is refused before any library loads it.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any, BinaryIO

#: The safetensors library's own limit on a header's length.
MAX_HEADER_BYTES = 100 * 1024 * 1024


def read_header(path: str | os.PathLike) -> dict[str, Any]:
    """The header of the safetensors file at ``path`` (``__metadata__`` included); ``ValueError`` when the file is
    not one, ``OSError`` when it cannot be read."""
    with open(path, "rb") as file:
        return header_of(file, os.fstat(file.fileno()).st_size)


def header_of(stream: BinaryIO, size: int) -> dict[str, Any]:
    """``read_header`` of a stream at its start, ``size`` bytes long (a member of an archive)."""
    start = stream.read(8)
    if len(start) < 8:
        raise ValueError(f"{size} bytes, shorter than a safetensors header")
    (length,) = struct.unpack("<Q", start)
    if length > min(MAX_HEADER_BYTES, size - 8):
        raise ValueError(f"its header claims {length:,} bytes, more than the file's {size:,} bytes hold")
    try:
        header = json.loads(stream.read(length).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"its header is a JSON {type(header).__name__}, not an object")
    data = size - 8 - length
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict):
                raise ValueError("its __metadata__ is not an object")
            continue
        if not _entry_fits(info, data):
            raise ValueError(f"tensor {name[:100]!r} has no valid dtype, shape and data_offsets within the file's "
                             f"{data:,} bytes of data")
    return header


def _entry_fits(info: Any, data: int) -> bool:
    if not isinstance(info, dict) or not isinstance(info.get("dtype"), str):
        return False
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        return False
    return (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= data)
