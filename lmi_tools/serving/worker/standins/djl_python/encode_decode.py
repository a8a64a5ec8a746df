"""``djl_python.encode_decode``: a request body by its content type, and an answer by the one asked for.

Written from DJL's behaviour (``engines/python/setup/djl_python/encode_decode.py``): ``decode`` reads JSON (also
with no content type, where an empty body is ``{"inputs": ""}``), CSV with an ``inputs``/``question``/``context``
header (or numbers without one), plain text as ``{"inputs": [text]}``, images, audio, npz and ndlist tensors, and
anything else as bytes; ``encode`` writes JSON, CSV, npz or ndlist and sets ``Content-Type``. numpy is imported only
where tensors or headerless CSV need it. ``tests/serving/test_async_standins.py`` holds them to DJL's own module where
that is installed.
"""

from __future__ import annotations

import csv
from io import StringIO
from typing import Any

from lmi_handlers.protocol import Input, Output

__all__ = ["decode", "decode_csv", "encode", "encode_csv"]

CSV_HEADERS = ("question", "context", "inputs")


def decode_csv(inputs: Input, require_headers: bool = True) -> Any:
    content = inputs.get_as_string()
    if not require_headers:
        import numpy as np

        result = np.genfromtxt(StringIO(content), delimiter=",")
        if np.isnan(result).any():
            raise ValueError("CSV contains non-numeric data. Please provide numeric data only.")
        return result
    if not any(header in content.splitlines()[0].lower() for header in CSV_HEADERS):
        raise ValueError("You need to provide the correct CSV with Header columns to use it with the inference "
                         "toolkit default handler.")
    rows = list(csv.DictReader(StringIO(content)))
    if "inputs" in rows[0]:
        return {"inputs": [row["inputs"] for row in rows]}
    return {"inputs": rows}


def encode_csv(content: Any) -> str:
    rows = content if isinstance(content, list) else list(content)
    stream = StringIO()
    writer = csv.DictWriter(stream, rows[0].keys())
    writer.writeheader()
    writer.writerows(rows)
    return stream.getvalue()


def decode(inputs: Input, content_type: str | None, key: str | None = None, require_csv_headers: bool = True) -> Any:
    if not content_type:
        return inputs.get_as_json(key=key) if inputs.get_as_bytes(key=key) else {"inputs": ""}
    if "application/json" in content_type:
        return inputs.get_as_json(key=key)
    if "text/csv" in content_type:
        return decode_csv(inputs, require_headers=require_csv_headers)
    if "text/plain" in content_type:
        return {"inputs": [inputs.get_as_string(key=key)]}
    if content_type.startswith("image/"):
        return {"inputs": inputs.get_as_image(key=key)}
    if content_type.startswith("audio/"):
        return {"inputs": inputs.get_as_bytes(key=key)}
    if "tensor/npz" in content_type:
        return {"inputs": inputs.get_as_npz(key=key)}
    if content_type in ("tensor/ndlist", "application/x-npy"):
        return {"inputs": inputs.get_as_numpy(key=key)}
    if content_type == "application/x-www-form-urlencoded":
        return {"inputs": inputs.get_as_string(key=key)}
    return {"inputs": inputs.get_as_bytes(key=key)}


def encode(outputs: Output, prediction: Any, content_type: str | None, key: str | None = None) -> None:
    if not content_type or "application/json" in content_type:
        outputs.add_as_json(prediction, key=key)
        outputs.add_property("Content-Type", "application/json")
    elif "text/csv" in content_type:
        # DJL calls Output.add_as_string, which its Output does not have: an AttributeError there, as here.
        outputs.add_as_string(encode_csv(prediction), key=key)  # type: ignore[attr-defined]
        outputs.add_property("Content-Type", "text/csv")
    elif "tensor/npz" in content_type:
        outputs.add_as_npz(prediction, key=key)
        outputs.add_property("Content-Type", "tensor/npz")
    else:
        outputs.add_as_numpy(prediction, key=key)
        outputs.add_property("Content-Type", "tensor/ndlist")
