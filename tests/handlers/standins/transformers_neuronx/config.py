"""``NeuronConfig`` and its companions, with the 0.11 constructors and checks."""

from .constants import GQA, Layout

DTYPES = ("float32", "float16", "bfloat16")


class QuantizationConfig:
    """Weight-only quantization; 0.11 knows only int8 (``s8``) with ``vector_dynamic`` scaling."""

    def __init__(self, quant_dtype="s8", dequant_dtype="f16", quantize_method="vector_dynamic", quantize_attn=True):
        if quant_dtype not in ("s8",):
            raise NotImplementedError(f"{quant_dtype} is not implemented. Available options are s8")
        if quantize_method not in ("vector_dynamic",):
            raise NotImplementedError(f"{quantize_method} is not implemented. Available options are vector_dynamic")
        self.quant_dtype = quant_dtype
        self.dequant_dtype = dequant_dtype
        self.quantize_method = quantize_method
        self.quantize_attn = quantize_attn


class ContinuousBatchingConfig:
    """0.10/0.11 take only the number of shared KV-cache slots (later releases added more fields)."""

    def __init__(self, batch_size_for_shared_caches):
        self.batch_size_for_shared_caches = batch_size_for_shared_caches


class GenerationConfig:
    """On-device generation settings (recorded only: the stand-in samples on the host)."""

    def __init__(self, *, max_length=None, do_sample=False, top_k=50, top_p=1.0, top_p_min_tokens=1,
                 global_top_k=None, eos_token_id=None, temperature=1.0, dynamic=False, deterministic=False):
        self.__dict__.update(max_length=max_length, do_sample=do_sample, top_k=top_k, top_p=float(top_p),
                             top_p_min_tokens=top_p_min_tokens, global_top_k=global_top_k,
                             eos_token_id=eos_token_id, temperature=float(temperature), dynamic=dynamic,
                             deterministic=deterministic)


class NeuronConfig:
    """Keyword-only feature switches; an unknown keyword fails as in the real library."""

    def __init__(self, *, sparse_attn=None, quant=None, continuous_batching=None, attention_layout=Layout.HSB,
                 collectives_layout=Layout.HSB, cache_layout=Layout.SBH, padding_side="left",
                 group_query_attention=None, on_device_embedding=False, on_device_generation=None,
                 all_reduce_dtype=None, cast_logits_dtype="float32", fuse_qkv=False, qkv_tiling=False,
                 weight_tiling=False, log_softmax_scores=False, shard_over_sequence=False, output_all_logits=False,
                 attn_output_transposed=False, **kwargs):
        assert cast_logits_dtype in DTYPES, (
            f"The `cast_logits_dtype={cast_logits_dtype}` argument must be one of {list(DTYPES)}")
        assert padding_side in ("left", "right"), (
            f"The `padding_side={padding_side}` argument must be either 'left' or 'right'")
        assert not qkv_tiling or fuse_qkv, "QKV weight tiling is currently only supported when QKV fusion is enabled."
        self.lhs_aligned = padding_side == "right" or bool(kwargs.pop("use_2d_cache_ids", False))
        assert len(kwargs) == 0, f"Unexpected NeuronConfig keyword arguments: {kwargs}"
        self.sparse_attn = sparse_attn
        self.quant = quant
        self.continuous_batching = continuous_batching
        if continuous_batching:
            self.lhs_aligned = True
        # Layout(...) raises ValueError for a name the library does not know.
        self.attention_layout = Layout(attention_layout.value if isinstance(attention_layout, Layout)
                                       else attention_layout)
        self.collectives_layout = Layout(collectives_layout.value if isinstance(collectives_layout, Layout)
                                         else collectives_layout)
        self.cache_layout = Layout(cache_layout.value if isinstance(cache_layout, Layout) else cache_layout)
        self.padding_side = padding_side
        self.group_query_attention = None if group_query_attention is None else GQA(group_query_attention)
        self.on_device_embedding = on_device_embedding
        self.on_device_generation = on_device_generation
        self.all_reduce_dtype = all_reduce_dtype
        self.cast_logits_dtype = cast_logits_dtype
        self.fuse_qkv = fuse_qkv
        self.qkv_tiling = qkv_tiling
        self.weight_tiling = weight_tiling
        self.log_softmax_scores = log_softmax_scores
        self.shard_over_sequence = shard_over_sequence
        self.output_all_logits = output_all_logits
        self.attn_output_transposed = attn_output_transposed

    @property
    def use_2d_cache_ids(self):
        return self.lhs_aligned

    def describe(self):
        """The settings that shape compiled graphs, as plain data (the stand-in's graph hashes use it)."""
        quant = self.quant and {"dtype": self.quant.quant_dtype, "dequant": self.quant.dequant_dtype,
                                "attn": self.quant.quantize_attn}
        cb = self.continuous_batching and self.continuous_batching.batch_size_for_shared_caches
        gqa = self.group_query_attention and self.group_query_attention.value
        return {"quant": quant, "continuous_batching": cb, "gqa": gqa, "fuse_qkv": self.fuse_qkv,
                "layouts": [self.attention_layout.value, self.collectives_layout.value, self.cache_layout.value],
                "all_reduce_dtype": self.all_reduce_dtype, "cast_logits_dtype": self.cast_logits_dtype,
                "padding_side": self.padding_side}
