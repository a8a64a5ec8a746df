"""The transformers backend: ``AutoModelForCausalLM`` on CPU or CUDA (the G5 path).

Continuous batching runs through the model's own ``forward`` with a paged KV cache we own
(``paged_cache``: one pool of fixed-size blocks, a block table per sequence, prefix blocks shared).
Where the architecture and transformers allow (``packed_attention``), a step is one forward: every chunk
of the batch (decodes, prompts, prompt pieces, recomputes) packed into one row of tokens, so the weights
are read once per step. Elsewhere a step runs at most two forwards: every one-token chunk (decode)
together, then every longer chunk together, left-padded, with the model's own attention reading each
row's slots in position order under one custom 4-D mask. Either way each token's key is written to its
slot in the pool and the model's RoPE and projection code runs unchanged.

At load a self-check compares this path with the model's native cache on two prompts of different
lengths, one of them prefilled in two chunks. An architecture where they disagree (or that cannot take
a custom cache, such as GPT-2 on older transformers) falls back to ``NativeRunner``: one sequence at a
time with the model's own cache: slower, but exact for any causal LM.

torch and transformers are imported lazily; nothing here runs at import time.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from array import array
from pathlib import Path
from typing import Any, Sequence

from ...config import ConfigError, HandlerConfig
from ...default_dtype import cpu_flags
from ...dtypes import LONG
from ...model_config import resolve_dtype
from ...sequence import Chunk, SequenceState
from ..base import DeviceMemory, split_batch
from .cpu.compiled_linear import compile_linears
from .cpu.kernels import check_target, choose, set_threads, step_threads
from .cpu.memory import keep_freed_memory
from .cpu.decode_attention import decode_reader
from .cpu.onednn_linear import prepack_linears
from .lora import LoraRows, load_lora
from .output_projection import SLICE, split_output_projection
from .packed_attention import PACKED_ATTENTION, Packed, packed_attention, switch_attention
from .options import HfOptions
from .paged_cache import BlockManager, PoolPlan, make_paged_cache
from .plan import HfPlan, plan
from .quantize import model_bytes, quantize_weights
from ..rows import Rows
from ..sampler import HONOURED_FIELDS, select_tokens
from ...structured.admission import GrammarBudget
from ...structured.masks import GrammarMasks
from ..tokenizer import HFTokenizer
from .speculative import (SPECULATIVE_KEYS, DraftProposer, SpeculativeOptions, Speculator, check_draft_tokenizer,
                          load_draft_tokenizer)

logger = logging.getLogger(__name__)


def _version(module: Any) -> tuple[int, int]:
    major, minor = module.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def resolve_device(torch: Any, device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", device, "no CUDA device is visible to this worker; use auto or cpu")
    return device


def torch_dtype(torch: Any, dtype: str, device: str, flags: frozenset[str], model_dir: str, **source: Any) -> Any:
    """The torch dtype ``model_config.resolve_dtype`` names (it reads the stored dtype only for ``auto`` off the
    CPU); the choice and its reason are logged."""
    stored: dict[str, Any] = {}
    if dtype == "auto" and device != "cpu":
        from transformers import AutoConfig

        stored = AutoConfig.from_pretrained(model_dir, **source).to_dict()
    chosen = resolve_dtype(dtype, device, stored, flags)
    logger.info("dtype: %s (%s%s)", chosen.dtype, "auto: " if dtype == "auto" else "", chosen.reason)
    return getattr(torch, LONG[chosen.dtype])


def gguf_source(config: HandlerConfig, name: str | None) -> dict[str, str]:
    """``option.gguf_file``: a .gguf file in the model directory that transformers reads and dequantizes at load
    (so memory is that of full precision); ``{}`` when unset. Refused with the reason before any loading."""
    if not name:
        return {}
    path = Path(config.model_id) / name
    if not path.is_file():
        raise ConfigError("gguf_file", name, f"no such file in the model directory {config.model_id}")
    try:
        import gguf  # noqa: F401  (transformers reads GGUF with it)
    except ImportError:
        raise ConfigError("gguf_file", name, "reading GGUF needs the gguf and accelerate packages: "
                          "pip install 'lmi-handlers[gguf]'") from None
    return {"gguf_file": name}


class HFBackend:
    name = "hf"
    #: Constrained requests are sampled under their grammar's token masks (``structured/masks.py``).
    structured_output = True
    #: min_p, penalties, logit_bias and top_logprobs, applied by ``sampler.select_tokens``.
    request_fields = HONOURED_FIELDS

    def __init__(self, config: HandlerConfig, options: HfOptions, grammar: GrammarBudget = GrammarBudget()):
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a progress bar is noise in a server log
        self.torch = torch
        self.cpu_flags = cpu_flags()
        device = resolve_device(torch, config.device)
        #: torch's threads per step, set on the step's own thread (None off the CPU)
        self.threads = step_threads(torch, config.async_mode) if device == "cpu" else None
        if device == "cpu":
            kept = keep_freed_memory()
            logger.info("memory: freed blocks kept for reuse (%s)", "glibc malloc" if kept else "not glibc: unchanged")
            logger.info("torch threads: %d a step%s", self.threads,
                        ", 1 on the loading thread (the event loop's)" if config.async_mode else "")
        source = gguf_source(config, options.gguf_file)
        dtype = torch_dtype(torch, config.dtype, device, self.cpu_flags, config.model_id, **source)
        common: dict[str, Any] = {"trust_remote_code": config.trust_remote_code, **source}
        if config.properties.get("revision"):
            common["revision"] = str(config.properties["revision"])
        kernels = options.kernels
        name = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
        check_target(kernels, device, name)
        cpu_dtype = name if device == "cpu" else None
        # Built before the weights load: a machine without a compiler is refused in seconds, not after minutes.
        chosen = choose(torch, kernels, cpu_dtype=cpu_dtype, quantized=options.quantize is not None)
        self.cpu_kernels = chosen
        self.torch_attention_named = kernels.attention == "torch"
        self.decode_kernel = chosen.attention_kernel
        speculative = options.speculative
        tokenizer = AutoTokenizer.from_pretrained(config.model_id, **common)
        if speculative is not None and speculative.draft is not None:  # refused before any weights load
            check_draft_tokenizer(config.model_id, speculative.draft, tokenizer,
                                  load_draft_tokenizer(speculative.draft, trust_remote_code=config.trust_remote_code))
        kwargs = dict(common)
        kwargs["dtype" if _version(transformers) >= (4, 56) else "torch_dtype"] = dtype
        multi_gpu = device == "cuda" and (config.tensor_parallel_degree or torch.cuda.device_count()) > 1
        if multi_gpu:
            kwargs["device_map"] = "auto"  # layers spread over the visible GPUs (needs accelerate)
        elif device == "cuda" and _version(transformers) >= (5, 0):
            # Straight onto the GPU: no copy of the weights in host memory first (transformers 4 needs accelerate).
            kwargs["device_map"] = device
        model = AutoModelForCausalLM.from_pretrained(config.model_id, **kwargs).eval()
        if not multi_gpu:
            model.to(device)
        #: The logits' width: a logit_bias id beyond it is refused at admission (``job.py``).
        head = model.get_output_embeddings()
        self.vocab_size = int(head.weight.shape[0] if head is not None else model.config.vocab_size)
        self.quantized = self._quantize(model, options.quantize)
        if chosen.linear == "onednn":
            logger.info("linear layers: %d through oneDNN with prepacked weights", prepack_linears(torch, model))
        elif chosen.linear == "compiled":
            logger.info("linear layers: %d through the compiled kernel", compile_linears(torch, chosen.linear_kernel,
                                                                                       model))
        elif split_output_projection(torch, model):
            logger.info("output projection: %d vocabulary rows at a time", SLICE)
        self.model = model
        self.device = next(model.parameters()).device
        self.lora_rows = LoraRows(torch, self.device, next(model.parameters()).dtype)
        self.tokenizer = HFTokenizer(tokenizer, getattr(model, "generation_config", None))
        self.plan = self._plan(config, options)
        self.max_sequence_length = self.plan.max_sequence_length
        self.max_batch_size = self.plan.batch_size
        self.pool = self.plan.pool
        self.grammars = GrammarMasks(tokenizer, self.tokenizer.eos_ids, self.vocab_size, grammar)
        self._keep = _logits_keep_argument(model)
        self.cache_keyword = cache_keyword(model)
        self.runner = self._choose_runner()
        if self.decode_kernel is not None and getattr(self.runner, "decode_kernel", None) is None:
            # (under auto it is a choice among others, not a request: no warning)
            log = logger.warning if kernels.attention == "compiled" else logger.info
            log("option.cpu_attention_kernel=%s: the compiled kernel has no effect: it serves the packed step, which "
                "needs transformers >= 4.48 and a Llama-family model; attention runs on torch's operators",
                kernels.attention)
        self.speculator = self._speculate(config, speculative)
        logger.info("loaded %s on %s (%s), %s runner, up to %d tokens per sequence", config.model_id, self.device,
                    dtype, self.runner.name, self.max_sequence_length)

    @staticmethod
    def _quantize(model: Any, method: str | None) -> Any:
        if method is None:
            logger.info("weights: %.1f MiB", model_bytes(model) / 2**20)
            return None
        done = quantize_weights(model, method)
        logger.info("weights: %s on %d linear layers (%s kernel), %.1f MiB -> %.1f MiB", done.method, done.layers,
                    done.kernel, done.bytes_before / 2**20, done.bytes_after / 2**20)
        return done

    def _speculate(self, config: HandlerConfig, options: SpeculativeOptions | None) -> Speculator | None:
        if options is None:
            return None
        if not isinstance(self.runner, PagedRunner):
            logger.warning("speculative decoding runs on the paged KV cache, which %s cannot use: it is off",
                           type(self.model).__name__)
            return None
        draft = None
        if options.draft is not None:
            skip = SPECULATIVE_KEYS | {"quantize", "gguf_file", "enable_prefix_caching"}
            props = {k: v for k, v in config.properties.items() if k not in skip}
            if options.draft_quantize:
                props["quantize"] = options.draft_quantize
            model = HFBackend(dataclasses.replace(config, model_id=options.draft, properties=props),
                              HfOptions.from_properties(props))
            if not isinstance(model.runner, PagedRunner):
                raise ConfigError("speculative_draft_model", options.draft, "the draft's architecture cannot use "
                                  "the paged KV cache; pick a draft the target's runner supports, or [ngram]")
            draft = DraftProposer(model.runner, self.torch, model.max_sequence_length)
        self.runner.speculator = Speculator(self.torch, options, self.runner, draft)
        logger.info("speculative decoding: %s, up to %d tokens per step", self.runner.speculator.method,
                    options.length)
        return self.runner.speculator

    def load_adapter(self, spec: Any) -> Any:
        """A LoRA adapter's weights (``adapters.AdapterSpec``), checked against the model, ready for its rows."""
        with self.torch.inference_mode():
            weights = load_lora(self.torch, self.model, self.lora_rows, spec)
        logger.info("adapter %s: %d modules, %.1f MiB", spec.name, len(weights.modules), weights.bytes / 2**20)
        return weights

    def compile_grammar(self, constraint: Any) -> Any:
        """``constraint``'s matcher, compiled within the grammar budgets at admission (``structured/admission.py``)."""
        return self.grammars.compile(constraint)

    def speculation_stats(self) -> dict[str, Any]:
        """Draft tokens proposed and accepted so far, for the engine's stats line ({} without speculation)."""
        return self.speculator.stats() if self.speculator is not None else {}

    @property
    def kv(self) -> BlockManager | None:
        return self.runner.blocks if isinstance(self.runner, PagedRunner) else None

    @property
    def chunked_prefill(self) -> bool:
        return isinstance(self.runner, PagedRunner)

    def _plan(self, config: HandlerConfig, options: HfOptions) -> HfPlan:
        """The load plan (``plan.py``) over the loaded model's config and, on CUDA, the memory its weights left."""
        torch, memory = self.torch, DeviceMemory("cpu", cpu_flags=self.cpu_flags)
        if self.device.type == "cuda":
            memory = DeviceMemory("cuda", torch.cuda.get_device_properties(self.device).total_memory,
                                  torch.cuda.memory_allocated(self.device))
        # The dtype the weights loaded in: transformers versions differ in what to_dict() reports for it.
        model_config = {**self.model.config.to_dict(), "dtype": str(self.model.dtype).removeprefix("torch.")}
        loaded = plan(config, options, model_config, memory)
        pool = loaded.pool
        logger.info("KV cache: %d blocks of %d tokens (%d tokens), prefix caching %s", pool.num_blocks,
                    pool.block_size, pool.tokens, "on" if pool.prefix_caching else "off")
        return loaded

    def _choose_runner(self) -> "PagedRunner | NativeRunner":
        native = NativeRunner(self)
        packed = packed_attention(self.model) if self._keep == "logits_to_keep" else None  # it keeps logits by index
        for attention in filter(None, (packed, self.model.config._attn_implementation)):
            try:
                paged = PagedRunner(self, attention, self.pool)
                if paged.agrees_with(native):
                    return paged
                logger.warning("the paged KV cache (%s attention) disagrees with %s's own cache", attention,
                               type(self.model).__name__)
            except Exception:
                logger.warning("the paged KV cache (%s attention) does not fit %s", attention,
                               type(self.model).__name__, exc_info=True)
        logger.warning("using the one-sequence-at-a-time path for %s", type(self.model).__name__)
        return native

    def forward(self, input_ids: Any, last: int = 1, cache: Any = None, **kwargs: Any) -> Any:
        """Last-position logits, ``[rows, vocab]``; with ``last`` > 1 the last positions', ``[rows, last, vocab]``;
        and the cache after the forward."""
        if self._keep:
            kwargs[self._keep] = last
        out = self.model(input_ids=input_ids, use_cache=True, **{self.cache_keyword: cache}, **kwargs)
        return (out.logits[:, -1] if last == 1 else out.logits[:, -last:]), getattr(out, self.cache_keyword)

    def step(self, batch: Sequence[Chunk]) -> dict[int, tuple[int, float]]:
        # Set on the step loop's own thread: torch keeps a count per thread.
        if self.threads is not None:
            set_threads(self.torch, self.threads)
        with self.torch.inference_mode():
            return self.runner.step(batch)

    def release(self, seq: SequenceState) -> None:
        with self.torch.inference_mode():  # the cache buffers are inference tensors
            self.runner.release(seq)

    def reset(self) -> None:
        self.runner.reset()


