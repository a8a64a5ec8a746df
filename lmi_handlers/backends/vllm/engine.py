"""vLLM's engine, driven by the handler: ``VllmBackend`` configures it at the init call; in DJL's sync mode
``VllmLoop`` builds and runs vLLM's ``LLMEngine``, in async mode ``async_engine.py`` drives its ``AsyncLLM``.

vLLM brings its own scheduler, KV cache and parallelism, so this backend brings its own step loop instead of our
``Engine``: ``VllmLoop`` has the same surface (``add``, ``cancel``, ``step``, ``run``...). Each ``step`` (one per
rolling-batch ``handle`` call) takes what vLLM's engine core produced since the last one and feeds each new token
through its ``SequenceState``, so events, stop sequences and bytes are the same as on our engine. A sequence our
side finishes first (a stop sequence) is aborted in vLLM; a client that goes away aborts its request.

A constrained request is compiled at admission with vLLM's tokenizer and the limits vLLM's own matcher gets
(``compile_grammar``, ``structured/admission.py``), so that what vLLM cannot follow is a 400 before it runs. What
vLLM's grammar still fails on while generating ends that request alone as an error, never as a finished answer:
vLLM ends it with ``finish_reason`` "error" (its matcher refused a token), or, where its matcher fails while
masking, with end-of-sequence; so a constrained answer that ends at end-of-sequence is checked against its grammar
(the admission's matcher consumes it) before it is reported finished (``sampling.append_output``, which the async
driver shares).

vLLM's engine core cannot recover from a failed step: it stops, and every later call raises. The loop then fails
every request with a 503 that says so and ends this worker process a moment later, as vLLM's own server exits, so
that the server (``lmi serve``, DJLServing) starts a fresh one instead of answering errors forever. An engine core
process that ends without a word (killed by a signal, or by the kernel's OOM killer) leaves ``LLMEngine.step()``
waiting forever; a watcher thread ends this process then too.
"""

from __future__ import annotations

import glob
import logging
import time
from typing import Any, Iterator, Sequence

from ...adapters import AdapterSpec, LoraOptions
from ...config import HandlerConfig
from ...errors import ConfigError, EngineStopped
from ...events import Event
from ...sequence import SequenceState
from ...structured.admission import GrammarBudget, GrammarCompiler
from ...structured.tools import Parser, ToolCalling, ToolOptions
from .structured import check_tool_parser, structured_outputs_params, tool_call_parser
from ..tokenizer import HFTokenizer
from .adapters import vllm_engine_args, vllm_lora_request
from .options import Options, engine_arg_defaults
from .sampling import EXTRA_FIELDS, append_output, check_request, vllm_request
from .stats import engine_stats, stat_logger
from .watch import EXIT_DELAY, EngineWatch, engine_dead, request_error

logger = logging.getLogger(__name__)
STATS_EVERY = 30.0  # seconds between two counter lines in the log while requests run


