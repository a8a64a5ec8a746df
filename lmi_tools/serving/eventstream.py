"""AWS event-stream framing, as SageMaker Runtime's InvokeEndpointWithResponseStream sends it.

Each message: total length, headers length, prelude CRC32, headers, payload, message CRC32 (all
big-endian; reference/sagemaker.md §3.3). Headers used here are strings (type 7). botocore checks
both CRCs and turns ``exception`` messages into ``EventStreamError``.
"""

from __future__ import annotations

import binascii
import json
import struct

STRING = 7


def _headers(headers: dict[str, str]) -> bytes:
    out = bytearray()
    for name, value in headers.items():
        raw_name, raw_value = name.encode("utf-8"), value.encode("utf-8")
        out += struct.pack(">B", len(raw_name)) + raw_name + struct.pack(">BH", STRING, len(raw_value)) + raw_value
    return bytes(out)


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    head = _headers(headers)
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack(">II", total, len(head))
    prelude += struct.pack(">I", binascii.crc32(prelude) & 0xFFFFFFFF)
    message = prelude + head + payload
    return message + struct.pack(">I", binascii.crc32(message) & 0xFFFFFFFF)


def payload_part(data: bytes) -> bytes:
    return encode_message({":event-type": "PayloadPart", ":content-type": "application/octet-stream",
                           ":message-type": "event"}, data)


def model_stream_error(message: str, error_code: str = "ModelStreamError") -> bytes:
    body = json.dumps({"Message": message, "ErrorCode": error_code}).encode("utf-8")
    return encode_message({":exception-type": "ModelStreamError", ":content-type": "application/json",
                           ":message-type": "exception"}, body)