def cache_keyword(model: Any) -> str:
    # transformers 5.24 renamed forward's past_key_values (and the output's) to cache; the old name goes in 5.40.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _logits_keep_argument(model: Any) -> str | None:
    names = inspect.signature(model.forward).parameters
    return next((n for n in ("logits_to_keep", "num_logits_to_keep") if n in names), None)


class NativeRunner:
    """One sequence at a time, each with the model's own cache object: works for any causal LM."""

    name = "native"

    def __init__(self, backend: HFBackend):
        self.backend = backend
        self.torch = backend.torch

    def logits_for(self, seq_ids: Sequence[int], state: Any = None) -> tuple[Any, Any]:
        ids = self.torch.tensor([list(seq_ids)], device=self.backend.device)
        return self.backend.forward(ids, cache=state)

    def step(self, batch: Sequence[Chunk]) -> dict[int, tuple[int, float]]:
        new, running = split_batch(batch)
        rows = Rows(new + running)
        logits = rows.each("forward", lambda row: self._forward(rows.seqs[row], row < len(new)))
        seqs = [rows.seqs[row] for row in logits]
        out: dict[int, Any] = rows.by_uid()
        if seqs:
            picked = select_tokens(self.torch, self.torch.cat(list(logits.values())), seqs, self.backend.grammars)
            out.update((seq.uid, choice) for seq, choice in zip(seqs, picked))
        return out

    def _forward(self, seq: SequenceState, new: bool) -> Any:
        """The sequence's next logits (its prompt's, or its last token's), with its adapter; its cache kept."""
        ids = seq.prompt_ids if new else seq.generated[-1:]
        with self.backend.lora_rows.select([seq.adapter], [len(ids)]):
            logits, seq.backend_state = self.logits_for(ids, None if new else seq.backend_state)
        return logits

    def release(self, seq: SequenceState) -> None:
        seq.backend_state = None

    def reset(self) -> None:
        pass


