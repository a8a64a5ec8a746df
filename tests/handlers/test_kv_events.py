"""KV events (issue 47): the hf engine's prefix cache as vLLM's ``KVEventBatch`` over ZeroMQ.

A subscriber rebuilds the engine's set of cached blocks from the events alone after a random workload with
evictions, and the set equals the engine's own, whose hashes are recomputed from each block's tokens. Where vLLM is
installed (its environment: ``tests/vllm/test_kv_events_vllm.py`` runs ``check_random_workload``) the decoder and the
block hashes are vLLM's own; elsewhere msgspec's plain decoder and ours. The options are vLLM's ``kv_events_config``.
"""

from __future__ import annotations

import json
import random
import socket
import time

import pytest

from lmi_handlers.backends.hf.paged_cache import BlockManager, PoolPlan
from lmi_handlers.backends.hf.prefix_cache import ROOT, block_key
from lmi_handlers.config import ConfigError
from lmi_handlers.engine import Engine
from lmi_handlers.kv_events import KVEventsOptions, attach, block_hash, none_hash
from lmi_handlers.request import GenerationRequest, SamplingParams, Schema, StoppingParams
from lmi_handlers.sequence import SequenceState



def zmq_socket(kind: str):
    """A socket of the ``kv-events`` extra's pyzmq (the tests skip without it)."""
    zmq = pytest.importorskip("zmq")
    pytest.importorskip("msgspec")
    return zmq.Context.instance().socket(getattr(zmq, kind))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PagedBackend:
    """A model-free backend with the hf backend's block pool: each sampled chunk gets a token from its prompt."""

    name, chunked_prefill, max_batch_size = "hf", True, 4

    def __init__(self, blocks: int, block_size: int = 4):
        self.kv = BlockManager(PoolPlan(num_blocks=blocks, block_size=block_size, prefix_caching=True))

    def step(self, chunks):
        return {c.seq.uid: (c.seq.all_ids[c.end - 1] % 7 + 10, 0.0) for c in chunks if c.sample}

    def release(self, seq):
        self.kv.release(seq)

    def reset(self):
        self.kv.reset()


def request(ids: list[int], new_tokens: int) -> SequenceState:
    stopping = StoppingParams(max_new_tokens=new_tokens, ignore_eos=True)
    return SequenceState(GenerationRequest(Schema.LMI, "", SamplingParams(), stopping), ids, decode=lambda ids: "")


def options(port: int, replay: int | None = None) -> KVEventsOptions:
    config = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}", "topic": "kv@test"}
    if replay:
        config["replay_endpoint"] = f"tcp://*:{replay}"
    return KVEventsOptions.from_properties({"kv_events_config": json.dumps(config)})


def subscriber(port: int):
    sock = zmq_socket("SUB")
    sock.connect(f"tcp://127.0.0.1:{port}")
    sock.subscribe(b"kv@")
    time.sleep(0.3)  # PUB drops what it sends before the subscription arrives
    return sock


def apply(blocks: set, batch) -> None:
    """A router's view of one replica: its cached block hashes, from the events alone."""
    for event in batch.events:
        kind = type(event).__name__
        if kind == "BlockStored":
            blocks.update(event.block_hashes)
        elif kind == "BlockRemoved":
            blocks.difference_update(event.block_hashes)
        else:
            blocks.clear()


