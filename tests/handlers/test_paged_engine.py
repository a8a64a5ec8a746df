"""The paged engine against transformers itself: greedy output equals ``model.generate`` for every request,
whatever the pool size (admission waits, preemption recomputes), prefix sharing and chunked prefill do.

Driven at the engine level with token-id prompts of chosen lengths (random ids of the tiny model's
vocabulary), so each test can make the pool run dry, share a prefix, or cut prompts into chunks.
"""

import random

import pytest

from lmi_handlers.request import GenerationRequest, SamplingParams, Schema, StoppingParams
from lmi_handlers.sequence import SequenceState

from .test_hf_backend import expected_ids, loaded

torch = pytest.importorskip("torch")


def sequence(handler, prompt_ids, max_new_tokens, **sampling):
    request = GenerationRequest(Schema.LMI, "ids", SamplingParams(**sampling), StoppingParams(max_new_tokens))
    tokenizer = handler.backend.tokenizer
    return SequenceState(request, prompt_ids, decode=tokenizer.decode, eos_ids=tokenizer.eos_ids, seed=sampling.get(
        "seed"))


def run(handler, arrivals):
    """``arrivals``: {step: [(prompt ids, max new tokens), ...]}; steps the engine until all finished."""
    engine, seqs, step = handler.engine, [], 0
    while step <= max(arrivals) or not engine.idle:
        for prompt, budget in arrivals.get(step, ()):
            seqs.append(sequence(handler, prompt, budget))
            engine.add(seqs[-1])
        engine.step()
        step += 1
    return seqs


def prompts(rng, count, low, high, vocab=300):
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(low, high))] for _ in range(count)]


def poison_pool(handler):
    """NaN in every slot of the paged pool but the scratch slot (the pool exists once a request has run)."""
    cache = handler.backend.runner.cache
    with torch.inference_mode():
        for pool in cache.keys + cache.values:
            pool[:, :cache.scratch].fill_(float("nan"))


def assert_exact(generate, seqs):
    for seq in seqs:
        assert seq.generated == expected_ids(generate, seq.prompt_ids, seq.max_new_tokens), seq


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir


@pytest.fixture(scope="module")
def generate(tiny_model_dir):
    """``model.generate`` on the same weights, the oracle."""
    import transformers

    return None, transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def test_a_small_pool_makes_requests_wait_and_preempts_yet_every_answer_is_exact(model_dir, tmp_path, generate):
    # 12 blocks of 4 tokens hold 48 tokens: about two of these sequences at once.
    handler = loaded(model_dir, tmp_path, rolling_batch="scheduler", max_rolling_batch_size=8, block_size=4,
                     num_gpu_blocks_override=12, max_model_len=48)
    rng = random.Random(0)
    arrivals = {0: [(p, 20) for p in prompts(rng, 4, 3, 14)], 3: [(p, 24) for p in prompts(rng, 3, 5, 20)]}
    seqs = run(handler, arrivals)
    stats = handler.engine.stats()
    assert stats["preemptions"] > 0, "the pool never ran dry: the test does not test preemption"
    assert stats["kv_blocks_used"] == 0 and stats["kv_blocks_free"] == 12
    assert_exact(generate, seqs)


def test_shared_prefix_blocks_are_reused_and_answers_stay_exact(model_dir, tmp_path, generate):
    handler = loaded(model_dir, tmp_path, rolling_batch="scheduler", enable_prefix_caching="true", block_size=8)
    rng = random.Random(1)
    system = prompts(rng, 1, 40, 40)[0]
    first = run(handler, {0: [(system + [5, 6, 7], 6)]})
    later = run(handler, {0: [(system + tail, 8) for tail in prompts(rng, 3, 1, 9)], 2: [(system + [9], 5)]})
    stats = handler.engine.stats()
    assert stats["prefix_cache_hit_tokens"] >= 4 * 40 // 8 * 8 - 8, stats
    assert 0 < stats["prefix_cache_hit_rate"] < 1
    assert_exact(generate, first + later)
    blocks = handler.backend.kv
    assert all(count == 0 for count in blocks.refs) and blocks.used == 0


