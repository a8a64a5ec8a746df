"""Speculative decoding in the hf backend (``option.speculative_draft_model``): greedy output equals
``model.generate`` with prompt lookup and with a draft model, alone and inside a busy rolling batch (sampled and
penalized rows beside, a pool small enough to preempt); sampled rows keep the target's distribution (rejection
sampling, checked against exact probabilities with many draws); acceptance is reported per request and in the
engine's counters; options and a draft whose tokenizer differs are refused before load.

The step cost model is pinned where a test needs guesses on every step (``always_speculate``): on a busy
two-core machine the load-time timing could otherwise switch speculation off, which is its job, not this test's.
"""

import json
import random

import pytest

from lmi_handlers.backends.hf.speculative import (NGRAM, ForwardCost, Proposal, Speculator, SpeculativeOptions,
                                               _Track, expected_tokens, ngram_proposal, parse_options)
from lmi_handlers.errors import ConfigError
from lmi_handlers.request import GenerationRequest, SamplingParams, Schema, StoppingParams
from lmi_handlers.sequence import SequenceState

from .test_hf_backend import ask, expected_ids, loaded
from .test_paged_engine import prompts, sequence

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def generate(tiny_model_dir):
    return None, transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory):
    """A one-layer model with other random weights and the same tokenizer: a draft the target often refuses."""
    from lmi_tools.models.tiny import TinySpec, build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("draft"), TinySpec(num_hidden_layers=1))


def always_speculate(handler):
    speculator = handler.backend.speculator
    speculator.cost = ForwardCost(1.0, 0.0)
    if speculator.draft is not None:
        speculator.draft.cost = ForwardCost(0.0, 0.0)
    return speculator


