"""The neuronx backend end to end through the transformers_neuronx stand-in, every architecture and mode.

Greedy tokens must equal transformers' ``generate`` on the same tiny weights. The exception is
what transformers-neuronx itself does: GPT-J and GPT-NeoX do not mask left padding, so in a batch
their shorter prompts attend to pad tokens; for those only the unpadded rows are compared.
"""

from __future__ import annotations

import pytest

from lmi_tools.models.tiny import ARCHITECTURES
from .neuronx_support import PROMPTS, ask, ask_batch, ask_stream, load, run_rolling

UNMASKED = ("gptj", "gpt_neox")


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_single_requests_match_generate(neuronx_standin, tiny_arch, reference, arch):
    handler = load(tiny_arch(arch))
    assert handler.backend.name == "neuronx"
    assert type(handler.backend.model).__module__.startswith("transformers_neuronx")
    for prompt in PROMPTS[:2]:
        assert ask(handler, prompt, 8) == reference(tiny_arch(arch), prompt, 8)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_dynamic_batch_matches_generate(neuronx_standin, tiny_arch, reference, arch):
    handler = load(tiny_arch(arch), batch_size=4)
    expected_runner = "continuous_batching" if arch in ("llama", "mistral") else "naive_rolling_batch"
    assert handler.backend.runner.name == expected_runner
    got = ask_batch(handler, PROMPTS, 6)
    for prompt, tokens in zip(PROMPTS, got):
        if arch in UNMASKED and prompt != max(PROMPTS, key=len):
            assert len(tokens) == 6  # left-padded row: transformers-neuronx lets it see the pad tokens
        else:
            assert tokens == reference(tiny_arch(arch), prompt, 6)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_streaming_matches_generate(neuronx_standin, tiny_arch, reference, arch):
    handler = load(tiny_arch(arch))
    assert ask_stream(handler, PROMPTS[0], 7) == reference(tiny_arch(arch), PROMPTS[0], 7)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_rolling_batch_matches_generate(neuronx_standin, tiny_arch, reference, arch):
    handler = load(tiny_arch(arch), rolling_batch="auto", max_rolling_batch_size=3)
    assert handler.backend.max_batch_size == 3
    # Arrivals while others run, a one-token-longer wait than the slots allow, and slot reuse.
    arrivals = {0: [(PROMPTS[0], 6)], 2: [(PROMPTS[1], 5), (PROMPTS[2], 8)], 3: [(PROMPTS[0], 4)],
                4: [(PROMPTS[2], 3)]}
    got = run_rolling(handler, arrivals)
    wanted = [(p, n) for step in sorted(arrivals) for p, n in arrivals[step]]
    for (prompt, max_new), tokens in zip(wanted, got):
        if arch in UNMASKED:
            assert len(tokens) == max_new
        else:
            assert tokens == reference(tiny_arch(arch), prompt, max_new)


@pytest.mark.parametrize("arch,strategy", [("opt", None), ("llama", "naive_rolling_batch"),
                                           ("mistral", "continuous_batching")])
def test_sequences_use_all_of_n_positions(neuronx_standin, tiny_arch, reference, arch, strategy):
    """A long prompt then a short one with a long budget: the naive strategy's shared cache position
    runs out before the short sequence is done and the rows are re-encoded (compacted)."""
    options = {"rolling_batch": "auto", "max_rolling_batch_size": 2, "n_positions": 48}
    if strategy:
        options["rolling_batch_strategy"] = strategy
    handler = load(tiny_arch(arch), **options)
    long_prompt, short_prompt = PROMPTS[1] + ", again", PROMPTS[2]
    prompt_tokens = len(handler.backend.tokenizer.encode(short_prompt))
    arrivals = {0: [(long_prompt, 6)], 1: [(short_prompt, 48 - prompt_tokens)]}
    got = run_rolling(handler, arrivals)
    assert got[1] == reference(tiny_arch(arch), short_prompt, 48 - prompt_tokens)
    assert got[0] == reference(tiny_arch(arch), long_prompt, 6)


def test_prompt_beyond_n_positions_is_a_400(neuronx_standin, tiny_arch):
    from lmi_tools.serving.worker.frontend import request_input
    from .neuronx_support import JSON, body

    handler = load(tiny_arch("llama"), n_positions=16)
    assert handler.backend.max_sequence_length == 16
    out = handler.handle(request_input(JSON, body("word " * 40, 4)))
    assert out.code == 400 and "inputs" in bytes(out.content.value_at(0)).decode()
    out = handler.handle(request_input(JSON, body("Hello world", 15)))
    assert out.code == 400 and "max_new_tokens" in bytes(out.content.value_at(0)).decode()