def test_prefix_cache_evicts_least_recently_used_blocks_when_the_pool_is_needed(model_dir, tmp_path, generate):
    handler = loaded(model_dir, tmp_path, rolling_batch="scheduler", enable_prefix_caching="true", block_size=4,
                     num_gpu_blocks_override=16, max_model_len=48)
    rng = random.Random(2)
    seqs = []
    for prompt in prompts(rng, 6, 20, 30):  # each leaves ~6 cached blocks; 16 blocks cannot keep them all
        seqs += run(handler, {0: [(prompt, 10)]})
    again = run(handler, {0: [(seqs[-1].prompt_ids, 10)]})
    assert handler.backend.kv.hit_tokens >= 16
    assert_exact(generate, seqs + again)


def test_chunked_prefill_cuts_long_prompts_and_keeps_decoding_the_others(model_dir, tmp_path, generate, monkeypatch):
    handler = loaded(model_dir, tmp_path, rolling_batch="scheduler", enable_chunked_prefill="true",
                     max_rolling_batch_prefill_tokens=16)
    steps = []
    step = handler.backend.step
    monkeypatch.setattr(handler.backend, "step", lambda batch: steps.append(list(batch)) or step(batch))
    rng = random.Random(3)
    short, long = prompts(rng, 2, 4, 8), prompts(rng, 2, 60, 90)
    seqs = run(handler, {0: [(p, 30) for p in short], 2: [(p, 12) for p in long]})
    assert_exact(generate, seqs)
    prefill = [sum(len(c.tokens) for c in batch if len(c.tokens) > 1) for batch in steps]
    assert max(prefill) <= 16
    # While the long prompts were prefilled piece by piece, the short ones decoded at every step.
    partial = [batch for batch in steps if any(not c.sample for c in batch)]
    assert len(partial) >= 8
    for seq in seqs[:2]:
        present = [i for i, batch in enumerate(steps) if any(c.seq is seq for c in batch)]
        assert present == list(range(present[0], present[0] + len(seq.generated))), "a short stream skipped a step"
    assert any(c.seq is seqs[0] for c in partial[0])


def test_without_chunking_the_budget_only_limits_admission(model_dir, tmp_path, generate):
    handler = loaded(model_dir, tmp_path, rolling_batch="scheduler", max_rolling_batch_prefill_tokens=16)
    rng = random.Random(4)
    seqs = run(handler, {0: [(p, 5) for p in prompts(rng, 3, 30, 40)]})
    assert_exact(generate, seqs)


def test_seeded_rows_sample_the_same_tokens_whatever_else_is_in_the_batch(model_dir, tmp_path):
    handler = loaded(model_dir, tmp_path, rolling_batch="scheduler")
    rng = random.Random(5)
    prompt = prompts(rng, 1, 10, 10)[0]
    params = dict(do_sample=True, temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.2, seed=77)

    def sample(neighbours):
        seq = sequence(handler, prompt, 16, **params)
        others = [sequence(handler, p, 16, **kw) for p, kw in neighbours]
        for s in others[:1] + [seq] + others[1:]:
            handler.engine.add(s)
        while not handler.engine.idle:
            handler.engine.step()
        return seq.generated

    alone = sample([])
    busy = sample([(p, dict(do_sample=True, seed=i, top_p=0.5)) for i, p in enumerate(prompts(rng, 3, 5, 20))]
                  + [(prompts(rng, 1, 8, 8)[0], {})])
    assert alone == busy and len(set(alone)) > 1


def test_a_top_k_of_one_samples_the_greedy_token(model_dir, tmp_path, generate):
    handler = loaded(model_dir, tmp_path, rolling_batch="scheduler")
    rng = random.Random(6)
    seqs = [sequence(handler, p, 10, do_sample=True, top_k=1, seed=3) for p in prompts(rng, 3, 5, 12)]
    for seq in seqs:
        handler.engine.add(seq)
    while not handler.engine.idle:
        handler.engine.step()
    for seq in seqs:
        assert seq.generated == expected_ids(generate, seq.prompt_ids, 10)


@pytest.mark.parametrize("options, field", [({"num_gpu_blocks_override": "2"}, "num_gpu_blocks_override"),
                                            ({"kv_cache_memory_bytes": "1000"}, "kv_cache_memory_bytes"),
                                            ({"block_size": "0"}, "block_size")])
