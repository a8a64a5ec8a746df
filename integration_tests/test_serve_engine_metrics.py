"""The engine's counters reach ``lmi serve``'s ``/metrics``: the handler sends them with each rolling-batch step
(``lmi_engine_stats``) and the server exports them per model."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

SYSTEM = "You are a careful assistant who answers in one short sentence and never guesses. " * 4


def _samples(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.labels.get("model") == "tiny"}


def test_prefix_cache_hits_show_in_metrics(serve, tiny_model_dir):
    model = serve.model_dir("tiny", {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint",
                                     "option.model_id": str(tiny_model_dir), "option.rolling_batch": "auto",
                                     "option.enable_prefix_caching": "true", "option.block_size": "16"})
    server = serve([model])
    for question in ("What is the capital of France?", "How many legs has a spider?"):
        response = httpx.post(server.url + "/invocations", timeout=60,
                              json={"inputs": SYSTEM + question, "parameters": {"max_new_tokens": 4}})
        assert response.status_code == 200, response.text
    metrics = _samples(server.url)
    # The second prompt shares at least two full blocks of the first one's tokens.
    assert metrics["lmi_prefix_cache_hits_total"] >= 32
    assert metrics["lmi_prefix_cache_queries_total"] > metrics["lmi_prefix_cache_hits_total"]
    assert 0 < metrics["lmi_prefix_cache_hit_rate"] < 1
    assert metrics["lmi_kv_cache_blocks_capacity"] == metrics["lmi_kv_cache_blocks_used"] + \
        metrics["lmi_kv_cache_blocks_free"]
    assert metrics["lmi_kv_cache_blocks_used"] == 0  # both answered: their blocks are back (cached or free)
    assert metrics["lmi_preemptions_total"] == 0
    assert metrics["lmi_waiting_sequences"] == 0
