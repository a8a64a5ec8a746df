"""The compiled decode attention (``option.cpu_attention_kernel=compiled``): the kernel against attention computed
in float64 on ragged reads through block tables of a float32 or bfloat16 pool, and the engine with it: greedy output
equal to ``model.generate`` alone, in a busy batch with chunked prompts in the same packed step, under preemption,
and with garbage in every slot a row must not read."""

import random
import shutil

import pytest

from .test_hf_backend import loaded
from .test_paged_engine import assert_exact, generate, poison_pool, prompts, run  # noqa: F401 - generate: a fixture

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler: the kernel cannot be built")


@pytest.fixture(scope="module")
def kernel():
    from lmi_handlers.backends.hf.cpu.decode_attention import build_kernel

    return build_kernel(torch)


def attention_in_float64(query, keys, values, tables, lengths, block_size, scale):
    """Each row's query heads against its first ``lengths[row]`` positions, one row at a time."""
    heads, groups, dim = query.shape[1], keys.shape[0], query.shape[2]
    out = []
    for row, length in enumerate(lengths.tolist()):
        slots = torch.tensor([tables[row, j // block_size] * block_size + j % block_size for j in range(length)])
        q = query[row].double().view(groups, heads // groups, dim)
        weights = torch.softmax(q @ keys[:, slots].double().transpose(1, 2) * scale, dim=-1)
        out.append((weights @ values[:, slots].double()).reshape(heads, dim))
    return torch.stack(out)


@pytest.mark.parametrize("pool", ["float32", "bfloat16"])
@pytest.mark.parametrize("heads, groups, dim, block_size", [(4, 2, 16, 4), (9, 3, 64, 16), (8, 8, 24, 16),
                                                            (6, 1, 40, 8), (10, 1, 16, 4)])
def test_the_kernel_equals_attention_in_float64_on_ragged_paged_reads(kernel, heads, groups, dim, block_size, pool):
    # dims of 24 and 40 leave a partial vector; lengths end inside, at and just past a block's end; 10 query heads
    # to a KV head are more than the kernel takes at once.
    generator = torch.Generator().manual_seed(heads * dim)
    lengths = torch.tensor([1, block_size, block_size + 1, 3 * block_size - 1, 37])
    width = -(-int(lengths.max()) // block_size) + 1  # one column of padding, as a step's tables have
    blocks = 4 * width * len(lengths)
    order = torch.randperm(blocks, generator=generator)[:len(lengths) * width].view(len(lengths), width)
    tables = torch.where(torch.arange(width) < (-(-lengths // block_size))[:, None], order, 0)
    # Every slot no row reads is NaN: a read past a row's length or through the padding would show.
    keys = torch.full((groups, blocks * block_size, dim), float("nan"))
    values = torch.full_like(keys, float("nan"))
    for row, length in enumerate(lengths.tolist()):
        for j in range(length):
            slot = tables[row, j // block_size] * block_size + j % block_size
            keys[:, slot] = torch.randn(groups, dim, generator=generator)
            values[:, slot] = torch.randn(groups, dim, generator=generator)
    # The model hands attention a transposed view: [rows, heads, dim] with the rows' stride the larger.
    query = torch.randn(heads, len(lengths), dim, generator=generator).transpose(0, 1)
    keys, values = keys.to(getattr(torch, pool)), values.to(getattr(torch, pool))  # (a bfloat16 pool: exact inputs)
    got = kernel(query, keys, values, tables, lengths, block_size, dim ** -0.5)
    want = attention_in_float64(query, keys, values, tables, lengths, block_size, dim ** -0.5)
    assert got.shape == (len(lengths), heads, dim)
    assert torch.allclose(got.double(), want, rtol=0, atol=2e-6), (got.double() - want).abs().max()


def test_rows_split_over_threads_and_give_the_same_bits_on_one_as_on_two(kernel):
    # A step's thread count (cpu/kernels.py) may change no answer: each thread attends whole rows.
    generator = torch.Generator().manual_seed(5)
    rows, heads, groups, dim, block_size = 16, 9, 3, 64, 16
    lengths = torch.randint(1, 120, (rows,), generator=generator)
    tables = torch.arange(rows * 8).view(rows, 8)
    keys, values = (torch.randn(groups, rows * 8 * block_size, dim, generator=generator) for _ in range(2))
    query = torch.randn(rows, heads, dim, generator=generator)
    before = torch.get_num_threads()
    try:
        got = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            got.append(kernel(query, keys, values, tables, lengths, block_size, dim ** -0.5))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(*got)


def compiled(handler, monkeypatch):
    """Counts the kernel's calls; skips where the packed step, which the kernel serves, cannot run."""
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) < Version("4.48"):
        pytest.skip("transformers < 4.48 runs no packed step")
    runner = handler.backend.runner
    # The load-time self-check falls back to another runner where the kernel's answers disagree with the model's.
    assert runner.name == "paged" and runner.decode_kernel is not None, "the kernel failed the load-time check"
    calls = []
    kernel = runner.decode_kernel
    monkeypatch.setattr(runner, "decode_kernel", lambda *args: calls.append(1) or kernel(*args))
    return calls


def test_greedy_output_equals_generate_alone_and_beside_chunked_prompts(tiny_model_dir, tmp_path, generate,
                                                                       monkeypatch):
    handler = loaded(tiny_model_dir, tmp_path, rolling_batch="scheduler", cpu_attention_kernel="compiled",
                     enable_chunked_prefill="true", max_rolling_batch_prefill_tokens=24, block_size=4)
    calls = compiled(handler, monkeypatch)
    rng = random.Random(11)
    alone = run(handler, {0: [(prompts(rng, 1, 3, 9)[0], 14)]})
    busy = run(handler, {0: [(p, 16) for p in prompts(rng, 4, 2, 20)], 2: [(p, 9) for p in prompts(rng, 2, 30, 60)],
                         5: [(p, 7) for p in prompts(rng, 3, 10, 20)]})
    assert calls, "the kernel never ran"
    assert_exact(generate, alone + busy)


def test_preemption_and_garbage_in_unread_slots_leave_every_answer_exact(tiny_model_dir, tmp_path, generate,
                                                                         monkeypatch):
    # 12 blocks of 4 tokens: requests wait and the youngest is preempted; reused blocks keep their old content.
    handler = loaded(tiny_model_dir, tmp_path, rolling_batch="scheduler", cpu_attention_kernel="compiled",
                     max_rolling_batch_size=8, block_size=4, num_gpu_blocks_override=12, max_model_len=48)
    calls = compiled(handler, monkeypatch)
    rng = random.Random(12)
    run(handler, {0: [(p, 3) for p in prompts(rng, 2, 5, 9)]})  # builds the pool
    poison_pool(handler)
    seqs = run(handler, {0: [(p, 20) for p in prompts(rng, 4, 3, 14)], 3: [(p, 24) for p in prompts(rng, 3, 5, 20)]})
    assert handler.engine.stats()["preemptions"] > 0, "the pool never ran dry: the test does not test preemption"
    assert calls
    assert_exact(generate, seqs)


def test_a_table_or_length_outside_the_pool_is_an_error_not_a_foreign_read(kernel):
    keys = torch.zeros(2, 8 * 4, 16)  # 8 blocks of 4 slots
    query = torch.zeros(1, 4, 16)
    for tables, lengths in ((torch.tensor([[8]]), torch.tensor([3])), (torch.tensor([[-1]]), torch.tensor([3])),
                            (torch.tensor([[0]]), torch.tensor([5])), (torch.tensor([[0]]), torch.tensor([0]))):
        with pytest.raises(RuntimeError, match="outside the pool|reads"):
            kernel(query, keys, keys, tables, lengths, 4, 0.25)
