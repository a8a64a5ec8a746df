"""The scheduler alone (plain Python, no model): fake requests and a small block pool with no tensors behind it
(the paged cache's ``BlockManager``, what the hf backend hands the scheduler as ``kv``), stepped as the engine
steps them. Admission, preemption, chunked prefill and prefix sharing, in milliseconds."""

import random
from collections import deque

import pytest

from lmi_handlers.backends.hf.paged_cache import BlockManager, PoolPlan
from lmi_handlers.request import GenerationRequest, SamplingParams, Schema, StoppingParams
from lmi_handlers.scheduler import DEFAULT_ADMISSION_BUDGET, DEFAULT_CHUNK_BUDGET, Scheduler
from lmi_handlers.sequence import SequenceState


class FakeBackend:
    """What the scheduler reads of a backend: its rows, whether it prefills in chunks, its pool, ``release``."""

    def __init__(self, blocks, block_size=4, rows=8, chunked=True, prefix=False):
        self.kv = BlockManager(PoolPlan(num_blocks=blocks, block_size=block_size, prefix_caching=prefix))
        self.max_batch_size = rows
        self.chunked_prefill = chunked

    def release(self, seq):
        self.kv.release(seq)


def request(prompt, new_tokens=4):
    stopping = StoppingParams(max_new_tokens=new_tokens, ignore_eos=True)
    return SequenceState(GenerationRequest(Schema.LMI, "", SamplingParams(), stopping), prompt, decode=lambda ids: "")


class Engine:
    """The engine's bookkeeping around ``schedule`` (``lmi_handlers/engine.py``), with a model that answers every
    sampled chunk with the next number; each step's chunks are kept for the assertions."""

    def __init__(self, backend, budget=None, chunked=False):
        self.backend = backend
        self.scheduler = Scheduler(backend, budget, chunked)
        self.waiting: deque[SequenceState] = deque()
        self.running: list[SequenceState] = []
        self.steps: list[list] = []

    def add(self, *seqs):
        self.waiting.extend(seqs)

    def step(self):
        chunks = self.scheduler.schedule(self.waiting, self.running)
        for chunk in chunks:
            seq = chunk.seq
            assert chunk.start == seq.num_cached and list(chunk.tokens) == seq.all_ids[chunk.start:chunk.end]
            if chunk.sample:
                seq.append(1000 + len(seq.generated), 0.0)
            seq.num_cached = chunk.end
            self.backend.kv.computed(seq)
            if seq.finished:
                self.backend.release(seq)
        self.running = [seq for seq in self.running if not seq.finished]
        self.steps.append(chunks)
        return chunks

    def run(self, limit=500):
        while self.waiting or self.running:
            self.step()
            assert len(self.steps) < limit, "no progress"


def widths(chunks):
    return {chunk.seq.uid: len(chunk.tokens) for chunk in chunks}


def test_requests_are_admitted_in_arrival_order_while_rows_last():
    engine = Engine(FakeBackend(blocks=64, rows=2))
    a, b, c = request([1] * 5), request([2] * 6), request([3] * 7)
    engine.add(a, b, c)
    assert widths(engine.step()) == {a.uid: 5, b.uid: 6}  # two rows: c waits
    assert list(engine.waiting) == [c]
    assert widths(engine.step()) == {a.uid: 1, b.uid: 1}  # running sequences decode first, one token each
    engine.run()
    assert all(len(seq.generated) == 4 for seq in (a, b, c)) and engine.backend.kv.used == 0


def test_a_request_the_pool_cannot_hold_waits_and_is_admitted_when_blocks_come_back():
    # 5 blocks of 4 tokens; each sequence of 8 prompt tokens takes 3 blocks (its prompt and next token).
    engine = Engine(FakeBackend(blocks=5))
    a, b = request(list(range(8)), new_tokens=2), request(list(range(8)), new_tokens=2)
    engine.add(a, b)
    assert widths(engine.step()) == {a.uid: 8}
    assert list(engine.waiting) == [b] and engine.backend.kv.available == 2
    engine.step()  # a's last token: it finishes and its blocks go back
    assert a.finished and widths(engine.step()) == {b.uid: 8}
    engine.run()
    assert len(b.generated) == 2 and engine.scheduler.preemptions == 0