def test_a_pool_too_small_for_one_sequence_is_a_config_error_naming_the_option(model_dir, tmp_path, options, field):
    from lmi_handlers.handler import Handler
    from lmi_tools.serving.worker.frontend import init_input

    handler = Handler()
    out = handler.handle(init_input({"model_id": str(model_dir), "model_dir": str(tmp_path), **options}))
    assert out is not None and out.code >= 400
    body = bytes(out.content.value_at(0)).decode()
    assert field in body and options[field] in body


def test_a_packed_step_runs_decodes_and_prompts_in_one_forward_and_stays_exact(model_dir, tmp_path, generate,
                                                                              monkeypatch):
    import transformers
    from packaging.version import Version

    handler = loaded(model_dir, tmp_path, rolling_batch="scheduler", enable_chunked_prefill="true",
                     max_rolling_batch_prefill_tokens=24, block_size=4)
    runner = handler.backend.runner
    # transformers < 4.48 (the neuronx image's 4.43) cannot pass the packed layout to attention: two forwards.
    assert runner.packed == (Version(transformers.__version__) >= Version("4.48"))
    forwards, mixed = [], []
    handler.backend.model.register_forward_hook(lambda *args: forwards.append(1))
    step = handler.backend.step

    def counted(batch):
        forwards.clear()
        out = step(batch)
        if len({len(c.tokens) > 1 for c in batch}) == 2:  # decodes and longer chunks together
            mixed.append((len(batch), len(forwards)))
        return out

    monkeypatch.setattr(handler.backend, "step", counted)
    rng = random.Random(5)
    seqs = run(handler, {0: [(p, 16) for p in prompts(rng, 3, 2, 6)], 2: [(p, 9) for p in prompts(rng, 2, 5, 40)],
                         5: [(p, 7) for p in prompts(rng, 3, 10, 20)]})
    assert_exact(generate, seqs)
    assert len(mixed) >= 3
    assert {count for _, count in mixed} == ({1} if runner.packed else {2}), mixed


def test_garbage_in_unwritten_slots_never_reaches_an_answer(model_dir, tmp_path, generate):
    # The pool is torch.empty memory, and a block handed out again still holds its last owner's values (an
    # overflow's inf or NaN among them). Masked positions must not read them: 0 * NaN is NaN. Poison every
    # slot but the scratch slot and check the answers, packed step and padded forwards alike.
    handler = loaded(model_dir, tmp_path, rolling_batch="scheduler", block_size=8, enable_chunked_prefill="true",
                     max_rolling_batch_prefill_tokens=16)
    rng = random.Random(6)
    run(handler, {0: [(p, 3) for p in prompts(rng, 2, 5, 9)]})  # builds the pool
    poison_pool(handler)
    seqs = run(handler, {0: [(p, 12) for p in prompts(rng, 3, 3, 11)], 2: [(p, 9) for p in prompts(rng, 2, 20, 30)]})
    assert_exact(generate, seqs)


def test_a_sequence_driven_past_the_models_positions_does_not_fail_the_step(model_dir, tmp_path):
    # job.py caps every request's budget at max_model_len; the engine used directly (benchmarks, speculation
    # probes) must still step, as it did before the step's inputs were built by broadcasting.
    handler = loaded(model_dir, tmp_path, rolling_batch="scheduler", max_model_len=32, block_size=4)
    seqs = run(handler, {0: [([5, 6, 7, 8] * 5, 30), ([9, 10, 11], 8)]})
    assert [len(seq.generated) for seq in seqs] == [30, 8]


def test_decode_rows_attending_in_groups_give_the_same_answers(model_dir, tmp_path, generate, monkeypatch):
    # On the CPU big decode batches attend a few rows at a time (packed_attention.DECODE_GATHER_BYTES); the tiny
    # model's rows are small enough for one group, so force one row per group.
    from lmi_handlers.backends.hf import packed_attention

    handler = loaded(model_dir, tmp_path, rolling_batch="scheduler", block_size=4)
    if not handler.backend.runner.packed:
        pytest.skip("transformers < 4.48 runs no packed step")
    monkeypatch.setattr(packed_attention, "DECODE_GATHER_BYTES", 1)
    rng = random.Random(7)
    seqs = run(handler, {0: [(p, 12) for p in prompts(rng, 5, 2, 30)], 3: [(p, 8) for p in prompts(rng, 3, 4, 12)]})
    assert_exact(generate, seqs)
