"""Fixtures shared by tests/ and integration_tests/: tiny models built locally, model directories."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama with random weights and a tokenizer trained here, saved with save_pretrained."""
    pytest.importorskip("torch")
    from lmi_tools.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a model directory: converted by ``lmi model smollm2`` into its cache ($LMI_CACHE,
    else ~/.cache/lmi) on first use, then reused by every session and checkout. The transformers 4.43.4
    environment has no GGUF reader: it reads what the main environment converted."""
    pytest.importorskip("torch")
    from lmi_tools.errors import ToolError
    from lmi_tools.models import gguf, smollm2

    out = smollm2.default_dir()
    try:
        return smollm2.convert_smollm2(out, say=lambda line: None)
    except ToolError as exc:
        if gguf.converted_from(out):
            return out
        pytest.fail(f"{exc} ({exc.hint}); or run `lmi model smollm2` from the main environment first")


@pytest.fixture(scope="session")
def make_lora():
    """``make_lora(base_dir, out, target_modules, seed, rank=8)``: a peft LoRA adapter for ``base_dir`` with random,
    non-zero factors (peft starts B at zero: an adapter that changes nothing would prove nothing), saved to
    ``out``; returns its path as a string."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft", reason="peft makes the test adapters")
    import torch.distributed.tensor  # noqa: F401 - peft reads it unimported; transformers 5 imports it, 4.43.4 not
    import transformers

    def make(base_dir, out, targets, seed, rank=8):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
        model = peft.get_peft_model(model, peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets),
                                                           init_lora_weights=False))
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.1)
        model.save_pretrained(out)
        return str(out)

    return make


@pytest.fixture(scope="session")
def thinking_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model as a reasoning model: ``<think>`` and ``</think>`` added to its vocabulary, a chat template
    that opens the reasoning in the prompt (as DeepSeek-R1's does), and weights set so that ``</think>`` is by far
    the likeliest next token whatever came before (greedy: it ends the reasoning at once; sampled: after a few
    random tokens), so that answers reach the part after the reasoning within a few tokens."""
    torch = pytest.importorskip("torch")
    from tokenizers import AddedToken
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmi_tools.models.tiny import CHAT_TEMPLATE, build_tiny_model

    out = build_tiny_model(tmp_path_factory.mktemp("thinking-model"))
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in ("<think>", "</think>")])
    tokenizer.chat_template = CHAT_TEMPLATE.replace("<|assistant|>{% endif %}", "<|assistant|><think>\n{% endif %}")
    model = AutoModelForCausalLM.from_pretrained(out)
    model.resize_token_embeddings(len(tokenizer))
    end = tokenizer.convert_tokens_to_ids("</think>")
    with torch.no_grad():
        # A large constant in one hidden dimension survives every layer and the final norm (about sqrt(hidden) after
        # it); only </think>'s output row reads that dimension, so its logit is about 6 above every other's.
        model.get_input_embeddings().weight[:, 0] = 100.0
        head = model.get_output_embeddings().weight
        head[:, 0] = 0.0
        head[end, 0] = 6.0 / model.config.hidden_size ** 0.5
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as a model directory: written by ``lmi model minilm`` into lmi's cache on first use."""
    from lmi_tools.errors import ToolError
    from lmi_tools.models import minilm

    try:
        return minilm.write_minilm(minilm.default_dir(), say=lambda line: None)
    except ToolError as exc:
        if (minilm.default_dir() / "model.safetensors").is_file():
            return minilm.default_dir()
        pytest.fail(f"{exc} ({exc.hint})")
