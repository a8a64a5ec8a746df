"""The paged KV cache of the transformers backend: one pool of fixed-size blocks shared by every sequence.

``BlockManager`` (plain Python) hands out blocks: each sequence has a block table (its blocks in order),
admission takes the blocks a prompt needs or waits, decoding adds a block whenever a sequence crosses a
block boundary, and release gives blocks back. With prefix caching on, full blocks are also keyed by
their content (``prefix_cache``) and shared between sequences by reference count. The choices of one request
(``n`` > 1) share their prompt's full blocks by reference count with or without it: the first choice prefills the
prompt, the others then compute only its last partial block (``shareable``, ``_forked``), as a prefix hit would.

``PagedKVCache`` (a transformers ``Cache``) holds the pool itself: per layer, keys and values as
``[kv_heads, slots, head_dim]`` where slot = block * block_size + offset, plus one scratch slot that
padding writes to and reads from. Before each forward ``plan`` says which slot each new token writes
and which slots each row reads, in position order; ``update`` writes, then gathers ``[rows, kv_heads,
positions, head_dim]`` for attention, so the model's own attention code runs unchanged. A packed step
(``packed_attention.py``) plans no reads: ``update`` returns the layer's pool and the packed attention
gathers each chunk's slots itself. Heads come first in the pool so that a gather is ``[kv_heads, rows,
positions, head_dim]`` in memory: the packed attention's decode rows multiply it as it lies, without a copy
per layer and step.

Pool size (the names LMI and vLLM users know): ``option.num_gpu_blocks_override`` (blocks), else
``option.kv_cache_memory_bytes``, else on CUDA ``option.gpu_memory_utilization`` of the device's memory
minus what the weights already hold, else on CPU the memory a contiguous cache would reserve for
``max_rolling_batch_size`` full-length sequences, at most ``CPU_DEFAULT_BYTES``. ``option.block_size``
tokens per block (16, as in vLLM).

With ``option.kv_events_config`` the prefix cache's changes go out as vLLM's KV events (``events``,
``lmi_handlers/kv_events.py``): each sequence then also carries its chain of vLLM block hashes.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Mapping

from ...config import ConfigError, parse_bool, parse_float, parse_int
from ...sequence import SequenceState
from .prefix_cache import PrefixCache, block_key, root_key

POOL_KEYS = frozenset({"block_size", "num_gpu_blocks_override", "kv_cache_memory_bytes", "gpu_memory_utilization",
                       "enable_prefix_caching"})
CPU_DEFAULT_BYTES = 4 << 30


@dataclass(frozen=True)
class PoolOptions:
    """The pool's options as written (None: not set)."""

    block_size: int = 16
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = False

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> "PoolOptions":
        return cls(block_size=parse_int(props, "block_size", 16, maximum=1024) or 16,
                   num_gpu_blocks_override=parse_int(props, "num_gpu_blocks_override", None),
                   kv_cache_memory_bytes=parse_int(props, "kv_cache_memory_bytes", None),
                   gpu_memory_utilization=parse_float(props, "gpu_memory_utilization", 0.9, 0.0, 1.0),
                   enable_prefix_caching=parse_bool(props, "enable_prefix_caching", False))


@dataclass(frozen=True)
class PoolPlan:
    num_blocks: int
    block_size: int
    prefix_caching: bool

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.block_size


