"""One class per architecture, with the constructor signatures and checks of transformers-neuronx 0.11.

* Llama, Mistral, Mixtral and BLOOM take keyword-only shape arguments. Llama/Mistral/Mixtral accept
  (and ignore) unknown keywords; the other classes apply extra keywords as overrides of their
  internal config and raise ``KeyError('Found invalid key ...')`` for a name it does not have.
* OPT and GPT-J refuse ``n_positions`` beyond the model's position embeddings.
* GPT-J and GPT-NeoX: ``n_positions`` only as an override, no prefill graphs (tokens go through one
  at a time), no quantization, no ``save``/``load``, no flexible TP, and their attention does not
  mask left padding (``start_ids`` is ignored).
* Continuous batching only for Llama and Mistral.
"""

from .base import NeuronModelBase, PretrainedModel
from .config import NeuronConfig
from .sampling import sample_loop

AMP_OF_DTYPE = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def _override(allowed, kwargs):
    for key in kwargs:
        if key not in allowed:
            raise KeyError(f'Found invalid key "{key}".')


def _eos(config):
    eos = config.eos_token_id
    return eos[0] if isinstance(eos, (list, tuple)) else eos


class _LlamaFamily(NeuronModelBase):
    def __init__(self, config, *, n_positions=2048, batch_size=1, amp="f32", tp_degree=2,
                 context_length_estimate=None, context_unroll=None, unroll=None, neuron_config=None, **kwargs):
        self._setup(config, n_positions=n_positions, batch_size=batch_size, amp=amp, tp_degree=tp_degree,
                    context_length_estimate=context_length_estimate, neuron_config=neuron_config, unroll=unroll)

    def sample(self, input_ids, sequence_length, start_ids=None, top_k=50, top_p=1.0, eos_token_override=None,
               temperature=1.0, streamer=None, stopping_criteria_list=None):
        self._check_sample_batch(input_ids)
        eos = _eos(self.config) if eos_token_override is None else eos_token_override
        return sample_loop(self, input_ids, start_ids, sequence_length, eos_token_id=eos, llama_style=True,
                           top_k=top_k, top_p=top_p, temperature=temperature, streamer=streamer)


class LlamaForSampling(_LlamaFamily):
    model_types = ("llama", "code_llama")
    continuous_batching_supported = True

    def __init__(self, config, *, n_positions=2048, batch_size=1, amp="f32", tp_degree=2,
                 context_length_estimate=None, context_unroll=None, unroll=None, neuron_config=None,
                 prefixed_length=0, **kwargs):
        super().__init__(config, n_positions=n_positions, batch_size=batch_size, amp=amp, tp_degree=tp_degree,
                         context_length_estimate=context_length_estimate, unroll=unroll, neuron_config=neuron_config)
        self.prefixed_length = prefixed_length

    def sample(self, input_ids, sequence_length, cache_ids=None, start_ids=None, top_k=50, top_p=1.0,
               eos_token_override=None, temperature=1.0, streamer=None, stopping_criteria_list=None,
               no_repeat_ngram_size=None, **kwargs):
        return super().sample(input_ids, sequence_length, start_ids=start_ids, top_k=top_k, top_p=top_p,
                              eos_token_override=eos_token_override, temperature=temperature, streamer=streamer)


class MistralForSampling(_LlamaFamily):
    model_types = ("mistral",)
    continuous_batching_supported = True


class MixtralForSampling(_LlamaFamily):
    model_types = ("mixtral",)


class _SimpleSampling:
    def sample(self, input_ids, sequence_length, start_ids=None, top_k=50, streamer=None):
        self._check_sample_batch(input_ids)
        return sample_loop(self, input_ids, start_ids, sequence_length, eos_token_id=_eos(self.config),
                           llama_style=False, top_k=top_k, streamer=streamer)