def echoing(rng, count, low, high):
    """Prompts that repeat a stretch of themselves, so prompt lookup finds matches."""
    return [p + p[: len(p) // 2] + p for p in prompts(rng, count, low, high)]


def busy_run(handler, rng, greedy, neighbours, budget=18):
    """Greedy sequences, and beside them sampled and penalized ones, joining over the first steps."""
    engine, step = handler.engine, 0
    seqs = [sequence(handler, p, budget) for p in greedy]
    others = [sequence(handler, p, budget, **kw) for p, kw in neighbours]
    arrivals = {}
    for seq in seqs + others:
        arrivals.setdefault(rng.randrange(4), []).append(seq)
    while step <= max(arrivals) or not engine.idle:
        for seq in arrivals.get(step, ()):
            engine.add(seq)
        engine.step()
        step += 1
    return seqs, others


@pytest.mark.parametrize("draft", ["ngram", "self", "other"])
def test_greedy_output_is_identical_in_a_busy_batch_that_preempts(tiny_model_dir, other_draft, tmp_path, generate,
                                                                  draft):
    model = {"ngram": NGRAM, "self": tiny_model_dir, "other": other_draft}[draft]
    handler = loaded(tiny_model_dir, tmp_path, rolling_batch="scheduler", max_rolling_batch_size=8, block_size=4,
                     num_gpu_blocks_override=40, max_model_len=96, speculative_draft_model=model)
    speculator = always_speculate(handler)
    rng = random.Random(11)
    neighbours = [(p, dict(do_sample=True, temperature=0.9, seed=i)) for i, p in enumerate(echoing(rng, 2, 5, 10))]
    neighbours += [(echoing(rng, 1, 5, 10)[0], dict(repetition_penalty=1.3))]
    seqs, others = busy_run(handler, rng, echoing(rng, 5, 4, 12), neighbours)
    for seq in seqs:
        assert seq.generated == expected_ids(generate, seq.prompt_ids, seq.max_new_tokens), seq
    penalized = others[-1]
    assert penalized.generated == expected_ids(generate, penalized.prompt_ids, penalized.max_new_tokens,
                                               repetition_penalty=1.3)
    assert penalized.speculation is None, "a penalized row must not speculate"
    stats = handler.engine.stats()
    assert stats["preemptions"] > 0, "the pool never ran dry: the test does not test preemption"
    assert stats["kv_blocks_used"] == 0
    assert speculator.proposed > 10 and stats["spec_draft_tokens"] == speculator.proposed
    drafted = sum(seq.speculation[0] for seq in seqs if seq.speculation)
    kept = sum(seq.speculation[1] for seq in seqs if seq.speculation)
    assert drafted > 0
    if draft == "self":
        assert kept == drafted  # the target drafting for itself agrees with itself
    if draft == "other":
        assert kept < drafted, "the other draft was never refused: the rejection path went untested"
    if speculator.draft is not None:
        assert not speculator.draft.cached and speculator.draft.runner.blocks.used == 0


def test_greedy_alone_with_prompt_lookup_gains_tokens_per_step(tiny_model_dir, tmp_path, generate):
    handler = loaded(tiny_model_dir, tmp_path, rolling_batch="scheduler", speculative_draft_model="[ngram]",
                     speculative_length="8")
    always_speculate(handler)
    prompt = echoing(random.Random(12), 1, 30, 30)[0]
    seq = sequence(handler, prompt, 40)
    handler.engine.add(seq)
    steps = 0
    while not handler.engine.idle:
        handler.engine.step()
        steps += 1
    assert seq.generated == expected_ids(generate, prompt, 40)
    assert seq.speculation[0] > 0
    assert steps == len(seq.generated) - seq.speculation[1], "every accepted guess saves one step"


def test_acceptance_is_in_the_details_and_the_engine_counters(tiny_model_dir, tmp_path):
    handler = loaded(tiny_model_dir, tmp_path, rolling_batch="disable", speculative_draft_model=str(tiny_model_dir),
                     speculative_length="3")
    always_speculate(handler)
    code, body = ask(handler, {"inputs": "the the the the the the", "parameters": {"max_new_tokens": 12,
                                                                                   "details": True}})
    details = json.loads(body)["details"]
    assert code == 200 and details["draft_tokens"] > 0
    assert details["accepted_draft_tokens"] == details["draft_tokens"] and details["acceptance_rate"] == 1.0
    stats = handler.engine.stats()
    assert stats["spec_method"] == "draft" and stats["spec_acceptance_rate"] == 1.0


def test_without_speculation_details_say_nothing_about_it(tiny_model_dir, tmp_path):
    handler = loaded(tiny_model_dir, tmp_path)
    _, body = ask(handler, {"inputs": "hello", "parameters": {"max_new_tokens": 3, "details": True}})
    assert "acceptance_rate" not in json.loads(body)["details"]
    assert "spec_acceptance_rate" not in handler.engine.stats()


def test_seeded_sampled_rows_reproduce_with_speculation(tiny_model_dir, tmp_path):
    handler = loaded(tiny_model_dir, tmp_path, rolling_batch="scheduler", speculative_draft_model=str(tiny_model_dir))
    always_speculate(handler)
    prompt = echoing(random.Random(13), 1, 10, 10)[0]

    def sample():
        seq = sequence(handler, prompt, 16, do_sample=True, temperature=0.8, top_p=0.9, seed=5)
        handler.engine.add(seq)
        while not handler.engine.idle:
            handler.engine.step()
        return seq

    first, second = sample(), sample()
    assert first.generated == second.generated and first.speculation[0] > 0


# --- rejection sampling keeps the target's distribution -----------------------------------------------------

VOCAB = 6


def _row(probs):
    return torch.log(torch.tensor(probs, dtype=torch.float32))


def _speculator():
    speculator = Speculator.__new__(Speculator)
    speculator.torch = torch
    return speculator


@pytest.mark.parametrize("q_rows", [
    None,  # prompt lookup: a point mass on the guess
    [[0.05, 0.05, 0.6, 0.1, 0.1, 0.1], [0.3, 0.3, 0.1, 0.1, 0.1, 0.1]],  # a draft far from the target
    [[0.35, 0.25, 0.15, 0.1, 0.1, 0.05], [0.1, 0.1, 0.2, 0.2, 0.2, 0.2]],  # a draft close to it
])
def test_the_first_emitted_token_follows_the_target_distribution(q_rows):
    p_rows = [[0.4, 0.2, 0.15, 0.1, 0.1, 0.05], [0.1, 0.5, 0.1, 0.1, 0.1, 0.1], [0.2] * 5 + [0.0]]
    logits = torch.stack([_row([max(v, 1e-12) for v in r]) for r in p_rows])
    speculator = _speculator()
    request = GenerationRequest(Schema.LMI, "x", SamplingParams(do_sample=True, temperature=1.0), StoppingParams(4))
    seq = SequenceState(request, [1, 2, 3], decode=lambda ids: "", seed=7)
    draws = 12000
    counts = [0] * VOCAB
    guess_rng = random.Random(3)
    q = None if q_rows is None else torch.tensor(q_rows)
    kept = 0
    for _ in range(draws):
        if q is None:
            guesses = [0, 1] if guess_rng.random() < 0.5 else [3, 5]
        else:
            guesses = [guess_rng.choices(range(VOCAB), weights=row)[0] for row in q_rows]
        emitted = speculator._rejection_sample(seq, logits, Proposal(guesses, q))
        counts[emitted[0]] += 1
        kept += emitted[0] == guesses[0]
    expected = [p * draws for p in p_rows[0]]
    chi2 = sum((c - e) ** 2 / e for c, e in zip(counts, expected))
    # 5 degrees of freedom: P(chi2 > 25.7) < 1e-4. The draws are seeded, so the test is deterministic.
    assert chi2 < 25.7, (counts, expected)
    total_variation = sum(abs(c / draws - p) for c, p in zip(counts, p_rows[0])) / 2
    assert total_variation < 0.02
    assert 0 < kept < draws


def test_top_k_and_temperature_shape_the_distribution_that_is_kept():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -2.0]] * 2)
    request = GenerationRequest(Schema.LMI, "x", SamplingParams(do_sample=True, temperature=0.7, top_k=3),
                                StoppingParams(4))
    seq = SequenceState(request, [1], decode=lambda ids: "", seed=1)
    target = torch.softmax(logits[0, :3] / 0.7, dim=-1).tolist()
    speculator, counts, draws = _speculator(), [0] * VOCAB, 8000
    for i in range(draws):
        counts[speculator._rejection_sample(seq, logits, Proposal([i % VOCAB]))[0]] += 1
    assert counts[3:] == [0, 0, 0]
    chi2 = sum((c - p * draws) ** 2 / (p * draws) for c, p in zip(counts, target))
    assert chi2 < 18.4  # 2 degrees of freedom, P < 1e-4