def plan_pool(options: PoolOptions, *, bytes_per_token: int, max_batch_size: int, max_sequence_length: int,
              cuda_memory: tuple[int, int] | None = None) -> PoolPlan:
    """How many blocks of how many tokens; ``cuda_memory`` is (device total, bytes already in use)."""
    block_size = options.block_size
    block_bytes = bytes_per_token * block_size
    per_sequence = math.ceil(max_sequence_length / block_size)
    enough = per_sequence * max_batch_size  # every row at full length: more blocks could never be used
    budget, left = options.kv_cache_memory_bytes, ""
    if budget is None and cuda_memory is not None:
        total, used = cuda_memory
        budget = int(total * options.gpu_memory_utilization) - used
        left = f" ({options.gpu_memory_utilization:g} of the device's {total} bytes, less {used} for the weights)"
    blocks = options.num_gpu_blocks_override
    if blocks is None:
        blocks = min(enough, (budget if budget is not None else CPU_DEFAULT_BYTES) // block_bytes)
    if blocks < per_sequence:
        source = next((k for k in ("num_gpu_blocks_override", "kv_cache_memory_bytes")
                       if getattr(options, k) is not None), "gpu_memory_utilization")
        raise ConfigError(source, getattr(options, source),
                          f"the KV cache must hold at least one full-length sequence ({max_sequence_length} tokens = "
                          f"{per_sequence} blocks of {block_size}, {per_sequence * block_bytes} bytes) but this gives "
                          f"{max(blocks, 0)} blocks{left if source == 'gpu_memory_utilization' else ''}; raise it "
                          "or lower option.max_model_len")
    return PoolPlan(blocks, block_size, options.enable_prefix_caching)


class BlockManager:
    """Block tables, reference counts and the free list of one pool (see the module docstring)."""

    def __init__(self, plan: PoolPlan):
        self.block_size = plan.block_size
        self.num_blocks = plan.num_blocks
        self.free = list(range(plan.num_blocks - 1, -1, -1))  # a stack: reuse warm blocks first
        self.refs = [0] * plan.num_blocks
        self.prefix = PrefixCache() if plan.prefix_caching else None
        self.tables: dict[int, list[int]] = {}
        # uid -> (blocks registered, key of the last one, its vLLM hash when events are on)
        self._keyed: dict[int, tuple[int, Any, bytes | None]] = {}
        self.prompt_tokens = 0
        self.hit_tokens = 0
        #: The KV events publisher (``kv_events.KVEvents``), when ``option.kv_events_config`` turns them on.
        self.events: Any = None

    @property
    def available(self) -> int:
        return len(self.free) + (len(self.prefix) if self.prefix is not None else 0)

    @property
    def used(self) -> int:
        return self.num_blocks - self.available

    def table(self, seq: SequenceState) -> list[int]:
        return self.tables[seq.uid]

    def admit(self, seq: SequenceState) -> int | None:
        """Blocks for the whole of ``seq.all_ids`` plus its next token; returns how many leading tokens are
        already in the cache (prefix hits), or None when the pool cannot hold it now (it waits)."""
        tokens = seq.all_ids
        # The last token is always computed: its logits choose the next one.
        root = root_key(seq.adapter)
        hits = self.prefix.match(tokens[:-1], self.block_size, root) if self.prefix is not None else self._forked(seq)
        parked = sum(1 for block in hits if self.refs[block] == 0)
        needed = math.ceil((len(tokens) + 1) / self.block_size) - len(hits)
        if needed > self.available - parked:
            return None
        for block in hits:
            if self.refs[block] == 0:  # (a parked block: only prefix caching parks)
                self.prefix.take(block)
            self.refs[block] += 1
        self.tables[seq.uid] = hits + [self._allocate() for _ in range(needed)]
        if self.prefix is not None:
            digest = self.events.hash_of.get(hits[-1]) if hits and self.events is not None else None
            self._keyed[seq.uid] = (len(hits), self.prefix.key_of[hits[-1]] if hits else root, digest)
            self.prompt_tokens += len(tokens)
            self.hit_tokens += len(hits) * self.block_size
        return len(hits) * self.block_size

    def shareable(self, seq: SequenceState) -> int:
        """Tokens of ``seq``'s prompt another choice of its request can share: its full blocks before the last
        prompt token (which is computed again, for its logits)."""
        return (len(seq.prompt_ids) - 1) // self.block_size * self.block_size

    def _forked(self, seq: SequenceState) -> list[int]:
        """The blocks ``seq`` shares with ``seq.fork_of`` (the same prompt): the full ones the source has computed.
        Read-only for both: each writes its later positions to blocks of its own (prefix caching shares the same
        blocks through its keys)."""
        source = seq.fork_of
        table = self.tables.get(source.uid) if source is not None else None
        if table is None:
            return []
        return table[:min(source.num_cached, self.shareable(seq)) // self.block_size]

    def grow(self, seq: SequenceState, tokens: int) -> bool:
        """Room for ``tokens`` tokens in ``seq``'s table; False when the pool ran dry."""
        table = self.tables[seq.uid]
        while len(table) * self.block_size < tokens:
            if not self.available:
                return False
            table.append(self._allocate())
        return True

    def computed(self, seq: SequenceState) -> None:
        """``seq.num_cached`` tokens are now in the cache: key the full blocks among them for reuse."""
        if self.prefix is None:
            return
        done, key, digest = self._keyed[seq.uid]
        full = seq.num_cached // self.block_size
        if full <= done:
            return
        tokens, table = seq.all_ids, self.tables[seq.uid]
        for index in range(done, full):
            block_tokens = tokens[index * self.block_size:(index + 1) * self.block_size]
            key = block_key(key, block_tokens)
            added = self.prefix.add(key, table[index])
            if self.events is not None:
                parent, digest = digest, self.events.hash(digest, block_tokens, seq.adapter)
                if added:
                    self.events.stored(table[index], digest, parent, block_tokens, seq.adapter)
        self._keyed[seq.uid] = (full, key, digest)

    def release(self, seq: SequenceState) -> None:
        self._keyed.pop(seq.uid, None)
        for block in self.tables.pop(seq.uid, ()):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                if self.prefix is not None and self.prefix.holds(block):
                    self.prefix.park(block)
                else:
                    self.free.append(block)

    def reset(self) -> None:
        """Forget every table and every cached prefix (after a failed step the pool's content is suspect)."""
        events = self.events
        self.__init__(PoolPlan(self.num_blocks, self.block_size, self.prefix is not None))
        self.events = events
        if events is not None:
            events.cleared()

    def _allocate(self) -> int:
        if self.free:
            block = self.free.pop()
        else:
            block = self.prefix.evict()
            if self.events is not None:
                self.events.removed(block)
        self.refs[block] = 1
        return block

    def stats(self) -> dict[str, Any]:
        out = {"kv_blocks_total": self.num_blocks, "kv_blocks_used": self.used, "kv_blocks_free": self.available,
               "kv_block_size": self.block_size}
        if self.prefix is not None:
            out.update(prefix_cache_hit_tokens=self.hit_tokens, prefix_cache_prompt_tokens=self.prompt_tokens,
                       prefix_cache_hit_rate=round(self.hit_tokens / self.prompt_tokens, 4) if self.prompt_tokens else 0.0)
        return out


_cache_class: Any = None


def make_paged_cache(torch: Any, num_slots: int) -> Any:
    """A ``PagedKVCache`` over ``num_slots`` token slots; the class subclasses transformers' ``Cache``."""
    global _cache_class
    if _cache_class is None:
        _cache_class = _build_cache_class(torch)
    return _cache_class(num_slots)


def _build_cache_class(torch: Any) -> Any:
    from transformers.cache_utils import Cache

    takes_layers = "layers" in inspect.signature(Cache.__init__).parameters

    class PagedKVCache(Cache):
        def __init__(self, num_slots: int) -> None:
            if takes_layers:
                super().__init__(layers=[])
            else:
                super().__init__()
            self.num_slots = num_slots
            self.scratch = num_slots  # the extra slot padding writes to and reads from
            self.keys: list[Any] = []
            self.values: list[Any] = []
            self._write: Any = None
            self._read: Any = None
            self._past = 0

        def plan(self, write: Any, read: Any, past: int) -> None:
            """``write``: [tokens] slot per new token, row-major; ``read``: [rows, positions] slots, or None
            for a packed step; ``past``: positions before this forward's first query (what the model asks
            for masks)."""
            self._write, self._read, self._past = write, read, past

        def update(self, key_states: Any, value_states: Any, layer_idx: int, cache_kwargs: Any = None,
                   *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            while len(self.keys) <= layer_idx:
                self.keys.append(None)
                self.values.append(None)
            if self.keys[layer_idx] is None:
                # torch.empty commits no memory until a block is first written; only scratch must be finite.
                shape = (key_states.shape[1], self.num_slots + 1, key_states.shape[3])
                for pool in (self.keys, self.values):
                    pool[layer_idx] = torch.empty(shape, dtype=key_states.dtype, device=key_states.device)
                    pool[layer_idx][:, self.scratch].zero_()
            keys, values = self.keys[layer_idx], self.values[layer_idx]
            heads, dim = key_states.shape[1], key_states.shape[3]
            # index_copy_/index_select rather than keys[slots]: the general indexing kernel gathers
            # [rows, positions] slots several times slower on CPU (benchmarks/engine.py decode).
            keys.index_copy_(1, self._write, key_states.transpose(0, 1).reshape(heads, -1, dim))
            values.index_copy_(1, self._write, value_states.transpose(0, 1).reshape(heads, -1, dim))
            if self._read is None:
                return keys, values
            shape = (heads, *self._read.shape, dim)
            flat = self._read.flatten()
            return (keys.index_select(1, flat).view(shape).transpose(0, 1),
                    values.index_select(1, flat).view(shape).transpose(0, 1))

        def get_seq_length(self, layer_idx: int | None = 0) -> int:
            return self._past

        def get_max_length(self) -> Any:
            return None

        def get_max_cache_shape(self, layer_idx: int = 0) -> Any:
            return -1

        def get_mask_sizes(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
            return (self._read.shape[1] if self._read is not None else self._past), 0

        def __len__(self) -> int:
            return len(self.keys)

    return PagedKVCache
