"""The Inferentia2 backend: transformers-neuronx models compiled for NeuronCores.

Load: the options (DJL's property names) are resolved against the model's ``config.json`` into
``CompileSettings`` (``options``), which pick the class for the ``model_type`` and its
constructor arguments: ``batch_size`` (``max_rolling_batch_size`` in rolling mode), ``tp_degree``,
``amp`` from ``dtype``, ``n_positions``, ``context_length_estimate`` and a ``NeuronConfig``
(continuous batching, GQA sharding, int8 weights, layouts). The class loads the HF safetensors
checkpoint itself (``from_pretrained(model_dir)``), ``to_neuron()`` compiles - or takes the
artifacts of ``compiled_graph_path`` when their settings match (``artifacts``) - and a
short warm-up runs both the prefill and the decode graphs before the first request.

Serving: ``step`` hands over to a runner (``runners``): continuous batching with per-slot
``cache_ids`` and slot ids in ``start_ids`` for Llama/Mistral, the naive static strategy for the
others. Tokens are chosen on the host with ``sampler.select_tokens``, like the hf backend.

``max_sequence_length`` is ``n_positions``: the request layer rejects a prompt plus
``max_new_tokens`` beyond it with a 400 (DJL's own handler silently truncates the prompt).

torch, transformers and transformers_neuronx are imported lazily.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Sequence

from ...config import HandlerConfig
from ...errors import BackendError
from ...request import GenerationRequest, SamplingParams, Schema, StoppingParams
from ...sequence import Chunk, SequenceState
from ..base import split_batch
from ..sampler import HONOURED_FIELDS
from ..tokenizer import HFTokenizer
from .artifacts import ArtifactStore
from .options import CompileSettings, NeuronxOptions, plan_compile
from .runners import ContinuousRunner, NaiveRunner

logger = logging.getLogger(__name__)

#: Classes that take ``context_length_estimate`` (GPT-J and GPT-NeoX have no prefill graphs).
WITH_CONTEXT_ESTIMATE = ("LlamaForSampling", "MistralForSampling", "MixtralForSampling", "OPTForSampling",
                         "GPT2ForSamplingWithContextBroadcasting", "BloomForSampling")


class NeuronxBackend:
    """transformers-neuronx on NeuronCores; see the module docstring."""

    name = "neuronx"
    kv = None  # the compiled graphs hold one KV row per batch slot
    chunked_prefill = False
    request_fields = HONOURED_FIELDS  # tokens are chosen by ``sampler.select_tokens``, as on hf

    def __init__(self, config: HandlerConfig, options: NeuronxOptions):
        import torch
        from transformers import AutoConfig, AutoTokenizer

        self.torch = torch
        common = {"trust_remote_code": config.trust_remote_code}
        if config.properties.get("revision"):
            common["revision"] = str(config.properties["revision"])
        model_config = AutoConfig.from_pretrained(config.model_id, **common)
        self.settings = plan_compile(config, options, model_config.to_dict())
        for warning in self.settings.warnings:
            logger.warning("neuronx: %s", warning)
        if "low_cpu_mem_usage" in config.properties:
            logger.info("option.low_cpu_mem_usage is ignored: transformers-neuronx loads weights layer by layer")
        self.tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(config.model_id, **common),
                                     _generation_config(config.model_id))
        store = ArtifactStore(options.compiled_graph_path, config.model_dir) if options.compiled_graph_path else None
        self.model = load_model(config.model_id, self.settings, store)
        self.vocab_size = int(model_config.vocab_size)
        self.max_sequence_length = self.settings.n_positions
        if config.max_model_len:
            self.max_sequence_length = min(self.max_sequence_length, config.max_model_len)
        self.max_batch_size = self.settings.batch_size
        if self.settings.continuous_batching:
            self.runner: ContinuousRunner | NaiveRunner = ContinuousRunner(self.model, torch, self.max_batch_size)
        else:
            self.runner = NaiveRunner(self.model, torch, self.max_batch_size, self.settings.n_positions,
                                      self.tokenizer.pad_id)
        self._warm_up()
        logger.info("neuronx: %s, batch %d, tp %d, amp %s, n_positions %d, %s", self.settings.model_class,
                    self.max_batch_size, self.settings.tp_degree, self.settings.amp, self.settings.n_positions,
                    self.runner.name)

    def step(self, batch: Sequence[Chunk]) -> dict[int, tuple[int, float]]:
        with self.torch.inference_mode():
            return self.runner.step(*split_batch(batch))

    def release(self, seq: SequenceState) -> None:
        self.runner.release(seq)

    def reset(self) -> None:
        self.runner.reset()
        reset_model(self.model)

    def _warm_up(self) -> None:
        """Two steps of a short probe, so the first request does not pay for graph loading and a
        broken setup fails at load rather than at first traffic."""
        prompt = self.tokenizer.encode("warm up")[: max(1, self.max_sequence_length - 2)]
        request = GenerationRequest(Schema.LMI, "warm up", SamplingParams(), StoppingParams(max_new_tokens=2))
        seq = SequenceState(request, prompt, decode=self.tokenizer.decode)
        try:
            seq.generated.append(self.step([Chunk(seq, 0, prompt)])[seq.uid][0])
            self.step([Chunk(seq, len(prompt), seq.generated[-1:])])
        finally:
            self.release(seq)
            self.runner.reset()


def _generation_config(model_id: str) -> Any:
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model_id)
    except (OSError, ValueError):
        return None


def reset_model(model: Any) -> None:
    """Clear the model's KV cache; GPT-2's class wants one of its prefill buckets named."""
    if type(model).__name__ == "GPT2ForSamplingWithContextBroadcasting":
        model.reset(model.context_buckets[-1])
    else:
        model.reset()


def load_model(model_id: str, settings: CompileSettings, store: ArtifactStore | None) -> Any:
    """Build the class for ``settings``, load the checkpoint, then compile or reuse artifacts."""
    import transformers_neuronx

    cls = getattr(transformers_neuronx, settings.model_class)
    kwargs = model_kwargs(transformers_neuronx, settings)
    _add_compiler_flags(settings.compiler_flags)
    try:
        model = cls.from_pretrained(model_id, **kwargs)
    except (AssertionError, AttributeError, KeyError, NotImplementedError, TypeError, ValueError) as exc:
        raise BackendError(f"transformers-neuronx refused {settings.model_class}"
                           f"({', '.join(f'{k}={v!r}' for k, v in kwargs.items() if k != 'neuron_config')}): "
                           f"{type(exc).__name__}: {exc}") from exc
    artifacts = store.prepare(settings) if store is not None else None
    if artifacts is not None:
        model.load(artifacts)
    started = time.monotonic()
    try:
        model.to_neuron()
    except FileNotFoundError as exc:
        if artifacts is None:
            raise
        raise BackendError(f"the compiled artifacts in {store.location} do not fit this model: {exc}") from exc
    logger.info("neuronx: %s in %.1f s", "loaded compiled artifacts" if artifacts else "compiled",
                time.monotonic() - started)
    if store is not None and artifacts is None:
        store.publish(model, settings)
    return model


def model_kwargs(tnx: Any, settings: CompileSettings) -> dict[str, Any]:
    """Constructor keywords for ``settings.model_class``."""
    neuron = dict(settings.neuron_config)
    if "quant" in neuron:
        neuron["quant"] = tnx.QuantizationConfig(**neuron["quant"])
    if settings.continuous_batching:
        neuron["continuous_batching"] = tnx.ContinuousBatchingConfig(batch_size_for_shared_caches=settings.batch_size)
    kwargs: dict[str, Any] = {"batch_size": settings.batch_size, "amp": settings.amp,
                              "tp_degree": settings.tp_degree, "neuron_config": tnx.NeuronConfig(**neuron)}
    kwargs["n_positions"] = [settings.n_positions] if settings.continuous_batching else settings.n_positions
    if settings.context_length_estimate and settings.model_class in WITH_CONTEXT_ESTIMATE:
        kwargs["context_length_estimate"] = list(settings.context_length_estimate)
    if settings.unroll is not None:
        kwargs["unroll"] = settings.unroll
    if settings.model_class == "GPT2ForSamplingWithContextBroadcasting":
        kwargs["prompt_batch_size"] = settings.batch_size  # prompts arrive as a full batch, not one broadcast
    return kwargs


def _add_compiler_flags(flags: Sequence[str]) -> None:
    # neuronx-cc reads NEURON_CC_FLAGS when to_neuron() compiles; keep what the image already sets.
    current = os.environ.get("NEURON_CC_FLAGS", "").split()
    missing = [flag for flag in flags if flag not in current]
    if missing:
        os.environ["NEURON_CC_FLAGS"] = " ".join(current + missing)
