"""vLLM's gauges from our engine (issue 47): the numbers ``Engine.stats()`` gives gateways and the ``[METRICS]`` lines
DJLServing's front end parses (with DJL's own pattern, ``Metric.parse``). How ``lmi serve`` names and labels them:
``tests/serving/test_gateway_metrics.py``."""

import io
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
