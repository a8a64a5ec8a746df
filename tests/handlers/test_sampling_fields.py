"""The OpenAI sampling fields on the hf engine against transformers' own logits processors and ``generate``:
logit bias (``SequenceBiasLogitsProcessor``), min-p (``MinPLogitsWarper``), the repetition penalty, and OpenAI's
presence and frequency penalties, which transformers lacks, against vLLM's formula written out below. Greedy
answers equal ``model.generate``; seeded answers equal a draw, with the request's own generator, from the
distribution transformers' processors give; both alone and inside a busy batch of rows that set none of them.
Then top log probabilities, and ``n`` choices sharing their prompt's KV blocks."""

import json
import random

import pytest

from lmi_handlers.backends import sampler
from lmi_handlers.request import GenerationRequest, SamplingParams, Schema, StoppingParams
from lmi_handlers.sequence import SequenceState

from .test_hf_backend import ask, expected_ids, loaded
from .test_paged_engine import prompts, sequence

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers import generation as hf  # noqa: E402

BIAS = ((17, 4.0), (300, 2.5), (1024, -3.0))
SMALL_BIAS = ((17, 0.3), (300, 0.2), (1024, -3.0))  # the tiny model's logits lie within about one of each other
#: Settings of the rows under test, and of their neighbours (which set none of the new fields).
SETTINGS = [dict(logit_bias=BIAS), dict(presence_penalty=1.5, frequency_penalty=0.7),
            dict(logit_bias=BIAS, repetition_penalty=1.3, frequency_penalty=-0.5, presence_penalty=0.8)]
NEIGHBOURS = [dict(), dict(do_sample=True, seed=5, top_p=0.6), dict(repetition_penalty=1.2)]


class OpenAIPenalties(hf.LogitsProcessor):
    """vLLM's ``apply_penalties`` (OpenAI's definition): each token generated so far loses frequency times its count
    and presence once; the prompt's tokens do not count."""

    def __init__(self, prompt_length, presence=None, frequency=None):
        self.start, self.presence, self.frequency = prompt_length, presence or 0.0, frequency or 0.0

    def __call__(self, input_ids, scores):
        out = input_ids[:, self.start:]
        counts = torch.zeros_like(scores).scatter_add_(1, out, torch.ones_like(out, dtype=scores.dtype))
        scores = scores.clone()
        scores -= self.frequency * counts
        scores -= self.presence * (counts > 0)
        return scores


def processors(prompt_length, settings):
    """transformers' processors for ``settings``, in vLLM's order (bias, penalties, temperature, min-p)."""
    out = hf.LogitsProcessorList()
    if settings.get("logit_bias"):
        out.append(hf.SequenceBiasLogitsProcessor({(token,): bias for token, bias in settings["logit_bias"]}))
    if settings.get("repetition_penalty", 1.0) != 1.0:
        out.append(hf.RepetitionPenaltyLogitsProcessor(settings["repetition_penalty"]))
    if settings.get("presence_penalty") or settings.get("frequency_penalty"):
        out.append(OpenAIPenalties(prompt_length, settings.get("presence_penalty"), settings.get("frequency_penalty")))
    if settings.get("do_sample"):
        out.append(hf.TemperatureLogitsWarper(settings.get("temperature", 1.0)))
        if settings.get("top_k"):
            out.append(hf.TopKLogitsWarper(settings["top_k"]))
        if settings.get("min_p"):
            out.append(hf.MinPLogitsWarper(settings["min_p"]))
    return out