class PagedRunner:
    """Batched prefill and decode over the paged KV cache; see the module docstring."""

    name = "paged"

    def __init__(self, backend: HFBackend, attention: str, plan: PoolPlan):
        self.backend = backend
        self.torch = backend.torch
        self.packed = attention == PACKED_ATTENTION
        self.decode_kernel = backend.decode_kernel if self.packed else None
        # The exact path (packed_attention's docstring): torch's attention named, a 16-bit model on the CPU.
        self.decode_alone = backend.torch_attention_named and backend.device.type == "cpu" and \
            next(backend.model.parameters()).element_size() == 2
        self.blocks = BlockManager(plan)
        self.block_size = plan.block_size
        self.cache = make_paged_cache(self.torch, plan.tokens)
        self.max_position = backend.max_sequence_length - 1
        self.speculator: Speculator | None = None  # set by the backend with option.speculative_draft_model
        # Built once, sliced every step: the key positions attention may read, the offsets within a block, and
        # the mask's two values (a decode step of a small model is a few dozen tensor operations in all).
        device, dtype = backend.device, next(backend.model.parameters()).dtype
        self.key_positions = self.torch.arange(backend.max_sequence_length + 1, device=device)
        self.block_offsets = self.key_positions[:self.block_size]
        self.attend = self.torch.tensor(0.0, dtype=dtype, device=device)
        self.ignore = self.torch.tensor(self.torch.finfo(dtype).min, dtype=dtype, device=device)
        self.no_mask = self.attend.view(1, 1, 1, 1)  # a packed step's masks travel in ``Packed``

    def step(self, batch: Sequence[Chunk]) -> dict[int, Any]:
        decode = [c for c in batch if len(c.tokens) == 1]
        sampled = [c for c in decode if c.sample]  # (a one-token piece of a chunked prompt samples nothing)
        proposals = self.speculator.plan(sampled) if self.speculator is not None and sampled else {}
        seqs, rows, out = [], [], {}
        longer = [c for c in batch if len(c.tokens) > 1]
        if proposals:
            out = self._verify(decode, proposals, seqs, rows)
            batch, decode = longer, []
        # Packed: the whole batch in one forward. Padded: the decodes, then the longer chunks (padding every
        # decode to a prompt's width would cost more than reading the weights twice).
        for group in ([batch] if self.packed else [decode, longer]):
            if not group:
                continue
            began = time.perf_counter()
            # A forward that fails runs again chunk by chunk, so that a chunk whose adapter fails ends alone.
            isolated = Rows([chunk.seq for chunk in group])
            done, logits = isolated.batched("forward", lambda live: self._forward([group[i] for i in live]),
                                            self.torch.stack)
            out.update(isolated.by_uid())
            if self.speculator is not None and (group is decode or not longer):  # plain decode steps: the cost model
                self.speculator.cost.observe(len(group), time.perf_counter() - began)
            keep = [k for k, i in enumerate(done) if group[i].sample]
            if keep:
                rows.append(logits if len(keep) == len(done) else logits[self.torch.tensor(keep)])
                seqs += [group[done[k]].seq for k in keep]
        if seqs:
            picked = select_tokens(self.torch, rows[0] if len(rows) == 1 else self.torch.cat(rows), seqs,
                                   self.backend.grammars)
            out.update((seq.uid, choice) for seq, choice in zip(seqs, picked))
        return out

    def _verify(self, decode: Sequence[Chunk], proposals: dict[int, Any], seqs: list[SequenceState],
                rows: list[Any]) -> dict[int, Any]:
        """One forward for every decode row, each widened with its guesses (padded to the widest); the tokens the
        speculator keeps per guessing row; rows without guesses go to ``seqs``/``rows`` for ``select_tokens``."""
        decode = [Chunk(c.seq, c.start, [*c.tokens, *proposals[c.seq.uid].tokens]) if c.seq.uid in proposals
                  else c for c in decode]
        width = max(len(c.tokens) for c in decode)
        began = time.perf_counter()
        logits = self._forward(decode, last=width)
        out = {}
        for chunk, row in zip(decode, logits):
            if chunk.seq.uid in proposals:
                out[chunk.seq.uid] = self.speculator.verify(chunk.seq, row[width - len(chunk.tokens):],
                                                            proposals[chunk.seq.uid])
            elif chunk.sample:
                seqs.append(chunk.seq)
                rows.append(row[-1:])
        self.speculator.cost.observe(len(decode) * width, time.perf_counter() - began)
        return out

    def _forward(self, chunks: Sequence[Chunk], last: int = 1) -> Any:
        """Run ``chunks`` through the model, packed or left-padded to one width; each chunk's logits at its last
        position (``[rows, vocab]``), or at its last ``last`` positions (``[rows, last, vocab]``, padded)."""
        if self.packed and last == 1:
            return self._packed_forward(chunks)
        width = max(len(c.tokens) for c in chunks)
        ids, positions, write, read, mask = \
            self._decode_inputs(chunks) if width == 1 else self._chunk_inputs(chunks, width)
        self.cache.plan(write, read, read.shape[1] - width)
        with self.backend.lora_rows.select([c.seq.adapter for c in chunks], [width] * len(chunks)):
            logits, _ = self.backend.forward(ids, last, attention_mask=mask, cache=self.cache,
                                             position_ids=positions)
        return logits

    def _packed_forward(self, chunks: Sequence[Chunk]) -> Any:
        """One row of every chunk's tokens, one-token chunks first (``packed_attention``); logits in ``chunks``'
        order."""
        order = sorted(range(len(chunks)), key=lambda i: len(chunks[i].tokens) > 1)
        ordered = [chunks[i] for i in order]
        ids, positions, write, keep, packed = self._packed_inputs(ordered)
        self.cache.plan(write, None, 0)
        config = self.backend.model.config
        stock = switch_attention(config, PACKED_ATTENTION)
        try:
            cache = {self.backend.cache_keyword: self.cache}
            with self.backend.lora_rows.select([c.seq.adapter for c in ordered], [len(c.tokens) for c in ordered]):
                logits = self.backend.model(input_ids=ids, position_ids=positions, attention_mask=self.no_mask,
                                            **cache, use_cache=True, logits_to_keep=keep, lmi_packed=packed).logits[0]
        finally:
            switch_attention(config, stock)
        if order != sorted(order):
            logits = logits[self.torch.tensor(sorted(range(len(order)), key=order.__getitem__))]
        return logits

    def _ints(self, values: list[int]) -> Any:
        # Through array: torch.tensor converts a Python list element by element, several times slower. (Every
        # caller has at least one value: frombuffer refuses an empty buffer.)
        ints = self.torch.frombuffer(array("q", values), dtype=self.torch.int64)
        return ints if self.backend.device.type == "cpu" else ints.to(self.backend.device)

    def _tables(self, chunks: Sequence[Chunk], view: int, lead: Sequence[Sequence[int]] = ()) -> Any:
        """``[rows, blocks]``: each row's block table over the first ``view`` positions, zero-padded; with
        ``lead``, each row starts with its own ``lead`` columns (one conversion for all of a step's integers)."""
        blocks = -(-view // self.block_size)
        flat: list[int] = []
        for i, chunk in enumerate(chunks):
            table = self.blocks.table(chunk.seq)[:blocks]
            flat += [*(lead[i] if lead else ()), *table, *[0] * (blocks - len(table))]
        return self._ints(flat).view(len(chunks), -1)

    def _read_slots(self, table: Any, view: int, hidden: Any = None) -> Any:
        """``[rows, view]``: the pool slot of each position a row reads, the scratch slot where ``hidden``."""
        # Past the model's positions (only where a caller skipped job.py's token budget) the masks, sliced from
        # key_positions, stop at its end: so does the read.
        view = min(view, len(self.key_positions))
        read = (table[:, :, None] * self.block_size + self.block_offsets).view(len(table), -1)[:, :view]
        return read if hidden is None else read.masked_fill_(hidden, self.cache.scratch)

    def _decode_rows(self, chunks: Sequence[Chunk]) -> tuple[Any, int]:
        """One-token chunks as ``[rows, 3 + blocks]``: each row's token, position, write slot (that of its position)
        and block table; and the positions the widest row reads."""
        size = self.block_size
        meta = []
        for c in chunks:
            block = self.blocks.table(c.seq)[c.start // size]
            meta.append((c.tokens[0], min(c.start, self.max_position), block * size + c.start % size))
        view = max(c.end for c in chunks)
        return self._tables(chunks, view, meta), view

    def _decode_reads(self, rows: Any, view: int) -> tuple[Any, Any]:
        """What each row of ``_decode_rows`` reads up to its own position: slots ``[rows, view]`` and mask
        ``[rows, 1, view]``."""
        hidden = self.key_positions[:view] > rows[:, 1:2]  # [rows, view]: past the row's own token
        mask = self.torch.where(hidden, self.ignore, self.attend)[:, None]
        return self._read_slots(rows[:, 3:], view, hidden), mask

    def _decode_inputs(self, chunks: Sequence[Chunk]) -> tuple[Any, ...]:
        """Model inputs when every chunk is one token: a row writes the slot of its position and reads up to it."""
        rows, view = self._decode_rows(chunks)
        read, mask = self._decode_reads(rows, view)
        return rows[:, :1], rows[:, 1:2], rows[:, 2], read, mask[:, None]

    def _packed_inputs(self, chunks: Sequence[Chunk]) -> tuple[Any, ...]:
        """Model inputs for one packed row: ids and positions ``[1, tokens]``, write slots ``[tokens]``, the row
        index of each chunk's last token, and ``Packed``; ``chunks`` has its one-token chunks first."""
        torch = self.torch
        rows = sum(1 for c in chunks if len(c.tokens) == 1)
        ids, positions, write, keep, pieces = [], [], [], list(range(rows)), []
        decode_read = decode_mask = decode_attend = None
        if rows:
            table, view = self._decode_rows(chunks[:rows])
            ids.append(table[:, 0])
            positions.append(table[:, 1])
            write.append(table[:, 2])
            if self.decode_kernel is None:
                decode_read, decode_mask = self._decode_reads(table, view)
            else:  # a row reads its positions up to its own: as many as its position plus one
                decode_attend = decode_reader(self.decode_kernel, table[:, 3:], table[:, 1] + 1, self.block_size)
        offset = rows
        for chunk in chunks[rows:]:
            read = self._read_slots(self._tables([chunk], chunk.end), chunk.end)[0]
            position = self.key_positions[chunk.start:chunk.end]
            visible = self.key_positions[:chunk.end] <= position[:, None]
            pieces.append((offset, len(chunk.tokens), read, torch.where(visible, self.attend, self.ignore)[None, None]))
            positions.append(position.clamp(max=self.max_position))
            write.append(read[chunk.start:])
            offset += len(chunk.tokens)
            keep.append(offset - 1)
        if rows < len(chunks):
            ids.append(self._ints([t for c in chunks[rows:] for t in c.tokens]))
        cat = lambda parts: parts[0] if len(parts) == 1 else torch.cat(parts)  # noqa: E731
        alone = tuple(min(c.start, self.max_position) + 1 for c in chunks[:rows]) if self.decode_alone else ()
        packed = Packed(rows, decode_read, decode_mask, tuple(pieces), decode_attend, alone)
        return cat(ids)[None], cat(positions)[None], cat(write), self._ints(keep), packed

    def _chunk_inputs(self, chunks: Sequence[Chunk], width: int) -> tuple[Any, ...]:
        """Model inputs for chunks of several tokens, left-padded to ``width``; padding writes to the scratch slot."""
        torch, device = self.torch, self.backend.device
        pad = self.backend.tokenizer.pad_id
        ids = torch.tensor([[pad] * (width - len(c.tokens)) + list(c.tokens) for c in chunks], device=device)
        view = max(c.end for c in chunks)  # positions attention reads
        meta = torch.tensor([[c.start, len(c.tokens)] for c in chunks], device=device)
        starts, lengths = meta[:, :1], meta[:, 1:]
        keys = self.key_positions[:view]
        read = self._read_slots(self._tables(chunks, view), view, keys >= starts + lengths)
        # Query column j of a row holds position start + j - (width - length); the first width - length
        # columns are padding, which writes to the scratch slot.
        columns = self.key_positions[:width]
        positions = starts + columns - (width - lengths)
        padding = columns < width - lengths
        write = read.gather(1, positions.clamp(min=0)).masked_fill(padding, self.cache.scratch)
        visible = keys[None, None, :] <= positions[:, :, None]
        mask = torch.where(visible, self.attend, self.ignore)[:, None]
        return ids, positions.clamp(0, self.max_position), write.flatten(), read, mask

    def release(self, seq: SequenceState) -> None:
        self.blocks.release(seq)
        if self.speculator is not None:
            self.speculator.release(seq)

    def reset(self) -> None:
        self.blocks.reset()
        if self.speculator is not None:
            self.speculator.reset()

    # --- load-time self-check ---------------------------------------------------------------

    def agrees_with(self, native: NativeRunner) -> bool:
        """Two prompts of different lengths, the longer prefilled in two chunks, then decoded twice, against
        the model's own cache one prompt at a time."""
        from ...request import GenerationRequest, SamplingParams, Schema, StoppingParams

        vocab = int(self.backend.model.get_input_embeddings().weight.shape[0])
        prompts = [[(7 * i + 3) % vocab for i in range(1, 9)], [(11 * i + 5) % vocab for i in range(1, 5)]]
        request = GenerationRequest(Schema.LMI, "probe", SamplingParams(), StoppingParams(max_new_tokens=3))
        seqs = [SequenceState(request, p, decode=lambda ids: "") for p in prompts]
        expected = []
        with self.torch.inference_mode():
            for prompt in prompts:
                logits, state = native.logits_for(prompt)
                rows = [logits]
                for _ in range(2):
                    logits, state = native.logits_for([int(rows[-1].argmax())], state)
                    rows.append(logits)
                expected.append(rows)
            try:
                for seq in seqs:
                    self.blocks.admit(seq)
                first = self._forward([Chunk(seqs[0], 0, prompts[0][:5]), Chunk(seqs[1], 0, prompts[1])])
                rest = self._forward([Chunk(seqs[0], 5, prompts[0][5:])])
                got = [self.torch.stack([rest[0], first[1]])]
                for _ in range(2):
                    for seq, row in zip(seqs, got[-1]):
                        seq.generated.append(int(row.argmax()))
                        self.blocks.grow(seq, seq.length)
                    got.append(self._forward([Chunk(s, s.length - 1, s.generated[-1:]) for s in seqs]))
            finally:
                self.reset()
        # A wrong position, mask or slot moves logits by about their own size. Rounding moves them by a share of the
        # largest that grows with the depth and the dtype's precision (bf16 keeps 8 bits; the margins measured are in
        # docs/gpu.md), so 16-bit types get 16 of their epsilons (bf16: 12.5%).
        relative = max(0.02, 16 * self.torch.finfo(self.attend.dtype).eps)
        worst = 0.0  # the largest logit difference, as a share of the one allowed
        for step, rows in enumerate(got):
            for i, row in enumerate(rows):
                want = expected[i][step]
                allowed = 1e-3 + relative * float(want.abs().max())
                worst = max(worst, float((row - want).abs().max()) / allowed)
        logger.info("paged KV cache self-check: largest logit difference from the model's own cache %.2f of the "
                    "allowed", worst)
        return worst <= 1.0
