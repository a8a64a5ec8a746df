"""The transformers backend: ``AutoModelForCausalLM`` on CPU or CUDA (the G5 path).

Continuous batching runs through the model's own ``forward`` with a KV cache we own
(``SlotCache``, a ``transformers`` ``Cache``): every active sequence has a row, rows stay packed at
the top of preallocated buffers, and each row keeps its own length, so sequences join and leave at
any step without touching the others. New prompts are prefilled together, left-padded, and their
keys written straight into their rows; each decode step writes one column per row. Attention sees
one custom 4-D mask, so the model's attention and RoPE code runs unchanged.

At load a self-check compares this path with the model's native cache on two prompts of different
lengths. An architecture where they disagree (or that cannot take a custom cache, such as GPT-2
on older transformers) falls back to ``NativeRunner``: one sequence at a time with the model's own
cache: slower, but exact for any causal LM.

torch and transformers are imported lazily; nothing here runs at import time.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Sequence

from ..config import ConfigError, HandlerConfig
from ..errors import InvalidRequest
from ..sequence import SequenceState
from .quantize import model_bytes, parse_method, quantize_weights
from .sampling import select_tokens
from .slot_cache import grouped_decode_attention, make_slot_cache

logger = logging.getLogger(__name__)


class HFTokenizer:
    """The small tokenizer surface the runtime needs, over a transformers tokenizer."""

    def __init__(self, tokenizer: Any, generation_config: Any = None):
        self.hf = tokenizer
        eos = set()
        for source in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
            if isinstance(source, int):
                eos.add(source)
            elif source:
                eos.update(int(i) for i in source)
        self.eos_ids = frozenset(eos)
        self.special_ids = frozenset(tokenizer.all_special_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos, default=0)

    def encode(self, text: str) -> list[int]:
        return list(self.hf(text, add_special_tokens=True)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def render_chat(self, messages: Sequence[tuple[str, str]]) -> str:
        if not getattr(self.hf, "chat_template", None):
            raise InvalidRequest("messages: this model's tokenizer has no chat template; send the LMI schema "
                                 '({"inputs": ...}) instead', field="messages")
        return self.hf.apply_chat_template([{"role": r, "content": c} for r, c in messages],
                                           tokenize=False, add_generation_prompt=True)

    def encode_chat(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        return list(self.hf(self.render_chat(messages), add_special_tokens=False)["input_ids"])


def _version(module: Any) -> tuple[int, int]:
    major, minor = module.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def resolve_device(torch: Any, device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", device, "no CUDA device is visible to this worker; use auto or cpu")
    return device


def resolve_dtype(torch: Any, dtype: str, device: str, model_dir: str) -> Any:
    if dtype == "auto":
        if device == "cpu":
            return torch.float32
        from transformers import AutoConfig

        stored = getattr(AutoConfig.from_pretrained(model_dir), "torch_dtype", None)
        return stored if stored in (torch.float16, torch.bfloat16) else torch.float16
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]


def model_max_positions(model_config: Any) -> int:
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(model_config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


class HFBackend:
    name = "hf"
    option_keys = frozenset({"quantize"})

    def __init__(self, config: HandlerConfig):
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a progress bar is noise in a server log
        self.torch = torch
        device = resolve_device(torch, config.device)
        dtype = resolve_dtype(torch, config.dtype, device, config.model_id)
        common = {"trust_remote_code": config.trust_remote_code}
        if config.properties.get("revision"):
            common["revision"] = str(config.properties["revision"])
        tokenizer = AutoTokenizer.from_pretrained(config.model_id, **common)
        kwargs = dict(common)
        kwargs["dtype" if _version(transformers) >= (4, 56) else "torch_dtype"] = dtype
        multi_gpu = device == "cuda" and (config.tensor_parallel_degree or torch.cuda.device_count()) > 1
        if multi_gpu:
            kwargs["device_map"] = "auto"  # layers spread over the visible GPUs (needs accelerate)
        model = AutoModelForCausalLM.from_pretrained(config.model_id, **kwargs).eval()
        if not multi_gpu:
            model.to(device)
        self.quantized = self._quantize(model, parse_method(config.properties.get("quantize")))
        self.model = model
        self.device = next(model.parameters()).device
        self.tokenizer = HFTokenizer(tokenizer, getattr(model, "generation_config", None))
        self.max_sequence_length = model_max_positions(model.config)
        if config.max_model_len:
            self.max_sequence_length = min(self.max_sequence_length, config.max_model_len)
        self.max_batch_size = max(config.max_rolling_batch_size, config.batch_size)
        self._keep = _logits_keep_argument(model)
        self.runner = self._choose_runner()
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

    def _choose_runner(self) -> "SlotRunner | NativeRunner":
        window = getattr(self.model.config, "sliding_window", None)
        if isinstance(window, int) and 0 < window < self.max_sequence_length:
            # The custom mask is a full causal one: stay within the window so they agree.
            self.max_sequence_length = window
        native = NativeRunner(self)
        for attention in filter(None, (grouped_decode_attention(self.model), self.model.config._attn_implementation)):
            try:
                slots = SlotRunner(self, attention)
                if slots.agrees_with(native):
                    return slots
                logger.warning("the batched slot cache (%s attention) disagrees with %s's own cache", attention,
                               type(self.model).__name__)
            except Exception:
                logger.warning("the batched slot cache (%s attention) does not fit %s", attention,
                               type(self.model).__name__, exc_info=True)
        logger.warning("using the one-sequence-at-a-time path for %s", type(self.model).__name__)
        return native

    def forward(self, input_ids: Any, **kwargs: Any) -> Any:
        """Last-position logits, ``[rows, vocab]``."""
        if self._keep:
            kwargs[self._keep] = 1
        out = self.model(input_ids=input_ids, use_cache=True, **kwargs)
        return out.logits[:, -1], out.past_key_values

    def step(self, new: Sequence[SequenceState], running: Sequence[SequenceState]) -> dict[int, tuple[int, float]]:
        with self.torch.inference_mode():
            return self.runner.step(new, running)

    def release(self, seq: SequenceState) -> None:
        with self.torch.inference_mode():  # the cache buffers are inference tensors
            self.runner.release(seq)

    def reset(self) -> None:
        self.runner.reset()


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
        return self.backend.forward(ids, past_key_values=state)

    def step(self, new: Sequence[SequenceState], running: Sequence[SequenceState]) -> dict[int, tuple[int, float]]:
        seqs, rows = [], []
        for seq in new:
            logits, seq.backend_state = self.logits_for(seq.prompt_ids)
            seqs.append(seq)
            rows.append(logits)
        for seq in running:
            logits, seq.backend_state = self.logits_for(seq.generated[-1:], seq.backend_state)
            seqs.append(seq)
            rows.append(logits)
        if not seqs:
            return {}
        picked = select_tokens(self.torch, self.torch.cat(rows), seqs)
        return {seq.uid: choice for seq, choice in zip(seqs, picked)}

    def release(self, seq: SequenceState) -> None:
        seq.backend_state = None

    def reset(self) -> None:
        pass


class _Slot:
    __slots__ = ("row", "start", "length")

    def __init__(self, row: int, start: int, length: int):
        self.row, self.start, self.length = row, start, length


class SlotRunner:
    """Batched prefill and decode over ``SlotCache``; see the module docstring."""

    name = "slots"

    def __init__(self, backend: HFBackend, decode_attention: str):
        self.backend = backend
        self.torch = backend.torch
        self.decode_attention = decode_attention
        self.cache = make_slot_cache(self.torch, backend.max_batch_size, backend.max_sequence_length)
        self.rows: list[SequenceState] = []  # rows[i] occupies cache row i
        self.neg = self.torch.finfo(next(backend.model.parameters()).dtype).min

    # --- one step ---------------------------------------------------------------------------

    def step(self, new: Sequence[SequenceState], running: Sequence[SequenceState]) -> dict[int, tuple[int, float]]:
        picked: dict[int, tuple[int, float]] = {}
        if running:
            decoding = list(self.rows)
            picked.update(zip((s.uid for s in decoding), select_tokens(self.torch, self._decode(), decoding)))
        if new:
            seqs = list(new)
            picked.update(zip((s.uid for s in seqs), select_tokens(self.torch, self._prefill(seqs), seqs)))
        return picked

    def _prefill(self, seqs: list[SequenceState]) -> Any:
        """Give ``seqs`` the next rows and run their prompts, left-padded to one width."""
        torch, device = self.torch, self.backend.device
        width = max(len(s.prompt_ids) for s in seqs)
        first = len(self.rows)
        ids = torch.full((len(seqs), width), self.backend.tokenizer.pad_id, dtype=torch.long)
        starts = []
        for i, seq in enumerate(seqs):
            start = width - len(seq.prompt_ids)
            ids[i, start:] = torch.tensor(seq.prompt_ids)
            seq.backend_state = _Slot(first + i, start, len(seq.prompt_ids))
            self.rows.append(seq)
            starts.append(start)
        start_t = torch.tensor(starts, device=device)[:, None]
        cols = torch.arange(width, device=device)
        positions = (cols[None, :] - start_t).clamp(min=0)
        # Row i, query q may see key c when start_i <= c <= q.
        visible = (cols[None, None, :] >= start_t[:, :, None]) & (cols[None, None, :] <= cols[None, :, None])
        self.cache.plan(first, first + len(seqs), width, columns=None, view=width)
        logits, _ = self.backend.forward(ids.to(device), attention_mask=self._additive(visible),
                                         position_ids=positions, past_key_values=self.cache)
        return logits

    def _decode(self) -> Any:
        """Feed every row its last generated token, each at its own next column."""
        torch, device = self.torch, self.backend.device
        slots = [seq.backend_state for seq in self.rows]
        ids = torch.tensor([[seq.generated[-1]] for seq in self.rows], device=device)
        starts = torch.tensor([s.start for s in slots], device=device)
        lengths = torch.tensor([s.length for s in slots], device=device)
        write = starts + lengths
        view = int(write.max()) + 1
        cols = torch.arange(view, device=device)
        visible = (cols[None, :] >= starts[:, None]) & (cols[None, :] <= write[:, None])
        self.cache.plan(0, len(self.rows), view, columns=write, view=view)
        config = self.backend.model.config
        stock, config._attn_implementation = config._attn_implementation, self.decode_attention
        try:
            logits, _ = self.backend.forward(ids, attention_mask=self._additive(visible[:, None, :]),
                                             position_ids=lengths[:, None], past_key_values=self.cache)
        finally:
            config._attn_implementation = stock
        for slot in slots:
            slot.length += 1
        return logits

    def _additive(self, visible: Any) -> Any:
        """[rows, q, k] booleans -> the [rows, 1, q, k] additive mask every attention path accepts."""
        dtype = next(self.backend.model.parameters()).dtype
        zero = self.torch.zeros((), dtype=dtype, device=visible.device)
        return self.torch.where(visible, zero, self.torch.tensor(self.neg, dtype=dtype,
                                                                  device=visible.device))[:, None]

    # --- slots ------------------------------------------------------------------------------

    def release(self, seq: SequenceState) -> None:
        slot = seq.backend_state
        if slot is None or slot.row >= len(self.rows) or self.rows[slot.row] is not seq:
            return
        last = self.rows.pop()
        if last is not seq:  # keep rows packed: the last row moves into the freed one
            moved = last.backend_state
            self.cache.move_row(moved.row, slot.row, moved.start + moved.length)
            moved.row = slot.row
            self.rows[slot.row] = last
        seq.backend_state = None

    def reset(self) -> None:
        for seq in self.rows:
            seq.backend_state = None
        self.rows = []

    # --- load-time self-check ---------------------------------------------------------------

    def agrees_with(self, native: NativeRunner) -> bool:
        """Two prompts of different lengths, prefilled together then decoded twice, against the
        model's own cache one prompt at a time."""
        from ..request import GenerationRequest, SamplingParams, Schema, StoppingParams

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
            got = [self._prefill(seqs)]
            for _ in range(2):
                for seq, row in zip(self.rows, got[-1]):
                    seq.generated.append(int(row.argmax()))
                got.append(self._decode())
        self.reset()
        for step, rows in enumerate(got):
            for i, row in enumerate(rows):
                want = expected[i][step]
                tolerance = 1e-3 + 0.02 * float(want.abs().max())
                if float((row - want).abs().max()) > tolerance:
                    return False
        return True
