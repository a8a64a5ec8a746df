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
    inputs = Input({}, PairList(pair_list=[("q", b"query"), ("data", b'{"a": 1}')]))
    assert inputs.get_as_bytes() == b'{"a": 1}'
    assert inputs.get_as_json() == {"a": 1}
    assert inputs.get_as_string("q") == "query"
    only_query = Input({}, PairList(pair_list=[("q", b"query")]))
    assert only_query.get_as_bytes() == b"query"
    with pytest.raises(KeyError):
        inputs.get_as_bytes("nope")
    assert Input().get_as_bytes() is None
    assert inputs.contains_key("q") and not inputs.contains_key("nope")


def test_empty_content_is_the_init_call():
    assert Input({"model_id": "x"}).is_empty()
    assert not Input({}, PairList(pair_list=[("data", b"")])).is_empty()


@pytest.mark.parametrize("sep", [".", "_"])
def test_get_batches_splits_by_fixed_positions(sep):
    props = {"batch_size": "2", "handler": "handle", f"batch_000{sep}Content-Type": "application/json",
             f"batch_001{sep}Accept": "text/event-stream"}
    content = PairList(pair_list=[(f"batch_000{sep}data", b"a"), (f"batch_001{sep}data", b"b")])
    first, second = Input(props, content).get_batches()
    assert first.get_properties() == {"Content-Type": "application/json"}
    assert second.get_property("accept") == "text/event-stream"
    assert (first.get_as_string(), second.get_as_string()) == ("a", "b")
    # Model-level properties (handler) live only on the outer Input.
    assert second.get_property("handler") is None


def test_unbatched_input_is_its_own_single_batch():
    inputs = Input({"Content-Type": "text/plain"}, PairList(pair_list=[("data", b"x")]))
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


# --- parity with djl_python, method by method (docs/djl-compat.md names these tests) -----------

def test_pairlist_constructors_and_add_follow_djl():
    assert PairList(keys=["a", "b"], values=[1, 2]).get_values() == [1, 2]
    with pytest.raises(ValueError, match="key value size mismatch"):
        PairList(keys=["a"], values=[1, 2])
    assert PairList(pair_list=[("a", 1), ("b", 2)]).get_keys() == ["a", "b"]
    assert PairList(pair_map={"a": 1, "b": 2}).get_values() == [1, 2]
    pairs = PairList()
    pairs.add("none", None)  # dropped, like djl_python
    pairs.add("x", b"1")
    pairs.add("first", b"0", index=0)
    pairs.add(pair=("kept", None))  # an explicit pair is kept even with a None value
    assert pairs.keys == ["first", "x", "kept"] and pairs.values == [b"0", b"1", None]
    other = PairList(pair_list=[("y", 2)])
    pairs.add_all(other)
    assert pairs.size() == 4 and pairs.get("y") == 2 and pairs.get("missing") is None
    assert pairs.get_keys() is pairs.keys  # the list itself, as djl_python returns it


def test_input_str_lists_properties_then_each_item_as_get_data_reads_it():
    inputs = Input({"content-type": "application/json"}, PairList(pair_list=[("data", b'{"a": 1}')]))
    assert str(inputs) == "properties: {'content-type': 'application/json'}\ndata: {'a': 1}"


def test_get_data_dispatches_on_content_type():
    def data(content_type, value):
        props = {} if content_type is None else {"Content-Type": content_type}
        return Input(props, PairList(pair_list=[("data", value)])).get_data()

    assert data("application/json; charset=utf-8", b"[1]") == [1]
    assert data("text/plain", "é".encode()) == "é"
    assert data(None, b"\x00") == b"\x00"
    assert Input().get_data() is None


def test_get_as_string_on_empty_input_raises_attribute_error_like_djl():
    with pytest.raises(AttributeError):
        Input().get_as_string()


def test_get_as_csv_reads_rows_as_dicts():
    inputs = Input({}, PairList(pair_list=[("data", b"a,b\n1,2\n")]))
    assert inputs.get_as_csv() == [{"a": "1", "b": "2"}]