def test_when_the_pool_runs_dry_the_youngest_is_preempted_and_recomputed_with_its_output_kept():
    # Two sequences of 7 prompt tokens take 2 blocks each; decoding past 8 tokens needs a third block each, and
    # the pool has 5: the younger one gives its blocks back and waits at the head of the queue.
    engine = Engine(FakeBackend(blocks=5))
    old, young = request(list(range(7)), new_tokens=6), request(list(range(10, 17)), new_tokens=6)
    engine.add(old, young)
    engine.step()
    while not engine.scheduler.preemptions:
        engine.step()
    assert engine.waiting[0] is young and young.num_cached == 0 and young not in engine.running
    kept = list(young.generated)
    assert kept, "it had generated tokens before it was preempted"
    # Readmitted, it prefills its prompt and what it generated so far, in one chunk, and goes on from there.
    while young not in engine.running:
        engine.step()
    recompute = next(chunk for chunk in engine.steps[-1] if chunk.seq is young)
    assert recompute.start == 0 and list(recompute.tokens) == young.prompt_ids + kept
    engine.run()
    assert old.generated == [1000 + i for i in range(6)] and young.generated == [1000 + i for i in range(6)]
    assert engine.backend.kv.used == 0


def test_a_sequence_alone_in_a_dry_pool_preempts_itself_and_waits():
    engine = Engine(FakeBackend(blocks=2))
    seq = request(list(range(7)), new_tokens=3)  # 7 + 1 tokens fill both blocks; the token at 8 needs a third
    engine.add(seq)
    engine.step()
    engine.step()
    assert engine.step() == [] and engine.scheduler.preemptions == 1 and list(engine.waiting) == [seq]


def test_chunked_prefill_cuts_long_prompts_to_the_budget_and_running_streams_keep_decoding():
    engine = Engine(FakeBackend(blocks=64), budget=8, chunked=True)
    running = request([1] * 3, new_tokens=20)
    engine.add(running)
    engine.step()
    long = request(list(range(100, 130)))  # 30 tokens: chunks of 8, 8, 8, 6 beside the decoding row
    engine.add(long)
    pieces = []
    while not long.generated:
        chunks = widths(engine.step())
        assert chunks[running.uid] == 1  # the stream decodes every step
        assert sum(width for uid, width in chunks.items() if uid != running.uid) <= 8  # decode rows cost no budget
        pieces.append(chunks[long.uid])
    assert pieces == [8, 8, 8, 6]
    engine.run()
    assert long.generated == [1000, 1001, 1002, 1003]


def test_chunking_has_a_default_budget_and_needs_a_backend_that_prefills_in_chunks():
    assert Scheduler(FakeBackend(blocks=4), chunked=True).budget == DEFAULT_CHUNK_BUDGET
    unchunked = Scheduler(FakeBackend(blocks=4, chunked=False), chunked=True)
    assert not unchunked.chunked and unchunked.budget == DEFAULT_ADMISSION_BUDGET


def test_prompts_arriving_together_are_admitted_a_budget_at_a_time_and_one_always_fits():
    """Without chunking, the default budget spreads a burst over steps (the first admitted answer sooner); a prompt
    longer than the budget still runs, alone in its step's prefill."""
    size = DEFAULT_ADMISSION_BUDGET // 4 - 1
    engine = Engine(FakeBackend(blocks=1000, rows=64, chunked=False))
    burst = [request(list(range(size))) for _ in range(10)]
    engine.add(*burst)
    assert [len(c.tokens) for c in engine.step()] == [size] * 4
    assert [len(c.tokens) for c in engine.step()] == [1] * 4 + [size] * 4
    long = request(list(range(DEFAULT_ADMISSION_BUDGET + 5)))
    engine.add(long)
    assert [len(c.tokens) for c in engine.step()] == [1] * 8 + [size] * 2
    assert [len(c.tokens) for c in engine.step()] == [1] * 10 + [DEFAULT_ADMISSION_BUDGET + 5]