class BloomForSampling(_SimpleSampling, NeuronModelBase):
    model_types = ("bloom",)
    OVERRIDES = ("embed_dim", "hidden_size", "attention_head_size", "n_head", "n_layer", "vocab_size",
                 "layer_norm_epsilon", "bos_token_id", "eos_token_id")

    def __init__(self, config, *, n_positions=2048, batch_size=1, amp="f32", tp_degree=2,
                 context_length_estimate=None, context_unroll=None, unroll=None, neuron_config=None, **kwargs):
        _override(self.OVERRIDES, kwargs)
        self._setup(config, n_positions=n_positions, batch_size=batch_size, amp=amp, tp_degree=tp_degree,
                    context_length_estimate=context_length_estimate, neuron_config=neuron_config, unroll=unroll)


class OPTForSampling(_SimpleSampling, NeuronModelBase):
    model_types = ("opt",)
    OVERRIDES = ("activation_function", "eos_token_id", "pad_token_id", "ffn_dim", "hidden_size",
                 "max_position_embeddings", "num_attention_heads", "num_hidden_layers", "vocab_size",
                 "word_embed_proj_dim")

    def __init__(self, config, batch_size=1, amp=None, tp_degree=2, n_positions=2048, unroll=None,
                 context_length_estimate=None, context_unroll=1, neuron_config=None, **kwargs):
        self._check_model_type(config)
        if amp is None:  # the checkpoint's dtype decides
            stored = getattr(config, "torch_dtype", None) or getattr(config, "dtype", None) or "float32"
            amp = AMP_OF_DTYPE[str(stored).replace("torch.", "")]
        _override(self.OVERRIDES, kwargs)
        if not config.do_layer_norm_before:
            raise NotImplementedError("do_layer_norm_before=False not implemented")
        top = max(n_positions) if isinstance(n_positions, (list, tuple)) else n_positions
        if top > config.max_position_embeddings:
            raise ValueError(f"Sequence length ({top}) cannot be larger than position embedding's context size "
                             f"({config.max_position_embeddings})!")
        self._setup(config, n_positions=n_positions, batch_size=batch_size, amp=amp, tp_degree=tp_degree,
                    context_length_estimate=context_length_estimate, neuron_config=neuron_config, unroll=unroll)


class GPT2ForSamplingWithContextBroadcasting(NeuronModelBase):
    """GPT-2; the prompt graph runs ``prompt_batch_size`` rows (the real class broadcasts them to the batch)."""

    model_types = ("gpt2",)
    OVERRIDES = ("activation_function", "n_embd", "n_head", "n_kv_head", "n_layer", "n_positions",
                 "max_position_embeddings", "vocab_size", "eos_token_id")

    def __init__(self, config, batch_size=1, prompt_batch_size=1, amp="f32", tp_degree=2, unroll=None,
                 context_length_estimate=None, context_unroll=1, neuron_config=None, reorder_cache=False,
                 **kwargs):
        _override(self.OVERRIDES, kwargs)
        assert context_length_estimate != 0, (
            "context_length_estimate cannot be set to 0 in the GPT2ForSamplingWithContextBroadcasting class.")
        n_positions = kwargs.get("n_positions") or config.n_positions
        if context_length_estimate is None:
            context_length_estimate = n_positions
        assert not isinstance(batch_size, list) or len(batch_size) == 1, (
            "GPT2 does not support compilation for multiple batch sizes")
        self._setup(config, n_positions=n_positions, batch_size=batch_size, amp=amp, tp_degree=tp_degree,
                    context_length_estimate=context_length_estimate, neuron_config=neuron_config or NeuronConfig(),
                    unroll=unroll)
        self.prompt_batch_size = prompt_batch_size
        self.context_batch_sizes = [prompt_batch_size]

    def reset(self, context_length_estimate):
        # The real class resets its prompt graph of this bucket together with the token graph.
        super().reset()

    def forward(self, input_ids, cache_ids=None, start_ids=None):
        rows, length = input_ids.shape
        if length > 1 and rows != self.prompt_batch_size:
            raise ValueError(f"the prompt graph was compiled for prompt_batch_size={self.prompt_batch_size}, "
                             f"got {rows} prompts")
        return super().forward(input_ids, cache_ids, start_ids)

    def sample(self, input_ids, sequence_length, cache_ids=None, start_ids=None, top_k=50, streamer=None,
               output_scores=False, **kwargs):
        if self.batch_sizes[0] % input_ids.shape[0]:
            raise ValueError(f"model batch_size must be multiples of runtime_batch_size; got batch_size="
                             f"{self.batch_sizes[0]} and runtime_batch_size={input_ids.shape[0]}")
        return sample_loop(self, input_ids, start_ids, sequence_length, eos_token_id=_eos(self.config),
                           llama_style=False, top_k=top_k, streamer=streamer)


