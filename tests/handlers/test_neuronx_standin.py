"""The transformers_neuronx stand-in behaves like the library where our backend depends on it."""

from __future__ import annotations

import pytest



def build(tnx, model_dir, cls="NeuronAutoModelForCausalLM", **kwargs):
    kwargs = {"batch_size": 1, "tp_degree": 2, "amp": "f32", "n_positions": 128, **kwargs}
    return getattr(tnx, cls).from_pretrained(str(model_dir), **kwargs)


def compiled(tnx, model_dir, **kwargs):
    model = build(tnx, model_dir, **kwargs)
    model.to_neuron()
    return model


def prompt_ids(model_dir, text="Hello world, this is"):
    import torch
    from transformers import AutoTokenizer

    return torch.tensor([AutoTokenizer.from_pretrained(model_dir)(text)["input_ids"]])


@pytest.mark.parametrize("arch,cls", [("llama", "LlamaForSampling"), ("mistral", "MistralForSampling"),
                                      ("mixtral", "MixtralForSampling"), ("opt", "OPTForSampling"),
                                      ("gptj", "GPTJForSampling"), ("gpt2", "GPT2ForSamplingWithContextBroadcasting"),
                                      ("gpt_neox", "GPTNeoXForSampling"), ("bloom", "BloomForSampling")])
def test_auto_class_and_greedy_sample_match_generate(neuronx_standin, tiny_arch, reference, arch, cls):
    model = compiled(neuronx_standin, tiny_arch(arch))
    assert type(model).__name__ == cls
    ids = prompt_ids(tiny_arch(arch))
    out = model.sample(ids, sequence_length=ids.shape[1] + 5, top_k=1)
    assert out[0, :ids.shape[1]].tolist() == ids[0].tolist()
    assert out[0, ids.shape[1]:].tolist() == reference(tiny_arch(arch), "Hello world, this is", 5)


@pytest.mark.parametrize("arch,kwargs,error,match", [
    ("bloom", {"low_cpu_mem_usage": True}, KeyError, "Found invalid key"),
    ("opt", {"context_length": 64}, KeyError, "Found invalid key"),
    ("gptj", {"context_length_estimate": 64}, KeyError, "Found invalid key"),
    ("gpt2", {"batch_size": [1, 2]}, AssertionError, "multiple batch sizes"),
    ("opt", {"n_positions": 4096}, ValueError, "cannot be larger than position embedding"),
    ("gptj", {"n_positions": 4096}, ValueError, "cannot be larger than position embedding"),
    ("llama", {"context_length_estimate": 256}, ValueError, "exceeds n_positions"),
    ("llama", {"amp": "fp16"}, KeyError, "amp"),
    ("llama", {"batch_size": "2"}, TypeError, "batch_size"),
    ("gpt_neox", {"unroll": 1}, NotImplementedError, "unroll"),
    ("llama", {"unroll": 3}, ValueError, "does not divide"),
])
def test_constructor_checks(neuronx_standin, tiny_arch, arch, kwargs, error, match):
    with pytest.raises(error, match=match):
        build(neuronx_standin, tiny_arch(arch), **kwargs)


def test_llama_ignores_unknown_keywords_like_the_library(neuronx_standin, tiny_arch):
    assert build(neuronx_standin, tiny_arch("llama"), no_such_option=1).n_positions == 128


def test_neuron_config_checks(neuronx_standin, tiny_arch):
    tnx = neuronx_standin
    with pytest.raises(AssertionError, match="Unexpected NeuronConfig keyword"):
        tnx.NeuronConfig(continuous_batch=True)
    with pytest.raises(ValueError):
        tnx.NeuronConfig(group_query_attention="shard-everything")
    with pytest.raises(NotImplementedError):
        tnx.QuantizationConfig(quant_dtype="f8e4m3fn")
    continuous = tnx.NeuronConfig(continuous_batching=tnx.ContinuousBatchingConfig(batch_size_for_shared_caches=4))
    with pytest.raises(AssertionError, match="batch_size_for_shared_caches"):
        build(tnx, tiny_arch("llama"), batch_size=2, neuron_config=continuous)
    with pytest.raises(NotImplementedError, match="continuous batching"):
        build(tnx, tiny_arch("mixtral"), batch_size=4, neuron_config=continuous)
    with pytest.raises(AssertionError, match="BSH cache layout"):
        build(tnx, tiny_arch("llama"), neuron_config=tnx.NeuronConfig(cache_layout="BSH"))
    with pytest.raises(NotImplementedError, match="quantization"):
        build(tnx, tiny_arch("gptj"), neuron_config=tnx.NeuronConfig(quant=tnx.QuantizationConfig()))


