"""Linear layers through oneDNN with prepacked weights (``option.cpu_linear_kernel=onednn``): logits close to the
stock ones, greedy output equal to ``model.generate`` on the same prepacked model alone and in a busy batch, and a
clear refusal where it cannot run."""

import random

import pytest

from lmi_handlers.backends.hf.cpu.onednn_linear import prepack_linears
from lmi_handlers.config import ConfigError

from .test_hf_backend import loaded
from .test_paged_engine import assert_exact, prompts, run

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


def load_model(path, prepacked=False):
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    if prepacked:
        assert prepack_linears(torch, model) == sum(type(m) is torch.nn.Linear for m in model.modules()) > 0
    return model


# float32 sums in another order; bfloat16 rounds each product's output to 8 bits too (2 layers of the tiny model)
@pytest.mark.parametrize("dtype, within", [("float32", 1e-4), ("bfloat16", 3e-2)])
def test_prepacked_logits_stay_within_rounding_of_the_stock_ones(tiny_model_dir, dtype, within):
    if dtype == "bfloat16" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("oneDNN multiplies no bfloat16 on this CPU")
    dtype = getattr(torch, dtype)
    stock, packed = load_model(tiny_model_dir).to(dtype), load_model(tiny_model_dir).to(dtype)
    prepack_linears(torch, packed)
    rng = random.Random(0)
    with torch.inference_mode():
        for rows, length in ((1, 5), (2, 1), (7, 3), (40, 1)):
            ids = torch.tensor([[rng.randrange(3, 2000) for _ in range(length)] for _ in range(rows)])
            want, got = stock(ids).logits.float(), packed(ids).logits.float()
            assert torch.allclose(got, want, rtol=within, atol=within * float(want.abs().max())), (rows, length)


def assert_equals_generate_on_the_same_kernels(tiny_model_dir, tmp_path, kernel, reference, **options):
    """Greedy output of the handler with ``option.cpu_linear_kernel=kernel`` (and ``options``) equals
    ``model.generate`` on ``reference`` (the model with the same kernels), alone and in a busy batch."""
    handler = loaded(tiny_model_dir, tmp_path, rolling_batch="scheduler", max_rolling_batch_size=8,
                     cpu_linear_kernel=kernel, **options)
    assert "forward" in vars(handler.backend.model.get_output_embeddings())
    rng = random.Random(4)
    alone = run(handler, {0: [(prompts(rng, 1, 4, 12)[0], 12)]})
    busy = run(handler, {0: [(p, 16) for p in prompts(rng, 5, 2, 20)], 2: [(p, 10) for p in prompts(rng, 3, 30, 60)]})
    assert_exact((None, reference), alone + busy)


def test_greedy_output_equals_generate_on_the_prepacked_model_alone_and_in_a_busy_batch(tiny_model_dir, tmp_path):
    assert_equals_generate_on_the_same_kernels(tiny_model_dir, tmp_path, "onednn",
                                               load_model(tiny_model_dir, prepacked=True))


def test_a_model_that_is_not_float32_or_bfloat16_on_the_cpu_is_refused_naming_the_option(tiny_model_dir):
    half = load_model(tiny_model_dir).to(torch.float16)
    with pytest.raises(ConfigError, match="cpu_linear_kernel.*onednn.*float32 or bfloat16.*float16"):
        prepack_linears(torch, half)
