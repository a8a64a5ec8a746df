"""What gateways and autoscalers read of a replica: vLLM's scheduler gauges, computed from an engine's counters.

The Gateway API Inference Extension's model-server protocol (its proposal 003) scores replicas by queued and running
requests, KV-cache use and the LoRA adapters in use, and reads them by default under vLLM's names
(``vllm/v1/metrics/loggers.py``). Every engine's ``stats()`` (``engine.Engine``, the vllm backend's loop and async
engine) states them under the keys below, as plain numbers and strings, so that any handler mode can send them: the
rolling batch sends the whole dictionary to ``lmi serve`` with each step (``rolling.STATS_PROPERTY``), in DJL's async
mode it answers a call of ``lmi serve``'s that asks for it (``async_service.py``); ``/metrics`` names them
(``lmi_tools/serving/metrics.py``), and ``DjlMetrics`` prints them for DJLServing's front end in either mode.

DJLServing reads a handler's metrics from its output: a line holding ``[METRICS]`` followed by
``Name.Unit:value|#Dimension:value|type`` (``PyProcess``'s reader and DJL's ``Metric.parse``); with
``SERVING_PROMETHEUS=true`` it exports each as a Prometheus series at ``GET /server/metrics``, named as printed,
labelled by the first dimension only. Its parser takes names of word characters only, so there the gauges are named
with ``_`` for vLLM's ``:`` (``vllm_num_requests_waiting{Model="..."}``), and ``vllm:lora_requests_info``, whose
meaning is in three labels, cannot be expressed (docs/fleet.md).
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any, Callable, Mapping, TextIO

#: vLLM's gauge -> (the ``stats()`` key that holds it, what it means).
GAUGES = {
    "vllm:num_requests_running": ("running", "Requests (sequences) in the running batch"),
    "vllm:num_requests_waiting": ("waiting", "Requests (sequences) admitted by the handler and waiting for a row or KV "
                                             "blocks; lmi serve adds those in its job queue"),
    "vllm:kv_cache_usage_perc": ("kv_cache_usage", "Fraction of the KV cache in use, 0 to 1 (blocks held by running "
                                                   "sequences; on a backend with a slot per sequence, slots in use)"),
}
#: vLLM's counters of the prefix cache, in tokens -> the ``stats()`` key.
COUNTERS = {
    "vllm:prefix_cache_queries": ("prefix_cache_prompt_tokens", "Prompt tokens looked up in the prefix cache"),
    "vllm:prefix_cache_hits": ("prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache"),
}
#: vLLM's LoRA gauge: its value is when it was last updated; its labels say which adapters run and wait.
LORA_INFO = "vllm:lora_requests_info"
#: The ``stats()`` keys behind ``vllm:lora_requests_info`` (present only where LoRA adapters are enabled).
LORA_KEYS = ("max_lora", "running_lora_adapters", "waiting_lora_adapters")
#: The most often ``DjlMetrics`` prints while the numbers change; an idle engine's last numbers go out at once.
DJL_INTERVAL = 1.0


def adapter_names(seqs: Any) -> str:
    """vLLM's label value: the distinct adapters of ``seqs``, comma-separated (sorted, so that one set of adapters is
    one label value)."""
    return ",".join(sorted({seq.adapter.name for seq in seqs if seq.adapter is not None}))


def _dimension(value: str) -> str:
    """DJL splits dimensions at ``,`` and ``:`` and ends them at ``|``."""
    return re.sub(r"[^\w.\-]", "_", value) or "model"


class DjlMetrics:
    """Prints the gauges as DJLServing's ``[METRICS]`` lines, at most every ``DJL_INTERVAL`` seconds while they change,
    and at once when the engine falls idle (its last step is the one that says so)."""

    def __init__(self, dimension: str = "model", out: TextIO | None = None, clock: Callable[[], float] = time.monotonic):
        self.dimension = _dimension(dimension)
        self.out = out
        self.clock = clock
        self._last: tuple[float, ...] | None = None
        self._at = -DJL_INTERVAL

    def publish(self, stats: Mapping[str, Any]) -> None:
        values = tuple(float(stats.get(key, 0)) for key, _ in GAUGES.values())
        idle = not stats.get("running") and not stats.get("waiting")
        now = self.clock()
        if values == self._last or (not idle and now - self._at < DJL_INTERVAL):
            return
        self._last, self._at = values, now
        out = self.out or sys.stdout
        for (name, _), value in zip(GAUGES.items(), values):
            out.write(f"[METRICS]{name.replace(':', '_')}.None:{value:g}|#Model:{self.dimension}|g\n")
        out.flush()