def test_runtime_checks(neuronx_standin, tiny_arch, monkeypatch):
    import torch

    tnx = neuronx_standin
    model = build(tnx, tiny_arch("opt"), batch_size=2)
    with pytest.raises(RuntimeError, match="to_neuron"):
        model.forward(torch.tensor([[1, 2], [1, 2]]))
    model.to_neuron()
    with pytest.raises(ValueError, match="Model not compiled for batch_size : 1"):
        model.forward(torch.tensor([[1, 2]]))
    with pytest.raises(RuntimeError, match="never written"):  # decoding at 5 before positions 0-4 exist
        model.forward(torch.tensor([[3], [3]]), torch.tensor([5], dtype=torch.int32))
    with pytest.raises(ValueError, match="beyond the compiled n_positions=128"):
        model.forward(torch.tensor([[3], [3]]), torch.tensor([128], dtype=torch.int32))
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "0")
    with pytest.raises(RuntimeError, match="tp_degree=2 needs 2 NeuronCores"):
        build(tnx, tiny_arch("opt")).to_neuron()
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES")
    with pytest.raises(ValueError, match="no flexible tensor parallelism"):
        build(tnx, tiny_arch("gptj"), tp_degree=8).to_neuron()
    assert not hasattr(build(tnx, tiny_arch("gptj")), "save")


def test_gptj_attention_ignores_start_ids(neuronx_standin, tiny_arch):
    """transformers-neuronx's GPT-J masks by cache position only, so left padding is attended to."""
    import torch

    ids = prompt_ids(tiny_arch("gptj"))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    gptj = compiled(neuronx_standin, tiny_arch("gptj"))
    with_start = gptj.forward(padded, None, torch.tensor([3]))
    assert torch.equal(with_start, gptj.forward(padded, None, None))
    llama = compiled(neuronx_standin, tiny_arch("llama"))
    masked = llama.forward(padded, None, torch.tensor([3]))
    assert torch.allclose(masked, llama.forward(ids, None, None), atol=1e-4)
    assert not torch.allclose(masked, llama.forward(padded, None, None), atol=1e-4)


def test_continuous_batching_decode_writes_every_slot(neuronx_standin, tiny_arch):
    """Slots left out of a decode call get token 0 written at position 0, as on the device."""
    import torch

    tnx = neuronx_standin
    config = tnx.NeuronConfig(continuous_batching=tnx.ContinuousBatchingConfig(batch_size_for_shared_caches=2))
    model = compiled(tnx, tiny_arch("llama"), batch_size=2, n_positions=[128], context_length_estimate=[128],
                     neuron_config=config)
    ids = prompt_ids(tiny_arch("llama"))
    length = ids.shape[1]
    positions = torch.arange(length, dtype=torch.int32)[None]
    for slot in (0, 1):
        model.forward(ids, positions, torch.tensor([slot]))
    step = torch.tensor([[length]], dtype=torch.int32)
    both = model.forward(torch.tensor([[5], [5]]), torch.cat([step, step]), torch.tensor([0, 1]))
    assert torch.allclose(both[0], both[1])
    model.forward(torch.tensor([[7]]), step + 1, torch.tensor([0]))  # slot 1 left out: its position 0 is clobbered
    again = model.forward(torch.tensor([[7], [7]]), torch.cat([step, step]) + 1, torch.tensor([0, 1]))
    assert not torch.allclose(again[0], again[1])


def test_save_then_load_skips_compilation(neuronx_standin, tiny_arch, tmp_path):
    tnx = neuronx_standin
    first = compiled(tnx, tiny_arch("mistral"), batch_size=2)
    first.save(str(tmp_path / "neff"))
    count = tnx.base.COMPILE_COUNTER["graphs"]
    second = build(tnx, tiny_arch("mistral"), batch_size=2)
    second.load(str(tmp_path / "neff"))
    second.to_neuron()
    assert tnx.base.COMPILE_COUNTER["graphs"] == count
    other = build(tnx, tiny_arch("mistral"), batch_size=4)
    other.load(str(tmp_path / "neff"))
    with pytest.raises(FileNotFoundError, match="no compiled graph"):
        other.to_neuron()
    with pytest.raises(AssertionError, match="not been successfully compiled"):
        build(tnx, tiny_arch("mistral")).save(str(tmp_path / "x"))
