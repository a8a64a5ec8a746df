"""The APIs current clients speak, on the hf engine: OpenAI's Responses (``openai``'s ``responses.create``) and
Anthropic's Messages (``anthropic``'s ``messages.create``, ``messages.stream``, ``count_tokens``), each translated
onto the chat route; a reasoning model's ``<think>`` part read apart (``option.reasoning_parser``); and embeddings
(``openai``'s ``embeddings.create``, ``huggingface_hub``'s ``feature_extraction``, score and rerank).

One ``lmi serve`` serves the module: the tiny model, the tiny model made a reasoning model (``thinking_model_dir``)
and all-MiniLM-L6-v2 (``option.task=text-embedding``, dynamic batching). Greedy answers of every API equal the chat
route's for the same conversation; embeddings equal sentence-transformers' ``encode``."""

import json
import threading

from concurrent.futures import ThreadPoolExecutor

import anthropic
import boto3
import httpx
import jsonschema
import openai
import pytest
from huggingface_hub import InferenceClient

from lmi_tools.sagemaker.invoke import invoke as sagemaker_invoke
from lmi_tools.sagemaker.invoke import request_body

BOOLEAN = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
           "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"],
           "additionalProperties": False}
SYSTEM = "You are terse."
TURNS = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
         {"role": "user", "content": "Another one?"}]
MAX = 12
NAMED = {"type": "function", "function": {"name": "get_weather"}}
#: Greedy, on Anthropic's client (whose create() takes no sampling arguments since 2.x).
GREEDY = {"extra_body": {"temperature": 0}}


TEXTS = ["The capital of France is Paris.", "Paris is in France.", "A quick brown fox", "Vectors of meaning",
         "What is deep learning?", "Deep learning trains neural networks.", "I like tea.", "ünïcödé 🙂"]


@pytest.fixture(scope="module")
def server(serve_module, tiny_model_dir, thinking_model_dir, minilm_dir):
    base = {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint", "option.rolling_batch": "scheduler",
            "option.max_new_tokens": 16}
    tiny = serve_module.model_dir("tiny", {**base, "option.model_id": str(tiny_model_dir)})
    thinker = serve_module.model_dir("thinker", {**base, "option.model_id": str(thinking_model_dir),
                                                 "option.reasoning_parser": "deepseek_r1"})
    minilm = serve_module.model_dir("minilm", {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint",
                                               "option.model_id": str(minilm_dir), "option.task": "text-embedding",
                                               "batch_size": 16, "max_batch_delay": 20})
    return serve_module([tiny, thinker, minilm], ready=False).wait_ready(timeout=300)


