"""Quality on a real model: SmolLM2-135M-Instruct (converted once per session by ``lmi model smollm2``), served
by the handler in rolling-batch mode, as the README's demo serves it. Run alone with ``pytest -m quality``.

Each greedy answer must contain the expected word *and* equal ``model.generate`` on the same prompt, so a
sensible answer cannot hide an inexact engine, nor an exact engine a broken model directory (a wrong RoPE base
or tokenizer in transformers 4.43.4 would still be "exact" and answer nonsense).

Every test of the served model runs in float32 on the stock kernels and in bfloat16, where the CPU computes it
natively, on the compiled linear kernel and torch's attention: each row's sums there run in one order whatever
the batch (torch's own bfloat16 product sums a 1,536-wide layer in another order from 5 rows on), so a busy
batch gives the answers ``generate`` gives on the same kernels alone. How often bfloat16's default kernels give
transformers' own ``generate``'s answers is measured last (``AGREEMENT``).
"""

from __future__ import annotations

import json
import random
import shutil

import pytest
from packaging.version import Version

from lmi_handlers.handler import Handler
from lmi_tools.serving.worker.frontend import RollingBatchLoop, RollingRequest, init_input, request_input

from ..test_bfloat16 import NATIVE_BF16, load_bf16, needs_packed_step
from ..test_hf_backend import STOCK_FP32

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.quality

JSON = [("Content-Type", "application/json")]
FACTS = [("What is the capital of France?", "Paris"), ("What is the capital of Germany?", "Berlin"),
         ("What is the capital of Japan?", "Tokyo"), ("What is 2+2?", "4"),
         ("How many days are there in a week?", "7")]
# Answers with accents and with Japanese characters, whose bytes are split across tokens.
NON_ASCII = ["Translate to French: I like coffee with milk.", "Write a short sentence in Spanish about the año nuevo.",
             "How do you say 'thank you' in Japanese?"]


# option.dtype and the kernels of each run of the module (module docstring)
SETTINGS = {"fp32": STOCK_FP32, "bf16": {"dtype": "bf16", "cpu_linear_kernel": "compiled", "cpu_attention_kernel": "torch"}}


@pytest.fixture(scope="module", params=list(SETTINGS))
def dtype(request):
    if request.param == "bf16":
        if not NATIVE_BF16:
            pytest.skip("this CPU has no native bfloat16 (avx512_bf16 or amx_bf16): auto loads float32 here")
        if shutil.which("c++") is None:
            pytest.skip("no C++ compiler: the compiled linear kernel cannot be built")
        needs_packed_step()
    return request.param


@pytest.fixture(scope="module")
def reference(smollm2_dir, dtype):
    """``generate``'s model: in bfloat16 with its linear layers on the compiled kernel, as the handler's."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    if dtype == "fp32":
        return tokenizer, transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir).eval()
    from lmi_handlers.backends.hf.cpu.compiled_linear import build_kernel, compile_linears

    model = load_bf16(smollm2_dir)
    compile_linears(torch, build_kernel(torch), model)
    return tokenizer, model


@pytest.fixture(scope="module")
def handler(smollm2_dir, tmp_path_factory, dtype):
    handler = Handler()
    props = {"model_id": str(smollm2_dir), "model_dir": str(tmp_path_factory.mktemp("model")),
             "rolling_batch": "scheduler", "max_rolling_batch_size": "8", **SETTINGS[dtype]}
    assert handler.handle(init_input(props)) is None
    return handler


def serve(handler, payloads, join_every=1, seed=0):
    """Requests through DJLServing's rolling-batch step protocol; one joins every ``join_every`` steps (after a
    random gap of 0-3 steps when 0). Returns each request's body."""
    rng, step, joins = random.Random(seed), 0, []
    for key, payload in enumerate(payloads):
        joins.append((step, RollingRequest(request_input(JSON, json.dumps(payload).encode()), seed=1, key=key)))
        step += join_every or rng.randint(0, 3)
    bodies = RollingBatchLoop(max_size=8).run(handler, joins)
    return [bodies[i] for i in range(len(payloads))]


def ask(handler, payload):
    return serve(handler, [payload])[0]


def chat(question, **extra):
    return {"messages": [{"role": "user", "content": question}], "max_tokens": 24, "temperature": 0, **extra}


def generate(reference, question, max_new_tokens=24):
    tokenizer, model = reference
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                           add_generation_prompt=True)
    ids = torch.tensor([tokenizer(prompt, add_special_tokens=False).input_ids])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


