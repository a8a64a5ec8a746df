"""The djl_python stand-ins behave as reference/djl-contract.md §2, §3 say."""

import json

import pytest

from lmi_handlers.protocol import Input, Output, PairList
from lmi_tools.serving.worker.codec import binary_decode


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
