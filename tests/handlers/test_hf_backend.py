"""The transformers backend against transformers itself, on a tiny random-weight model built locally.

Greedy output through the handler equals ``model.generate(do_sample=False)`` for the same prompt: alone, in a
dynamic batch of mixed prompts, and in a rolling batch whatever joined beside it and whenever.
"""

import json
import random

import pytest

from lmi_handlers.backends.hf.backend import HFTokenizer
from lmi_handlers.handler import Handler
from lmi_tools.serving.worker.frontend import RollingBatchLoop, RollingRequest, batch_input, init_input, request_input

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

JSON = [("Content-Type", "application/json")]
PROMPTS = ["Hello world", "The quick brown fox jumps over the lazy", "What is the capital of France?",
           "Tokens arrive one at a time, and", "A", "Engineers validate a configuration before deploying it"]


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    return tokenizer, model


def expected_ids(reference, prompt_ids, max_new_tokens, **kwargs):
    _, model = reference
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                             max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
    return out[0, len(prompt_ids):].tolist()


# The stock CPU path, which exactness against the stock model's ``generate`` needs (the default, auto, may take
# kernels that sum in another order); a test of a kernel names it over this.
STOCK_KERNELS = {"cpu_linear_kernel": "stock", "cpu_attention_kernel": "torch"}


def loaded(tiny_model_dir, tmp_path, **options):
    handler = Handler()
    props = {"model_id": str(tiny_model_dir), "model_dir": str(tmp_path), **STOCK_KERNELS,
             **{k: str(v) for k, v in options.items()}}
    assert handler.handle(init_input(props)) is None
    return handler


@pytest.fixture(scope="module")
def handler(tiny_model_dir, tmp_path_factory):
    return loaded(tiny_model_dir, tmp_path_factory.mktemp("model"), batch_size=8)


def ask(handler, payload, headers=JSON):
    out = handler.handle(request_input(headers, json.dumps(payload).encode()))
    if out.stream_content is not None:
        return out.code, "".join(out.stream_content)
    return out.code, bytes(out.content.value_at(0)).decode()


def token_ids(body):
    return [t["id"] for t in json.loads(body)["details"]["tokens"]]


def test_the_batched_paged_path_was_chosen(handler):
    assert handler.backend.runner.name == "paged"


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_generate_alone(handler, reference, prompt):
    tokenizer, _ = reference
    code, body = ask(handler, {"inputs": prompt, "parameters": {"max_new_tokens": 20, "details": True}})
    assert code == 200
    want = expected_ids(reference, tokenizer(prompt).input_ids, 20)
    assert token_ids(body) == want
    assert json.loads(body)["generated_text"] == tokenizer.decode(want, skip_special_tokens=True)


def test_greedy_equals_generate_inside_a_dynamic_batch(handler, reference):
    tokenizer, _ = reference
    budgets = [3, 17, 9, 20, 1, 12]
    batch = batch_input([request_input(JSON, json.dumps({"inputs": p, "parameters": {
        "max_new_tokens": n, "details": True}}).encode()) for p, n in zip(PROMPTS, budgets)])
    out = handler.handle(batch)
    assert out.code == 200
    for i, (prompt, budget) in enumerate(zip(PROMPTS, budgets)):
        assert token_ids(bytes(out.content.value_at(i))) == expected_ids(reference, tokenizer(prompt).input_ids, budget)


def test_decoding_through_the_rust_tokenizer_equals_transformers_decode(tiny_model_dir):
    rng = random.Random(5)
    for cleanup in (False, True):
        tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir, clean_up_tokenization_spaces=cleanup)
        ours = HFTokenizer(tokenizer)
        # The Rust decode only where transformers would not clean up spaces after it.
        assert (ours._rust_decode is None) == cleanup
        for length in (1, 2, 7, 40):
            ids = [rng.randrange(len(tokenizer)) for _ in range(length)] + sorted(ours.special_ids)[:1]
            assert ours.decode(ids) == tokenizer.decode(ids, skip_special_tokens=True)