@pytest.fixture(scope="module")
def alone(handler):
    """Each question's greedy chat answer, asked alone."""
    return {q: json.loads(ask(handler, chat(q))) for q in [q for q, _ in FACTS] + NON_ASCII}


def content(answer):
    return answer["choices"][0]["message"]["content"]


@pytest.mark.parametrize("question,word", FACTS)
def test_greedy_chat_answers_the_question(alone, reference, question, word):
    answer = alone[question]
    assert word in content(answer)
    assert content(answer) == generate(reference, question)
    assert answer["choices"][0]["finish_reason"] == "stop"  # ended by <|im_end|>, before max_tokens


def test_the_chat_template_is_the_models(handler, reference):
    tokenizer, _ = reference
    answer = json.loads(ask(handler, {"inputs": "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                                                "<|im_start|>assistant\n", "parameters": {"max_new_tokens": 40}}))
    assert answer["generated_text"] == "The capital of France is Paris."
    assert "You are a helpful AI assistant named SmolLM" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False)


def test_generation_stops_on_the_models_eos(handler, reference):
    tokenizer, _ = reference
    plain = json.loads(ask(handler, {"inputs": "<|im_start|>user\nWhat is the capital of Germany?<|im_end|>\n"
                                               "<|im_start|>assistant\n",
                                     "parameters": {"max_new_tokens": 40, "details": True}}))
    details = plain["details"]
    assert details["finish_reason"] == "eos_token" and details["generated_tokens"] < 40
    assert details["tokens"][-1]["id"] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert plain["generated_text"] == "The capital of Germany is Berlin."  # the EOS text is not in the answer


def test_a_stop_sequence_ends_the_text_exactly(handler):
    answer = json.loads(ask(handler, chat("What is the capital of France?", stop=[" Paris"])))
    assert answer["choices"][0]["message"]["content"] == "The capital of France is"
    assert answer["choices"][0]["finish_reason"] == "stop"
    prompt = "<|im_start|>user\nWhat is the capital of Japan?<|im_end|>\n<|im_start|>assistant\n"
    plain = json.loads(ask(handler, {"inputs": prompt, "parameters": {"max_new_tokens": 40, "stop": ["of J"],
                                                                      "details": True}}))
    assert plain["generated_text"] == "The capital " and plain["details"]["finish_reason"] == "stop_sequence"
    stream = ask(handler, {"inputs": prompt, "stream": True, "parameters": {"max_new_tokens": 40, "stop": ["of J"]}})
    assert "".join(json.loads(line)["token"]["text"] for line in stream.splitlines()) == "The capital "


@pytest.mark.parametrize("question", NON_ASCII)
def test_streamed_text_equals_plain_text_with_non_ascii_output(handler, alone, reference, question):
    plain = content(alone[question])
    assert any(ord(ch) > 127 for ch in plain) and plain == generate(reference, question)
    events = [e[len("data: "):] for e in ask(handler, chat(question, stream=True)).split("\n\n") if e]
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1]) == plain


def test_the_same_greedy_answers_inside_a_busy_rolling_batch(handler, alone):
    # Sampled neighbours of other lengths join and leave at random steps between the greedy requests.
    noise = [chat("Tell me a story about a dragon.", max_tokens=n, temperature=1.0, seed=n) for n in (30, 7)]
    payloads = [chat(q) for q in alone]
    mixed = payloads[:3] + noise[:1] + payloads[3:6] + noise[1:] + payloads[6:]
    bodies = serve(handler, mixed, join_every=0, seed=3)
    busy = [content(json.loads(b)) for b, p in zip(bodies, mixed) if p not in noise]
    assert busy == [content(answer) for answer in alone.values()]


def test_sampling_with_a_seed_is_reproducible(handler):
    payload = {"inputs": "<|im_start|>user\nWrite a sentence about the sea.<|im_end|>\n<|im_start|>assistant\n",
               "parameters": {"max_new_tokens": 16, "do_sample": True, "temperature": 1.0, "top_p": 0.95,
                              "seed": 42, "details": True}}
    first, again = (json.loads(b) for b in serve(handler, [payload, payload]))
    assert first["generated_text"] == again["generated_text"] and first["generated_text"].strip()
    other = json.loads(json.dumps(payload))
    other["parameters"]["seed"] = 7
    assert json.loads(ask(handler, other))["generated_text"] != first["generated_text"]  # another seed, another sample
    assert first["details"]["seed"] == 42 and first["details"]["generated_tokens"] <= 16


