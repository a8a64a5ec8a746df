"""Linear layers through the compiled kernel (``option.cpu_linear_kernel=compiled``): the kernel against the product
in float64 on every row block and a padded last panel, in float32 and (on a CPU with AVX-512 BF16) bfloat16, greedy
output equal to ``model.generate`` on the same kernels alone and in a busy batch, and a clear refusal where it
cannot run."""

import shutil
from types import SimpleNamespace

import pytest

from lmi_handlers.config import ConfigError

from .test_bfloat16 import load_bf16, needs_packed_step
from .test_onednn_linear import assert_equals_generate_on_the_same_kernels

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler: the kernel cannot be built")


@pytest.fixture(scope="module")
def kernel():
    from lmi_handlers.backends.hf.cpu.compiled_linear import build_kernel

    return build_kernel(torch)


@pytest.fixture
def bf16_kernel(kernel):
    """The kernel, where it was built with its bfloat16 path."""
    if not kernel.bfloat16:
        pytest.skip("this build has no bfloat16 path: the CPU (or ATEN_CPU_CAPABILITY) has no AVX-512 BF16")
    return kernel


def compiled_model(path, kernel, bf16=False):
    from lmi_handlers.backends.hf.cpu.compiled_linear import compile_linears

    model = load_bf16(path) if bf16 else transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    assert compile_linears(torch, kernel, model) == sum(type(m) is torch.nn.Linear for m in model.modules()) > 0
    return model


# 1-29 rows pass through every block size (1-14 rows with AVX-512, 1-6 otherwise) and even splits into 2-3 blocks;
# 20, 17 and 1 outputs leave the last panel part padding; 7 and 33 inputs are no multiple of a vector.
@pytest.mark.parametrize("out_features, in_features", [(48, 64), (20, 7), (17, 33), (1, 5), (200, 96)])
def test_the_kernel_equals_the_product_in_float64(kernel, out_features, in_features):
    from lmi_handlers.backends.hf.cpu.compiled_linear import compile_linears

    generator = torch.Generator().manual_seed(out_features)
    layer = torch.nn.Linear(in_features, out_features)
    torch.nn.init.normal_(layer.bias, generator=generator)
    forward = torch.nn.Sequential(layer)
    assert compile_linears(torch, kernel, forward) == 1
    for rows in [*range(1, 30), 33, 64]:
        x = torch.randn(rows, in_features, generator=generator)
        want = x.double() @ layer.weight.double().T + layer.bias.double()
        scale = x.double().abs() @ layer.weight.double().abs().T + layer.bias.double().abs()
        got = forward(x.view(rows, 1, in_features)).view(rows, out_features)  # any leading shape, as a model calls it
        assert torch.all((got.double() - want).abs() <= 1e-6 * scale), (rows, (got.double() - want).abs().max())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_product_splits_over_threads_and_gives_the_same_bits_on_one_as_on_two(kernel, dtype):
    # A step's thread count (cpu/kernels.py) may change no answer: each thread computes whole outputs.
    # 576 outputs are 36 panels, split over the threads in groups; 1-100 rows cover one to several row blocks.
    from lmi_handlers.backends.hf.cpu.compiled_linear import compile_linears

    if dtype == "bfloat16" and not kernel.bfloat16:
        pytest.skip("this build has no bfloat16 path: the CPU (or ATEN_CPU_CAPABILITY) has no AVX-512 BF16")
    generator = torch.Generator().manual_seed(3)
    forward = torch.nn.Sequential(torch.nn.Linear(96, 576), torch.nn.Linear(576, 200)).to(getattr(torch, dtype))
    assert compile_linears(torch, kernel, forward) == 2
    before = torch.get_num_threads()
    try:
        for rows in (1, 5, 16, 64, 100):
            x = torch.randn(rows, 96, generator=generator).to(getattr(torch, dtype))
            got = []
            for threads in (1, 2):
                torch.set_num_threads(threads)
                got.append(forward(x))
            assert torch.equal(*got), rows
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("out_features, in_features", [(48, 64), (20, 7), (17, 33), (1, 5), (200, 96)])
def test_in_bfloat16_each_output_is_the_exact_product_rounded_once(bf16_kernel, out_features, in_features):
    # (not named for the float64 tests that every vector build runs: only an AVX-512 BF16 build has this path)
    from lmi_handlers.backends.hf.cpu.compiled_linear import compile_linears, relative_error

    generator = torch.Generator().manual_seed(out_features)
    layer = torch.nn.Linear(in_features, out_features).to(torch.bfloat16)
    torch.nn.init.normal_(layer.bias, generator=generator)
    forward = torch.nn.Sequential(layer)
    assert compile_linears(torch, bf16_kernel, forward) == 1
    for rows in [*range(1, 30), 33, 64]:
        x = torch.randn(rows, in_features, generator=generator).to(torch.bfloat16)
        got = forward(x.view(rows, 1, in_features)).view(rows, out_features)
        assert got.dtype == torch.bfloat16
        assert float(relative_error(torch, got, x, layer).max()) <= 1e-6, rows


def test_the_kernel_is_built_for_the_vectors_torch_dispatches_to(kernel):
    # Floats a register: the build took the flags of torch's capability (AVX-512, AVX2, none).
    assert kernel.width == {"AVX512": 16, "AVX2": 8}.get(torch.backends.cpu.get_cpu_capability(), 1)


def test_greedy_output_equals_generate_on_the_compiled_model_alone_and_in_a_busy_batch(tiny_model_dir, tmp_path,
                                                                                       kernel):
    assert_equals_generate_on_the_same_kernels(tiny_model_dir, tmp_path, "compiled",
                                               compiled_model(tiny_model_dir, kernel))


def test_in_bfloat16_greedy_output_equals_generate_on_the_compiled_model_alone_and_in_a_busy_batch(
        tiny_model_dir, tmp_path, bf16_kernel):
    # Each row's sums run in one order whatever the other rows, so a busy batch gives the bits generate gives alone.
    needs_packed_step()
    assert_equals_generate_on_the_same_kernels(tiny_model_dir, tmp_path, "compiled",
                                               compiled_model(tiny_model_dir, bf16_kernel, bf16=True), dtype="bf16")


def test_a_model_that_is_not_float32_or_bfloat16_on_the_cpu_is_refused_naming_the_option(tiny_model_dir, kernel):
    from lmi_handlers.backends.hf.cpu.compiled_linear import compile_linears

    half = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval().to(torch.float16)
    with pytest.raises(ConfigError, match="cpu_linear_kernel.*compiled.*float32 or bfloat16.*float16"):
        compile_linears(torch, kernel, half)


def test_a_bfloat16_model_is_refused_by_a_build_without_avx512_bf16(tiny_model_dir):
    from lmi_handlers.backends.hf.cpu.compiled_linear import compile_linears, load_check

    without = SimpleNamespace(width=16, bfloat16=False)  # what an AVX2 or AVX-512 build without BF16 says
    with pytest.raises(ConfigError, match="cpu_linear_kernel.*compiled.*no AVX-512 BF16.*option.dtype=fp32"):
        compile_linears(torch, without, load_bf16(tiny_model_dir))
    assert "no bfloat16 path" in load_check(torch, without, torch.bfloat16)
