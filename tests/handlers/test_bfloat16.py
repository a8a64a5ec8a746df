"""bfloat16 on the CPU: what ``dtype=auto`` loads where the CPU computes it natively, the paged KV pool in bfloat16,
and greedy output equal to transformers' own bfloat16 ``generate`` on the stock kernels, alone and in a busy
batch (the compiled kernels' own tests are beside them: ``test_compiled_linear.py``, ``test_decode_attention.py``;
SmolLM2's agreement with the compiled kernels is in ``quality/test_smollm2.py``)."""

import logging
import random

import pytest

from lmi_handlers.default_dtype import cpu_flags, native_bf16

from .test_hf_backend import loaded
from .test_paged_engine import assert_exact, prompts, run

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NATIVE_BF16 = native_bf16(cpu_flags())
needs_native_bf16 = pytest.mark.skipif(not NATIVE_BF16, reason="this CPU has no native bfloat16 (avx512_bf16 or "
                                       "amx_bf16): dtype=auto loads float32 here")


def needs_packed_step():
    """Skips where the packed step, whose bfloat16 decode attention equals generate's, cannot run."""
    from packaging.version import Version

    if Version(transformers.__version__) < Version("4.48"):
        pytest.skip("transformers < 4.48 runs no packed step: the padded step attends over positions padded to the "
                    "longest row, which SDPA sums in another order than generate's in bfloat16")


def load_bf16(path):
    """The model as transformers loads it in bfloat16 (not cast after loading: ``.to`` would round its float32
    buffers, RoPE's frequencies, too)."""
    from packaging.version import Version

    keyword = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    return transformers.AutoModelForCausalLM.from_pretrained(path, **{keyword: torch.bfloat16}).eval()


@pytest.fixture(scope="module")
def generate_bf16(tiny_model_dir):
    """``model.generate`` on the same weights in bfloat16, the oracle."""
    return None, load_bf16(tiny_model_dir)


@needs_native_bf16
def test_auto_loads_bfloat16_on_this_cpu_with_a_bfloat16_kv_pool_and_says_why(tiny_model_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="lmi_handlers")
    handler = loaded(tiny_model_dir, tmp_path, dtype="auto", rolling_batch="scheduler")
    assert handler.backend.model.dtype == torch.bfloat16 and handler.backend.plan.dtype == "bf16"
    run(handler, {0: [([5, 6, 7], 2)]})
    assert {pool.dtype for pool in handler.backend.runner.cache.keys + handler.backend.runner.cache.values} == \
        {torch.bfloat16}
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dtype:")]
    assert line == f"dtype: bf16 (auto: this CPU computes bfloat16 natively ({', '.join(NATIVE_BF16)}))"


def test_option_dtype_fp32_loads_float32_as_before(tiny_model_dir, tmp_path):
    handler = loaded(tiny_model_dir, tmp_path, dtype="fp32", rolling_batch="scheduler")
    run(handler, {0: [([5, 6, 7], 2)]})
    assert handler.backend.model.dtype == torch.float32 and handler.backend.runner.cache.keys[0].dtype == torch.float32


def test_stock_kernels_in_bfloat16_give_generates_greedy_output_alone_and_in_a_busy_batch(tiny_model_dir, tmp_path,
                                                                                          generate_bf16):
    needs_packed_step()
    handler = loaded(tiny_model_dir, tmp_path, dtype="bf16", rolling_batch="scheduler", max_rolling_batch_size=8)
    assert handler.backend.runner.name == "paged" and handler.backend.runner.packed
    rng = random.Random(21)
    alone = [run(handler, {0: [(prompt, 16)]})[0] for prompt in prompts(rng, 3, 3, 20)]
    busy = run(handler, {0: [(p, 16) for p in prompts(rng, 5, 2, 20)], 2: [(p, 10) for p in prompts(rng, 3, 30, 60)]})
    assert_exact(generate_bf16, alone + busy)
