"""``lmi bench`` against an embedding model: the target, the body, and how its answers are read (requests per
second are embeddings per second)."""

import json

import pytest

from lmi_tools.answers.messages import Api
from lmi_tools.answers.reader import AnswerReader
from lmi_tools.bench.apis import RequestShape, build_body
from lmi_tools.bench.targets import parse_target
from lmi_tools.errors import UsageError


def read(api, body, content_type="application/json", status=200):
    reader = AnswerReader(api, content_type, status)
    reader.feed(json.dumps(body).encode(), 0.0)
    return reader.finish(0.1)


def test_an_embeddings_path_is_the_embeddings_api_and_never_streams():
    target = parse_target("http://127.0.0.1:8080/v1/embeddings")
    assert (target.api, target.stream) == (Api.OPENAI_EMBEDDINGS, False)
    assert parse_target("http://h:1", api="openai-embeddings").url == "http://h:1/v1/embeddings"
    with pytest.raises(UsageError, match="does not stream"):
        parse_target("http://h:1/v1/embeddings", stream=True)
    assert build_body(Api.OPENAI_EMBEDDINGS, "text", RequestShape(16, stream=False, model="m")) == {
        "input": "text", "model": "m"}


def test_embedding_answers_are_read_as_whole_answers_with_their_input_tokens():
    answer = read(Api.OPENAI_EMBEDDINGS, {"object": "list", "data": [{"embedding": [0.1]}],
                                          "usage": {"prompt_tokens": 7, "total_tokens": 7}})
    assert (answer.error, answer.input_tokens, answer.output_tokens) == (None, 7, 0)
    assert "dimensions" in read(Api.OPENAI_EMBEDDINGS, {"error": {"message": "dimensions: no"}}, status=400).error
    lmi = read(Api.LMI, [[0.5, 0.25]])  # LMI's embedding answer, as lmi invoke reads it too
    assert lmi.error is None and json.loads(lmi.text) == [[0.5, 0.25]]
