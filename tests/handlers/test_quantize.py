"""``option.quantize=static_int8`` on the hf backend: the int8 linear layer computes what its dequantized weights
compute, the model shrinks, the serving path stays exact against ``model.generate`` on the same quantized model
(alone and in a busy rolling batch), and a method the backend does not have is a clear error at load."""

import json

import pytest

from lmi_handlers.backends.hf.quantize import GEMM_ROWS, model_bytes, parse_method, quantize_weights
from lmi_handlers.errors import ConfigError
from lmi_handlers.handler import Handler
from lmi_tools.serving.worker.frontend import RollingBatchLoop, RollingRequest, init_input, request_input

from .test_hf_backend import STOCK_FP32

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

JSON = [("Content-Type", "application/json")]
# The last one is longer than GEMM_ROWS tokens: its prefill takes the layers' GEMM route, its decode the kernel.
PROMPTS = ["Hello world", "The quick brown fox jumps over the lazy", "What is the capital of France?", "A",
           "Once upon a time, in a small village by the sea, an old fisherman mended his nets every evening"]


@pytest.fixture(scope="module")
def quantized_reference(tiny_model_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    before = model_bytes(model)
    done = quantize_weights(model, "static_int8")
    return transformers.AutoTokenizer.from_pretrained(tiny_model_dir), model, before, done


@pytest.fixture(scope="module")
def handler(tiny_model_dir, tmp_path_factory):
    handler = Handler()
    props = {"model_id": str(tiny_model_dir), "model_dir": str(tmp_path_factory.mktemp("q")), "quantize": "static_int8",
             "rolling_batch": "scheduler", "max_rolling_batch_size": "4", **STOCK_FP32}
    assert handler.handle(init_input(props)) is None
    return handler


def generate(reference, prompt, max_new_tokens):
    tokenizer, model, _, _ = reference
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def test_int8_linear_matches_its_dequantized_weights():
    linear = torch.nn.Linear(64, 48, bias=True)
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.Sequential(linear)])
    original = linear.weight.detach().clone()
    quantize_weights(model, "static_int8")
    int8 = model.layers[0][0]
    dequantized = int8.weight_int8.float() * int8.scales[:, None].float()
    # half an int8 step (1/254 of a row's largest weight) plus the scale's own rounding: rounding error only
    assert ((dequantized - original).abs().amax(1) <= original.abs().amax(1) / 100).all()
    x = torch.randn(3, 5, 64)
    want = (x @ dequantized.t() + linear.bias).detach()
    tolerance = 1e-4 if int8.kernel == "dequant" else 1e-2 * float(want.abs().max())  # bf16 activations
    assert torch.allclose(int8(x), want, atol=tolerance) and int8(x).dtype == x.dtype


def test_many_rows_take_a_gemm_that_computes_the_kernels_numbers():
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(64, 48, bias=False))])
    quantize_weights(model, "static_int8")
    int8 = model.layers[0][0]
    x = torch.randn(GEMM_ROWS + 3, 64, generator=torch.Generator().manual_seed(0))
    together = int8(x)  # one call of GEMM_ROWS + 3 rows: the GEMM route where the kernel is int8pack_mm
    alone = torch.cat([int8(row[None]) for row in x])  # one row at a time: the kernel
    # The same bf16 inputs and bf16 result; only the order of the fp32 sums may differ: one bf16 step at most
    # (a sum that cancels to near zero can differ more relatively, not absolutely: the atol).
    assert torch.allclose(together, alone, rtol=2 ** -7, atol=1e-3 * float(alone.abs().max())), \
        (together - alone).abs().max()


def test_weights_shrink_the_head_is_int8_and_the_embeddings_stay(quantized_reference):
    _, model, before, done = quantized_reference
    assert done.layers == 7 * model.config.num_hidden_layers + 1  # q, k, v, o, gate, up, down per layer; the head
    assert done.bytes_after < before and done.bytes_before == before
    assert model.lm_head.weight_int8.dtype == torch.int8 and model.get_input_embeddings().weight.dtype == torch.float32


def rolling(handler, jobs):
    """Token ids per prompt; ``jobs`` are (prompt, max_new_tokens, step at which it joins), as DJL sends them."""
    joins = []
    for prompt, budget, step in sorted(jobs, key=lambda job: job[2]):
        body = json.dumps({"inputs": prompt, "parameters": {"max_new_tokens": budget, "details": True}})
        joins.append((step, RollingRequest(request_input(JSON, body.encode()), seed=1, key=prompt)))
    bodies = RollingBatchLoop(max_size=4).run(handler, joins)
    return {prompt: [t["id"] for t in json.loads(body)["details"]["tokens"]] for prompt, body in bodies.items()}


def test_greedy_output_equals_generate_on_the_quantized_model_alone(handler, quantized_reference):
    assert len(quantized_reference[0](PROMPTS[-1]).input_ids) > GEMM_ROWS  # the GEMM route is exercised
    for prompt in PROMPTS:
        assert rolling(handler, [(prompt, 8, 0)])[prompt] == generate(quantized_reference, prompt, 8), prompt


def test_greedy_output_is_exact_in_a_busy_rolling_batch(handler, quantized_reference):
    jobs = [(prompt, 6 + 2 * i, [0, 0, 2, 5, 3][i]) for i, prompt in enumerate(PROMPTS)]
    got = rolling(handler, jobs)
    for prompt, budget, _ in jobs:
        assert got[prompt] == generate(quantized_reference, prompt, budget), prompt


@pytest.mark.parametrize("value", ["awq", "int4", "bitsandbytes8"])
def test_other_methods_are_refused_naming_what_is_allowed(value):
    with pytest.raises(ConfigError, match=f"option.quantize='{value}' is invalid: .*static_int8"):
        parse_method(value)
    assert parse_method("") is None and parse_method(" STATIC_INT8 ") == "static_int8"


def test_the_batched_slot_runner_serves_the_quantized_model(handler):
    backend = handler.backend
    assert backend.runner.name != "native" and backend.quantized.method == "static_int8"
