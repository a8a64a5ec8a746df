"""LoRA adapters without a model: options, adapter_config.json checks, which adapter a request names, the
registry's limits, one wrapped linear layer's products for a batch of several adapters, and the mapping onto vLLM's
engine arguments and ``LoRARequest`` (the latter where vLLM imports)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from lmi_handlers.adapters import Adapter, Adapters, AdapterSpec, LoraOptions, read_adapter, requested_adapters
from lmi_handlers.backends.vllm.adapters import vllm_engine_args, vllm_lora_request
from lmi_handlers.errors import AdapterNotFound, ConfigError, InvalidRequest
from lmi_handlers.protocol import Input, PairList


def safetensors(tensors):
    """A safetensors file's bytes: ``tensors`` maps names to shapes, their data zeros in F32."""
    header, offset = {}, 0
    for key, shape in tensors.items():
        size = 4 * shape[0] * shape[1]
        header[key] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def folder(tmp_path, name="a1", **config):
    path = tmp_path / name
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16,
                                                          "target_modules": ["q_proj", "v_proj"], **config}))
    (path / "adapter_model.safetensors").write_bytes(safetensors({
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": (8, 64),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": (64, 8)}))
    return str(path)


def test_options_parse_with_djls_names_and_defaults():
    assert LoraOptions.from_properties({}) == LoraOptions(False, 4, 16, None)
    options = LoraOptions.from_properties({"enable_lora": "true", "max_loras": "2", "max_lora_rank": "64",
                                           "max_cpu_loras": "8"})
    assert options == LoraOptions(True, 2, 64, 8)
    with pytest.raises(ConfigError, match="option.max_cpu_loras=1.*at least option.max_loras"):
        LoraOptions.from_properties({"max_loras": "2", "max_cpu_loras": "1"})
    with pytest.raises(ConfigError, match="option.max_lora_rank"):
        LoraOptions.from_properties({"max_lora_rank": "zero"})


def test_adapter_config_is_read_and_checked_naming_the_adapter(tmp_path):
    spec = read_adapter("a1", folder(tmp_path), LoraOptions(True))
    assert (spec.rank, spec.alpha, spec.targets, spec.scaling) == (8, 16.0, ("q_proj", "v_proj"), 2.0)
    rs = read_adapter("rs", folder(tmp_path, "rs", use_rslora=True), LoraOptions(True))
    assert rs.scaling == pytest.approx(16 / 8 ** 0.5)
    with pytest.raises(InvalidRequest, match="adapter big .*rank 32 exceeds option.max_lora_rank=16"):
        read_adapter("big", folder(tmp_path, "big", r=32), LoraOptions(True))
    with pytest.raises(InvalidRequest, match="adapter dora .*use_dora"):
        read_adapter("dora", folder(tmp_path, "dora", use_dora=True), LoraOptions(True))
    with pytest.raises(InvalidRequest, match="adapter ia3 .*peft_type IA3"):
        read_adapter("ia3", folder(tmp_path, "ia3", peft_type="IA3"), LoraOptions(True))
    with pytest.raises(InvalidRequest, match="adapter gone: not a local directory"):
        read_adapter("gone", str(tmp_path / "missing"), LoraOptions(True))


def _with(src, name, content):
    (Path(src) / name).write_bytes(content)
    return src


@pytest.mark.parametrize("change, message", [
    (lambda d: _with(d, "adapter_config.json", b"[1, 2]"), "adapter_config.json is a JSON list; expected an object"),
    (lambda d: _with(d, "adapter_config.json", b'{"r": 8,'), "adapter_config.json is not valid JSON"),
    (lambda d: _with(d, "adapter_config.json", b"\xff\xfe{}"), "adapter_config.json is not valid JSON"),
    (lambda d: _with(d, "adapter_config.json", json.dumps({"r": 8, "target_modules": 5}).encode()),
     "target_modules=5"),
    (lambda d: _with(d, "adapter_config.json", json.dumps({"r": 8, "lora_alpha": "x", "target_modules": ["q"]})
                     .encode()), "lora_alpha='x'"),
    (lambda d: _with(d, "adapter_model.safetensors", b"\x00" * 4), "adapter_model.safetensors is not a safetensors "
                                                                    "file: 4 bytes"),
    (lambda d: _with(d, "adapter_model.safetensors", struct.pack("<Q", 2**60) + b"{}"), "header claims"),
    (lambda d: _with(d, "adapter_model.safetensors", struct.pack("<Q", 4) + b"[1] "), "header is a JSON list"),
    (lambda d: _with(d, "adapter_model.safetensors", struct.pack("<Q", 3) + b"{x}"), "header is not JSON"),
    # a truncated download: the header promises more data than the file holds
    (lambda d: _with(d, "adapter_model.safetensors", safetensors({"a.lora_A.weight": (8, 64)})[:-1]),
     "'a.lora_A.weight' has no valid dtype, shape and data_offsets within the file's 2,047 bytes"),
])
def test_malformed_and_garbage_adapter_files_are_400s_naming_the_adapter_and_the_file(tmp_path, change, message):
    src = change(folder(tmp_path, "bad"))
    with pytest.raises(InvalidRequest) as caught:
        read_adapter("bad", src, LoraOptions(True))
    assert caught.value.status == 400 and caught.value.field == "src"
    assert str(caught.value).startswith(f"adapter bad ({src}): ") and message in str(caught.value)


