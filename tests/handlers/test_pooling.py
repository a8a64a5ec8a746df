"""Embeddings on the hf backend (``option.task=text-embedding``): a dynamic batch of LMI and OpenAI embedding
requests against sentence-transformers' own ``encode`` of all-MiniLM-L6-v2 (an encoder, mean pooling, normalized)
and against transformers' own last hidden state of a decoder (the tiny Llama, last-token pooling)."""

import base64
import json
import struct
from types import SimpleNamespace

import pytest

from lmi_handlers.handler import Handler
from lmi_tools.serving.worker.frontend import batch_input, init_input, request_input

JSON = [("Content-Type", "application/json")]
TEXTS = ["The capital of France is Paris.", "A quick brown fox", "Embeddings map text to vectors.",
         "What is deep learning?", "ünïcödé and emoji 🙂"]


def loaded(model_dir, **options):
    handler = Handler()
    props = {"engine": "Python", "entryPoint": "lmi_handlers.entrypoint", "model_id": str(model_dir),
             "task": "text-embedding", **{k: str(v) for k, v in options.items()}}
    assert handler.handle(init_input(props)) is None, "the model did not load"
    return handler


def answers(handler, *payloads):
    """Each payload's (status, JSON answer) from one dynamic batch."""
    inputs = batch_input([request_input(JSON, json.dumps(p).encode()) for p in payloads])
    out = handler.handle(inputs)
    bodies = [json.loads(bytes(out.content.value_at(i))) for i in range(out.content.size())]
    return [(b["code"] if isinstance(b, dict) and "error" in b else out.code, b) for b in bodies]


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5)


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return loaded(minilm_dir)


@pytest.fixture(scope="module")
def reference(minilm_dir):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    model = sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu")
    return [list(map(float, v)) for v in model.encode(TEXTS)]


def test_a_batch_of_both_shapes_equals_sentence_transformers_encode(minilm, reference):
    base64_request = {"input": TEXTS[2:4], "encoding_format": "base64", "model": "mine"}
    (c1, one), (c2, many), (c3, oai), (c4, b64), (c5, bad) = answers(
        minilm, {"inputs": TEXTS[0]}, {"inputs": TEXTS}, {"input": TEXTS[1:3]}, base64_request, {"inputs": ""})
    assert (c1, c2, c3, c4, c5) == (200, 200, 200, 200, 400) and "inputs" in bad["error"]
    decoded = [list(struct.unpack(f"<{len(base64.b64decode(d['embedding'])) // 4}f",
                                  base64.b64decode(d["embedding"]))) for d in b64["data"]]
    got = [one] + many + [d["embedding"] for d in oai["data"]] + decoded
    want = [reference[0]] + reference + reference[1:3] + reference[2:4]
    similarities = [cosine(g, w) for g, w in zip(got, want)]
    assert len(got) == 10 and min(similarities) >= 0.9999, similarities
    assert all(abs(sum(x * x for x in g) - 1) < 1e-5 for g in got)  # normalized, as its Normalize module says
    assert oai["object"] == "list" and [d["index"] for d in oai["data"]] == [0, 1]
    assert oai["usage"]["prompt_tokens"] == oai["usage"]["total_tokens"] > 0 and b64["model"] == "mine"


def test_token_ids_embed_like_their_text_and_bad_inputs_name_their_field(minilm, minilm_dir):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(minilm_dir)(TEXTS[0])["input_ids"]
    (_, text), (_, tokens), *refused = answers(
        minilm, {"input": TEXTS[0]}, {"input": ids}, {"input": [ids, [10**9]]}, {"input": TEXTS[0], "dimensions": 8},
        {"inputs": "word " * 400}, {"inputs": "x", "truncate": True}, {"input": "x", "encoding_format": "int8"},
        {"inputs": ["a", 3]}, {"inputs": "x", "stream": True})
    assert text["data"][0]["embedding"] == tokens["data"][0]["embedding"]
    fields = ["input[1]", "dimensions", "inputs", "truncate", "encoding_format", "inputs[1]", "stream"]
    for (code, body), field in zip(refused, fields):
        assert code == 400 and body["error"].startswith(field), (field, body)
    assert "at most 256 tokens" in refused[2][1]["error"]  # sentence_bert_config's max_seq_length


