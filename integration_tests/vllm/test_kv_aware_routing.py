"""KV-aware routing over two ``lmi serve`` replicas of the hf engine (issue 47), read with vLLM's own decoder.

Each replica publishes its prefix cache as vLLM's KV events (``option.kv_events_config``); a test router subscribes
to both, keeps each replica's set of cached block hashes from the events alone, computes a prompt's block hashes
with vLLM's own hasher and sends it to the replica whose blocks match its prefix longest (the one with fewer requests
on a tie). A workload of repeated long prefixes, more than one replica's KV pool holds, gets a clearly higher prefix
cache hit rate so than by round robin: round robin puts every prefix on both replicas, which then evict each other's
reuse. Both rates are printed (``-s``)."""

from __future__ import annotations

import json
import random
import socket

import httpx
import pytest

from tests.handlers.test_kv_events import apply

pytest.importorskip("vllm", reason="the vllm backend's tests run in the vLLM environment (scripts/test.sh)")

BLOCK = 16
PREFIXES, REQUESTS = 6, 36


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def replicas(serve_module, vllm_tiny_model_dir):
    out = []
    for i in range(2):
        port = free_port()
        events = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}", "topic": f"kv@replica{i}"}
        model = serve_module.model_dir(f"tiny{i}", {
            "engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint", "option.backend": "hf",
            "option.model_id": str(vllm_tiny_model_dir), "option.rolling_batch": "auto", "option.max_model_len": 512,
            "option.enable_prefix_caching": "true", "option.block_size": BLOCK,
            # 32 blocks (512 tokens): three of the six prefixes at a time, not all six.
            "option.num_gpu_blocks_override": 32, "option.kv_events_config": json.dumps(events),
            # torch's own kernels: nothing to compile against this environment's torch
            "option.cpu_linear_kernel": "stock", "option.cpu_attention_kernel": "torch"})
        server = serve_module([f"tiny={model}"], ready=False).wait_ready(timeout=300)
        out.append((server, port))
    return out


class Router:
    """One subscriber per replica; each replica's cached blocks as its events say."""

    def __init__(self, ports: list[int]):
        import msgspec
        import zmq
        from vllm.distributed.kv_events import KVEventBatch
        from vllm.utils.hashing import sha256
        from vllm.v1.core import kv_cache_utils

        kv_cache_utils.init_none_hash(sha256)
        self.hash = lambda parent, tokens: kv_cache_utils.hash_block_tokens(sha256, parent, tokens)
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.subs = []
        for port in ports:
            sub = zmq.Context.instance().socket(zmq.SUB)
            sub.connect(f"tcp://127.0.0.1:{port}")
            sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
            self.subs.append(sub)
        self.blocks: list[set[bytes]] = [set() for _ in ports]
        self.sent = [0] * len(ports)

    def read(self, wait_ms: int = 150) -> None:
        for sub, blocks in zip(self.subs, self.blocks):
            while sub.poll(wait_ms):
                _, _, payload = sub.recv_multipart()
                apply(blocks, self.decoder.decode(payload))

    def choose(self, ids: list[int]) -> int:
        chain, parent = [], None
        for start in range(0, len(ids) - BLOCK, BLOCK):  # the last token is always computed, as in admission
            parent = self.hash(parent, ids[start:start + BLOCK])
            chain.append(parent)

        def matched(blocks: set[bytes]) -> int:
            return next((i for i, digest in enumerate(chain) if digest not in blocks), len(chain))

        best = max(range(len(self.blocks)), key=lambda r: (matched(self.blocks[r]), -self.sent[r]))
        self.sent[best] += 1
        return best


def workload(seed: int, tokenizer) -> list[str]:
    from lmi_tools.models.tiny import corpus

    words = [word for word in corpus(seed=seed, words=4000) if len(word) < 8]
    rng = random.Random(seed)
    prefixes = []
    for p in range(PREFIXES):
        text = words[rng.randrange(len(words))]
        while len(tokenizer.encode(text)) < 8 * BLOCK:  # eight blocks and a bit
            text += " " + words[rng.randrange(len(words))]
        prefixes.append(text)
    return [rng.choice(prefixes) + " " + " ".join(rng.sample(words, 2)) for _ in range(REQUESTS)]


def hit_rate(servers, ask) -> float:
    def counters():
        out = []
        for server, _ in servers:
            text = httpx.get(server.url + "/metrics", timeout=10).text
            values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                      if line.startswith(("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"))}
            out.append((values.get("vllm:prefix_cache_hits_total", 0), values.get("vllm:prefix_cache_queries_total", 0)))
        return out

    before = counters()
    ask()
    after = counters()
    hits = sum(a[0] - b[0] for a, b in zip(after, before))
    queries = sum(a[1] - b[1] for a, b in zip(after, before))
    return hits / queries


def test_kv_aware_routing_beats_round_robin_on_the_prefix_cache_hit_rate(replicas, vllm_tiny_model_dir):
    from transformers import AutoTokenizer

    from lmi_handlers.backends.tokenizer import HFTokenizer

    tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(str(vllm_tiny_model_dir)))
    router = Router([port for _, port in replicas])

    def send(replica: int, prompt: str) -> None:
        server = replicas[replica][0]
        answer = httpx.post(server.url + "/invocations", json={"inputs": prompt, "parameters": {"max_new_tokens": 2}},
                            timeout=120)
        assert answer.status_code == 200, answer.text

    def round_robin():
        for i, prompt in enumerate(workload(1, tokenizer)):
            send(i % 2, prompt)

    def kv_aware():
        router.read()
        for prompt in workload(2, tokenizer):  # other prefixes: the first run's blocks never match
            send(router.choose(tokenizer.encode(prompt)), prompt)
            router.read()

    rr = hit_rate(replicas, round_robin)
    routed = hit_rate(replicas, kv_aware)
    print(f"\nprefix cache hit rate: round robin {rr:.1%}, KV-aware routing {routed:.1%}")
    assert routed > rr + 0.15, (rr, routed)
    assert min(router.sent) > 0  # both replicas served
