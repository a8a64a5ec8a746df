"""How ``lmi serve``'s ``/metrics`` names and labels an engine's counters under vLLM's names (issue 47)."""

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lmi_tools.serving.metrics import _gateway
from lmi_tools.serving.worker.frontend import RollingBatchLoop


def test_lmi_serve_labels_them_as_vllm_does():
    loop = RollingBatchLoop()
    loop._read_stats('{"running": 2, "waiting": 1, "kv_cache_usage": 0.25, "max_lora": 4, "running_lora_adapters": '
                     '"a,b", "waiting_lora_adapters": "", "kv_block_size": 16, "kv_blocks_total": 64, '
                     '"prefix_cache_prompt_tokens": 100, "prefix_cache_hit_tokens": 40}')
    model = SimpleNamespace(rolling_batch=loop, channel=None, settings=SimpleNamespace(rolling=True), in_flight=0,
                            jobs=SimpleNamespace(qsize=lambda: 3))
    class Collector:
        def collect(self):
            return _gateway([("tiny", model)])

    registry = CollectorRegistry()
    registry.register(Collector())
    samples = {s.name: s for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples}
    assert samples["vllm:num_requests_waiting"].value == 4  # the engine's one and the job queue's three
    assert samples["vllm:num_requests_running"].labels == {"model_name": "tiny", "engine": "0"}
    assert samples["vllm:kv_cache_usage_perc"].value == 0.25
    assert samples["vllm:prefix_cache_hits_total"].value == 40
    lora = samples["vllm:lora_requests_info"]
    assert lora.labels == {"model_name": "tiny", "max_lora": "4", "running_lora_adapters": "a,b",
                           "waiting_lora_adapters": ""} and lora.value == loop.engine_stats_at
    assert samples["vllm:cache_config_info"].labels["num_gpu_blocks"] == "64"
