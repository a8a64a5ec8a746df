"""The vllm backend over an engine that vLLM's own OpenAI server already runs (AWS's vLLM container).

There the server has built and started vLLM's ``AsyncLLM`` before any handler code runs, from its command line
(the container's ``SM_VLLM_*`` variables), and holds it as ``app.state.engine_client``. ``ServedVllm`` takes the
backend's options and tool-call options as the resolver parsed them (``vllm_container/service.py``), reads what
requests are checked against (model length, vocabulary, the seed rule) from that engine's configuration, loads the
same tokenizer vLLM tokenizes with, and drives that engine, one ``generate`` per sequence, with the async engine of
DJL's async mode (``async_engine.py``): no second engine is ever built. ``ServedAdapters`` are the LoRA adapters that
server holds, by name, as requests name them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...adapters import Adapter, Adapters, LoraOptions, read_adapter
from ...errors import AdapterNotFound
from ...structured.admission import GrammarBudget
from ...structured.tools import ToolOptions
from .engine import VllmBackend, load_tokenizer
from .options import Options
from .structured import check_tool_parser


class ServedVllm(VllmBackend):
    """``client``: the engine client of a running vLLM server (its ``vllm_config`` and ``generate``); ``options``
    and ``tools``: the deployment's (what the server was started with is read from ``client``)."""

    def __init__(self, options: Options, tools: ToolOptions, client: Any, grammar: GrammarBudget = GrammarBudget()):
        model = client.vllm_config.model_config
        self.options = options
        self.grammar_budget = grammar
        self.client = client
        self.tokenizer = load_tokenizer(model.tokenizer, model.trust_remote_code, model.tokenizer_revision)
        if tools.parser is not None:
            check_tool_parser(self.tokenizer.hf, tools.parser)
        self._adopt(client.vllm_config)

    def make_engine(self) -> Any:
        raise NotImplementedError("vLLM's server steps its own engine: requests join it through make_async_engine")

    def make_async_engine(self) -> Any:
        from .async_engine import AsyncVllmEngine

        return AsyncVllmEngine(self, self.client)


class ServedAdapters(Adapters):
    """The LoRA adapters vLLM's server holds (``--lora-modules``, and those its adapter API loads), as the handler's
    registry: a request names one as on DJLServing (the body's ``adapters``, the ``adapter`` query parameter,
    SageMaker's ``X-Amzn-SageMaker-Adapter-Identifier`` header). Each is checked as DJLServing's registration checks
    it (``read_adapter``) when first named, and keeps the server's id, so vLLM runs the adapter it already loaded.
    ``lora``: the deployment's LoRA options; whether LoRA is on, and the largest rank, are the running engine's."""

    def __init__(self, models: Any, lora: LoraOptions, lora_config: Any):
        rank = lora_config.max_lora_rank if lora_config is not None else lora.max_lora_rank
        super().__init__(replace(lora, enabled=lora_config is not None, max_lora_rank=rank), None)
        #: vLLM's ``OpenAIServingModels``: its ``lora_requests`` by name.
        self.models = models

    def get(self, name: str) -> Adapter:
        served = self.models.lora_requests
        if name not in served:
            known = ", ".join(sorted(served)) or ("none" if self.options.enabled else
                                                  "none (vLLM runs without LoRA: SM_VLLM_ENABLE_LORA)")
            raise AdapterNotFound(f"adapter {name!r} is not registered on this model; registered adapters: {known}",
                                  field="adapters", value=name)
        lora = served[name]
        adapter = self.by_name.get(name)
        if adapter is None or adapter.uid != lora.lora_int_id:
            spec = read_adapter(name, lora.lora_path, self.options)
            adapter = self.by_name[name] = Adapter(spec, None, uid=lora.lora_int_id)
        return adapter
