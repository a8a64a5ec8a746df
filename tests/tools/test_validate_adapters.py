"""lmi validate on an ``adapters/`` folder: ranks and targets as the runtime reads them, factor shapes against the
model's layers (from the safetensors header), and the adapters' memory; lmi package ships the folder."""

from __future__ import annotations

import json
import struct
import tarfile

from lmi_tools.packaging.package import build
from lmi_tools.validation.validate import validate_model_dir

from .model_shapes import LLAMA_2_7B
from .test_validate import by_check, make_dir

GPU = {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint", "option.rolling_batch": "scheduler",
       "option.enable_lora": "true", "option.dtype": "fp16"}


def adapter(model_dir, name, rank=8, factors=None, **config):
    """An adapter folder: its config and a safetensors file of zeros with these factors' shapes."""
    path = model_dir / "adapters" / name
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                                                          "target_modules": ["q_proj", "v_proj"], **config}))
    factors = factors or {"model.layers.0.self_attn.q_proj": (4096, 4096), "model.layers.0.self_attn.v_proj": (4096, 4096)}
    header, offset = {}, 0
    for module, (width_in, width_out) in factors.items():
        for key, shape in ((f"base_model.model.{module}.lora_A.weight", [rank, width_in]),
                           (f"base_model.model.{module}.lora_B.weight", [width_out, rank])):
            size = shape[0] * shape[1] * 2
            header[key] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
    raw = json.dumps(header).encode()
    (path / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))
    return path


def test_adapters_are_checked_and_their_memory_counted(tmp_path):
    model = make_dir(tmp_path, GPU, instance="g5.2xlarge", config=LLAMA_2_7B, model_py=None)
    adapter(model, "a1")
    adapter(model, "a2", rank=16)
    [finding] = by_check(validate_model_dir(model), "adapters")
    # (8 + 16) ranks x 2 modules x (4096 + 4096) x 2 bytes
    assert finding.level == "ok" and "2 LoRA adapters, 768 KiB in fp16" in finding.message, finding


def test_a_bad_adapter_is_an_error_naming_it(tmp_path):
    model = make_dir(tmp_path, {**GPU, "option.max_lora_rank": "8"}, instance="g5.2xlarge", config=LLAMA_2_7B,
                     model_py=None)
    adapter(model, "big", rank=16)
    adapter(model, "other", factors={"model.layers.0.self_attn.q_proj": (576, 576)})
    adapter(model, "head", factors={"lm_head": (4096, 32000)})
    errors = [f.message for f in by_check(validate_model_dir(model), "adapters") if f.level == "error"]
    assert len(errors) == 3
    assert "adapter big" in errors[0] and "option.max_lora_rank=8" in errors[0]
    assert "adapter head" in errors[1] and "lm_head" in errors[1]
    assert "adapter other" in errors[2] and "another base model" in errors[2]


def test_adapters_without_enable_lora_are_a_warning(tmp_path):
    model = make_dir(tmp_path, {k: v for k, v in GPU.items() if k != "option.enable_lora"}, instance="g5.2xlarge",
                     config=LLAMA_2_7B, model_py=None)
    adapter(model, "a1")
    [finding] = by_check(validate_model_dir(model), "adapters")
    assert finding.level == "warning" and "option.enable_lora is off" in finding.message


def test_package_ships_the_adapters_folder(tmp_path):
    model = make_dir(tmp_path, GPU, instance="g5.2xlarge", config=LLAMA_2_7B, model_py=None)
    adapter(model, "a1")
    build(model, tmp_path / "model.tar.gz", None, validate=False)
    with tarfile.open(tmp_path / "model.tar.gz") as tar:
        names = tar.getnames()
    assert {"adapters/a1/adapter_config.json", "adapters/a1/adapter_model.safetensors"} <= set(names)