def reference_sample(model, prompt, steps, settings):
    """Each token drawn by inverse CDF, with a generator seeded as the request's, from the distribution
    transformers' processors give (in the order the sampler walks it: by descending logit when top-k cuts)."""
    ids, generator = torch.tensor([prompt]), torch.Generator().manual_seed(settings["seed"])
    chain = processors(len(prompt), settings)
    with torch.inference_mode():
        for _ in range(steps):
            scores = chain(ids, model(ids).logits[:, -1].float())[0]
            probs = torch.softmax(scores, dim=-1)
            order = scores.argsort(descending=True) if settings.get("top_k") else torch.arange(len(scores))
            cumulative = probs[order].cumsum(0)
            point = torch.rand(1, generator=generator) * cumulative[-1]
            token = order[torch.searchsorted(cumulative, point, right=True).clamp(max=len(scores) - 1)]
            ids = torch.cat([ids, token.view(1, 1)], dim=1)
    return ids[0, len(prompt):].tolist()


def run_together(handler, seqs):
    for seq in seqs:
        handler.engine.add(seq)
    while not handler.engine.idle:
        handler.engine.step()


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    return loaded(tiny_model_dir, tmp_path_factory.mktemp("model"), rolling_batch="disable")


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.mark.parametrize("settings", SETTINGS)
def test_greedy_answers_equal_generate_with_the_same_processors_alone_and_in_a_busy_batch(engine, model, settings):
    rng = random.Random(11)
    prompt, others = prompts(rng, 1, 6, 12)[0], prompts(rng, len(NEIGHBOURS), 4, 14)
    want = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=12, do_sample=False, logits_processor=processors(len(prompt), settings))
    want = want[0, len(prompt):].tolist()
    alone = sequence(engine, prompt, 12, **settings)
    run_together(engine, [alone])
    busy = [sequence(engine, p, 12, **kw) for p, kw in zip(others, NEIGHBOURS)]
    mine = sequence(engine, prompt, 12, **settings)
    run_together(engine, busy[:1] + [mine] + busy[1:])
    assert alone.generated == mine.generated == want
    assert want != expected_ids((None, model), prompt, 12), "the settings changed nothing: the test tests nothing"
    for seq, kw in zip(busy[::2], NEIGHBOURS[::2]):  # the greedy neighbours: as generate gives them
        assert seq.generated == expected_ids((None, model), seq.prompt_ids, 12, **kw)


@pytest.mark.parametrize("settings", [dict(temperature=0.8, min_p=0.3), dict(min_p=0.2, top_k=40, logit_bias=SMALL_BIAS),
                                      dict(temperature=1.3, min_p=0.1, presence_penalty=1.0, frequency_penalty=0.5,
                                           repetition_penalty=1.1)])
def test_seeded_answers_are_draws_from_transformers_processed_distribution(engine, model, settings):
    settings = dict(settings, do_sample=True, seed=1234)
    rng = random.Random(12)
    prompt = prompts(rng, 1, 8, 8)[0]
    want = reference_sample(model, prompt, 12, settings)
    alone = sequence(engine, prompt, 12, **settings)
    run_together(engine, [alone])
    mine = sequence(engine, prompt, 12, **settings)
    run_together(engine, [sequence(engine, p, 12, **kw) for p, kw in zip(prompts(rng, 3, 4, 10), NEIGHBOURS)]
                 + [mine])
    assert alone.generated == mine.generated == want and len(set(want)) > 3


def rows(count, logits, **sampling):
    request = GenerationRequest(Schema.LMI, "ids", SamplingParams(**sampling), StoppingParams(4))
    return [SequenceState(request, [1, 2], decode=str, seed=seed) for seed in range(count)]


def test_rows_that_set_nothing_pick_the_same_tokens_and_log_probs_beside_rows_that_do():
    logits = torch.randn(6, 2048, generator=torch.Generator().manual_seed(0)) * 3
    plain = rows(2, logits) + rows(2, logits, do_sample=True) + rows(2, logits, do_sample=True, top_k=9)
    alone = sampler.select_tokens(torch, logits, plain)
    for seq in plain:
        seq.sampler_state = None  # the same generators again
    extra = (rows(1, logits, logit_bias=BIAS) + rows(1, logits, do_sample=True, min_p=0.2, presence_penalty=1.0)
             + rows(1, logits, top_logprobs=3, frequency_penalty=2.0))
    mixed = sampler.select_tokens(torch, torch.cat([logits, logits[:3]]), plain + extra)
    assert mixed[:6] == alone


