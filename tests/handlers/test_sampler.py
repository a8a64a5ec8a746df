"""Batched token selection (``backends/sampler.py``): sampled rows follow the distribution they ask for, whether
they draw in vocabulary order (temperature only) or sorted (top-k, top-p), and only truncating rows sort."""

import pytest

from lmi_handlers.backends import sampler
from lmi_handlers.request import GenerationRequest, SamplingParams, Schema, StoppingParams
from lmi_handlers.sequence import SequenceState

torch = pytest.importorskip("torch")

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 3.0])
DRAWS = 6000


def sequences(count, **sampling):
    request = GenerationRequest(Schema.LMI, "ids", SamplingParams(do_sample=True, **sampling), StoppingParams(4))
    return [SequenceState(request, [1], decode=str, seed=seed) for seed in range(count)]


def frequencies(seqs):
    """Each token's share of one draw per sequence, all rows in one batch."""
    picks = [token for token, _ in sampler.select_tokens(torch, LOGITS.repeat(len(seqs), 1), seqs)]
    return torch.bincount(torch.tensor(picks), minlength=len(LOGITS)).float() / len(seqs)


def kept(probs, top_k=0, top_p=1.0):
    """``probs`` after top-k then top-p, renormalized, as transformers applies them."""
    order = probs.argsort(descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    keep[order[:top_k or len(probs)]] = True
    mass = probs[order].cumsum(0) - probs[order]
    keep[order[(mass >= top_p) & (torch.arange(len(probs)) > 0)]] = False
    out = torch.where(keep, probs, torch.zeros_like(probs))
    return out / out.sum()


@pytest.mark.parametrize("sampling", [{"temperature": 1.0}, {"temperature": 0.5}, {"temperature": 1.0, "top_k": 3},
                                      {"temperature": 0.8, "top_p": 0.7}])
def test_sampled_rows_follow_the_distribution_they_ask_for(sampling):
    want = kept(torch.softmax(LOGITS / sampling["temperature"], dim=0), sampling.get("top_k", 0),
                sampling.get("top_p", 1.0))
    got = frequencies(sequences(DRAWS, **sampling))
    assert (got - want).abs().max() < 0.025, (got, want)  # about 4 standard deviations at 6,000 draws
    assert torch.all(got[want == 0] == 0)


def test_only_rows_whose_top_k_or_top_p_cuts_something_sort_their_logits(monkeypatch):
    sorted_rows = []
    stock = sampler._sorted_probs
    monkeypatch.setattr(sampler, "_sorted_probs",
                        lambda torch, scores, params: sorted_rows.append(len(params)) or stock(torch, scores, params))
    seqs = sequences(3) + sequences(2, top_k=2) + sequences(2, top_k=len(LOGITS)) + sequences(1, top_p=0.5)
    sampler.select_tokens(torch, LOGITS.repeat(len(seqs), 1), seqs)
    assert sorted_rows == [3]  # top_k=2 twice and top_p=0.5 once; a top-k of the whole vocabulary cuts nothing


def test_a_seeded_row_draws_the_same_token_beside_rows_that_sort_and_rows_that_do_not():
    def first_row_token(neighbours):
        seqs = sequences(1, temperature=0.9) + neighbours
        return sampler.select_tokens(torch, torch.randn(len(seqs), 50, generator=torch.Generator().manual_seed(1)),
                                     seqs)[0][0]

    alone = first_row_token([])
    assert first_row_token(sequences(3, top_p=0.3)) == alone
    assert first_row_token(sequences(4)) == alone


def test_log_probabilities_agree_with_float64_to_within_float32_rounding():
    # torch's fused CPU log_softmax is 1.8x faster but approximates exp: over 49,152 logits it was 1.2e-6 off
    # float64 here (9e-6 on SmolLM2's " Paris"), where max, subtract, exp, sum and log stay within 2e-7.
    logits = torch.randn(16, 49_152, generator=torch.Generator().manual_seed(0)) * 3
    request = GenerationRequest(Schema.LMI, "ids", SamplingParams(), StoppingParams(4))
    picked = sampler.select_tokens(torch, logits, [SequenceState(request, [1], decode=str) for _ in range(16)])
    exact = torch.log_softmax(logits.double(), dim=-1)
    assert [token for token, _ in picked] == logits.argmax(dim=-1).tolist()
    assert max(abs(lp - float(exact[row, token])) for row, (token, lp) in enumerate(picked)) < 5e-7


@pytest.mark.parametrize("vocab", [49_152, 50_257])  # whole blocks of 64, and a short last block
def test_blockwise_argmax_is_torch_argmax_with_ties_and_in_the_last_block(vocab):
    logits = torch.randn(16, vocab, generator=torch.Generator().manual_seed(vocab))
    logits[1, [7, 70, 3000]] = 9.0  # ties: the first column wins, as argmax's
    logits[2, [200, 201]] = 9.0  # a tie inside one block
    logits[3, -1] = 9.0  # the vocabulary's last column
    assert logits.numel() >= sampler.BLOCKWISE_FROM
    assert torch.equal(sampler._argmax(torch, logits), logits.argmax(dim=-1))


def test_blockwise_draws_follow_the_weights_and_never_pick_a_zero_weight():
    weights = torch.zeros(130)  # two whole blocks and a last block of two
    weights[[0, 63, 64, 127, 129]] = torch.tensor([1.0, 2.0, 3.0, 1.0, 3.0])
    uniforms = torch.rand(DRAWS, generator=torch.Generator().manual_seed(0))
    rows = weights.repeat(DRAWS, 1)
    assert rows.numel() >= sampler.BLOCKWISE_FROM
    got = torch.bincount(sampler._draw(torch, rows, uniforms), minlength=130).float() / DRAWS
    assert (got - weights / weights.sum()).abs().max() < 0.025, got[weights > 0]
    assert torch.all(got[weights == 0] == 0)


def test_blockwise_draws_are_the_cumulative_sums_draws():
    weights = torch.softmax(torch.randn(64, 49_152, generator=torch.Generator().manual_seed(2)) * 3, dim=-1)
    uniforms = torch.rand(64, generator=torch.Generator().manual_seed(3))
    cumulative = weights.cumsum(dim=-1)
    expected = torch.searchsorted(cumulative, uniforms[:, None] * cumulative[:, -1:], right=True)[:, 0]
    assert torch.equal(sampler._draw(torch, weights, uniforms), expected)


def test_blockwise_draws_at_the_top_of_a_row_stay_on_positive_weights():
    # A point just under a row's total lands where the block sums and the sums inside a block round apart;
    # each block's second half weighs 0 (what top-k and top-p leave), so a draw past the last weight would show.
    generator = torch.Generator().manual_seed(5)
    weights = torch.rand(512, 256, generator=generator) ** 4
    for start in (32, 96, 160, 224):
        weights[:, start:start + 32] = 0
    picks = sampler._draw(torch, weights, 1 - torch.rand(512, generator=generator) * 1e-6)
    assert torch.all(weights.gather(1, picks[:, None]) > 0)
