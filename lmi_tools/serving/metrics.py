"""What ``GET /metrics`` reports, in Prometheus' text format (prometheus-client).

Counted as requests pass: requests by model, route and status; time to first token, time between streamed
chunks (one per generation step in rolling batch) and end-to-end latency, from the moment a request was
queued; prompt and generated tokens where an answer states them (the TGI and OpenAI routes, chat answers
with ``usage``). Read from the models when scraped: queue depth, running sequences, readiness and worker
restarts, and the engine's counters as of its latest rolling-batch step, or in DJL's async mode its latest read
(``async_channel.py``) (KV blocks, prefix cache hits and queries in tokens as vLLM counts them, preemptions), where
the handler reports them.

Beside ours, the series gateways and autoscalers read, under vLLM's names, labels and meanings
(``lmi_handlers/gauges.py``): ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` (the engine's queue plus
the model's job queue), ``vllm:kv_cache_usage_perc``, the prefix cache counters, ``vllm:lora_requests_info`` where
LoRA adapters are on, and ``vllm:cache_config_info`` where the engine has a block pool. Labels stay bounded: the
server's own model names, ``engine="0"``, and the adapters of one batch at a time.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from lmi_handlers.gauges import COUNTERS, GAUGES, LORA_INFO, LORA_KEYS

from .dispatcher import Chunk, End, PendingRequest, ServedModel, Start, Status
from .store import ModelStore

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self, store: ModelStore):
        self.registry = CollectorRegistry()
        self.requests = Counter("lmi_requests", "HTTP requests answered, by model, route and status",
                                ["model", "route", "status"], registry=self.registry)
        self.ttft = Histogram("lmi_time_to_first_token_seconds", "From queued to the first streamed chunk",
                              ["model"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.itl = Histogram("lmi_inter_token_latency_seconds", "Between two streamed chunks of one answer",
                             ["model"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("lmi_request_duration_seconds", "From queued to the answer's last byte",
                             ["model"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.prompt_tokens = Counter("lmi_prompt_tokens", "Prompt tokens of answered requests", ["model"],
                                     registry=self.registry)
        self.generated_tokens = Counter("lmi_generated_tokens", "Tokens generated", ["model"],
                                        registry=self.registry)
        self.registry.register(_ModelState(store))

    def watch(self, pending: PendingRequest, model: str) -> None:
        """Time this request's answer as the dispatcher emits it."""
        pending.on_event = _Timer(self, model, pending.enqueued_at)

    def tokens(self, model: str, prompt: int, generated: int) -> None:
        self.prompt_tokens.labels(model).inc(prompt)
        self.generated_tokens.labels(model).inc(generated)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Timer:
    def __init__(self, metrics: Metrics, model: str, queued_at: float):
        self.metrics, self.model, self.queued_at = metrics, model, queued_at
        self.last_chunk: float | None = None

    def __call__(self, event: Start | Chunk | End) -> None:
        now = time.monotonic()
        final = isinstance(event, End) or (isinstance(event, Chunk) and event.final)
        if isinstance(event, Chunk) and not final:  # a streamed piece: a complete answer has no "first token"
            if self.last_chunk is None:
                self.metrics.ttft.labels(self.model).observe(now - self.queued_at)
            else:
                self.metrics.itl.labels(self.model).observe(now - self.last_chunk)
            self.last_chunk = now
        if final:
            self.metrics.e2e.labels(self.model).observe(now - self.queued_at)


# Engine counter (``Engine.stats()`` key) -> (metric, is a counter, help).
ENGINE_METRICS = {
    "waiting": ("lmi_waiting_sequences", False, "Sequences admitted by the handler, waiting for KV blocks or a row"),
    "kv_blocks_total": ("lmi_kv_cache_blocks_capacity", False, "Blocks in the paged KV cache pool"),
    "kv_blocks_used": ("lmi_kv_cache_blocks_used", False, "KV cache blocks held by running sequences"),
    "kv_blocks_free": ("lmi_kv_cache_blocks_free", False, "KV cache blocks free or holding an idle cached prefix"),
    "prefix_cache_hit_tokens": ("lmi_prefix_cache_hits", True, "Prompt tokens found in the prefix cache"),
    "prefix_cache_prompt_tokens": ("lmi_prefix_cache_queries", True, "Prompt tokens looked up in the prefix cache"),
    "prefix_cache_hit_rate": ("lmi_prefix_cache_hit_rate", False, "Prefix cache hits / queries, in tokens"),
    "preemptions": ("lmi_preemptions", True, "Sequences preempted (recomputed later) when the KV pool ran dry"),
    "spec_draft_tokens": ("lmi_spec_decode_draft_tokens", True, "Draft tokens proposed by speculative decoding"),
    "spec_accepted_tokens": ("lmi_spec_decode_accepted_tokens", True, "Draft tokens the target model accepted"),
    "spec_acceptance_rate": ("lmi_spec_decode_acceptance_rate", False, "Accepted / proposed draft tokens"),
}