def test_numpy_helpers_round_trip_ndlist_and_npz():
    np = pytest.importorskip("numpy")
    arrays = [np.arange(6, dtype="float32").reshape(2, 3), np.array([[1, -2]], dtype=">i8")]
    out = Output().add_as_numpy(arrays, key="nd").add_as_npz(arrays, key="npz")
    for content_type, key in (("tensor/ndlist", "nd"), ("tensor/npz", "npz")):
        inputs = Input({"content-type": content_type}, PairList(pair_list=[(key, out.content.get(key))]))
        back = inputs.get_data(key)
        assert [a.tolist() for a in back] == [a.tolist() for a in arrays]
        assert back[0].dtype == np.float32 and back[1].dtype.kind == "i"
    # get_as_numpy also reads npz bytes (they start with PK), as djl_python's np_util does.
    assert Input({}, PairList(pair_list=[("data", out.content.get("npz"))])).get_as_numpy()[0].shape == (2, 3)


def test_ndlist_layout_is_djls():
    np = pytest.importorskip("numpy")
    encoded = bytes(Output().add_as_numpy(np.ones((1, 2), dtype="float64")).content.value_at(0))
    assert encoded[:4] == b"\x00\x00\x00\x01"  # one array
    assert encoded[4:10] == b"\x00\x04NDAR" and encoded[10:14] == b"\x00\x00\x00\x03" and encoded[14] == 0
    assert b"\x00\x07default\x00\x07FLOAT64" in encoded and encoded.endswith(b"<" + (16).to_bytes(4, "big")
                                                                                 + np.ones(2).tobytes())


def test_output_add_stores_bytearrays_and_json_encodes_other_types():
    class Text(str):
        pass

    out = Output().add("s").add(b"b").add(bytearray(b"a")).add(Text("t")).add({"n": 1})
    # str becomes bytes (str.encode), everything else a bytearray, as djl_python stores them.
    assert [type(v) for v in out.content.values] == [bytes] + [bytearray] * 4
    assert out.content.values[:3] == [b"s", b"b", b"a"]
    assert out.content.value_at(3) == b'"t"'  # a str subclass is JSON, exact-type checks as in djl_python
    assert out.content.value_at(4) == b'{\n  "n":1\n}'


def test_add_as_json_encodes_numpy_and_datetime_values():
    import datetime

    np = pytest.importorskip("numpy")
    value = {"i": np.int64(3), "f": np.float32(0.5), "a": np.arange(2), "t": datetime.datetime(2024, 1, 2)}
    assert json.loads(Output().add_as_json(value).content.value_at(0)) == {
        "i": 3, "f": 0.5, "a": [0, 1], "t": "2024-01-02 00:00:00"}
    with pytest.raises(ValueError):
        Output().add_as_json(float("nan"))


def test_output_str_names_each_item_type():
    shown = json.loads(str(Output().add("x", key="k").add_property("p", "v")))
    assert shown == {"code": 200, "message": "OK", "properties": {"p": "v"},
                     "content": {"k": "type: <class 'bytes'>"}}


def test_error_default_message_is_v0_29_0s():
    out = Output().error("boom")
    assert (out.code, out.message) == (424, "prediction failure")
    assert out.get_property("content-type") == "application/json" and out.get_properties() is out.properties


def test_finalize_keeps_the_last_function_and_returns_its_result():
    out = Output().finalize(lambda: 0).finalize(lambda a, b, c: a + b + c, 1, 2, 3)
    assert out.execute_finalize() == 6
    assert Output().execute_finalize() is None


def test_default_stream_formatter_is_djls_json_line():
    out = Output().add_stream_content(iter(["é"]))
    assert out.stream_output_formatter is Output._default_stream_output_formatter
    assert out.stream_output_formatter("é") == bytearray(b'{"outputs": "\\u00e9"}\n')


def test_write_utf8_is_the_wire_string():
    buf = bytearray()
    Output.write_utf8(buf, "hé")
    Output.write_utf8(buf, None)
    assert bytes(buf) == b"\x00\x00\x00\x03h\xc3\xa9\xff\xff\xff\xff"