def test_streamed_text_equals_non_streamed_text(handler):
    for prompt in PROMPTS[:3]:
        params = {"max_new_tokens": 24}
        _, plain = ask(handler, {"inputs": prompt, "parameters": params})
        code, stream = ask(handler, {"inputs": prompt, "stream": True, "parameters": params})
        lines = [json.loads(line) for line in stream.splitlines()]
        assert code == 200 and len(lines) == 24
        assert "".join(line["token"]["text"] for line in lines) == json.loads(plain)["generated_text"]
        assert lines[-1]["generated_text"] == json.loads(plain)["generated_text"]


def test_stop_sequence_cuts_the_text_and_never_leaks(handler):
    _, plain = ask(handler, {"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 24}})
    text = json.loads(plain)["generated_text"]
    stop = text[8:12]
    _, body = ask(handler, {"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 24, "stop": [stop],
                                                                  "details": True}})
    result = json.loads(body)
    assert result["generated_text"] == text[:text.index(stop)]
    assert result["details"]["finish_reason"] == "stop_sequence"
    _, stream = ask(handler, {"inputs": PROMPTS[1], "stream": True, "parameters": {"max_new_tokens": 24,
                                                                                   "stop": stop}})
    streamed = "".join(json.loads(line)["token"]["text"] for line in stream.splitlines())
    assert streamed == text[:text.index(stop)] and stop not in streamed


def test_chat_uses_the_tokenizer_template(handler, reference):
    tokenizer, _ = reference
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    code, body = ask(handler, {"messages": messages, "max_tokens": 10, "temperature": 0})
    assert code == 200
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want = expected_ids(reference, tokenizer(prompt, add_special_tokens=False).input_ids, 10)
    answer = json.loads(body)
    assert answer["choices"][0]["message"]["content"] == tokenizer.decode(want, skip_special_tokens=True)
    assert answer["usage"]["completion_tokens"] == len(want)


def test_chat_stream_is_openai_sse(handler):
    code, stream = ask(handler, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "stream": True,
                                 "temperature": 0})
    events = [e for e in stream.split("\n\n") if e]
    assert code == 200 and events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["choices"][0]["delta"]["role"] == "assistant"


def test_prompt_beyond_the_context_is_a_400_never_truncated(handler):
    code, body = ask(handler, {"inputs": "word " * 600})
    error = json.loads(body)
    assert code == 400 and error["code"] == 400
    assert "inputs: the prompt is" in error["error"] and "at most 511 prompt tokens" in error["error"]
    code, body = ask(handler, {"inputs": "Hello", "parameters": {"max_new_tokens": 510}})
    assert code == 400 and "parameters.max_new_tokens" in json.loads(body)["error"]
    assert "Ask for at most" in json.loads(body)["error"]
    for budget in ("max_tokens", "max_completion_tokens"):  # chat: the field as the client wrote it
        code, body = ask(handler, {"messages": [{"role": "user", "content": "Hi"}], budget: 510})
        assert code == 400 and json.loads(body)["error"].startswith(f"{budget}: the prompt is")


def test_repetition_penalty_matches_generate(handler, reference):
    tokenizer, _ = reference
    _, body = ask(handler, {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 16, "repetition_penalty": 1.3,
                                                                 "details": True}})
    assert token_ids(body) == expected_ids(reference, tokenizer(PROMPTS[0]).input_ids, 16, repetition_penalty=1.3)


def test_seeded_sampling_is_reproducible_alone_and_in_a_batch(handler):
    payload = {"inputs": PROMPTS[2], "parameters": {"max_new_tokens": 12, "do_sample": True, "temperature": 0.9,
                                                    "top_k": 50, "top_p": 0.95, "seed": 1234, "details": True}}
    first = token_ids(ask(handler, payload)[1])
    assert token_ids(ask(handler, payload)[1]) == first
    other = {"inputs": PROMPTS[3], "parameters": {"max_new_tokens": 20, "do_sample": True, "seed": 9}}
    out = handler.handle(batch_input([request_input(JSON, json.dumps(other).encode()),
                                      request_input(JSON, json.dumps(payload).encode())]))
    assert token_ids(bytes(out.content.value_at(1))) == first
    reseeded = json.loads(json.dumps(payload))
    reseeded["parameters"]["seed"] = 4321
    assert token_ids(ask(handler, reseeded)[1]) != first