def test_a_nul_byte_and_a_garbage_bin_file_are_refused_by_name(tmp_path):
    with pytest.raises(InvalidRequest, match="src: adapter evil: a path may not hold a NUL byte"):
        read_adapter("evil", str(tmp_path) + "\x00/x", LoraOptions(True))
    src = folder(tmp_path, "bin")
    (tmp_path / "bin" / "adapter_model.safetensors").unlink()
    with pytest.raises(InvalidRequest, match=r"adapter bin \(.*\): no adapter_model.safetensors or adapter_model.bin"):
        read_adapter("bin", src, LoraOptions(True))
    (tmp_path / "bin" / "adapter_model.bin").write_bytes(b"garbage")
    with pytest.raises(InvalidRequest, match="adapter_model.bin is not a file torch.save wrote"):
        read_adapter("bin", src, LoraOptions(True))
    (tmp_path / "bin" / "adapter_model.bin").write_bytes(b"PK\x03\x04")  # torch.save's zip: loaded (and checked)
    assert read_adapter("bin", src, LoraOptions(True)).rank == 8          # by the backend


def item(body, query=(), headers=None):
    content = PairList()
    for key, value in query:
        content.add(key, value.encode())
    content.add("data", json.dumps(body).encode())
    return Input(headers or {}, content)


def test_a_request_names_adapters_in_djls_order_and_the_callers_body_is_untouched():
    body = {"inputs": ["x", "y"], "adapters": ["a1", ""]}
    data, named = requested_adapters(item(body), body)
    assert named == ["a1", ""] and "adapters" not in data and body["adapters"] == ["a1", ""]
    assert requested_adapters(item(body, [("adapter", "q")]), body)[1] == "q"
    headers = {"x-amzn-sagemaker-adapter-identifier": "h"}
    assert requested_adapters(item(body, [("adapter", "q")], headers), body)[1] == "h"
    assert requested_adapters(item({"inputs": "x"}), {"inputs": "x"})[1] is None


def registry(options=LoraOptions(True, max_loras=1, max_cpu_loras=2)):
    return Adapters(options, load=lambda spec: spec.name)


def test_the_registry_resolves_names_and_refuses_unknown_ones_with_a_404_listing_the_others(tmp_path):
    adapters = registry()
    adapters.register("a1", folder(tmp_path))
    assert [a.name if a else None for a in adapters.for_inputs(["a1", ""], 2)] == ["a1", None]
    assert [a.name for a in adapters.for_inputs("a1", 3)] == ["a1"] * 3
    with pytest.raises(AdapterNotFound, match="'nope' is not registered.*registered adapters: a1") as info:
        adapters.for_inputs("nope", 1)
    assert info.value.status == 404
    with pytest.raises(InvalidRequest, match="adapters: expected one adapter name per input: 2 inputs, 1 names"):
        adapters.for_inputs(["a1"], 2)
    with pytest.raises(InvalidRequest, match="adapters: expected an adapter name"):
        adapters.for_inputs([1], 1)


def test_registration_limits_and_lifecycle(tmp_path):
    adapters = registry()
    first = adapters.register("a1", folder(tmp_path), {"pin": "true"})
    with pytest.raises(InvalidRequest, match="adapter a1 is already registered"):
        adapters.register("a1", folder(tmp_path, "again"))
    adapters.register("a2", folder(tmp_path, "a2"))
    with pytest.raises(InvalidRequest, match="adapter a3: 2 adapters are registered, option.max_cpu_loras=2"):
        adapters.register("a3", folder(tmp_path, "a3"))
    assert adapters.update("a1", {"pin": "false"}).options == {"pin": "false"}
    assert adapters.unregister("a1") is first
    again = adapters.register("a1", str(tmp_path / "a1"))
    assert again.uid != first.uid  # never the old registration's prefix blocks or vLLM cache entry
    with pytest.raises(InvalidRequest, match="option.enable_lora=true"):
        Adapters(LoraOptions(), load=None).register("a1", folder(tmp_path, "x"))


