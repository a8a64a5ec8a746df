"""LoRA adapters on the hf engine, on SmolLM2-135M-Instruct with adapters made here by peft (random, non-zero).

Every greedy answer with an adapter must equal ``PeftModel.generate`` with that adapter, and every base-model
answer in the same batch the base model's, alone and with three adapters and the base model interleaved in one
busy rolling batch (prefix caching on: an adapter's blocks never serve another). Also: the request forms (the
body's ``adapters``, the ``adapter`` query parameter, SageMaker's header), registration errors that name the
adapter while the base keeps serving, and deleting an adapter while a request uses it.
"""

from __future__ import annotations

import json

import pytest

from lmi_handlers.handler import Handler
from lmi_handlers.protocol import Input
from lmi_tools.serving.worker.frontend import RollingBatchLoop, RollingRequest, init_input, request_input

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft", reason="peft makes the test adapters and is the oracle")

pytestmark = pytest.mark.quality

JSON = [("Content-Type", "application/json")]
# A shared preamble of several KV blocks: with prefix caching on, the same prompt under another adapter would find
# these blocks cached if keys ignored the adapter.
PREAMBLE = ("Below is a question from a student. Answer it in a short and friendly way, with one example, and do not "
            "repeat the question. ")
PROMPTS = [PREAMBLE + "The capital of France is", PREAMBLE + "Write a haiku about the sea.",
           PREAMBLE + "def fibonacci(n):"]