@pytest.fixture(scope="module")
def encoded(minilm_dir):
    """sentence-transformers' own ``encode`` of ``TEXTS``."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    model = sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu")
    return {text: [float(x) for x in vector] for text, vector in zip(TEXTS, model.encode(TEXTS))}


def _cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / (sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def _chat(oai, model="tiny", **kwargs):
    return oai.chat.completions.create(model=model, **kwargs).choices[0]


def _streamed_response(oai, **kwargs):
    """The events of a streamed response, and its final response."""
    events = list(oai.responses.create(stream=True, **kwargs))
    return events, events[-1].response


def test_greedy_responses_and_messages_answers_equal_the_chat_routes(oai, claude):
    chat = oai.chat.completions.create(model="tiny", messages=[{"role": "system", "content": SYSTEM}, *TURNS],
                                       max_tokens=MAX, temperature=0)
    want, usage = chat.choices[0].message.content, chat.usage
    assert want
    response = oai.responses.create(model="tiny", instructions=SYSTEM, input=TURNS, max_output_tokens=MAX,
                                    temperature=0)
    assert response.output_text == want and response.status in ("completed", "incomplete")
    assert (response.usage.input_tokens, response.usage.output_tokens) == (usage.prompt_tokens,
                                                                           usage.completion_tokens)
    events, final = _streamed_response(oai, model="tiny", instructions=SYSTEM, input=TURNS, max_output_tokens=MAX,
                                       temperature=0)
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{final.status}"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == want == final.output_text
    message = claude.messages.create(model="tiny", system=SYSTEM, messages=TURNS, max_tokens=MAX, **GREEDY)
    assert message.content[0].text == want and message.usage.input_tokens == usage.prompt_tokens
    assert message.stop_reason == ("max_tokens" if chat.choices[0].finish_reason == "length" else "end_turn")
    with claude.messages.stream(model="tiny", system=SYSTEM, messages=TURNS, max_tokens=MAX, **GREEDY) as stream:
        assert "".join(stream.text_stream) == want
        assert stream.get_final_message().usage.output_tokens == usage.completion_tokens
    assert claude.messages.count_tokens(model="tiny", system=SYSTEM, messages=TURNS).input_tokens == \
        usage.prompt_tokens


def test_responses_and_messages_count_their_tokens_in_metrics(oai, claude, server):
    def generated():
        lines = httpx.get(server.url + "/metrics").text.splitlines()
        return sum(float(line.split()[-1]) for line in lines
                   if line.startswith('lmi_generated_tokens_total{model="tiny"}'))

    before = generated()
    counts = [oai.responses.create(model="tiny", input="Hi", max_output_tokens=3).usage.output_tokens,
              list(oai.responses.create(model="tiny", input="Hi", max_output_tokens=3, stream=True))[-1]
              .response.usage.output_tokens,
              claude.messages.create(model="tiny", messages=TURNS, max_tokens=3).usage.output_tokens]
    assert generated() - before == sum(counts) > 0


def test_a_stop_sequence_is_anthropics_stop_sequence(oai, claude):
    free = _chat(oai, messages=TURNS, max_tokens=MAX, temperature=0).message.content
    stop = free.strip().split()[1] if len(free.split()) > 1 else free.strip()[1:3]
    message = claude.messages.create(model="tiny", messages=TURNS, max_tokens=MAX, stop_sequences=[stop], **GREEDY)
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", stop)
    assert message.content[0].text == free[:free.index(stop)]


def test_responses_function_tools_and_text_format_streamed_or_not(oai):
    tool = {"type": "function", "name": "get_weather", "description": "The weather", "parameters": WEATHER}
    for choice in ("required", {"type": "function", "name": "get_weather"}):
        kwargs = dict(model="tiny", input="Weather?", tools=[tool], tool_choice=choice, max_output_tokens=40,
                      temperature=0)
        calls = [item for item in oai.responses.create(**kwargs).output if item.type == "function_call"]
        assert [c.name for c in calls] == ["get_weather"]
        jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
        events, final = _streamed_response(oai, **kwargs)
        pieces = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert pieces == done[0].arguments == calls[0].arguments == final.output[0].arguments
    text = {"format": {"type": "json_schema", "name": "answer", "schema": BOOLEAN, "strict": True}}
    response = oai.responses.create(model="tiny", input="Yes or no?", text=text, max_output_tokens=20, temperature=0)
    jsonschema.validate(json.loads(response.output_text), BOOLEAN)
    assert response.text.format.type == "json_schema"
    _, final = _streamed_response(oai, model="tiny", input="Yes or no?", text=text, max_output_tokens=20,
                                  temperature=0)
    assert final.output_text == response.output_text


def test_anthropic_tool_use_then_tool_result_equals_the_chat_conversation(oai, claude):
    tool = {"name": "get_weather", "description": "The weather", "input_schema": WEATHER}
    ask = [{"role": "user", "content": "Weather?"}]
    message = claude.messages.create(model="tiny", messages=ask, max_tokens=40, tools=[tool],
                                     tool_choice={"type": "tool", "name": "get_weather"}, **GREEDY)
    use = message.content[-1]
    assert (use.type, use.name, message.stop_reason) == ("tool_use", "get_weather", "tool_use")
    jsonschema.validate(use.input, WEATHER)
    with claude.messages.stream(model="tiny", messages=ask, max_tokens=40, tools=[tool],
                                tool_choice={"type": "tool", "name": "get_weather"}, **GREEDY) as stream:
        assert stream.get_final_message().content[-1].input == use.input
    follow = ask + [{"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name,
                                                        "input": use.input}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny"}]}]
    answer = claude.messages.create(model="tiny", messages=follow, max_tokens=MAX, **GREEDY)
    chat = _chat(oai, max_tokens=MAX, temperature=0, messages=ask + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": use.id, "type": "function", "function": {
            "name": use.name, "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "Sunny"}])
    assert answer.content[0].text == chat.message.content


def test_previous_response_id_continues_the_stored_conversation(oai, server):
    first = oai.responses.create(model="tiny", instructions=SYSTEM, input=TURNS[0]["content"], max_output_tokens=MAX,
                                 temperature=0)
    second = oai.responses.create(model="tiny", instructions=SYSTEM, input="Another one?", max_output_tokens=MAX,
                                  temperature=0, previous_response_id=first.id)
    chat = _chat(oai, max_tokens=MAX, temperature=0, messages=[
        {"role": "system", "content": SYSTEM}, TURNS[0], {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Another one?"}])
    assert second.output_text == chat.message.content and second.previous_response_id == first.id
    assert oai.responses.retrieve(second.id).output_text == second.output_text
    with pytest.raises(openai.BadRequestError, match="only a response in progress"):
        oai.responses.cancel(second.id)
    oai.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(first.id)
    unstored = oai.responses.create(model="tiny", input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        oai.responses.create(model="tiny", input="Hi", previous_response_id=unstored.id)


def test_a_cancel_ends_a_response_in_progress(oai, server):
    seen = threading.Event()
    with httpx.stream("POST", server.url + "/v1/responses", timeout=120, json={
            "model": "tiny", "input": "Count.", "max_output_tokens": 16, "stream": True,
            "temperature": 1.0, "seed": 1}) as stream:
        lines = stream.iter_lines()
        for line in lines:
            if line.startswith("data:") and json.loads(line[5:])["type"] == "response.in_progress":
                response_id = json.loads(line[5:])["response"]["id"]
                assert oai.responses.cancel(response_id).status == "cancelled"
                seen.set()
                break
        rest = [json.loads(line[5:]) for line in lines if line.startswith("data:")]
    assert seen.is_set() and rest[-1]["type"] == "response.cancelled"
    assert oai.responses.retrieve(response_id).status == "cancelled"


def test_reasoning_is_read_apart_on_chat_responses_and_messages(oai, claude):
    ask = [{"role": "user", "content": "Think, then answer."}]
    for seed in (1, 2):
        whole = _chat(oai, "thinker", messages=ask, max_tokens=16, temperature=1.0, seed=seed).message
        reasoning = whole.model_extra["reasoning_content"]
        streamed = list(oai.chat.completions.create(model="thinker", messages=ask, max_tokens=16, temperature=1.0,
                                                    seed=seed, stream=True))
        assert "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in streamed) == reasoning
        assert "".join(c.choices[0].delta.content or "" for c in streamed) == (whole.content or "")
        assert "</think>" not in reasoning + (whole.content or "")
        response = oai.responses.create(model="thinker", input=ask, max_output_tokens=16, temperature=1.0,
                                        extra_body={"seed": seed})
        items = {item.type: item for item in response.output}
        assert items["reasoning"].content[0].text == reasoning
        assert response.output_text == (whole.content or "")
    # Messages has no seed: sampled answers start with a thinking block unless </think> comes first (1 in 6 or so)
    for _ in range(8):
        message = claude.messages.create(model="thinker", messages=ask, max_tokens=16)
        if message.content and message.content[0].type == "thinking":
            break
    assert message.content[0].thinking and "</think>" not in message.content[0].thinking


def test_a_schema_and_a_forced_tool_call_hold_after_the_reasoning(oai):
    ask = [{"role": "user", "content": "Yes or no?"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": BOOLEAN}}
    thought = []
    for seed in (None, 1, 2, 3):
        sampling = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
        choice = _chat(oai, "thinker", messages=ask, max_tokens=120, response_format=fmt, **sampling)
        jsonschema.validate(json.loads(choice.message.content), BOOLEAN)
        assert choice.finish_reason == "stop"  # the grammar ended the answer
        thought.append(choice.message.model_extra["reasoning_content"])
        tool = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
        called = _chat(oai, "thinker", messages=ask, max_tokens=120, tools=[tool], tool_choice=NAMED, **sampling)
        jsonschema.validate(json.loads(called.message.tool_calls[0].function.arguments), WEATHER)
        assert called.finish_reason == "tool_calls"
    assert thought[0] == "" and any(thought[1:])  # greedy ends the reasoning at once; sampled ones reason first


def test_errors_come_in_each_apis_shape_naming_the_clients_field(oai, claude, server):
    with pytest.raises(openai.BadRequestError, match="max_output_tokens"):
        oai.responses.create(model="tiny", input="Hi", max_output_tokens=0)
    with pytest.raises(openai.BadRequestError, match="text.format.schema"):
        oai.responses.create(model="tiny", input="Hi", text={"format": {"type": "json_schema", "name": "x",
                                                                       "schema": {"type": "foo"}}})
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\]"):
        oai.responses.create(model="tiny", input="Hi", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match="unknown field"):
        oai.responses.create(model="tiny", input="Hi", extra_body={"frobnicate": 1})
    with pytest.raises(openai.BadRequestError, match=r"input\[0\]\.type"):
        oai.responses.create(model="tiny", input=[{"type": "image", "image_url": "x"}])
    with pytest.raises(anthropic.BadRequestError, match="stop_sequences"):
        claude.messages.create(model="tiny", messages=TURNS, max_tokens=4, stop_sequences=[""])
    body = httpx.post(server.url + "/v1/messages", json={"model": "tiny", "messages": TURNS}).json()
    assert body == {"type": "error", "error": {"type": "invalid_request_error",
                                               "message": "max_tokens: Field required"}}
    image = [{"role": "user", "content": [{"type": "image", "source": {}}]}]
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[0\]\.content\[0\]\.type"):
        claude.messages.create(model="tiny", messages=image, max_tokens=4)


def test_embeddings_of_every_client_and_route_equal_sentence_transformers(oai, server, encoded):
    got = []  # (vector, text) from every route and client
    for fmt in ({}, {"encoding_format": "float"}):  # the openai client asks for base64 unless told, and decodes it
        answer = oai.embeddings.create(model="minilm", input=TEXTS[:3], **fmt)
        got += [(d.embedding, text) for d, text in zip(answer.data, TEXTS[:3])]
        assert answer.usage.prompt_tokens > 0 and answer.model == "minilm"
    got.append((oai.embeddings.create(model="minilm", input=TEXTS[3]).data[0].embedding, TEXTS[3]))
    tei = InferenceClient(base_url=server.url + "/?model_name=minilm")  # TEI's POST /
    got.append((list(tei.feature_extraction(TEXTS[4])), TEXTS[4]))
    hub = InferenceClient(model=server.url + "/predictions/minilm").feature_extraction(TEXTS[5])
    got.append((list(hub), TEXTS[5]))

    def invoke(text):  # 16 at once: the dynamic batches mix them
        response = httpx.post(server.url + "/invocations?model_name=minilm", json={"inputs": [text]}, timeout=60)
        return response.json()[0], text

    with ThreadPoolExecutor(16) as pool:
        got += list(pool.map(invoke, TEXTS * 2))
    runtime = boto3.client("sagemaker-runtime", endpoint_url=server.url, region_name="us-east-1",
                           aws_access_key_id="testing", aws_secret_access_key="testing")
    answer = sagemaker_invoke(runtime, "minilm", request_body(TEXTS[6]))  # what lmi invoke sends and prints
    got.append((json.loads(answer.text), TEXTS[6]))
    similarities = [_cosine(vector, encoded[text]) for vector, text in got]
    assert len(got) == 26 and min(similarities) >= 0.9999, similarities


def test_score_rerank_and_cohere_embed_are_cosines_of_the_same_vectors(server, encoded):
    def close(got, want):  # the server's default dtype is bf16 on a CPU with native bf16; the reference float32
        return len(got) == len(want) and all(abs(g - w) < 2e-3 for g, w in zip(got, want))

    scores = httpx.post(server.url + "/score", json={"model": "minilm", "text_1": TEXTS[0],
                                                     "text_2": TEXTS[1:4]}).json()
    assert close([d["score"] for d in scores["data"]], [_cosine(encoded[TEXTS[0]], encoded[t]) for t in TEXTS[1:4]])
    pairs = httpx.post(server.url + "/v1/score", json={"model": "minilm", "queries": TEXTS[:2],
                                                       "documents": TEXTS[2:4]}).json()
    assert close([d["score"] for d in pairs["data"]],
                 [_cosine(encoded[a], encoded[b]) for a, b in zip(TEXTS[:2], TEXTS[2:4])])
    documents = [TEXTS[6], TEXTS[5], TEXTS[2]]
    ranked = httpx.post(server.url + "/v1/rerank", json={"model": "minilm", "query": TEXTS[4], "top_n": 2,
                                                         "documents": [documents[0], {"text": documents[1]},
                                                                       documents[2]]}).json()
    relevance = [_cosine(encoded[TEXTS[4]], encoded[d]) for d in documents]
    order = sorted(range(3), key=lambda i: -relevance[i])[:2]
    assert [r["index"] for r in ranked["results"]] == order and order[0] == 1  # the deep-learning sentence first
    assert close([r["relevance_score"] for r in ranked["results"]], [relevance[i] for i in order])
    assert ranked["results"][0]["document"]["text"] == TEXTS[5] and ranked["usage"]["total_tokens"] > 0
    cohere = httpx.post(server.url + "/v2/embed", json={"model": "minilm", "texts": TEXTS[:2], "input_type":
                                                        "search_document", "embedding_types": ["float"]}).json()
    assert min(_cosine(v, encoded[t]) for v, t in zip(cohere["embeddings"]["float"], TEXTS[:2])) >= 0.9999


def test_embedding_errors_name_the_field_in_openais_shape(oai, server):
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        oai.embeddings.create(model="minilm", input="hi", dimensions=64)
    with pytest.raises(openai.BadRequestError, match="option.task=text-embedding"):
        oai.embeddings.create(model="tiny", input="hi")
    with pytest.raises(openai.BadRequestError, match="at most 256 tokens"):
        oai.embeddings.create(model="minilm", input="word " * 300)
    body = httpx.post(server.url + "/rerank", json={"model": "minilm", "query": "", "documents": ["a"]}).json()
    assert body["error"]["type"] == "invalid_request_error" and "query" in body["error"]["message"]


HOSTILE = [  # (path, body, the field the 400 names)
    ("/v1/responses", {"model": "tiny", "input": 5}, "input"),
    ("/v1/responses", {"model": "tiny", "input": []}, "input"),
    ("/v1/responses", {"model": "tiny", "input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ("/v1/responses", {"model": "tiny", "input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
    ("/v1/responses", {"model": "tiny", "input": "x", "text": "json"}, "text"),
    ("/v1/responses", {"model": "tiny", "input": "x", "tool_choice": "required"}, "tool_choice"),
    ("/v1/responses", {"model": "tiny", "input": "x", "background": True}, "background"),
    ("/v1/responses", {"model": "tiny", "input": "x", "reasoning": {"effort": "high"}}, "reasoning.effort"),
    ("/v1/responses", {"model": "tiny", "input": "x", "temperature": -1}, "temperature"),
    ("/v1/messages", {"model": "tiny", "max_tokens": 4, "messages": "hi"}, "messages"),
    ("/v1/messages", {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]}, "messages[0].content[0].type"),
    ("/v1/messages", {"model": "tiny", "max_tokens": 4, "messages": TURNS, "tool_choice": {"type": "maybe"}},
     "tool_choice"),
    ("/v1/messages", {"model": "tiny", "max_tokens": 0, "messages": TURNS}, "max_tokens"),
    ("/v1/messages", {"model": "tiny", "max_tokens": 4, "messages": TURNS, "system": [{"type": "image"}]},
     "system[0]"),
    ("/v1/embeddings", {"model": "minilm", "input": ["x"] * 2049}, "input"),
    ("/v1/embeddings", {"model": "minilm", "input": [[1, -2]]}, "input[0]"),
    ("/v1/embeddings", {"model": "minilm", "input": "x", "user": 3}, "user"),
    ("/score", {"model": "minilm", "text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_1"),
    ("/v2/embed", {"model": "minilm", "texts": ["a"], "embedding_types": ["int8"]}, "embedding_types"),
]


@pytest.mark.parametrize("path, body, field", HOSTILE, ids=[f"{p}-{f}" for p, _, f in HOSTILE])
def test_hostile_bodies_get_a_400_naming_their_field_and_spare_the_server(server, path, body, field):
    answer = httpx.post(server.url + path, json=body, timeout=60)
    error = answer.json()["error"]
    message = error["message"] if isinstance(error, dict) else error
    assert answer.status_code == 400 and message.startswith(field), (answer.status_code, message)
    assert httpx.get(server.url + "/ping").status_code == 200