class VllmBackend:
    """vLLM's ``LLMEngine`` for the model, with the tokenizer our side detokenizes with."""

    name = "vllm"
    kv = None
    chunked_prefill = False
    request_fields = frozenset(EXTRA_FIELDS)
    #: Constrained requests go to vLLM's own structured outputs, ``auto`` tool calls to vLLM's own tool parsers
    #: (``structured.py``).
    structured_output = True
    #: ``option.reasoning_parser`` reaches vLLM as its engine argument: its structured outputs wait for the end of
    #: the reasoning (``structured/reasoning.py``).
    reasoning_aware = True
    #: Engine arguments a subclass sets whatever the options say (the pooler: vLLM's pooling runner).
    engine_overrides: dict[str, Any] = {}

    def __init__(self, config: HandlerConfig, options: Options, tools: ToolOptions, lora: LoraOptions,
                 grammar: GrammarBudget = GrammarBudget()):
        import vllm
        from vllm import EngineArgs
        from vllm.config import StructuredOutputsConfig

        try:
            import vllm.v1.engine.llm_engine  # noqa: F401 - the V1 engine this backend drives
        except ImportError:
            raise ConfigError("rolling_batch", "vllm", f"this Python has vLLM {vllm.__version__}, without the V1 "
                              "engine this backend drives (vLLM 0.8 or later; tested with 0.32); use an LMI image "
                              "with a newer vLLM, or option.rolling_batch=auto") from None

        self.options = options
        self.grammar_budget = grammar
        self.tokenizer = load_tokenizer(config.model_id, options.trust_remote_code, options.revision)
        if tools.parser is not None:
            check_tool_parser(self.tokenizer.hf, tools.parser)  # before vLLM's start, which takes minutes
        accepted = engine_arg_defaults(EngineArgs)
        for key in sorted({key for key, _ in options.passthrough} - set(accepted)):
            logger.warning("option.%s is ignored: vLLM %s has no engine argument %s", key, vllm.__version__, key)
        kwargs = options.engine_args(config.model_id, accepted)
        kwargs.update(vllm_engine_args(lora))
        kwargs.update(self.engine_overrides)
        # vLLM reads "no free whitespace in JSON" from its engine config, not from a request's parameters: compact
        # JSON by default, as on the hf engine (a request's whitespace_pattern still allows some), through the same
        # grammar library (llguidance: vLLM's "guidance" backend).
        kwargs.setdefault("structured_outputs_config",
                          StructuredOutputsConfig(backend="guidance", disable_any_whitespace=True))
        if self.options.tensor_parallel_size is None:
            kwargs["tensor_parallel_size"] = _device_count()
        logger.info("vllm: engine arguments %s", kwargs)
        try:
            vllm_config = EngineArgs(**kwargs).create_engine_config()
        except Exception as exc:  # noqa: BLE001 - whatever vLLM refuses is the option's fault: name it
            raise self._refused(exc, kwargs, config) from exc
        self.llm: Any = None  # vLLM's LLMEngine, once make_engine builds it
        self._adopt(vllm_config)

    def _adopt(self, vllm_config: Any) -> None:
        """What requests are checked against, from the configuration of the engine that serves them."""
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        #: vLLM's latest scheduler statistics (``stats.py``), what the engine's ``stats()`` reports.
        self.vllm_stats: dict[str, Any] = {}
        self.max_sequence_length = vllm_config.model_config.max_model_len
        self.vocab_size = vllm_config.model_config.get_vocab_size()
        self.max_batch_size = vllm_config.scheduler_config.max_num_seqs
        # llguidance's tokenizer as vLLM's guidance backend converts it, with llguidance's default limits (those of
        # vLLM's own matchers): what passes here is what vLLM's matcher gets.
        hf = self.tokenizer.hf
        self.grammars = GrammarCompiler(hf, max(self.vocab_size, len(hf)), hf.eos_token_id,
                                        self.grammar_budget, library_limits=True)
        # After a step that prefilled only part of a prompt, vLLM rewinds that request's own random generator (one
        # exists only for a request with a seed), and a CPU generator cannot rewind: on vLLM's CPU build the engine
        # stops ("CPU Generator does not use offset"). Prompts are split only with chunked prefill.
        self.seeds_stop_engine = (vllm_config.device_config.device_type == "cpu"
                                  and vllm_config.scheduler_config.enable_chunked_prefill)

    def compile_grammar(self, constraint: Any) -> Any:
        """``constraint`` checked at admission as vLLM's matcher will run it (``structured/admission.py``); the
        matcher, which checks an answer that ends at end-of-sequence (``sampling.append_output``)."""
        return self.grammars.compile(constraint)

    def make_engine(self) -> "VllmLoop":
        """vLLM's ``LLMEngine``, stepped by the handler's rolling batch (DJL's sync mode)."""
        from vllm.v1.engine.llm_engine import LLMEngine

        self.llm = LLMEngine.from_vllm_config(self.vllm_config, stat_loggers=[stat_logger(self.vllm_stats)])
        return VllmLoop(self)

    def make_async_engine(self) -> Any:
        """vLLM's ``AsyncLLM``, which requests join one ``generate`` each (DJL's async mode; on the event loop)."""
        from vllm.v1.engine.async_llm import AsyncLLM

        from .async_engine import AsyncVllmEngine

        return AsyncVllmEngine(self, AsyncLLM.from_vllm_config(self.vllm_config, disable_log_stats=True,
                                                                stat_loggers=[stat_logger(self.vllm_stats)]))

    def tool_call_parser(self, name: str, calling: ToolCalling) -> Parser:
        """vLLM's own parser ``name`` reads an ``auto`` answer on this engine (``structured.py``)."""
        return tool_call_parser(self.tokenizer.hf, name, calling)

    def load_adapter(self, spec: AdapterSpec) -> AdapterSpec:
        """vLLM loads an adapter from its folder when a request first names it (``vllm_lora_request``)."""
        return spec

    def _refused(self, exc: Exception, kwargs: dict[str, Any], config: HandlerConfig) -> ConfigError:
        """The option behind an engine argument vLLM refused: the one its error names, else every one set."""
        message = " ".join(str(exc).split())[:600]
        named = getattr(exc, "parameter", None)
        candidates = [named] if named in kwargs else sorted((k for k in kwargs if k in message), key=len, reverse=True)
        if candidates:
            key = self.options.source(candidates[0])
            return ConfigError(key, config.properties.get(key, kwargs[candidates[0]]), f"vLLM refused it: {message}")
        return ConfigError("rolling_batch", "vllm", f"vLLM refused the engine arguments {kwargs}: {message}")