TOKENS = 12
ADAPTERS = {"a1": ["q_proj", "v_proj"], "a2": ["q_proj", "k_proj", "o_proj", "gate_proj"],
            "a3": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


@pytest.fixture(scope="module")
def adapter_dirs(smollm2_dir, tmp_path_factory, make_lora):
    root = tmp_path_factory.mktemp("adapters")
    return {name: make_lora(smollm2_dir, root / name, targets, seed)
            for seed, (name, targets) in enumerate(ADAPTERS.items(), 1)}


@pytest.fixture(scope="module")
def oracle(smollm2_dir, adapter_dirs):
    """{adapter or "": {prompt: greedy text}} from peft's own generate."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    model = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir),
                                           adapter_dirs["a1"], adapter_name="a1").eval()
    for name in ("a2", "a3"):
        model.load_adapter(adapter_dirs[name], adapter_name=name)
    answers = {}
    for name in ("", *ADAPTERS):
        answers[name] = {}
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            args = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=TOKENS, do_sample=False)
            with torch.inference_mode():
                if name:
                    model.set_adapter(name)
                    out = model.generate(**args)
                else:
                    with model.disable_adapter():
                        out = model.generate(**args)
            answers[name][prompt] = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    return answers


def manage(handler, action, name, src=None, **options):
    inputs = Input({"name": name, **({"src": src} if src else {})})
    for key, value in options.items():
        inputs.content.add(key, str(value).encode())
    out = handler.manage_adapter(inputs, action)
    return out.code, json.loads(bytes(out.content.value_at(0)))


@pytest.fixture(scope="module")
def handler(smollm2_dir, adapter_dirs, tmp_path_factory):
    handler = Handler()
    props = {"model_id": str(smollm2_dir), "model_dir": str(tmp_path_factory.mktemp("model")),
             "rolling_batch": "scheduler", "max_rolling_batch_size": "8", "enable_lora": "true",
             "enable_prefix_caching": "true", "max_lora_rank": "16"}
    assert handler.handle(init_input(props)) is None
    for name, src in adapter_dirs.items():
        assert manage(handler, "register", name, src)[0] == 200
    return handler


def payload(prompt, adapter=None):
    body = {"inputs": prompt, "parameters": {"max_new_tokens": TOKENS}}
    return body if adapter is None else {**body, "adapters": adapter}


def serve(handler, bodies, headers=JSON, query=(), join_every=1):
    joins = [(i * join_every, RollingRequest(request_input(headers, json.dumps(b).encode(), query), seed=1, key=i))
             for i, b in enumerate(bodies)]
    out = RollingBatchLoop(max_size=8).run(handler, joins)
    return [json.loads(out[i]) for i in range(len(bodies))]


def test_the_adapters_change_the_answers(oracle):
    for name in ADAPTERS:
        assert sum(oracle[name][p] != oracle[""][p] for p in PROMPTS) >= 2, name


def test_each_adapter_alone_equals_peft_generate(handler, oracle):
    exact = 0
    for name in ADAPTERS:
        for prompt in PROMPTS:
            assert serve(handler, [payload(prompt, name)])[0]["generated_text"] == oracle[name][prompt], (name, prompt)
            exact += 1
    assert exact == 9


def test_three_adapters_and_the_base_interleave_in_one_busy_batch(handler, oracle):
    # 16 requests, one joining every step: every step mixes prefill and decode rows of several adapters, and the
    # same prompt under different adapters (prefix caching is on) never shares blocks.
    names = ["a1", "", "a2", "a3"]
    jobs = [(names[i % 4], PROMPTS[(i // 4) % 3]) for i in range(16)]
    answers = serve(handler, [payload(p, a if a else "") for a, p in jobs])
    mismatches = [(a, p) for (a, p), got in zip(jobs, answers) if got["generated_text"] != oracle[a][p]]
    assert mismatches == []
    assert handler.backend.kv.stats()["prefix_cache_hit_tokens"] > 0  # the cache was in use all along


def test_the_request_forms_name_adapters(handler, oracle):
    prompt = PROMPTS[0]
    listed = serve(handler, [{"inputs": PROMPTS[:2], "parameters": {"max_new_tokens": TOKENS},
                              "adapters": ["a2", ""]}])[0]
    assert [r["generated_text"] for r in listed] == [oracle["a2"][PROMPTS[0]], oracle[""][PROMPTS[1]]]
    # DJLServing's rolling-batch loop forwards only the body: the query parameter reaches the other modes' Input.
    job = handler.prepare(request_input(JSON, json.dumps(payload(prompt, "a1")).encode(), [("adapter", "a3")]))
    assert [seq.adapter.name for seq in job.seqs] == ["a3"]
    header = JSON + [("X-Amzn-SageMaker-Adapter-Identifier", "a1")]
    assert serve(handler, [payload(prompt, "a2")], headers=header)[0]["generated_text"] == oracle["a1"][prompt]


def step_errors(handler, body, query=()):
    loop = RollingBatchLoop(max_size=8)
    loop.add(RollingRequest(request_input(JSON, json.dumps(body).encode(), query), seed=1, key=0))
    item = loop.step(handler)[0]
    return item.code, item.error


def test_an_unknown_adapter_is_a_404_naming_the_registered_ones(handler):
    code, error = step_errors(handler, payload(PROMPTS[0], "nope"))
    assert code == 404 and "'nope'" in error and "a1, a2, a3" in error
    code, error = step_errors(handler, {"inputs": PROMPTS[:2], "adapters": ["a1"]})
    assert code == 400 and "adapters" in error and "2 inputs, 1 names" in error


def test_bad_adapters_are_refused_by_name_and_the_base_keeps_serving(handler, smollm2_dir, tiny_model_dir,
                                                                     tmp_path, oracle, make_lora):
    big = make_lora(smollm2_dir, tmp_path / "big", ["q_proj"], 7, rank=32)
    code, body = manage(handler, "register", "big", big)
    assert code == 400 and "adapter big" in body["error"] and "max_lora_rank=16" in body["error"]
    head = make_lora(smollm2_dir, tmp_path / "head", ["lm_head"], 8)
    code, body = manage(handler, "register", "head", head)
    assert code == 400 and "adapter head" in body["error"] and "lm_head" in body["error"]
    other = make_lora(tiny_model_dir, tmp_path / "other", ["q_proj"], 9)
    code, body = manage(handler, "register", "other", other)
    assert code == 400 and "adapter other" in body["error"] and "another base model" in body["error"]
    code, body = manage(handler, "register", "none", str(tmp_path / "missing"))
    assert code == 400 and "adapter none" in body["error"]
    config = json.loads((tmp_path / "big" / "adapter_config.json").read_text())
    (tmp_path / "big" / "adapter_config.json").write_text(json.dumps({**config, "r": 8, "target_modules": [
        "q_proj", "c_attn"]}))  # a module of another architecture, though the weights adapt q_proj only
    code, body = manage(handler, "register", "gpt2", str(tmp_path / "big"))
    assert code == 400 and body["error"].startswith(f"adapter gpt2 ({tmp_path / 'big'}): target_modules names c_attn")
    weights = tmp_path / "head" / "adapter_model.safetensors"  # its header holds, its tensors' bytes do not
    raw = weights.read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    header = {k: {**v, "dtype": "F64"} if k != "__metadata__" else v for k, v in header.items()}
    encoded = json.dumps(header).encode()
    weights.write_bytes(len(encoded).to_bytes(8, "little") + encoded + raw[8 + int.from_bytes(raw[:8], "little"):])
    (tmp_path / "head" / "adapter_config.json").write_text(json.dumps({**config, "r": 8, "target_modules": [
        "q_proj"]}))
    code, body = manage(handler, "register", "f64", str(tmp_path / "head"))
    assert code == 400 and "adapter f64" in body["error"] and "adapter_model.safetensors cannot be loaded" in \
        body["error"], body
    assert sorted(handler.adapters.by_name) == ["a1", "a2", "a3"]
    assert serve(handler, [payload(PROMPTS[1])])[0]["generated_text"] == oracle[""][PROMPTS[1]]


def test_deleting_an_adapter_lets_its_running_request_finish_and_refuses_new_ones(handler, adapter_dirs, oracle):
    assert manage(handler, "register", "doomed", adapter_dirs["a2"])[0] == 200
    loop = RollingBatchLoop(max_size=8)
    loop.add(RollingRequest(request_input(JSON, json.dumps(payload(PROMPTS[2], "doomed")).encode()), seed=1, key=0))
    text = "".join(item.data for item in loop.step(handler))
    assert manage(handler, "unregister", "doomed") == (200, {"status": "Adapter doomed unregistered"})
    while loop.active:
        text += "".join(item.data for item in loop.step(handler))
    assert json.loads(text)["generated_text"] == oracle["a2"][PROMPTS[2]]
    assert step_errors(handler, payload(PROMPTS[2], "doomed"))[0] == 404
    assert manage(handler, "unregister", "doomed")[0] == 404


def test_with_the_onednn_linear_kernel_adapter_rows_stay_equal_to_peft(smollm2_dir, adapter_dirs, oracle, tmp_path):
    # The base layers run through oneDNN with prepacked weights; the adapters' products stay on torch's operators.
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    handler = Handler()
    props = {"model_id": str(smollm2_dir), "model_dir": str(tmp_path), "rolling_batch": "scheduler",
             "max_rolling_batch_size": "8", "enable_lora": "true", "cpu_linear_kernel": "onednn"}
    assert handler.handle(init_input(props)) is None
    for name, src in adapter_dirs.items():
        assert manage(handler, "register", name, src)[0] == 200
    jobs = [(name, prompt) for prompt in PROMPTS[:2] for name in ("a1", "", "a2", "a3")]
    answers = serve(handler, [payload(p, a) for a, p in jobs])
    assert [(a, p) for (a, p), got in zip(jobs, answers) if got["generated_text"] != oracle[a][p]] == []
