"""vLLM's own scheduler statistics, as the vllm backend's ``stats()`` states them (``lmi_handlers/gauges.py``).

vLLM hands each step's ``SchedulerStats`` to its stat loggers; ``stat_logger`` makes one that keeps the latest
numbers (and adds up the prefix cache's per-step counts) in a dictionary that the step loop (``engine.py``) and the
async driver (``async_engine.py``) report through ``engine_stats``. vLLM's ``/metrics`` derives its ``vllm:*`` series
from the same objects (``vllm/v1/metrics/loggers.py``), so the meanings are vLLM's.
"""

from __future__ import annotations

from typing import Any, Callable


def stat_logger(sink: dict[str, Any]) -> Callable[[Any, int], Any]:
    """A factory for ``LLMEngine``'s ``stat_loggers`` that writes into ``sink``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class LatestStats(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0):
            lora = vllm_config.lora_config
            sink["max_lora"] = lora.max_loras if lora is not None else None

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            if scheduler_stats is None:
                return
            cache = scheduler_stats.prefix_cache_stats
            sink.update(running=scheduler_stats.num_running_reqs,
                        waiting=scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs,
                        kv_cache_usage=round(scheduler_stats.kv_cache_usage, 4),
                        prefix_cache_prompt_tokens=sink.get("prefix_cache_prompt_tokens", 0) + cache.queries,
                        prefix_cache_hit_tokens=sink.get("prefix_cache_hit_tokens", 0) + cache.hits,
                        running_lora_adapters=",".join(sorted(scheduler_stats.running_lora_adapters)),
                        waiting_lora_adapters=",".join(sorted(scheduler_stats.waiting_lora_adapters)))

        def log_engine_initialized(self) -> None:
            pass

    return LatestStats


def engine_stats(sink: dict[str, Any], in_flight: int) -> dict[str, int | float | str]:
    """The numbers of ``sink`` as an engine's ``stats()`` states them; with no request in flight (``in_flight``)
    nothing runs or waits and no block is held, whatever vLLM's last step said."""
    out = {key: value for key, value in sink.items() if value is not None}
    if "max_lora" not in out:
        for key in ("running_lora_adapters", "waiting_lora_adapters"):
            out.pop(key, None)
    out.setdefault("running", in_flight)
    out.setdefault("waiting", 0)
    if not in_flight:
        out.update(running=0, waiting=0, kv_cache_usage=0.0)
    return out
