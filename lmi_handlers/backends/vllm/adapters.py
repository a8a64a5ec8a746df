"""LoRA adapters on vLLM's engine: the same adapters and options (``lmi_handlers/adapters.py``) in vLLM's terms."""

from __future__ import annotations

from typing import Any

from ...adapters import Adapter, AdapterRule, LoraOptions

#: The ranks vLLM's ``LoRAConfig.max_lora_rank`` accepts.
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: vLLM serves adapters up to its largest rank; it checks an adapter's modules itself, when a request first names it.
RULE = AdapterRule(max_rank=VLLM_RANKS[-1])


def vllm_engine_args(options: LoraOptions) -> dict[str, Any]:
    """vLLM's engine arguments for ``options`` ({} when LoRA is off). vLLM accepts only ``VLLM_RANKS`` as its rank
    limit: ``option.max_lora_rank`` is rounded up to the next of them (adapters are still checked against the
    option itself at registration). vLLM's ``max_cpu_loras`` is its cache of loaded adapters, at least
    ``max_loras``. ``RULE`` refuses a rank above them all."""
    if not options.enabled:
        return {}
    RULE.check(options, "vllm")
    rank = next(r for r in VLLM_RANKS if r >= options.max_lora_rank)
    return {"enable_lora": True, "max_loras": options.max_loras, "max_lora_rank": rank,
            "max_cpu_loras": max(options.max_cpu_loras or options.max_loras, options.max_loras)}


def vllm_lora_request(adapter: Adapter | None) -> Any:
    """vLLM's ``LoRARequest`` for a sequence's adapter (None for the base model): its name, an id unique to the
    registration (a re-registered name is a new adapter to vLLM's cache), and its folder."""
    if adapter is None:
        return None
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=adapter.name, lora_int_id=adapter.uid, lora_path=adapter.spec.src)
