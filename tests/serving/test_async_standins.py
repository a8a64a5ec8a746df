"""The ``djl_python.async_utils`` and ``djl_python.encode_decode`` stand-ins an async ``model.py`` imports under
``lmi serve``: their answers, and (where ``djl_python`` is installed) the same bytes and values as DJL's own."""

import asyncio
import importlib
import importlib.util
import json

import pytest

from lmi_handlers.protocol import Input, PairList
from lmi_tools.serving.worker.codec import binary_decode

ours_utils = importlib.import_module("lmi_tools.serving.worker.standins.djl_python.async_utils")
ours_codec = importlib.import_module("lmi_tools.serving.worker.standins.djl_python.encode_decode")
HAS_DJL = importlib.util.find_spec("djl_python") is not None


def item(output) -> dict:
    return binary_decode(bytes(output.content.value_at(0)))


def test_whole_and_streamed_answers_are_djls_map():
    whole = ours_utils.create_non_stream_output({"text": "é"}, properties={"X-Extra": "1"})
    assert item(whole) == {"data": '{"text": "é"}\n', "last": "True"}
    assert whole.properties == {"Content-Type": "application/json", "X-Extra": "1"} and whole.code == 200
    chunk = ours_utils.create_stream_chunk_output("", True, error="bad", code=424)
    assert item(chunk) == {"data": "\n", "last": "True", "error": "bad", "code": "424"}
    assert chunk.properties == {"Content-Type": "application/jsonlines"}


@pytest.mark.skipif(not HAS_DJL, reason="djl_python is not installed")
@pytest.mark.parametrize("call", [
    lambda m: m.create_non_stream_output("plain"),
    lambda m: m.create_non_stream_output({"a": [1, "ü"]}, properties={"k": "v", "Content-Type": "text/x"}),
    lambda m: m.create_non_stream_output("", error="no", code=400),
    lambda m: m.create_stream_chunk_output({"token": "t"}, False),
    lambda m: m.create_stream_chunk_output("x\n", True, error="e", code=500),
])
def test_the_same_bytes_as_djls_helpers(call):
    from djl_python import async_utils

    ours, theirs = call(ours_utils), call(async_utils)
    assert bytes(ours.content.value_at(0)) == bytes(theirs.content.value_at(0))
    assert ours.properties == theirs.properties and ours.code == theirs.code


async def _stream(formatter, accumulate=False):
    async def chunks():
        for piece in ("a", "b", "c"):
            yield piece

    return [item(out) async for out in ours_utils.handle_streaming_response(chunks(), formatter, accumulate)]


def test_streaming_through_a_formatter_stops_at_its_last_chunk_and_a_failure_is_a_424():
    assert asyncio.run(_stream(lambda c: (c.upper(), c == "b"))) == [{"data": "A\n", "last": "False"},
                                                                     {"data": "B\n", "last": "True"}]

    def history(chunk, history):
        return "".join(history + [chunk]), False, history + [chunk]

    assert [i["data"] for i in asyncio.run(_stream(history, accumulate=True))] == ["a\n", "ab\n", "abc\n"]

    def broken(chunk):
        raise ValueError("no")

    assert asyncio.run(_stream(broken)) == [{"data": "\n", "last": "True", "error": "no", "code": "424"}]


def test_the_adapter_a_request_names():
    header = Input({"X-Amzn-SageMaker-Adapter-Identifier": "a1"})
    assert ours_utils._extract_lora_adapter(header, {"adapters": "a2"}) == "a1"
    payload = {"inputs": "x", "adapters": "a2"}
    assert ours_utils._extract_lora_adapter(Input(), payload) == "a2" and payload == {"inputs": "x"}


def body(data: bytes, content_type=None) -> Input:
    content = PairList()
    content.add("data", data)
    return Input({"Content-Type": content_type} if content_type else {}, content)


CASES = [  # (body, content type)
    (b'{"inputs": "x"}', "application/json"), (b'{"inputs": "x"}', None), (b"", None),
    (b"hello", "text/plain"), (b"inputs\nfirst\nsecond\n", "text/csv"), (b"question,context\nq,c\n", "text/csv"),
    (b"raw", "application/octet-stream"), (b"a=1", "application/x-www-form-urlencoded"), (b"x", "audio/wav"),
]


@pytest.mark.parametrize("data, content_type", CASES)
def test_decode_reads_each_content_type(data, content_type):
    decoded = ours_codec.decode(body(data, content_type), content_type)
    if HAS_DJL:
        from djl_python import encode_decode

        assert decoded == encode_decode.decode(body(data, content_type), content_type)
    assert isinstance(decoded, dict) and "inputs" in decoded


def test_decode_refuses_a_csv_without_its_headers_and_encode_writes_json():
    with pytest.raises(ValueError, match="correct CSV with Header columns"):
        ours_codec.decode(body(b"a,b\n1,2\n", "text/csv"), "text/csv")
    assert ours_codec.decode_csv(body(b"1,2\n3,4\n"), require_headers=False).tolist() == [[1.0, 2.0], [3.0, 4.0]]
    from lmi_handlers.protocol import Output

    out = Output()
    ours_codec.encode(out, {"a": 1}, "application/json")
    assert json.loads(bytes(out.content.value_at(0))) == {"a": 1}
    assert out.properties == {"Content-Type": "application/json"}
    assert ours_codec.encode_csv([{"a": 1, "b": 2}]) == "a,b\r\n1,2\r\n"