@pytest.mark.parametrize("linear,attention", [("onednn", "torch"), ("onednn", "compiled"), ("compiled", "compiled")])
def test_with_cpu_kernels_answers_stay_right_and_equal_generate_on_the_same_kernels(smollm2_dir, tmp_path, linear,
                                                                                   attention):
    from lmi_handlers.backends.hf.cpu.compiled_linear import build_kernel, compile_linears
    from lmi_handlers.backends.hf.cpu.onednn_linear import prepack_linears

    if linear == "onednn" and not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    if "compiled" in (linear, attention) and shutil.which("c++") is None:
        pytest.skip("no C++ compiler: the compiled kernels cannot be built")
    if attention == "compiled" and Version(transformers.__version__) < Version("4.48"):
        pytest.skip("transformers < 4.48 runs no packed step, which the attention kernel serves")
    handler = Handler()
    props = {"model_id": str(smollm2_dir), "model_dir": str(tmp_path), "rolling_batch": "scheduler",
             "max_rolling_batch_size": "8", "cpu_linear_kernel": linear, "cpu_attention_kernel": attention,
             "dtype": "fp32"}
    assert handler.handle(init_input(props)) is None
    assert (handler.backend.runner.decode_kernel is not None) == (attention == "compiled")  # it passed the load check
    tokenizer, model = transformers.AutoTokenizer.from_pretrained(smollm2_dir), \
        transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir).eval()
    if linear == "onednn":
        prepack_linears(torch, model)
    else:
        compile_linears(torch, build_kernel(torch), model)
    bodies = serve(handler, [chat(question) for question, _ in FACTS], join_every=0, seed=5)  # a busy batch
    for (question, word), body in zip(FACTS, bodies):
        assert word in content(json.loads(body))
        assert content(json.loads(body)) == generate((tokenizer, model), question)


# Chat questions and the share of their greedy answers (up to 24 tokens) that bfloat16's default kernels must give
# exactly as transformers' own bfloat16 ``generate`` does, in a busy batch. Rounding to 8 bits in another order (the
# compiled kernels sum each product in their own order, and the attention kernel keeps its weights in float32 where
# SDPA rounds them) moves logits by about a unit in bfloat16's last place, which flips a near tie now and then and
# the rest of the answer with it; a wrong kernel answers none the same. The stock kernels, each question alone,
# must give them all. docs/engine.md gives the share measured.
AGREEMENT_QUESTIONS = [q for q, _ in FACTS] + NON_ASCII + [
    "Who wrote Hamlet?", "Why is the sky blue?", "What is the largest planet in our solar system?",
    "Explain photosynthesis in one sentence.", "What language is spoken in Brazil?", "List three colors.",
    "What is the chemical symbol for gold?", "Give me a synonym for happy."]
AGREEMENT = 0.5


def test_in_bfloat16_the_default_kernels_mostly_give_generates_answers_and_the_stock_ones_all(smollm2_dir, tmp_path):
    if not NATIVE_BF16:
        pytest.skip("this CPU has no native bfloat16 (avx512_bf16 or amx_bf16): auto loads float32 here")
    needs_packed_step()
    tokenizer, model = transformers.AutoTokenizer.from_pretrained(smollm2_dir), load_bf16(smollm2_dir)
    want = [generate((tokenizer, model), question) for question in AGREEMENT_QUESTIONS]
    answers = {}
    for kernels, options in (("auto", {}), ("stock", {"cpu_linear_kernel": "stock", "cpu_attention_kernel": "torch"})):
        handler = Handler()
        props = {"model_id": str(smollm2_dir), "model_dir": str(tmp_path / kernels), "rolling_batch": "scheduler",
                 "max_rolling_batch_size": "8", **options}  # dtype=auto: bfloat16 here
        assert handler.handle(init_input(props)) is None and handler.backend.model.dtype == torch.bfloat16
        if kernels == "auto":  # a busy batch
            bodies = serve(handler, [chat(q) for q in AGREEMENT_QUESTIONS], join_every=0, seed=5)
        else:  # each alone: torch's own product is exact only on generate's row counts
            bodies = [ask(handler, chat(q)) for q in AGREEMENT_QUESTIONS]
        answers[kernels] = [content(json.loads(body)) for body in bodies]
    assert answers["stock"] == want
    same = sum(got == expected for got, expected in zip(answers["auto"], want))
    print(f"bfloat16, default kernels: {same} of {len(want)} answers as generate's")
    assert same >= AGREEMENT * len(want), [(q, a) for q, a, w in zip(AGREEMENT_QUESTIONS, answers["auto"], want)
                                           if a != w]
