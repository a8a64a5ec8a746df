"""vLLM's gauges from our engine (issue 47): the numbers ``Engine.stats()`` gives gateways and the ``[METRICS]`` lines
DJLServing's front end parses (with DJL's own pattern, ``Metric.parse``). How ``lmi serve`` names and labels them:
``tests/serving/test_gateway_metrics.py``."""

import asyncio
import io
import json
import re

from lmi_handlers.adapters import Adapter, AdapterSpec
from lmi_handlers.engine import Engine
from lmi_handlers.gauges import DJL_INTERVAL, DjlMetrics

from .test_kv_events import PagedBackend, request

#: DJL's ``ai.djl.metric.Metric`` pattern: Name.Unit:value|#Dimension:value|timestamp|type.
DJL_METRIC = re.compile(r"\s*([\w\s]+)\.([\w\s]+):([0-9\-,.e]+)(?>\|#([^|]*))?(?>\|(\d+))?(?>\|([cgh]))?")


def adapter(name):
    return Adapter(AdapterSpec(name, f"/adapters/{name}", 8, 16.0, ("q_proj",)), weights=None)


def test_kv_cache_use_and_the_adapters_running_and_waiting():
    backend = PagedBackend(blocks=10)
    backend.max_batch_size = 2
    engine = Engine(backend)
    engine.scheduler.max_adapters = 4
    seqs = [request([1] * 7, 3) for _ in range(3)]
    for seq, name in zip(seqs, ("b", "a", "c")):
        seq.adapter = adapter(name)
        engine.add(seq)
    engine.step()
    stats = engine.stats()
    assert stats["running"] == 2 and stats["waiting"] == 1
    assert stats["kv_cache_usage"] == backend.kv.used / 10 > 0
    assert (stats["max_lora"], stats["running_lora_adapters"], stats["waiting_lora_adapters"]) == (4, "a,b", "c")
    while not engine.idle:
        engine.step()
    assert engine.stats()["kv_cache_usage"] == 0


def test_djl_lines_parse_with_djls_pattern_and_follow_the_engine():
    out, now = io.StringIO(), [100.0]
    metrics = DjlMetrics("my model:1", out, clock=lambda: now[0])
    metrics.publish({"running": 3, "waiting": 2, "kv_cache_usage": 0.5})
    # Java's reader takes what follows "[METRICS]" on a line.
    parsed = [DJL_METRIC.fullmatch(line.split("[METRICS]", 1)[1]).groups() for line in out.getvalue().splitlines()]
    assert [(name, value, dimension, kind) for name, _, value, dimension, _, kind in parsed] == [
        ("vllm_num_requests_running", "3", "Model:my_model_1", "g"),
        ("vllm_num_requests_waiting", "2", "Model:my_model_1", "g"),
        ("vllm_kv_cache_usage_perc", "0.5", "Model:my_model_1", "g")]
    metrics.publish({"running": 4, "waiting": 1, "kv_cache_usage": 0.6})  # within the interval: not yet
    assert len(out.getvalue().splitlines()) == 3
    now[0] += DJL_INTERVAL
    metrics.publish({"running": 4, "waiting": 1, "kv_cache_usage": 0.6})
    metrics.publish({"running": 0, "waiting": 0, "kv_cache_usage": 0})  # idle: at once
    assert len(out.getvalue().splitlines()) == 9 and out.getvalue().endswith("vllm_kv_cache_usage_perc.None:0|#Model:my_model_1|g\n")


def test_in_async_mode_the_gauges_answer_lmi_serves_call_and_go_out_as_djl_lines(monkeypatch):
    """DJL's async mode has no step answers to carry the counters: ``lmi serve`` asks for them with a call, and for
    DJLServing they are printed while requests run, then once the engine is idle."""
    from lmi_handlers import async_service, gauges
    from lmi_handlers.protocol import Input

    from .test_async_mode import call, items, loaded
    from .test_async_mode import request as async_request

    monkeypatch.setattr(gauges, "DJL_INTERVAL", 0.05)
    monkeypatch.setattr(async_service, "DJL_INTERVAL", 0.05)
    module = loaded("ours", scripted_step_delay_ms="20")
    out = module.handler.djl_metrics.out = io.StringIO()  # this handler's lines alone

    async def scenario():
        running = asyncio.ensure_future(call("ours", module, async_request({"inputs": "x", "parameters": {
            "max_new_tokens": 20}}, "r")))
        await asyncio.sleep(0.2)
        during = await call("ours", module, Input({"lmi_engine_stats": "true", "request_tracking_id": "s1"}))
        await running
        await asyncio.sleep(0.2)  # the publisher's last turn
        after = await call("ours", module, Input({"lmi_engine_stats": "true", "request_tracking_id": "s2"}))
        return during, after

    during, after = (json.loads(items(outputs)[0]["data"]) for outputs in module.run(scenario()))
    assert (during["running"], during["kv_cache_usage"]) == (1, round(1 / 32, 4)) and after["running"] == 0
    lines = [line.split("[METRICS]", 1)[1] for line in out.getvalue().splitlines() if "[METRICS]" in line]
    running = [DJL_METRIC.fullmatch(line).group(3) for line in lines if line.startswith("vllm_num_requests_running")]
    assert "1" in running and running[-1] == "0", lines