class VllmLoop(EngineWatch):
    """The handler's engine when vLLM runs the steps (``Engine``'s surface: ``add``, ``cancel``, ``step``...)."""

    def __init__(self, backend: VllmBackend):
        self.backend = backend
        self.llm = backend.llm
        self.seqs: dict[str, SequenceState] = {}
        #: Events of requests vLLM refused when they were added, answered at the next step.
        self.refused: dict[int, list[Event]] = {}
        self._logged = time.monotonic()
        super().__init__()

    @property
    def idle(self) -> bool:
        return not self.seqs and not self.refused

    def add(self, seq: SequenceState) -> None:
        try:
            if self.stopped is not None:
                raise EngineStopped(self.stopped)
            check_request(seq, self.backend)
            request = vllm_request(seq, self.backend.tokenizer.eos_ids,
                                   structured_outputs=structured_outputs_params(seq.request.constraint),
                                   lora_request=vllm_lora_request(seq.adapter))
            self.llm.add_request(str(seq.uid), request.prompt, request.params, lora_request=request.lora_request,
                                 priority=seq.request.priority, trace_headers=seq.trace_headers)
        except Exception as exc:  # noqa: BLE001 - a request vLLM refuses fails alone
            if engine_dead(exc):
                self.refused.update(self._stop(exc))
            self.refused[seq.uid] = [seq.fail(*request_error(exc, self.stopped))]
            return
        self.seqs[str(seq.uid)] = seq

    def cancel(self, seq: SequenceState) -> None:
        """Stop a sequence now (its client went away): vLLM frees its KV blocks."""
        if self.seqs.pop(str(seq.uid), None) is not None and self.stopped is None:
            self.llm.abort_request([str(seq.uid)])
        self.refused.pop(seq.uid, None)
        seq.finished = True

    def reset(self) -> None:
        if self.seqs and self.stopped is None:
            self.llm.abort_request(list(self.seqs))
        for seq in self.seqs.values():
            seq.finished = True
        self.seqs, self.refused = {}, {}

    def stats(self) -> dict[str, int | float | str]:
        """vLLM's own numbers (``stats.py``)."""
        return engine_stats(self.backend.vllm_stats, len(self.seqs))

    def step(self) -> dict[int, list[Event]]:
        """What vLLM generated since the last step, as events by sequence uid."""
        events, self.refused = self.refused, {}
        if not self.seqs:
            return events
        try:
            outputs = self.llm.step()
        except Exception as exc:  # noqa: BLE001 - vLLM's engine stops after a failed step: so does this worker
            events.update(self._stop(exc))
            return events
        for output in outputs:
            seq = self.seqs.get(output.request_id)
            if seq is not None:
                events[seq.uid] = self._append(seq, output)
        if time.monotonic() - self._logged >= STATS_EVERY:
            self._logged = time.monotonic()
            logger.info("vllm: %d sequences", len(self.seqs))
        return events

    def _stop(self, exc: Exception) -> dict[int, list[Event]]:
        """vLLM's engine stopped: the running requests fail with a 503 saying so, and this process exits soon."""
        if self.stopped is None:
            logger.error("vllm: the engine stopped (%s: %s) with %d sequences running; its own error is above. "
                         "This worker exits in %g s so that the server starts a fresh one",
                         type(exc).__name__, exc, len(self.seqs), EXIT_DELAY)
            self.stopped = (f"vLLM's engine stopped ({type(exc).__name__}); the model's worker restarts, the cause "
                            "is in the server log")
            self.exit_soon()
        events = {seq.uid: [seq.fail(EngineStopped.status, self.stopped)] for seq in self.seqs.values()}
        self.seqs = {}
        return events


    def run(self, seqs: Sequence[SequenceState]) -> Iterator[dict[int, list[Event]]]:
        """Steps until every one of ``seqs`` has finished (the non-rolling modes)."""
        for seq in seqs:
            self.add(seq)
        # A sequence vLLM refused is finished at once; its error event still has to reach its job.
        while not all(seq.finished for seq in seqs) or self.refused:
            yield self.step()

    def _append(self, seq: SequenceState, output: Any) -> list[Event]:
        events = append_output(seq, output)
        if seq.finished:
            del self.seqs[output.request_id]
            if not output.finished:  # our side stopped it first (a stop sequence)
                self.llm.abort_request([output.request_id])
        return events


def load_tokenizer(model: str, trust_remote_code: bool, revision: str | None) -> HFTokenizer:
    """The model's transformers tokenizer (the one vLLM tokenizes with) and its generation config's EOS ids."""
    from transformers import AutoTokenizer, GenerationConfig

    common = {"trust_remote_code": trust_remote_code, "revision": revision}
    try:
        generation_config = GenerationConfig.from_pretrained(model, **common)
    except OSError:  # no generation_config.json: the tokenizer's EOS alone
        generation_config = None
    return HFTokenizer(AutoTokenizer.from_pretrained(model, **common), generation_config)


def _device_count() -> int:
    """``tensor_parallel_degree=max``: every GPU, else every NeuronCore (two per Inferentia2 device), else 1."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count()
    return 2 * len(glob.glob("/dev/neuron[0-9]*")) or 1