def test_all_guesses_kept_add_a_bonus_token_from_the_last_position():
    logits = torch.tensor([[0.0, 30.0, 0.0], [0.0, 0.0, 30.0], [30.0, 0.0, 0.0]])
    request = GenerationRequest(Schema.LMI, "x", SamplingParams(do_sample=True), StoppingParams(4))
    seq = SequenceState(request, [1], decode=lambda ids: "", seed=2)
    assert _speculator()._rejection_sample(seq, logits, Proposal([1, 2])) == [1, 2, 0]
    assert _speculator()._rejection_sample(seq, logits, Proposal([2, 2])) == [1]


# --- proposals, fallback, options ---------------------------------------------------------------------------

def test_prompt_lookup_continues_the_latest_earlier_match():
    ids = [5, 6, 7, 8, 9, 1, 5, 6, 7, 2, 3, 5, 6, 7]
    assert ngram_proposal(ids, 3, 4, 1) == [2, 3, 5]  # "5 6 7" last seen before "2 3 5"
    assert ngram_proposal([1, 2, 3, 4], 3, 4, 1) == []
    assert ngram_proposal([4, 9, 9, 4], 2, 3, 2) == []  # only a 1-gram matches, below the minimum
    assert ngram_proposal([4, 9, 9, 4], 2, 3, 1) == [9, 9]


