"""The output projection in vocabulary slices (``backends/hf/output_projection.py``): the same logits bit for bit,
greedy output still equal to ``model.generate`` in a busy batch, and the stock product wherever slicing gains
nothing or would not be exact."""

import random

import pytest

from lmi_handlers.backends.hf import output_projection
from lmi_handlers.backends.hf.output_projection import split_output_projection

from .test_hf_backend import loaded
from .test_paged_engine import assert_exact, prompts, run

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def wide_vocab_dir(tmp_path_factory):
    """The tiny model with an 8,192-token vocabulary: eight slices of the projection."""
    from lmi_tools.models.tiny import TinySpec, build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("wide-vocab"), TinySpec(vocab_size=8192))


def load_model(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path).eval()


def is_split(model):
    return "forward" in vars(model.get_output_embeddings())


def test_sliced_logits_equal_the_stock_logits_bit_for_bit(wide_vocab_dir):
    stock, split = load_model(wide_vocab_dir), load_model(wide_vocab_dir)
    assert split_output_projection(torch, split) and is_split(split) and not is_split(stock)
    rng = random.Random(0)
    with torch.inference_mode():
        for rows, length in ((1, 5), (2, 1), (7, 3), (40, 1)):
            ids = torch.tensor([[rng.randrange(3, 8192) for _ in range(length)] for _ in range(rows)])
            assert torch.equal(split(ids).logits, stock(ids).logits), (rows, length)


def test_greedy_output_with_the_sliced_projection_equals_generate_alone_and_in_a_busy_batch(wide_vocab_dir, tmp_path):
    handler = loaded(wide_vocab_dir, tmp_path, rolling_batch="scheduler", max_rolling_batch_size=8)
    assert is_split(handler.backend.model)
    rng = random.Random(3)
    alone = run(handler, {0: [(prompts(rng, 1, 4, 12, vocab=8192)[0], 12)]})
    busy = run(handler, {0: [(p, 16) for p in prompts(rng, 5, 2, 20, vocab=8192)],
                         2: [(p, 10) for p in prompts(rng, 3, 30, 60, vocab=8192)]})
    assert_exact((None, load_model(wide_vocab_dir)), alone + busy)


def test_the_stock_product_stays_where_slicing_gains_nothing_or_is_not_exact(tiny_model_dir, wide_vocab_dir,
                                                                             monkeypatch):
    small = load_model(tiny_model_dir)  # 2,048 tokens: the whole matrix stays in cache
    assert not split_output_projection(torch, small) and not is_split(small)
    half = load_model(wide_vocab_dir).to(torch.bfloat16)  # only float32 was measured
    assert not split_output_projection(torch, half) and not is_split(half)
    monkeypatch.setattr(output_projection, "_identical", lambda *args: False)  # a BLAS whose slices round differently
    wide = load_model(wide_vocab_dir)
    assert not split_output_projection(torch, wide) and not is_split(wide)


def test_the_load_check_notices_a_single_differing_logit():
    stock = lambda hidden: hidden.sum(dim=-1, keepdim=True).expand(*hidden.shape[:-1], 16)  # noqa: E731

    def off_by_one_ulp(hidden):
        out = stock(hidden).clone()
        out[..., 3] = torch.nextafter(out[..., 3], torch.tensor(float("inf")))
        return out

    assert output_projection._identical(torch, stock, stock, 8)
    assert not output_projection._identical(torch, stock, off_by_one_ulp, 8)