def test_a_single_request_is_answered_unbatched(minilm, reference):
    out = minilm.handle(request_input(JSON, json.dumps({"inputs": [TEXTS[4]]}).encode()))
    assert out.code == 200 and cosine(json.loads(bytes(out.content.value_at(0)))[0], reference[4]) >= 0.9999
    out = minilm.handle(request_input(JSON, json.dumps({"inputs": 5}).encode()))
    assert out.code == 400


def test_a_decoder_pools_its_last_token_as_transformers_computes_it(tiny_model_dir):
    import torch
    from transformers import AutoModel, AutoTokenizer

    handler = loaded(tiny_model_dir)
    tokenizer, model = AutoTokenizer.from_pretrained(tiny_model_dir), AutoModel.from_pretrained(tiny_model_dir)
    [(code, vectors)] = answers(handler, {"inputs": TEXTS[:3]})
    assert code == 200
    for text, vector in zip(TEXTS[:3], vectors):
        with torch.no_grad():
            hidden = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0, -1]
        want = torch.nn.functional.normalize(hidden, dim=-1).tolist()
        assert cosine(vector, want) >= 0.9999 and max(abs(a - b) for a, b in zip(vector, want)) < 1e-4


def test_an_embedding_model_refuses_rolling_batch_and_unknown_tasks(tmp_path, tiny_model_dir):
    handler = Handler()
    props = {"model_id": str(tiny_model_dir), "task": "text-embedding", "rolling_batch": "auto"}
    out = handler.handle(init_input(props))
    assert out.code == 400 and "option.rolling_batch" in bytes(out.content.value_at(0)).decode()
    out = Handler().handle(init_input({"model_id": str(tiny_model_dir), "task": "translation"}))
    assert out.code == 400 and "option.task" in bytes(out.content.value_at(0)).decode()


def test_async_mode_answers_each_embedding_request_alone_as_sync_mode_does(minilm_dir, minilm):
    """DJL's async engine (``option.async_mode=true``) awaits each request: its vectors are sync mode's, in
    ``async_utils``' bytes, and a bad request fails alone with its own status."""
    import asyncio
    import queue

    from lmi_tools.serving.worker.async_engine import invoke
    from lmi_tools.serving.worker.codec import binary_decode

    handler = Handler()
    module = SimpleNamespace(handle=handler.handle)
    loop = asyncio.new_event_loop()

    async def call(inputs, tracking_id):
        inputs.properties.update({"handler": "handle", "request_tracking_id": tracking_id})
        inputs.function_name = "handle"
        answers: queue.SimpleQueue = queue.SimpleQueue()
        await invoke(module, inputs, answers)
        return answers.get()

    props = {"engine": "Python", "model_id": str(minilm_dir), "task": "text-embedding", "async_mode": "true"}
    assert loop.run_until_complete(call(init_input(props), "init")).code == 204  # loaded: DJL's "No content"

    async def both():
        good = request_input(JSON, json.dumps({"input": TEXTS[:2]}).encode())
        bad = request_input(JSON, json.dumps({"input": ""}).encode())
        outputs = await asyncio.gather(call(good, "a"), call(bad, "b"))
        return [binary_decode(bytes(out.content.value_at(0))) for out in outputs]

    good, bad = loop.run_until_complete(both())
    [(code, sync)] = answers(minilm, {"input": TEXTS[:2]})
    assert good["last"] == "True" and code == 200
    assert [d["embedding"] for d in json.loads(good["data"])["data"]] == [d["embedding"] for d in sync["data"]]
    assert bad["code"] == "400" and "input" in bad["error"]
