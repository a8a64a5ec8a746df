"""The djl_python stand-ins and the socket codec behave as reference/djl-contract.md §1.10, §2, §3 say."""

import io
import json

import pytest

from lmi_handlers.protocol import (Input, Output, PairList, StreamBroken, binary_decode, encode_input,
                                   iter_output_frames, read_input, read_output_header, read_stream_chunks)


def test_get_property_is_case_insensitive_and_properties_are_raw():
    inputs = Input({"Content-Type": "application/json", "X-Thing": "1"})
    assert inputs.get_property("content-type") == "application/json"
    assert inputs.get_property("x-thing") == "1"
    assert inputs.get_property("missing") is None
    assert inputs.get_properties() == {"Content-Type": "application/json", "X-Thing": "1"}


def test_get_as_bytes_prefers_data_then_first_item():
    inputs = Input({}, PairList([("q", b"query"), ("data", b'{"a": 1}')]))
    assert inputs.get_as_bytes() == b'{"a": 1}'
    assert inputs.get_as_json() == {"a": 1}
    assert inputs.get_as_string("q") == "query"
    only_query = Input({}, PairList([("q", b"query")]))
    assert only_query.get_as_bytes() == b"query"
    with pytest.raises(KeyError):
        inputs.get_as_bytes("nope")
    assert Input().get_as_bytes() is None


def test_empty_content_is_the_init_call():
    assert Input({"model_id": "x"}).is_empty()
    assert not Input({}, PairList([("data", b"")])).is_empty()


@pytest.mark.parametrize("sep", [".", "_"])
def test_get_batches_splits_by_fixed_positions(sep):
    props = {"batch_size": "2", "handler": "handle", f"batch_000{sep}Content-Type": "application/json",
             f"batch_001{sep}Accept": "text/event-stream"}
    content = PairList([(f"batch_000{sep}data", b"a"), (f"batch_001{sep}data", b"b")])
    first, second = Input(props, content).get_batches()
    assert first.get_properties() == {"Content-Type": "application/json"}
    assert second.get_property("accept") == "text/event-stream"
    assert (first.get_as_string(), second.get_as_string()) == ("a", "b")
    # Model-level properties (handler) live only on the outer Input.
    assert second.get_property("handler") is None


def test_unbatched_input_is_its_own_single_batch():
    inputs = Input({"Content-Type": "text/plain"}, PairList([("data", b"x")]))
    assert inputs.get_batches() == [inputs]
    assert not inputs.is_batch() and inputs.get_batch_size() == 1


def test_output_add_with_batch_index_and_json():
    out = Output().add("hello", key="data", batch_index=3).add_as_json({"k": [1]}, key="j").add(b"raw")
    assert out.content.get_keys() == ["batch_3.data", "j", None]
    assert out.content.value_at(0) == b"hello"
    assert json.loads(out.content.value_at(1)) == {"k": [1]}
    assert out.content.value_at(1).startswith(b"{\n")  # pretty JSON like djl_python's add_as_json


def test_output_error_sets_code_body_and_content_type():
    out = Output().error("bad thing", code=400, message="Bad Request")
    assert (out.code, out.message) == (400, "Bad Request")
    assert out.properties["content-type"] == "application/json"
    assert json.loads(out.content.value_at(0)) == {"code": 400, "message": "Bad Request", "error": "bad thing"}
    assert Output().error("x").code == 424


def test_binary_encode_round_trip_stringifies_values():
    encoded = Output.binary_encode({"data": "tok é", "last": True, "code": 400})
    assert binary_decode(encoded) == {"data": "tok é", "last": "True", "code": "400"}


def test_input_wire_round_trip():
    original = Input({"Content-Type": "application/json", "handler": "handle"},
                     PairList([("data", b'{"inputs": "hi"}'), ("extra", b"\x00\x01")]))
    decoded = read_input(io.BytesIO(encode_input(original)))
    assert decoded.get_properties() == original.get_properties()
    assert decoded.get_content().get_keys() == ["data", "extra"]
    assert decoded.get_as_bytes("extra") == b"\x00\x01"
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