def test_legacy_schema_counts_the_prompt_in_seq_length(handler, reference):
    tokenizer, _ = reference
    code, body = ask(handler, {"text": ["Hello world", "A"], "seq_length": 12})
    assert code == 200
    texts = json.loads(body)["outputs"]  # the inf2 examples' own handle() answers {"outputs": [...]}
    for prompt, text in zip(["Hello world", "A"], texts):
        ids = tokenizer(prompt).input_ids
        want = expected_ids(reference, ids, 12 - len(ids))
        assert text == prompt + tokenizer.decode(want, skip_special_tokens=True)
    code, body = ask(handler, {"text": "A", "seq_length": 12})
    assert code == 200 and json.loads(body) == {"outputs": [texts[1]]}
    code, body = ask(handler, {"text": "Hello world", "seq_length": 3})
    assert code == 400 and "seq_length" in json.loads(body)["error"]


def test_list_inputs_answer_a_list(handler, reference):
    tokenizer, _ = reference
    code, body = ask(handler, {"inputs": PROMPTS[:2], "parameters": {"max_new_tokens": 5}})
    assert code == 200
    for prompt, item in zip(PROMPTS[:2], json.loads(body)):
        want = expected_ids(reference, tokenizer(prompt).input_ids, 5)
        assert item == {"generated_text": tokenizer.decode(want, skip_special_tokens=True)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rolling_batch_greedy_equals_generate_whenever_a_request_joins(tiny_model_dir, tmp_path, reference, seed):
    """Randomized arrivals: every request's tokens equal generate() for its prompt alone."""
    tokenizer, _ = reference
    handler = loaded(tiny_model_dir, tmp_path, rolling_batch="auto", max_rolling_batch_size=6)
    rng = random.Random(seed)
    joins, step = [], 0
    for i in range(14):
        prompt, budget = rng.choice(PROMPTS) + " " * rng.randint(0, 1) + str(i), rng.randint(1, 24)
        payload = {"inputs": prompt, "parameters": {"max_new_tokens": budget, "details": True}}
        joins.append((step, RollingRequest(request_input(JSON, json.dumps(payload).encode()), seed=1,
                                           key=(f"r{i}", prompt, budget))))
        step += rng.randint(0, 2)  # several join some steps, none others
    bodies = RollingBatchLoop(max_size=6).run(handler, joins)
    assert len(bodies) == 14
    for (name, prompt, budget), body in bodies.items():
        assert token_ids(body) == expected_ids(reference, tokenizer(prompt).input_ids, budget), name


def test_a_model_directory_answers_every_call_djl_sends(tiny_model_dir, tmp_path, reference):
    """The done-when of issue 2: serving.properties read as DJLServing reads it, then the init call, a single
    call, a dynamic batch and a streamed call, each built as the Java front end builds it."""
    from lmi_tools.modeldir.properties import read_serving_properties

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "serving.properties").write_text(
        f"engine=Python\noption.entryPoint=lmi_handlers.entrypoint\noption.model_id={tiny_model_dir}\n"
        + "".join(f"option.{key}={value}\n" for key, value in STOCK_KERNELS.items()))
    handler = Handler()
    options = {**read_serving_properties(model_dir), "model_dir": str(model_dir)}
    assert handler.handle(init_input(options)) is None
    tokenizer, _ = reference
    want = expected_ids(reference, tokenizer(PROMPTS[0]).input_ids, 8)
    code, body = ask(handler, {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 8, "details": True}})
    assert code == 200 and token_ids(body) == want
    batch = batch_input([request_input(JSON, json.dumps({"inputs": p, "parameters": {"max_new_tokens": 8,
                                                                                      "details": True}}).encode())
                         for p in PROMPTS[:3]])
    out = handler.handle(batch)
    assert token_ids(bytes(out.content.value_at(0))) == want and out.content.size() == 3
    code, stream = ask(handler, {"inputs": PROMPTS[0], "stream": True, "parameters": {"max_new_tokens": 8}})
    assert code == 200 and [json.loads(line)["token"]["id"] for line in stream.splitlines()] == want
