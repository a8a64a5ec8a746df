"""The handler under DJL's async engine (``option.async_mode=true``), driven the way each engine calls it: ours
(``lmi_tools/serving/worker/async_engine.py``) and, where ``djl_python`` is installed, DJL's own
``PythonAsyncEngine.invoke_handler`` (its source, without its sockets). Many requests in flight at once, on the
scripted backend; greedy answers against transformers' ``generate`` on the hf backend and the neuronx stand-in."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import queue
import time
from types import SimpleNamespace

import pytest

from lmi_handlers.handler import Handler
from lmi_handlers.protocol import Input
from lmi_tools.serving.worker.async_engine import invoke
from lmi_tools.serving.worker.codec import binary_decode
from lmi_tools.serving.worker.frontend import init_input, request_input

HAS_DJL = importlib.util.find_spec("djl_python") is not None
ENGINES = ["ours", pytest.param("djl", marks=pytest.mark.skipif(not HAS_DJL, reason="djl_python is not installed"))]
JSON = [("Content-Type", "application/json")]
SCRIPTED = {"backend": "scripted", "max_new_tokens": "6", "async_mode": "true", "model_dir": "/tmp"}


def module_of(handler: Handler) -> SimpleNamespace:
    """What DJL's service loader finds in ``lmi_handlers.entrypoint``, bound to ``handler``; ``run`` runs a coroutine
    on the module's one event loop (DJL's engine has one for the worker's life)."""
    loop = asyncio.new_event_loop()
    return SimpleNamespace(handle=handler.handle, handler=handler, run=loop.run_until_complete,
                           **{f"{action}_adapter": (lambda action: lambda inputs: handler.manage_adapter(
                               inputs, action))(action) for action in ("register", "update", "unregister")})


async def call(engine: str, module: SimpleNamespace, inputs: Input, function: str = "handle") -> list:
    """Every Output the engine sends for ``inputs``, in order."""
    inputs.properties.setdefault("handler", function)
    inputs.function_name = function
    if engine == "ours":
        answers: queue.SimpleQueue = queue.SimpleQueue()
        await invoke(module, inputs, answers)
        return [answers.get() for _ in range(answers.qsize())]
    from djl_python.python_async_engine import PythonAsyncEngine
    from djl_python.service_loader import ModelService

    djl = PythonAsyncEngine.__new__(PythonAsyncEngine)  # its request path, without the sockets of its __init__
    djl.service, djl.output_queue = ModelService(module, "/tmp"), asyncio.Queue()
    await djl.invoke_handler(function, inputs)
    return [djl.output_queue.get_nowait() for _ in range(djl.output_queue.qsize())]


def items(outputs: list) -> list[dict[str, str]]:
    return [binary_decode(bytes(out.content.value_at(0))) for out in outputs]


def text(outputs: list) -> str:
    return "".join(item["data"] for item in items(outputs))


async def settled(module: SimpleNamespace) -> dict:
    """The engine's counters once nothing runs (a cancellation reaches the engine's thread a moment later)."""
    for _ in range(200):
        stats = module.handler._async.engine.stats()
        if stats["running"] == 0 and stats.get("waiting", 0) == 0:
            break
        await asyncio.sleep(0.01)
    return stats


def request(payload: dict, tracking_id: str, headers=JSON) -> Input:
    inputs = request_input(headers, json.dumps(payload).encode())
    inputs.properties["request_tracking_id"] = tracking_id
    return inputs


def loaded(engine: str, **options) -> SimpleNamespace:
    module = module_of(Handler())
    [init] = module.run(call(engine, module, init_input({**SCRIPTED, **options})))
    assert init.code == 204, str(init)  # None: DJL's "No content"
    return module


def sync_answer(payload: dict, headers=JSON, **options) -> str:
    """The same request in DJL's sync mode (its whole body, or its stream's chunks joined)."""
    handler = Handler()
    assert handler.handle(init_input({**SCRIPTED, "async_mode": "false", **options})) is None
    out = handler.handle(request_input(headers, json.dumps(payload).encode()))
    return "".join(out.stream_content) if out.stream_content is not None else bytes(out.content.value_at(0)).decode()


