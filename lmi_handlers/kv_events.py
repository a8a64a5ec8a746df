"""KV events in vLLM's format: what prefix-aware routers (llm-d's KV-cache indexer, Dynamo's KV router, HyperPod's
``kvaware`` routing) read to learn which blocks each replica holds.

The hf engine's prefix cache (``backends/hf/paged_cache.py``) reports a full block when it starts to hold one
(``BlockStored``), a block it evicts (``BlockRemoved``) and a reset (``AllBlocksCleared``); each engine step's events go
out as one ``KVEventBatch``, msgpack-encoded by msgspec with vLLM's field names, tags and array layout
(``vllm/distributed/kv_events.py``), on a ZeroMQ PUB socket as ``(topic, sequence number, payload)`` with an optional
ROUTER socket that replays buffered batches from a sequence number, the end marked by sequence -1.

Configuration is vLLM's ``kv_events_config`` (``option.kv_events_config``, a JSON object with vLLM's fields), which
LMI passes through to vLLM; the vllm backend passes it to vLLM's own publisher.

Block hashes are vLLM's default ``sha256`` ones: SHA-256 of the pickled (parent hash, block token ids, extra keys),
the first block's parent being the hash of the seed ``PYTHONHASHSEED`` or ``vllm-none-hash``; a LoRA adapter's blocks
carry ``("lora", name, folder)`` as vLLM's do. They equal vLLM's where the Python version (pickle's protocol) and
the seed are the same; vLLM's other ``prefix_caching_hash_algo`` choices are not reproduced. pyzmq and msgspec are
the ``kv-events`` extra, imported only when events are on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

from .errors import ConfigError

logger = logging.getLogger(__name__)
#: vLLM's storage medium of the engine's own KV pool (its CPU build reports this one too).
MEDIUM = "GPU"
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
#: The option this module reads: vLLM's engine argument, a JSON object.
KEYS = ("kv_events_config",)


@dataclass(frozen=True)
class KVEventsOptions:
    """vLLM's ``KVEventsConfig`` fields and defaults."""

    enable_kv_cache_events: bool = False
    publisher: str = "zmq"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> "KVEventsOptions | None":
        """The options ``option.kv_events_config`` sets, or None when events are off."""
        text = str(props.get("kv_events_config") or "").strip()
        if not text:
            return None
        try:
            given = json.loads(text)
        except ValueError as exc:
            raise ConfigError("kv_events_config", text, f"expected a JSON object of vLLM's KVEventsConfig ({exc})")
        if not isinstance(given, dict):
            raise ConfigError("kv_events_config", text, "expected a JSON object of vLLM's KVEventsConfig")
        for key, value in given.items():
            kind = _TYPES.get(key)
            if kind is None:
                raise ConfigError("kv_events_config", text, f"unknown field {key!r}; vLLM's fields are "
                                  f"{', '.join(_TYPES)}")
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
                raise ConfigError("kv_events_config", text, f"{key}: expected {_TYPES_SAID[kind]}, got {value!r}")
        options = cls(**given)
        if options.publisher not in ("zmq", "null"):
            raise ConfigError("kv_events_config", text, f"publisher {options.publisher!r}: allowed are zmq, null")
        return options if options.enable_kv_cache_events and options.publisher == "zmq" else None


_TYPES: dict[str, Any] = {f.name: type(f.default) for f in fields(KVEventsOptions)} | {
    "replay_endpoint": (str, type(None))}
_TYPES_SAID = {bool: "true or false", str: "a string", int: "an integer", (str, type(None)): "a string or null"}