def test_a_sequence_whose_guesses_fail_stops_guessing_then_probes():
    track = _Track()
    assert track.wanted(5) >= 2
    for _ in range(4):
        track.update(4, 0)
    wanted = [track.wanted(5) for _ in range(16)]
    assert wanted.count(0) == 14 and wanted.count(1) == 2
    for _ in range(6):
        track.update(5, 5)
    assert track.wanted(5) == 5


def test_the_step_falls_back_to_plain_decoding_when_guessing_costs_more_than_it_gains():
    speculator = _speculator()
    speculator.draft = None
    request = GenerationRequest(Schema.LMI, "x", SamplingParams(), StoppingParams(4))
    seqs = [SequenceState(request, [1], decode=lambda ids: "") for _ in range(8)]
    speculator.tracks = {seq.uid: _Track() for seq in seqs}
    for track in speculator.tracks.values():
        track.estimate = 0.9
    wanted = [(seq, 5) for seq in seqs]
    speculator.cost = ForwardCost(fixed=0.02, per_token=0.0001)  # weights dominate: guess all five
    assert speculator._worthwhile(wanted, 8) == 5
    speculator.cost = ForwardCost(fixed=0.001, per_token=0.002)  # compute dominates a full batch: do not guess
    assert speculator._worthwhile(wanted, 8) == 0

    class Draft:
        @staticmethod
        def step_cost(rows, guesses):
            return guesses * 0.019

    speculator.draft, speculator.cost = Draft(), ForwardCost(fixed=0.02, per_token=0.0001)
    assert speculator._worthwhile(wanted, 8) == 0  # a draft nearly as slow as the target never pays
    assert expected_tokens(1.0, 4) == pytest.approx(4.90, abs=0.01)


def test_options_default_and_refuse_with_the_option_named():
    assert parse_options({}) is None
    assert parse_options({"speculative_draft_model": "[ngram]"}) == SpeculativeOptions(None, 5, 4, 1, None)
    assert parse_options({"speculative_draft_model": "/d", "speculative_draft_quantize": "static_int8"}).draft_quantize \
        == "static_int8"
    cases = [({"speculative_draft_model": "/d", "speculative_length": "0"}, "speculative_length"),
             ({"speculative_draft_model": "/d", "speculative_length": "17"}, "speculative_length"),
             ({"speculative_length": "4"}, "speculative_length"),
             ({"speculative_draft_model": "[ngram]", "speculative_draft_quantize": "static_int8"},
              "speculative_draft_quantize"),
             ({"speculative_draft_model": "/d", "speculative_draft_quantize": "awq"}, "speculative_draft_quantize"),
             ({"speculative_draft_model": "[ngram]", "ngram_prompt_lookup_min": "5"}, "ngram_prompt_lookup_min")]
    for props, key in cases:
        with pytest.raises(ConfigError) as error:
            parse_options(props)
        assert error.value.key == key, (props, error.value)


def test_a_draft_with_another_tokenizer_is_refused_naming_both(tiny_model_dir, tmp_path_factory):
    from lmi_handlers.handler import Handler
    from lmi_tools.models.tiny import TinySpec, build_tiny_model
    from lmi_tools.serving.worker.frontend import init_input

    stranger = build_tiny_model(tmp_path_factory.mktemp("stranger"), TinySpec(seed=1))
    out = Handler().handle(init_input({"model_id": str(tiny_model_dir), "model_dir": str(tiny_model_dir),
                                       "speculative_draft_model": str(stranger)}))
    body = bytes(out.content.value_at(0)).decode()
    assert out.code == 400 and "speculative_draft_model" in body
    assert str(stranger) in body and str(tiny_model_dir) in body and "vocabularies differ" in body