def test_auto_backend_is_neuronx_when_the_library_imports(neuronx_standin, tiny_arch):
    handler = load(tiny_arch("gpt2"), backend="auto")
    assert handler.backend.name == "neuronx"


def test_quantized_bf16_model_is_built_as_configured(neuronx_standin, tiny_arch, monkeypatch):
    monkeypatch.setenv("NEURON_CC_FLAGS", "--logfile /tmp/compile.log")
    handler = load(tiny_arch("llama"), dtype="bf16", load_in_8bit="true", group_query_attention="shard-over-heads",
                   neuron_optimize_level=1, enable_mixed_precision_accumulation="true",
                   rolling_batch="auto", max_rolling_batch_size=2)
    model = handler.backend.model
    assert (model.amp, model.tp_degree, model.batch_sizes, model.n_positions) == ("bf16", 2, [2], 128)
    assert model.neuron_config.quant.dequant_dtype == "bf16"
    assert model.neuron_config.continuous_batching.batch_size_for_shared_caches == 2
    assert model.neuron_config.group_query_attention.value == "shard-over-heads"
    assert model.context_buckets == [128]  # continuous batching: one prefill bucket covering n_positions
    import os

    assert os.environ["NEURON_CC_FLAGS"].split() == ["--logfile", "/tmp/compile.log", "-O1",
                                                     "--enable-mixed-precision-accumulation"]
    assert len(run_rolling(handler, {0: [(PROMPTS[0], 4)]})[0]) == 4


def test_tp_degree_max_takes_the_visible_cores(neuronx_standin, tiny_arch, monkeypatch):
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "4-7")
    handler = load(tiny_arch("bloom"), tensor_parallel_degree="max")
    assert handler.backend.model.tp_degree == 4


def test_tp_beyond_the_visible_cores_fails_at_load(neuronx_standin, tiny_arch, monkeypatch):
    from lmi_handlers.handler import Handler
    from lmi_tools.serving.worker.frontend import init_input

    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "0-1")
    handler = Handler()
    out = handler.handle(init_input({"model_id": str(tiny_arch("opt")), "backend": "neuronx",
                                     "tensor_parallel_degree": "4", "n_positions": "64"}))
    message = bytes(out.content.value_at(0)).decode()
    assert out.code >= 400 and "model failed to load" in message and "tp_degree=4" in message


def test_library_refusal_names_the_class_and_arguments(neuronx_standin, tiny_arch):
    """BLOOM (alibi) has no position limit we check; the library refuses an unknown argument itself."""
    from lmi_handlers.backends.neuronx.backend import load_model
    from lmi_handlers.backends.neuronx.options import CompileSettings
    from lmi_handlers.errors import BackendError

    settings = CompileSettings(model_type="bloom", model_class="OPTForSampling", batch_size=1, tp_degree=2,
                               amp="f32", n_positions=64, context_length_estimate=None, continuous_batching=False,
                               unroll=None, neuron_config={}, compiler_flags=(), model_shape={})
    with pytest.raises(BackendError, match=r"refused OPTForSampling\(batch_size=1.*cannot run a 'bloom' model"):
        load_model(str(tiny_arch("bloom")), settings, None)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_failed_step_fails_its_requests_then_serving_goes_on(neuronx_standin, tiny_arch, reference, arch,
                                                                monkeypatch):
    handler = load(tiny_arch(arch), rolling_batch="auto", max_rolling_batch_size=2)
    model = handler.backend.model
    real_forward = model.forward
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("NRT error: execution failed")
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", flaky)
    with pytest.raises(AssertionError, match="NRT error"):
        run_rolling(handler, {0: [(PROMPTS[0], 6)]})
    assert run_rolling(handler, {0: [(PROMPTS[1], 4), (PROMPTS[2], 5)]}) == [
        reference(tiny_arch(arch), PROMPTS[1], 4), reference(tiny_arch(arch), PROMPTS[2], 5)]


def test_without_transformers_neuronx_the_backend_says_so_before_any_download():
    import importlib.util

    from lmi_handlers.deployment import resolve
    from lmi_handlers.errors import ConfigError

    assert importlib.util.find_spec("transformers_neuronx") is None  # no stand-in on the path in this test
    with pytest.raises(ConfigError, match="needs transformers-neuronx.*option.backend=hf"):
        resolve({"backend": "neuronx", "model_id": "meta-llama/Meta-Llama-3-8B", "model_dir": "/nowhere"})
