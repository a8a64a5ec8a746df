"""Fixtures and drivers for the neuronx backend tests (imported by those test modules).

``neuronx_standin`` puts ``tests/handlers/standins`` on ``sys.path`` for one test and forgets the module
afterwards, so no other test sees a ``transformers_neuronx`` (backend auto-detection looks for it).
The drivers send exactly what DJLServing sends (``lmi_tools.serving.worker.frontend``) through ``Handler``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from lmi_handlers.handler import Handler
from lmi_tools.serving.worker.codec import binary_decode
from lmi_tools.serving.worker.frontend import RollingRequest, batch_input, init_input, request_input, rolling_step_input

STANDINS = Path(__file__).parent / "standins"
JSON = [("Content-Type", "application/json")]
PROMPTS = ["Hello world, this is", "The quick brown fox jumps over the lazy dog", "Paris"]


def _forget_standin() -> None:
    for name in list(sys.modules):
        if name == "transformers_neuronx" or name.startswith("transformers_neuronx."):
            del sys.modules[name]


@pytest.fixture
def neuronx_standin(monkeypatch: pytest.MonkeyPatch):
    """The stand-in ``transformers_neuronx`` module, importable for this test only."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.syspath_prepend(str(STANDINS))
    for name in ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", "NEURON_CC_FLAGS"):
        monkeypatch.delenv(name, raising=False)
    _forget_standin()
    import transformers_neuronx

    assert transformers_neuronx.IS_STANDIN
    # The tiny models run many small forwards: extra threads only add overhead, and on a busy
    # 2-core machine they made these tests five times slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield transformers_neuronx
    finally:
        torch.set_num_threads(threads)
        _forget_standin()


@pytest.fixture(scope="session")
def tiny_arch(tmp_path_factory: pytest.TempPathFactory):
    """``tiny_arch(model_type)``: the directory of a tiny random model of that architecture (built once)."""
    pytest.importorskip("torch")
    from lmi_tools.models.tiny import build_tiny_arch

    built: dict[str, Path] = {}

    def get(model_type: str) -> Path:
        if model_type not in built:
            built[model_type] = build_tiny_arch(tmp_path_factory.mktemp(model_type), model_type)
        return built[model_type]

    return get


@pytest.fixture(scope="session")
def reference():
    """``reference(model_dir, prompt, n)``: new token ids of transformers' greedy ``generate``."""
    cache: dict[tuple[str, str, int], list[int]] = {}
    models: dict[str, Any] = {}

    def get(model_dir: Path, prompt: str, max_new_tokens: int) -> list[int]:
        key = (str(model_dir), prompt, max_new_tokens)
        if key not in cache:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            if str(model_dir) not in models:
                models[str(model_dir)] = (AutoTokenizer.from_pretrained(model_dir),
                                          AutoModelForCausalLM.from_pretrained(model_dir).eval())
            tokenizer, model = models[str(model_dir)]
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
            cache[key] = out[0, ids.shape[1]:].tolist()
        return cache[key]

    return get


def load(model_dir: Path, **options: Any) -> Handler:
    """A Handler initialized like DJLServing would, with the neuronx backend on the tiny model."""
    properties = {"model_id": str(model_dir), "model_dir": str(model_dir), "backend": "neuronx", "dtype": "fp32",
                  "tensor_parallel_degree": "2", "n_positions": "128", **{k: str(v) for k, v in options.items()}}
    handler = Handler()
    assert handler.handle(init_input(properties)) is None
    return handler


def body(prompt: str, max_new_tokens: int, **extra: Any) -> bytes:
    return json.dumps({"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens, "details": True},
                       **extra}).encode()


def ask(handler: Handler, prompt: str, max_new_tokens: int) -> list[int]:
    """Token ids of one plain request."""
    out = handler.handle(request_input(JSON, body(prompt, max_new_tokens)))
    assert out.code == 200, bytes(out.content.value_at(0))
    return [t["id"] for t in json.loads(bytes(out.content.value_at(0)))["details"]["tokens"]]


def ask_batch(handler: Handler, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    """Token ids of a dynamic batch, one request per prompt."""
    out = handler.handle(batch_input([request_input(JSON, body(p, max_new_tokens)) for p in prompts]))
    bodies = [json.loads(bytes(out.content.value_at(i))) for i in range(out.content.size())]
    return [[t["id"] for t in b["details"]["tokens"]] for b in bodies]


def ask_stream(handler: Handler, prompt: str, max_new_tokens: int) -> list[int]:
    out = handler.handle(request_input(JSON, body(prompt, max_new_tokens, stream=True)))
    lines = [json.loads(line) for chunk in out.stream_content for line in chunk.splitlines() if line]
    assert "generated_text" in lines[-1]
    return [line["token"]["id"] for line in lines]


def run_rolling(handler: Handler, arrivals: dict[int, list[tuple[str, int]]]) -> list[list[int]]:
    """Drive rolling-batch steps like DJLServing; ``arrivals[step]`` = (prompt, max_new_tokens) pairs
    that join at that step. Returns the token ids of every request, in arrival order."""
    active: list[tuple[int, RollingRequest]] = []
    results: dict[int, list[int]] = {}
    pieces: dict[int, str] = {}  # a JSON answer comes in pieces, one per step, as DJL's json formatter sends it
    order = 0
    for step in range(1000):
        for prompt, max_new in arrivals.get(step, []):
            active.append((order, RollingRequest(request_input(JSON, body(prompt, max_new)), seed=step)))
            order += 1
        if not active and step > max(arrivals):
            break
        out = handler.handle(rolling_step_input([request for _, request in active]))
        assert out.content.size() == len(active)
        still = []
        for i, (index, request) in enumerate(active):
            item = binary_decode(bytes(out.content.value_at(i)))
            request.started = True
            assert "error" not in item, item
            pieces[index] = pieces.get(index, "") + item["data"]
            if item["last"] == "True":
                results[index] = [t["id"] for t in json.loads(pieces[index])["details"]["tokens"]]
            else:
                still.append((index, request))
        active = still
    return [results[i] for i in range(order)]