FORMATS = {  # name: (payload, headers, options)
    "lmi json": ({"inputs": "x", "parameters": {"details": True}}, JSON, {}),
    "jsonlines": ({"inputs": "x", "stream": True}, JSON, {}),
    "sse": ({"inputs": "x", "stream": True}, JSON + [("Accept", "text/event-stream")], {}),
    "chat": ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "logprobs": True}, JSON, {}),
    "chat stream": ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}, JSON, {}),
    "tgi": ({"inputs": "x", "parameters": {"details": True}}, JSON, {"tgi_compat": "true"}),
    "tgi stream": ({"inputs": "x", "stream": True}, JSON, {"tgi_compat": "true"}),
}


def _stable(text: str) -> str:
    """Chat answers carry an id and a time of their own."""
    import re

    return re.sub(r'"(id|created)":("[^"]*"|\d+)', r'"\1":_', text)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", list(FORMATS))
def test_each_format_is_the_sync_text_in_async_utils_bytes(engine, name):
    payload, headers, options = FORMATS[name]
    module = loaded(engine, **options)
    outputs = module.run(call(engine, module, request(payload, "t1", headers)))
    streamed = payload.get("stream", False)
    assert all(out.get_property("request_tracking_id") == "t1" and out.code == 200 for out in outputs)
    assert [item["last"] for item in items(outputs)] == ["False"] * (len(outputs) - 1) + ["True"]
    # A stream's pieces keep their own line endings; a whole answer gains one, as every LMI async answer does.
    assert _stable(text(outputs)) == _stable(sync_answer(payload, headers, **options) + ("" if streamed else "\n"))
    if HAS_DJL:  # the very bytes DJL's helpers write for the same text
        from djl_python import async_utils

        for out, item in zip(outputs, items(outputs)):
            data, last = item["data"][:-1], item["last"] == "True"
            made = async_utils.create_stream_chunk_output(data, last) if streamed else \
                async_utils.create_non_stream_output(data)
            assert bytes(out.content.value_at(0)) == bytes(made.content.value_at(0))


async def _many(engine: str, module: SimpleNamespace, payloads: list[dict]) -> list[list]:
    return await asyncio.gather(*[call(engine, module, request(p, str(i))) for i, p in enumerate(payloads)])


@pytest.mark.parametrize("engine", ENGINES)
def test_requests_in_flight_together_share_steps_and_a_bad_one_fails_alone(engine):
    module = loaded(engine, scripted_step_delay_ms="5")
    steps = []
    backend = module.handler.backend
    original = backend.step
    backend.step = lambda batch: steps.append(len(batch)) or original(batch)
    good = [{"inputs": "x", "parameters": {"max_new_tokens": 1 + i % 6}} for i in range(16)]
    bad = [{"inputs": ""}, {"inputs": "x", "parameters": {"max_new_tokens": -1}}]
    answers = module.run(_many(engine, module, good + bad))
    for payload, outputs in zip(good, answers):
        assert json.loads(text(outputs)) == {"generated_text": " The quick"[:payload["parameters"]["max_new_tokens"]]}
    for outputs in answers[16:]:
        [item] = items(outputs)
        assert item["code"] == "400" and item["last"] == "True" and item["data"] == "\n"
    assert max(steps) > 8 and len(steps) < 16  # concurrent requests joined the same steps


