"""Embeddings on the vllm backend: all-MiniLM-L6-v2 served by ``lmi serve`` with ``option.task=text-embedding``
(vLLM's pooling runner), asked with the ``openai`` and ``huggingface_hub`` clients and LMI's schema, against vLLM's
own ``/v1/embeddings`` on the same model."""

import math
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from huggingface_hub import InferenceClient

pytest.importorskip("vllm", reason="the vllm backend's tests run in the vLLM environment (scripts/test.sh)")

pytestmark = pytest.mark.quality

TEXTS = ["The capital of France is Paris.", "Paris is in France.", "A quick brown fox", "Vectors of meaning",
         "What is deep learning?", "Deep learning trains neural networks.", "I like tea.", "ünïcödé 🙂"]


@pytest.fixture(scope="module")
def servers(serve_module, minilm_dir, vllm_properties, vllm_server):
    """``lmi serve`` on the vllm backend and vLLM's own server, both on all-MiniLM-L6-v2, started side by side."""
    own = vllm_server(minilm_dir, "--runner", "pooling")
    properties = {k: v for k, v in vllm_properties.items() if k != "option.max_model_len"}  # the model's own: 256
    model = serve_module.model_dir("minilm", {**properties, "option.model_id": str(minilm_dir),
                                              "option.backend": "vllm", "option.task": "text-embedding",
                                              "batch_size": 16, "max_batch_delay": 20})
    ours = serve_module([model], ready=False)
    return ours.wait_ready(timeout=900), own.wait_ready()


@pytest.fixture(scope="module")
def server(servers):
    return servers[0]


@pytest.fixture(scope="module")
def reference(servers, minilm_dir):
    """vLLM's own ``/v1/embeddings`` of ``TEXTS``."""
    answer = httpx.post(servers[1].url + "/v1/embeddings", timeout=120,
                        json={"model": str(minilm_dir), "input": TEXTS, "encoding_format": "float"})
    assert answer.status_code == 200, answer.text
    return {text: item["embedding"] for text, item in zip(TEXTS, answer.json()["data"])}


def _cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_embeddings_of_every_client_equal_vllms_own_v1_embeddings(server, reference):
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    got = []
    for fmt in ({}, {"encoding_format": "float"}):  # the client's default is base64, decoded by the client
        got += [(d.embedding, t) for d, t in zip(oai.embeddings.create(model="minilm", input=TEXTS[:3], **fmt).data,
                                                 TEXTS[:3])]
    got.append((list(InferenceClient(base_url=server.url).feature_extraction(TEXTS[3])), TEXTS[3]))

    def invoke(text):  # at once: the dynamic batches mix them
        return httpx.post(server.url + "/invocations", json={"inputs": [text]}, timeout=120).json()[0], text

    with ThreadPoolExecutor(16) as pool:
        got += list(pool.map(invoke, TEXTS * 2))
    similarities = [_cosine(vector, reference[text]) for vector, text in got]
    assert len(got) == 23 and min(similarities) >= 0.9999, similarities
    assert max(max(abs(a - b) for a, b in zip(v, reference[t])) for v, t in got) < 1e-5


def test_score_and_rerank_on_vllms_vectors_and_errors_in_openais_shape(server, reference):
    scores = httpx.post(server.url + "/score", json={"text_1": TEXTS[4], "text_2": TEXTS[5:7]}).json()
    want = [_cosine(reference[TEXTS[4]], reference[t]) for t in TEXTS[5:7]]
    assert all(abs(d["score"] - w) < 1e-4 for d, w in zip(scores["data"], want)) and len(scores["data"]) == 2
    ranked = httpx.post(server.url + "/rerank", json={"query": TEXTS[4], "documents": TEXTS[5:7]}).json()
    assert [r["index"] for r in ranked["results"]] == sorted(range(2), key=lambda i: -want[i])
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        oai.embeddings.create(model="minilm", input="hi", dimensions=8)
