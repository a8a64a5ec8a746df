"""DJL's socket wire codec behaves as reference/djl-contract.md §1.10 says, in both directions."""

import io

import pytest

from lmi_handlers.protocol import Input, Output, PairList
from lmi_tools.serving.worker.codec import (StreamBroken, encode_input, iter_output_frames, read_input,
                                            read_output_header, read_stream_chunks)


def test_input_wire_round_trip():
    original = Input({"Content-Type": "application/json", "handler": "handle"},
                     PairList(pair_list=[("data", b'{"inputs": "hi"}'), ("extra", b"\x00\x01")]))
    decoded = read_input(io.BytesIO(encode_input(original)))
    assert decoded.get_properties() == original.get_properties()
    assert decoded.get_content().get_keys() == ["data", "extra"]
    assert decoded.get_as_bytes("extra") == b"\x00\x01"
    assert type(decoded.get_as_bytes()) is bytearray  # what djl_python's Input.read hands a handler
    assert decoded.get_function_name() == "handle"


def test_output_wire_round_trip_plain():
    out = Output(code=200).add_property("content-type", "application/json").add("body")
    header = read_output_header(io.BytesIO(b"".join(iter_output_frames(out))))
    assert (header.code, header.message, header.is_stream) == (200, "OK", False)
    assert header.properties == {"content-type": "application/json"}
    assert header.content.value_at(0) == b"body"


def test_output_wire_stream_and_broken_stream():
    out = Output().add_stream_content(iter(["a", "b"]), output_formatter=None)
    stream = io.BytesIO(b"".join(iter_output_frames(out)))
    assert read_output_header(stream).is_stream
    assert list(read_stream_chunks(stream)) == [b"a", b"b"]

    def failing():
        yield "first"
        raise RuntimeError("model exploded")

    stream = io.BytesIO(b"".join(iter_output_frames(Output().add_stream_content(failing(), None))))
    read_output_header(stream)
    chunks = read_stream_chunks(stream)
    assert next(chunks) == b"first"
    with pytest.raises(StreamBroken, match="model exploded"):
        next(chunks)


def test_default_stream_formatter_wraps_outputs():
    out = Output().add_stream_content(iter(["x"]))
    stream = io.BytesIO(b"".join(iter_output_frames(out)))
    read_output_header(stream)
    assert list(read_stream_chunks(stream)) == [b'{"outputs": "x"}\n']