def none_hash() -> bytes:
    """The parent hash of a chain's first block, as vLLM derives it for ``sha256``."""
    seed = os.environ.get("PYTHONHASHSEED") or "vllm-none-hash"
    return hashlib.sha256(pickle.dumps(seed, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def lora_keys(adapter: Any) -> tuple[tuple[str, str, str], ...] | None:
    """A block's extra keys under ``adapter`` (None: the base model), as vLLM hashes a LoRA request's blocks."""
    return None if adapter is None else (("lora", adapter.name, adapter.spec.src),)


def block_hash(parent: bytes | None, tokens: Sequence[int], extra: tuple | None, root: bytes) -> bytes:
    """vLLM's ``hash_block_tokens`` with its ``sha256``: the chain's hash up to and with this block."""
    payload = pickle.dumps((parent or root, tuple(tokens), extra), protocol=pickle.HIGHEST_PROTOCOL)
    return hashlib.sha256(payload).digest()


_messages: Any = None


def message_classes() -> Any:
    """msgspec structs with vLLM's names, fields and layout (built on first use: msgspec is optional)."""
    global _messages
    if _messages is None:
        import msgspec

        class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
            pass

        class BlockStored(KVCacheEvent):
            block_hashes: list[bytes]
            parent_block_hash: bytes | None
            token_ids: list[int]
            block_size: int
            lora_id: int | None
            medium: str | None
            lora_name: str | None
            extra_keys: list[Any] | None = None
            group_idx: int | None = None

        class BlockRemoved(KVCacheEvent):
            block_hashes: list[bytes]
            medium: str | None
            group_idx: int | None = None

        class AllBlocksCleared(KVCacheEvent):
            pass

        class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
            ts: float
            events: list[BlockStored | BlockRemoved | AllBlocksCleared]
            data_parallel_rank: int | None = None

        _messages = (KVEventBatch, BlockStored, BlockRemoved, AllBlocksCleared)
    return _messages


class KVEvents:
    """Collects one step's events (``stored``, ``removed``, ``cleared``) and hands them to the publishing thread at
    ``flush``; keeps each cached block's hash for its removal."""

    def __init__(self, options: KVEventsOptions, block_size: int):
        self.block_size = block_size
        self.root = none_hash()
        self.hash_of: dict[int, bytes] = {}  # cached block -> its hash
        self._pending: list[Any] = []
        self._classes = message_classes()
        self._publisher = _Publisher(options)

    def hash(self, parent: bytes | None, tokens: Sequence[int], adapter: Any) -> bytes:
        return block_hash(parent, tokens, lora_keys(adapter), self.root)

    def stored(self, block: int, digest: bytes, parent: bytes | None, tokens: Sequence[int], adapter: Any) -> None:
        self.hash_of[block] = digest
        extra = lora_keys(adapter)
        self._pending.append(self._classes[1](
            block_hashes=[digest], parent_block_hash=parent, token_ids=list(tokens), block_size=self.block_size,
            lora_id=None if adapter is None else adapter.uid, medium=MEDIUM,
            lora_name=None if adapter is None else adapter.name,
            extra_keys=None if extra is None else [tuple(key[1] for key in extra)], group_idx=0))

    def removed(self, block: int) -> None:
        digest = self.hash_of.pop(block, None)
        if digest is not None:
            self._pending.append(self._classes[2](block_hashes=[digest], medium=MEDIUM, group_idx=0))

    def cleared(self) -> None:
        self.hash_of.clear()
        self._pending.append(self._classes[3]())
        self.flush()  # a reset can follow a failed step, which flushes nothing

    def flush(self) -> None:
        if self._pending:
            batch, self._pending = self._classes[0](ts=time.time(), events=self._pending, data_parallel_rank=0), []
            self._publisher.put(batch)

    def close(self) -> None:
        self._publisher.close()


class _Publisher:
    """The ZeroMQ side: a thread that numbers, encodes and sends each batch, keeps the last ``buffer_steps`` of them
    and answers replay requests."""

    def __init__(self, options: KVEventsOptions):
        import zmq

        self.options = options
        self.topic = options.topic.encode()
        self.batches: queue.Queue[Any] = queue.Queue(maxsize=options.max_queue_size)
        self.sent: deque[tuple[int, bytes]] = deque(maxlen=options.buffer_steps)
        context = zmq.Context.instance()
        self.pub = context.socket(zmq.PUB)
        self.pub.set_hwm(options.hwm)
        self.replay = context.socket(zmq.ROUTER) if options.replay_endpoint else None
        try:
            _open(self.pub, options.endpoint)
            if self.replay is not None:
                self.replay.bind(options.replay_endpoint)
        except zmq.ZMQError as exc:
            raise ConfigError("kv_events_config", options.endpoint, f"cannot open the KV events socket: {exc}")
        self.thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self.thread.start()

    def put(self, batch: Any) -> None:
        try:
            self.batches.put_nowait(batch)
        except queue.Full:  # no subscriber keeps up: vLLM's queue drops the same way
            logger.warning("kv events: queue full (%d batches), one dropped", self.options.max_queue_size)

    def close(self) -> None:
        self.batches.put(None)
        self.thread.join(timeout=2)

    def _run(self) -> None:
        import msgspec

        encoder = msgspec.msgpack.Encoder()
        number = 0
        while True:
            if self.replay is not None and self.replay.poll(0):
                self._replay()
            try:
                batch = self.batches.get(timeout=0.05)
            except queue.Empty:
                continue
            if batch is None:
                break
            payload = encoder.encode(batch)
            self.pub.send_multipart((self.topic, number.to_bytes(8, "big"), payload))
            self.sent.append((number, payload))
            number += 1
        self.pub.close(linger=0)
        if self.replay is not None:
            self.replay.close(linger=0)

    def _replay(self) -> None:
        frames = self.replay.recv_multipart()
        if len(frames) != 3:
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for number, payload in list(self.sent):
            if number >= first:
                self.replay.send_multipart((client, b"", self.topic, number.to_bytes(8, "big"), payload))
        self.replay.send_multipart((client, b"", b"", END_OF_REPLAY, b""))


def _open(socket: Any, endpoint: str) -> None:
    """Bind an address with a wildcard (or ipc/inproc), connect to any other, as vLLM's publisher does."""
    if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
        socket.bind(endpoint)
    else:
        socket.connect(endpoint)


def attach(backend: Any, options: KVEventsOptions | None, props: Mapping[str, Any]) -> KVEvents | None:
    """Publish ``backend``'s prefix cache as ``options`` (``option.kv_events_config``) ask (None: off); ConfigError
    where the backend has no prefix cache to report."""
    if options is None:
        return None
    kv = getattr(backend, "kv", None)
    if kv is None:
        raise ConfigError("kv_events_config", props["kv_events_config"], f"the {backend.name} backend has no block "
                          "cache to report; KV events come from the hf backend and from vLLM")
    if kv.prefix is None:
        raise ConfigError("kv_events_config", props["kv_events_config"], "KV events report the prefix cache's "
                          "blocks: set option.enable_prefix_caching=true")
    kv.events = KVEvents(options, kv.block_size)
    return kv.events