class _ModelState:
    """Read from the models at scrape time."""

    def __init__(self, store: ModelStore):
        self.store = store

    def collect(self) -> Iterator[Metric]:
        queued = GaugeMetricFamily("lmi_queue_depth", "Requests waiting in the model's job queue", labels=["model"])
        running = GaugeMetricFamily("lmi_running_sequences", "Sequences in the rolling batch", labels=["model"])
        ready = GaugeMetricFamily("lmi_model_ready", "1 when the model answers requests", labels=["model"])
        restarts = CounterMetricFamily("lmi_worker_restarts", "Worker processes restarted after dying or timing "
                                                              "out", labels=["model"])
        for name, model in list(self.store.models.items()):
            queued.add_metric([name], model.jobs.qsize())
            running.add_metric([name], len(model.rolling_batch.active))
            ready.add_metric([name], 1 if model.status is Status.READY else 0)
            restarts.add_metric([name], model.restarts)
        yield from (queued, running, ready, restarts)
        yield from self._engine_counters()
        yield from _gateway(list(self.store.models.items()))

    def _engine_counters(self) -> Iterator[Metric]:
        models = [(name, _engine(model).engine_stats) for name, model in list(self.store.models.items())]
        for key, (metric, counter, text) in ENGINE_METRICS.items():
            kind = CounterMetricFamily if counter else GaugeMetricFamily
            family = kind(metric, text, labels=["model"])
            for name, stats in models:
                if key in stats:
                    family.add_metric([name], stats[key])
            if family.samples:
                yield family


def _gateway(models: list[tuple[str, ServedModel]]) -> Iterator[Metric]:
    """vLLM's series (``lmi_handlers/gauges.py``), labelled as vLLM labels them, plus the model's name."""
    labels = ["model_name", "engine"]
    gauges = {name: GaugeMetricFamily(name, text, labels=labels) for name, (_, text) in GAUGES.items()}
    counters = {name: CounterMetricFamily(name, text, labels=labels) for name, (_, text) in COUNTERS.items()}
    lora = GaugeMetricFamily(LORA_INFO, "When the adapters running and waiting were last reported (seconds since "
                             "the epoch)", labels=["model_name", *LORA_KEYS])
    cache = GaugeMetricFamily("vllm:cache_config_info", "The KV cache's configuration, in its labels",
                              labels=[*labels, "block_size", "num_gpu_blocks"])
    for name, model in models:
        engine = _engine(model)
        stats = dict(engine.engine_stats)
        stats.setdefault("running", _in_flight(model))
        stats["waiting"] = stats.get("waiting", 0) + model.jobs.qsize()
        for family, (key, _) in zip(gauges.values(), GAUGES.values()):
            if key in stats:
                family.add_metric([name, "0"], stats[key])
        for family, (key, _) in zip(counters.values(), COUNTERS.values()):
            if key in stats:
                family.add_metric([name, "0"], stats[key])
        if "max_lora" in stats:
            lora.add_metric([name, *(str(stats.get(key, "")) for key in LORA_KEYS)], engine.engine_stats_at)
        if "kv_block_size" in stats:
            cache.add_metric([name, "0", str(stats["kv_block_size"]), str(stats["kv_blocks_total"])], 1)
    yield from (family for family in (*gauges.values(), *counters.values(), lora, cache) if family.samples)


def _in_flight(model: ServedModel) -> int:
    """The requests a model runs, where its handler states no counters."""
    if model.channel is not None:
        return model.channel.requests()
    return len(model.rolling_batch.active) if model.settings.rolling else model.in_flight


def _engine(model: ServedModel) -> Any:
    """Where a model's engine counters come in (``engine_stats``, ``engine_stats_at``): its rolling batch's steps, or
    in DJL's async mode its channel's reads."""
    return model.channel or model.rolling_batch
