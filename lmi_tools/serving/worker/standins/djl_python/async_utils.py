"""``djl_python.async_utils``: the helpers an async ``model.py`` answers DJL's async engine with.

Written from DJL's behaviour (``engines/python/setup/djl_python/async_utils.py``): an ``Output`` whose only content
item is the binary-encoded map ``{"data": <text> + "\\n", "last", ["error"], ["code"]}`` and a ``Content-Type``
property (``application/json`` for a whole answer, ``application/jsonlines`` for a stream's chunk); a dict is
written as JSON first. ``lmi_handlers.djl.async_output`` makes the bytes, the same ones the handler's async path
sends. ``tests/serving/test_async_standins.py`` holds them to DJL's own module where that is installed.
"""

from __future__ import annotations

import json
import logging
from typing import Any, AsyncGenerator, AsyncIterator, Callable

from lmi_handlers.djl import async_output
from lmi_handlers.protocol import Input, Output

#: The header SageMaker names an inference component's adapter with (``djl_python.input_parser``'s).
SAGEMAKER_ADAPTER_IDENTIFIER_HEADER = "X-Amzn-SageMaker-Adapter-Identifier"

__all__ = ["create_non_stream_output", "create_stream_chunk_output", "handle_streaming_response"]


def create_non_stream_output(data: str | dict, properties: dict | None = None, error: str | None = None,
                             code: int | None = None) -> Output:
    output = async_output(_text(data), True, "application/json", error, code)
    for key, value in (properties or {}).items():
        output.add_property(key, value)
    return output


def create_stream_chunk_output(data: str | dict, last_chunk: bool, error: str | None = None,
                               code: int | None = None) -> Output:
    return async_output(_text(data), last_chunk, "application/jsonlines", error, code)


async def handle_streaming_response(response: AsyncIterator[Any], stream_output_formatter: Callable,
                                    accumulate_chunks: bool = False, **kwargs: Any) -> AsyncGenerator[Output, None]:
    """Each chunk of ``response`` through ``stream_output_formatter`` (``(data, last)``, or with
    ``accumulate_chunks`` ``(data, last, history)`` given ``history=``) as a stream chunk, until one is last; a
    formatter that raises ends the stream with a 424 naming its error."""
    history: list = []
    async for chunk in response:
        try:
            if accumulate_chunks:
                data, last, history = stream_output_formatter(chunk, history=history, **kwargs)
            else:
                data, last = stream_output_formatter(chunk, **kwargs)
        except Exception as exc:  # noqa: BLE001 - DJL's rule: the formatter's failure is the stream's last chunk
            logging.exception("stream_output_formatter failed")
            yield create_stream_chunk_output("", True, error=str(exc), code=424)
            return
        yield create_stream_chunk_output(data, last)
        if last:
            return


def _extract_lora_adapter(raw_request: Input, decoded_payload: dict) -> str | None:
    """The adapter a request names: SageMaker's header first, else the payload's ``adapters`` (removed from it)."""
    if SAGEMAKER_ADAPTER_IDENTIFIER_HEADER in raw_request.get_properties():
        return raw_request.get_property(SAGEMAKER_ADAPTER_IDENTIFIER_HEADER)
    if "adapters" in decoded_payload:
        return decoded_payload.pop("adapters")
    return None


def _text(data: str | dict) -> str:
    return json.dumps(data, ensure_ascii=False) if isinstance(data, dict) else data