@pytest.mark.parametrize("engine", ENGINES)
def test_a_cancelled_request_ends_in_the_engine_with_a_499(engine):
    module = loaded(engine, scripted_step_delay_ms="20")

    async def scenario():
        stream = asyncio.ensure_future(call(engine, module, request(
            {"inputs": "x", "stream": True, "parameters": {"max_new_tokens": 500}}, "long")))
        await asyncio.sleep(0.3)
        cancel = Input({"lmi_cancel": "long", "request_tracking_id": "c1"})
        [answer] = await call(engine, module, cancel)
        return await stream, answer, await settled(module)

    outputs, answer, stats = module.run(scenario())
    assert answer.code == 204  # the cancel call itself answers nothing
    last = items(outputs)[-1]
    assert last["code"] == "499" and last["last"] == "True" and len(outputs) < 100
    assert stats["running"] == 0


def test_leaving_a_stream_early_stops_its_sequence():
    module = loaded("ours", scripted_step_delay_ms="10")

    async def scenario():
        stream = await module.handle(request({"inputs": "x", "stream": True, "parameters": {"max_new_tokens": 500}},
                                             "s"))
        await stream.__anext__()
        await stream.aclose()  # what happens to the generator when its consumer is cancelled
        return await settled(module)

    assert module.run(scenario())["running"] == 0


def test_the_event_loop_runs_while_the_engine_steps():
    module = loaded("ours", scripted_step_delay_ms="100")

    async def scenario():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.ensure_future(ticker())
        started = time.monotonic()
        await call("ours", module, request({"inputs": "x", "parameters": {"max_new_tokens": 5}}, "1"))
        elapsed = time.monotonic() - started
        task.cancel()
        return ticks, elapsed

    ticks, elapsed = module.run(scenario())
    assert elapsed >= 0.5 and ticks >= elapsed / 0.01 / 4  # the loop kept ticking through five 100 ms steps


@pytest.mark.parametrize("engine", ENGINES)
def test_adapter_calls_answer_djls_map(engine):
    module = loaded(engine)
    outputs = module.run(call(engine, module, Input({"name": "a1", "src": "/nowhere"}), "register_adapter"))
    [item] = items(outputs)
    assert item["code"] == "400" and "does not serve adapters" in item["error"] and item["last"] == "True"


@pytest.mark.parametrize("engine", ENGINES)
def test_a_load_that_fails_fails_the_init_call(engine):
    module = module_of(Handler())
    [out] = module.run(call(engine, module, init_input({**SCRIPTED, "max_new_tokens": "many"})))
    assert out.code == 400 and "max_new_tokens" in bytes(out.content.value_at(0)).decode()


def test_async_mode_refuses_djls_rolling_batch_beside_it():
    module = module_of(Handler())
    [out] = module.run(call("ours", module, init_input({**SCRIPTED, "rolling_batch": "scheduler"})))
    assert out.code == 400 and "option.rolling_batch=disable" in bytes(out.content.value_at(0)).decode()


# --- greedy answers against transformers, 16 requests in flight ------------------------------------------------


def _token_ids(outputs: list) -> list[int]:
    return [token["id"] for token in json.loads(text(outputs))["details"]["tokens"]]


