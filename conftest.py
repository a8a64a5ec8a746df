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