def test_the_scheduler_keeps_max_loras_distinct_adapters_in_a_batch():
    from collections import deque

    from lmi_handlers.request import GenerationRequest, SamplingParams, Schema, StoppingParams
    from lmi_handlers.scheduler import Scheduler
    from lmi_handlers.sequence import SequenceState

    class Backend:
        max_batch_size, kv = 8, None

    spec = AdapterSpec("a", "/a", 8, 16.0, ("q_proj",))
    one, two = Adapter(spec, None), Adapter(spec, None)
    request = GenerationRequest(Schema.LMI, "x", SamplingParams(), StoppingParams(4))
    seqs = [SequenceState(request, [1, 2], decode=str) for _ in range(4)]
    for seq, adapter in zip(seqs, [one, None, two, one]):
        seq.adapter = adapter
    scheduler = Scheduler(Backend())
    scheduler.max_adapters = 1
    waiting, running = deque(seqs), []
    scheduler.schedule(waiting, running)
    assert running == seqs[:2] and list(waiting) == seqs[2:]  # "two" waits for "one" to leave, in arrival order


def test_options_map_onto_vllms_engine_arguments():
    assert vllm_engine_args(LoraOptions()) == {}
    assert vllm_engine_args(LoraOptions(True, max_loras=2, max_lora_rank=12)) == {
        "enable_lora": True, "max_loras": 2, "max_lora_rank": 16, "max_cpu_loras": 2}
    assert vllm_engine_args(LoraOptions(True, 4, 64, 10))["max_cpu_loras"] == 10
    with pytest.raises(ConfigError, match="option.max_lora_rank=1024"):
        vllm_engine_args(LoraOptions(True, max_lora_rank=1024))


def test_an_adapter_maps_onto_vllms_lora_request():
    lora = pytest.importorskip("vllm.lora.request", reason="vLLM's own LoRARequest (its environment only)")
    adapter = Adapter(AdapterSpec("a1", "/opt/ml/model/adapters/a1", 8, 16.0, ("q_proj",)), None)
    request = vllm_lora_request(adapter)
    assert isinstance(request, lora.LoRARequest)
    assert (request.lora_name, request.lora_int_id, request.lora_path) == ("a1", adapter.uid, adapter.spec.src)
    assert vllm_lora_request(None) is None


def test_one_layer_applies_each_tokens_own_adapter_in_a_batch_of_several():
    """Runs of tokens with two adapters, one that does not adapt this layer, and the base model, in one product:
    each run equals its adapter applied alone (peft's ``base(x) + B(A(x)) * scaling``), base tokens stay exact."""
    torch = pytest.importorskip("torch")
    from lmi_handlers.backends.hf.lora import LoraRows, LoraWeights, _linear_class

    torch.manual_seed(0)
    base = torch.nn.Linear(8, 6)
    rows = LoraRows(torch, "cpu", torch.float32)
    layer = _linear_class(torch)(base, "proj", rows)

    def adapter(rank, scaling, adapts=True):
        weights = LoraWeights(rank=rank, scaling=scaling)
        if adapts:
            weights.modules["proj"] = (torch.randn(rank, 8), torch.randn(6, rank), scaling)
        return Adapter(AdapterSpec(f"r{rank}", "/src", rank, 1.0, ("proj",)), weights)

    def alone(one, x):
        if one is None or "proj" not in one.weights.modules:
            return base(x)
        a, b, scaling = one.weights.modules["proj"]
        return base(x) + torch.nn.functional.linear(torch.nn.functional.linear(x, a), b) * scaling

    first, second, elsewhere = adapter(4, 2.0), adapter(2, 0.5), adapter(3, 1.0, adapts=False)
    runs, lengths = [first, None, second, first, elsewhere], [2, 1, 3, 2, 1]
    x = torch.randn(1, sum(lengths), 8)
    with rows.select(runs, lengths):
        got = layer(x)
    starts = [sum(lengths[:i]) for i in range(len(runs))]
    for one, start, length in zip(runs, starts, lengths):
        if one is None or one is elsewhere:  # the base layer's own output for these tokens, plus an exact zero
            assert torch.equal(got[:, start:start + length], base(x)[:, start:start + length])
        else:
            torch.testing.assert_close(got[:, start:start + length], alone(one, x[:, start:start + length]))
    with rows.select([second, second], [4, 5]):
        assert torch.equal(layer(x), alone(second, x))
    assert torch.equal(layer(x), base(x))  # outside a selection: the base layer alone