class _NoPrefillGraphs(_SimpleSampling, PretrainedModel):
    """GPT-J and GPT-NeoX: tokens one at a time, the mask follows cache positions only."""

    masks_left_padding = False

    def _setup_serial(self, config, batch_size, amp, tp_degree, neuron_config, kwargs, context_size, checked):
        _override(self.OVERRIDES, kwargs)
        n_positions = kwargs.get("n_positions") or context_size
        if checked and n_positions > context_size:
            raise ValueError(f"Sequence length ({n_positions}) cannot be larger than position embedding's context "
                             f"size ({context_size})!")
        if neuron_config is not None and neuron_config.quant:
            raise NotImplementedError("Support for quantization is not yet implemented")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool):
            raise TypeError(f"{type(self).__name__} is compiled for one batch size (an int), got {batch_size!r}")
        self._setup(config, n_positions=n_positions, batch_size=batch_size, amp=amp, tp_degree=tp_degree,
                    context_length_estimate=0, neuron_config=neuron_config)

    def _check_sharding(self):
        heads = self.config.num_attention_heads
        if heads % self.tp_degree:
            raise ValueError(f"{type(self).__name__} has no flexible tensor parallelism: {heads} attention heads "
                             f"cannot be split over tp_degree={self.tp_degree}")
        super()._check_sharding()

    def forward(self, input_ids, cache_offset, start_ids=None):
        return super().forward(input_ids, cache_offset, start_ids)


class GPTJForSampling(_NoPrefillGraphs):
    model_types = ("gptj",)
    OVERRIDES = ("activation_function", "n_embd", "n_head", "n_layer", "n_positions", "n_ctx", "rotary_dim",
                 "vocab_size", "eos_token_id")

    def __init__(self, config, batch_size=1, amp="f32", tp_degree=2, unroll=None, init_n_active_tokens=None,
                 neuron_config=None, **kwargs):
        if init_n_active_tokens is not None:
            raise NotImplementedError(f"init_n_active_tokens={init_n_active_tokens}")
        self._setup_serial(config, batch_size, amp, tp_degree, neuron_config, kwargs, config.n_positions,
                           checked=True)


class GPTNeoXForSampling(_NoPrefillGraphs):
    model_types = ("gpt_neox",)
    OVERRIDES = ("activation_function", "n_embd", "n_head", "n_layer", "n_positions", "n_ctx", "rotary_dim",
                 "vocab_size", "eos_token_id", "rotary_emb_base", "use_parallel_residual")

    def __init__(self, config, batch_size=1, amp="f32", tp_degree=2, unroll=None, init_n_active_tokens=None,
                 neuron_config=None, **kwargs):
        if not config.use_parallel_residual:
            raise NotImplementedError("use_parallel_residual=False is not yet implemented")
        if unroll is not None:
            raise NotImplementedError(f"unroll={unroll} is not yet implemented")
        if init_n_active_tokens is not None:
            raise NotImplementedError(f"init_n_active_tokens={init_n_active_tokens} is not yet implemented")
        # Unlike GPT-J, the real class does not compare n_positions with the position embeddings (RoPE).
        self._setup_serial(config, batch_size, amp, tp_degree, neuron_config, kwargs,
                           config.max_position_embeddings, checked=False)