def test_hf_greedy_answers_equal_generate_with_16_in_flight(tiny_model_dir, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from .test_hf_backend import PROMPTS, STOCK_FP32

    module = module_of(Handler())
    props = {"model_id": str(tiny_model_dir), "model_dir": str(tmp_path), "async_mode": "true",
             "max_rolling_batch_size": "16", **STOCK_FP32}
    module.run(call("ours", module, init_input(props)))
    payloads = [{"inputs": PROMPTS[i % len(PROMPTS)], "parameters": {"max_new_tokens": 4 + i % 5, "details": True}}
                for i in range(16)]
    answers = module.run(_many("ours", module, payloads))
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    for payload, outputs in zip(payloads, answers):
        ids = tokenizer(payload["inputs"], return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=payload["parameters"]["max_new_tokens"])
        assert _token_ids(outputs) == out[0, ids.shape[1]:].tolist()


def test_neuronx_greedy_answers_equal_generate_in_flight_together(neuronx_standin, tiny_arch, reference):
    from .neuronx_support import PROMPTS

    model_dir = tiny_arch("llama")
    module = module_of(Handler())
    props = {"model_id": str(model_dir), "model_dir": str(model_dir), "backend": "neuronx", "dtype": "fp32",
             "tensor_parallel_degree": "2", "n_positions": "128", "async_mode": "true", "max_rolling_batch_size": "3"}
    module.run(call("ours", module, init_input(props)))
    assert module.handler.backend.max_batch_size == 3  # async mode compiles the rolling batch's rows
    payloads = [{"inputs": p, "parameters": {"max_new_tokens": 5, "details": True}} for p in PROMPTS[:3]]
    for payload, outputs in zip(payloads, module.run(_many("ours", module, payloads))):
        assert _token_ids(outputs) == reference(model_dir, payload["inputs"], 5)


def test_hf_adapters_register_between_steps_and_answer_as_in_sync_mode(tiny_model_dir, tmp_path, make_lora):
    from .test_hf_backend import STOCK_FP32

    adapter = make_lora(tiny_model_dir, tmp_path / "a1", ["q_proj", "v_proj"], 1)
    props = {"model_id": str(tiny_model_dir), "model_dir": str(tmp_path), "enable_lora": "true",
             "max_lora_rank": "8", **STOCK_FP32}
    payloads = [{"inputs": "Hello world", "parameters": {"max_new_tokens": 6, "details": True}, **extra}
                for extra in ({}, {"adapters": "a1"})]
    module = module_of(Handler())
    module.run(call("ours", module, init_input({**props, "async_mode": "true"})))
    [registered] = items(module.run(call("ours", module, Input({"name": "a1", "src": adapter}), "register_adapter")))
    assert json.loads(registered["data"]) == {"status": "Adapter a1 registered"} and registered["last"] == "True"
    base, adapted = (_token_ids(outputs) for outputs in module.run(_many("ours", module, payloads)))
    sync = Handler()
    sync.handle(init_input(props))
    assert sync.manage_adapter(Input({"name": "a1", "src": adapter}), "register").code == 200
    expected = [[t["id"] for t in json.loads(bytes(sync.handle(request_input(JSON, json.dumps(p).encode()))
                                                  .content.value_at(0)))["details"]["tokens"]] for p in payloads]
    assert [base, adapted] == expected and base != adapted


def test_a_grammar_failing_mid_stream_ends_only_its_own_stream_in_async_mode(tiny_model_dir, tmp_path, monkeypatch):
    """Issue 43 in async mode: a streamed request whose grammar fails at its third mask ends alone with its own 400,
    one whose grammar is refused at admission gets its 400 before it runs, and the streams in flight beside them
    answer as they do alone, with none of the hostile requests' text."""
    pytest.importorskip("llguidance")
    from .test_hf_backend import STOCK_FP32
    from .test_step_isolation import GOOD, HOSTILE, SECRET, answer, wrap_matchers

    module = module_of(Handler())
    props = {"model_id": str(tiny_model_dir), "model_dir": str(tmp_path), "async_mode": "true", **STOCK_FP32}
    module.run(call("ours", module, init_input(props)))
    good = [GOOD["stream"], {**GOOD["digits"], "stream": True}, GOOD["json"]]
    alone = [text(module.run(_many("ours", module, [payload]))[0]) for payload in good]
    wrap_matchers(module.handler, monkeypatch, compute=3)
    refused = {"inputs": SECRET, "parameters": {"guided_regex": f"({SECRET}{{1000}}){{1000}}"}}
    answers = module.run(_many("ours", module, [*good, {**HOSTILE["mask"], "stream": True}, refused]))
    assert [answer(_stable(text(outputs))) for outputs in answers[:3]] == [answer(_stable(body)) for body in alone]
    assert all(SECRET not in text(outputs) for outputs in answers[:3])
    failed, early = items(answers[3])[-1], items(answers[4])
    assert failed["code"] == "400" and failed["last"] == "True" and "parameters.guided_regex:" in failed["error"]
    assert len(early) == 1 and early[0]["code"] == "400" and "option.max_grammar_chars" in early[0]["error"]