def check_random_workload(decode, hasher, seed: int = 3) -> tuple[int, int]:
    """Random requests over a few shared prefixes on a pool that must evict; returns (events, evictions) after
    asserting that the rebuilt set equals the engine's. ``decode(payload)`` gives a batch; ``hasher(parent, tokens)``
    a block's hash."""
    port, rng = free_port(), random.Random(seed)
    backend = PagedBackend(blocks=24)
    events = attach(backend, options(port), {"kv_events_config": "{}"})
    engine = Engine(backend, chunked_prefill=True)
    sub = subscriber(port)
    prefixes = [[rng.randrange(100, 200) for _ in range(rng.randrange(8, 20))] for _ in range(5)]
    digest_of: dict = {}  # our key of a prefix -> its hash, recomputed from the tokens
    seqs = []
    for _ in range(40):
        seq = request(rng.choice(prefixes) + [rng.randrange(200, 300) for _ in range(rng.randrange(1, 6))], 3)
        seqs.append(seq)
        engine.add(seq)
        if rng.random() < 0.4:
            engine.step()
    while not engine.idle:
        engine.step()
    for seq in seqs:
        key, digest, ids = ROOT, None, seq.all_ids
        for start in range(0, len(ids) - 3, 4):
            key, digest = block_key(key, ids[start:start + 4]), hasher(digest, ids[start:start + 4])
            digest_of[key] = digest
    expected = {digest_of[key] for key in backend.kv.prefix.block_of}
    rebuilt, kinds, numbers = set(), [], []
    while sub.poll(500):
        topic, number, payload = sub.recv_multipart()
        numbers.append(int.from_bytes(number, "big"))
        batch = decode(payload)
        kinds += [type(event).__name__ for event in batch.events]
        apply(rebuilt, batch)
    events.close()
    assert topic == b"kv@test" and numbers == list(range(len(numbers)))
    assert rebuilt == expected and expected == set(events.hash_of.values())
    return len(kinds), kinds.count("BlockRemoved")


def test_a_subscriber_rebuilds_the_engines_cached_blocks_from_the_events_alone():
    root = none_hash()
    msgspec = pytest.importorskip("msgspec")
    count, evictions = check_random_workload(lambda payload: _plain(msgspec.msgpack.decode(payload)),
                                             lambda parent, tokens: block_hash(parent, tokens, None, root))
    assert count > 20 and evictions > 0  # the pool had to evict: BlockRemoved events were part of it


def _plain(raw):
    """msgspec's plain decoding as the batch classes' shape: [ts, [{"type": ...}], rank]."""
    from types import SimpleNamespace

    events = [type(event["type"], (SimpleNamespace,), {})(**event) for event in raw[1]]
    return SimpleNamespace(ts=raw[0], events=events)


def test_missed_batches_are_replayed_from_a_sequence_number():
    client = zmq_socket("DEALER")
    port, replay = free_port(), free_port()
    backend = PagedBackend(blocks=8)
    events = attach(backend, options(port, replay), {"kv_events_config": "{}"})
    engine = Engine(backend)
    for prompt in ([1] * 9, [2] * 9, [3] * 9):
        engine.add(request(prompt, 2))
        while not engine.idle:
            engine.step()
    time.sleep(0.3)
    client.connect(f"tcp://127.0.0.1:{replay}")
    client.send_multipart([b"", (1).to_bytes(8, "big")])
    replies = []
    while client.poll(2000):
        _, topic, number, payload = client.recv_multipart()
        if int.from_bytes(number, "big", signed=True) == -1:
            break
        replies.append(int.from_bytes(number, "big"))
    events.close()
    assert replies and replies[0] == 1 and replies == list(range(1, len(replies) + 1))


@pytest.mark.parametrize("config, message", [
    ("{not json", "expected a JSON object"),
    ('{"enable_kv_cache_events": true, "endpont": "tcp://*:1"}', "unknown field 'endpont'"),
    ('{"enable_kv_cache_events": "yes"}', "enable_kv_cache_events: expected true or false"),
    ('{"enable_kv_cache_events": true, "buffer_steps": true}', "buffer_steps: expected an integer"),
    ('{"enable_kv_cache_events": true, "publisher": "kafka"}', "allowed are zmq, null"),
])
def test_bad_options_name_the_option_and_the_field(config, message):
    with pytest.raises(ConfigError, match="kv_events_config") as caught:
        KVEventsOptions.from_properties({"kv_events_config": config})
    assert message in str(caught.value)


def test_events_are_off_unless_enabled_and_need_a_prefix_cache():
    zmq_socket("PUB").close()
    assert KVEventsOptions.from_properties({}) is None
    assert KVEventsOptions.from_properties({"kv_events_config": '{"endpoint": "tcp://*:1"}'}) is None
    on = options(free_port())
    plain = PagedBackend(blocks=4)
    plain.kv = BlockManager(PoolPlan(num_blocks=4, block_size=4, prefix_caching=False))
    with pytest.raises(ConfigError, match="enable_prefix_caching=true"):
        attach(plain, on, {"kv_events_config": "{}"})
    slots = type("Slots", (), {"name": "scripted", "kv": None})()
    with pytest.raises(ConfigError, match="scripted backend has no block cache"):
        attach(slots, on, {"kv_events_config": "{}"})