def test_without_chunking_the_budget_only_limits_admission_and_one_prompt_always_fits():
    engine = Engine(FakeBackend(blocks=64), budget=8)
    a, b, c = request([1] * 20), request([2] * 5), request([3] * 5)
    engine.add(a, b, c)
    assert widths(engine.step()) == {a.uid: 20}  # over the budget, but alone it is admitted whole
    assert widths(engine.step()) == {a.uid: 1, b.uid: 5}  # b fits what is left; c would not
    assert widths(engine.step()) == {a.uid: 1, b.uid: 1, c.uid: 5}


def test_a_shared_prefix_is_found_in_the_cache_and_only_the_rest_is_prefilled():
    engine = Engine(FakeBackend(blocks=16, prefix=True))
    system = list(range(50, 58))  # two full blocks of 4
    first = request(system + [1, 2, 3])
    engine.add(first)
    engine.step()  # prefilled: its full blocks are keyed
    second = request(system + [7, 8])
    engine.add(second)
    chunks = {chunk.seq.uid: chunk for chunk in engine.step()}
    assert chunks[second.uid].start == 8 and list(chunks[second.uid].tokens) == [7, 8]
    kv = engine.backend.kv
    assert kv.table(second)[:2] == kv.table(first)[:2] and kv.refs[kv.table(first)[0]] == 2
    engine.run()
    assert kv.used == 0 and kv.stats()["prefix_cache_hit_tokens"] == 8


def test_a_preempted_sequence_finds_its_own_blocks_in_the_prefix_cache_when_it_comes_back():
    engine = Engine(FakeBackend(blocks=5, prefix=True))
    old, young = request(list(range(7)), new_tokens=6), request(list(range(10, 17)), new_tokens=6)
    engine.add(old, young)
    while not engine.scheduler.preemptions:
        engine.step()
    while young not in engine.running:
        engine.step()
    recompute = next(chunk for chunk in engine.steps[-1] if chunk.seq is young)
    assert recompute.start > 0  # its first blocks were parked, not lost
    engine.run()
    assert young.generated == [1000 + i for i in range(6)]


@pytest.mark.parametrize("seed", range(20))
def test_random_traffic_on_a_small_pool_finishes_every_request_exactly_and_frees_every_block(seed):
    rng = random.Random(seed)
    block_size = rng.choice([2, 4])
    # At least one full-length sequence (16 prompt + 8 new tokens, and the next): what loading guarantees.
    longest = -(-(16 + 8 + 1) // block_size)
    backend = FakeBackend(blocks=rng.randint(longest, 2 * longest), block_size=block_size, rows=rng.randint(1, 6),
                          prefix=rng.random() < 0.5)
    engine = Engine(backend, budget=rng.choice([None, 8, 16]), chunked=rng.random() < 0.5)
    shared = [rng.randrange(100) for _ in range(6)]
    seqs = [request((shared if rng.random() < 0.5 else []) + [rng.randrange(100) for _ in range(rng.randint(1, 10))],
                    new_tokens=rng.randint(1, 8)) for _ in range(12)]
    pending = list(seqs)
    while pending or engine.waiting or engine.running:
        if pending and rng.random() < 0.5:
            engine.add(pending.pop(0))
        engine.step()
        assert len(engine.running) <= backend.max_batch_size
        assert len(engine.steps) < 1000, "no progress"
    for seq in seqs:
        assert seq.generated == [1000 + i for i in range(seq.max_new_tokens)]
    assert backend.kv.used == 0