def test_top_log_probs_are_the_most_likely_tokens_of_the_raw_distribution_for_the_rows_that_ask():
    logits = torch.randn(4, 2048, generator=torch.Generator().manual_seed(1)) * 3
    seqs = rows(1, logits, top_logprobs=5) + rows(1, logits) + rows(1, logits, top_logprobs=20, logit_bias=BIAS,
                                                                     do_sample=True, temperature=0.5)
    seqs += rows(1, logits, top_logprobs=1)
    picks = sampler.select_tokens(torch, logits, seqs)
    exact = torch.log_softmax(logits.double(), dim=-1)
    assert len(picks[1]) == 2  # no alternatives computed for a row that did not ask
    for row, k in ((0, 5), (2, 20), (3, 1)):
        token, log_prob, top = picks[row]
        values, ids = exact[row].topk(k)
        assert [t for t, _ in top] == ids.tolist()
        assert max(abs(p - v) for (_, p), v in zip(top, values.tolist())) < 5e-7
        assert abs(log_prob - float(exact[row, token])) < 5e-7  # before bias and temperature, as vLLM reports


def test_among_tied_logits_the_greedy_token_is_its_positions_first_alternative():
    """bf16 logits tie often: the argmax takes the lowest id, and the alternatives list it first too."""
    logits = torch.zeros(1, 2048)
    logits[0, [1838, 1568, 7]] = 4.0
    [(token, _, top)] = sampler.select_tokens(torch, logits, rows(1, logits, top_logprobs=3))
    assert token == 7 and [t for t, _ in top] == [7, 1568, 1838]


def test_a_logit_bias_outside_the_vocabulary_is_a_400_naming_the_field(engine):
    code, body = ask(engine, {"inputs": "hi", "parameters": {"logit_bias": {"2048": 5}}})
    assert code == 400 and "parameters.logit_bias: token id 2048 is not in this model's vocabulary" in body
    code, body = ask(engine, {"inputs": "hi", "parameters": {"logit_bias": {"2047": 5}, "max_new_tokens": 2}})
    assert code == 200


def test_n_choices_share_the_prompts_blocks_and_each_equals_one_request_seeded_seed_plus_its_index(engine,
                                                                                                  monkeypatch):
    # The first choice prefills the prompt; the others share its full blocks of 16 before the last token and
    # compute the rest again, one step later.
    prompt = " ".join(["seven"] * 39)
    body = {"inputs": prompt, "parameters": {"n": 4, "do_sample": True, "seed": 9, "max_new_tokens": 8,
                                             "details": True, "top_logprobs": 2}}
    chunks = []
    step = engine.backend.step
    monkeypatch.setattr(engine.backend, "step", lambda batch: chunks.append(list(batch)) or step(batch))
    code, answer = ask(engine, body)
    monkeypatch.undo()
    assert code == 200
    details = json.loads(answer)["details"]
    choices = [details] + details["best_of_sequences"]
    starts = sorted(c.start for batch in chunks for c in batch if len(c.tokens) > 1)
    shared = (details["prompt_tokens"] - 1) // 16 * 16
    assert shared >= 32 and starts == [0, shared, shared, shared], starts
    for i, choice in enumerate(choices):
        alone = {**body, "parameters": {**body["parameters"], "n": 1, "seed": 9 + i}}
        single = json.loads(ask(engine, alone)[1])["details"]
        assert [t["id"] for t in choice["tokens"]] == [t["id"] for t in single["tokens"]]
        assert choice["seed"] == 9 + i and all(len(t["top_logprobs"]) == 2 for t in choice["tokens"])
    assert len({tuple(t["id"] for t in c["tokens"]) for c in choices}) > 1
    assert all(count == 0 for count in engine.backend.kv.refs)
