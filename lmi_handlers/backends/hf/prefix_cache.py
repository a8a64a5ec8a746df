"""Prefix caching: full KV blocks keyed by their token content, shared between sequences.

A block is keyed by its own tokens and the key of the block before it, so a key names the whole prefix
up to the block's end. A sequence with a LoRA adapter starts its chain from the adapter's own root
(``root_key``): keys and values computed under one adapter never serve another, nor the base model. ``match`` finds the longest run of cached blocks at the start of a prompt. Blocks
nobody uses any more stay cached (``park``) until the pool needs them back, least recently used first
(``evict``). Reference counts live in the block manager (``paged_cache.BlockManager``); this module only
knows which blocks hold which prefix.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable, Sequence

ROOT: Hashable = None


def root_key(adapter: Any) -> Hashable:
    """Where a sequence's chain of block keys starts: the base model's root, or its adapter registration's."""
    return ROOT if adapter is None else ("adapter", adapter.uid)


def block_key(parent: Hashable, tokens: Sequence[int]) -> tuple[int, tuple[int, ...]]:
    """The key of a full block: its tokens exactly, and its parent's key by hash."""
    return hash(parent), tuple(tokens)


class PrefixCache:
    def __init__(self) -> None:
        self.block_of: dict[Hashable, int] = {}
        self.key_of: dict[int, Hashable] = {}
        self.idle: OrderedDict[int, None] = OrderedDict()  # cached blocks with no user, oldest first

    def __len__(self) -> int:
        return len(self.idle)

    def match(self, tokens: Sequence[int], block_size: int, root: Hashable = ROOT) -> list[int]:
        """The cached blocks holding the longest prefix of ``tokens`` made of full blocks, from ``root``."""
        found: list[int] = []
        key: Hashable = root
        for start in range(0, len(tokens) - block_size + 1, block_size):
            key = block_key(key, tokens[start:start + block_size])
            block = self.block_of.get(key)
            if block is None:
                break
            found.append(block)
        return found

    def add(self, key: Hashable, block: int) -> bool:
        """Record that ``block`` holds the prefix ``key`` (the first block computed for a key wins); whether it
        does now."""
        if key in self.block_of or block in self.key_of:
            return False
        self.block_of[key] = block
        self.key_of[block] = key
        return True

    def holds(self, block: int) -> bool:
        return block in self.key_of

    def park(self, block: int) -> None:
        """``block`` lost its last user: keep its content until the pool needs the block."""
        self.idle[block] = None

    def take(self, block: int) -> None:
        """A parked block is in use again."""
        self.idle.pop(block, None)

    def evict(self) -> int:
        """Forget the least recently used parked block and hand it back for reuse."""
        block, _ = self.idle.popitem(last=False)
        del self.block_of[self.key_of.pop(block)]
        return block

    def clear(self) -> None:
        self.block_of.clear()
        self.key_of.clear()
        self.idle.clear()
