"""The block manager alone (plain Python): tables, reference counts, prefix keys and LRU eviction."""

import pytest

from lmi_handlers.backends.hf.paged_cache import BlockManager, PoolOptions, PoolPlan, plan_pool
from lmi_handlers.config import ConfigError
from lmi_handlers.request import GenerationRequest, SamplingParams, Schema, StoppingParams
from lmi_handlers.sequence import SequenceState


def seq(ids):
    request = GenerationRequest(Schema.LMI, "", SamplingParams(), StoppingParams(max_new_tokens=4))
    return SequenceState(request, ids, decode=lambda ids: "")


def computed(manager, s):
    s.num_cached = s.length
    manager.computed(s)


def test_admission_takes_the_prompt_and_its_next_token_or_waits():
    manager = BlockManager(PoolPlan(num_blocks=4, block_size=4, prefix_caching=False))
    a = seq(list(range(7)))  # 7 + 1 tokens: 2 blocks
    assert manager.admit(a) == 0 and len(manager.table(a)) == 2 and manager.available == 2
    assert manager.admit(seq(list(range(9)))) is None  # needs 3: it waits, nothing taken
    assert manager.available == 2
    assert manager.grow(a, 12) and manager.available == 1
    manager.release(a)
    assert manager.available == 4 and manager.used == 0


def test_full_blocks_are_shared_by_content_and_parked_then_evicted_oldest_first():
    manager = BlockManager(PoolPlan(num_blocks=6, block_size=4, prefix_caching=True))
    a = seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    manager.admit(a)
    computed(manager, a)
    b = seq([1, 2, 3, 4, 5, 6, 7, 8, 42, 43])
    assert manager.admit(b) == 8  # two full blocks found
    assert manager.table(b)[:2] == manager.table(a)[:2]
    assert manager.refs[manager.table(a)[0]] == 2
    shared = manager.table(a)[:2]
    manager.release(a)
    manager.release(b)
    assert manager.used == 0 and len(manager.prefix) == 2  # parked, still findable
    c = seq([1, 2, 3, 4, 99, 98, 97])
    assert manager.admit(c) == 4 and manager.table(c)[0] == shared[0]
    manager.release(c)
    # A prompt whose blocks are all computed still recomputes its last token for its logits.
    assert manager.admit(seq([1, 2, 3, 4, 5, 6, 7, 8])) == 4
    big = seq(list(range(100, 121)))  # 22 tokens: 6 blocks, so every parked block is evicted
    manager.reset()
    assert manager.admit(big) == 0 and manager.available == 0


def test_stats_report_hits_against_prompt_tokens():
    manager = BlockManager(PoolPlan(num_blocks=8, block_size=2, prefix_caching=True))
    a = seq([5, 6, 7, 8, 9])
    manager.admit(a)
    computed(manager, a)
    manager.admit(seq([5, 6, 7, 8, 1]))
    stats = manager.stats()
    assert stats["prefix_cache_hit_tokens"] == 4 and stats["prefix_cache_prompt_tokens"] == 10
    assert stats["prefix_cache_hit_rate"] == 0.4


def test_pool_plan_from_options():
    common = dict(bytes_per_token=100, max_batch_size=4, max_sequence_length=64)

    def plan(props, **more):
        return plan_pool(PoolOptions.from_properties(props), **common, **more)

    assert plan({}).num_blocks == 16  # CPU: what four full-length rows need
    assert plan({"kv_cache_memory_bytes": "24000", "block_size": "8"}).num_blocks == 30
    assert plan({"kv_cache_memory_bytes": "10000000"}).num_blocks == 16  # never more than usable
    assert plan({"num_gpu_blocks_override": "9"}).tokens == 144
    assert plan({}, cuda_memory=(100_000, 20_000)).num_blocks == 16
    assert plan({"gpu_memory_utilization": "0.5"}, cuda_memory=(40_000, 10_000)).num_blocks == 6
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        plan({"gpu_memory_utilization": "0.3"}, cuda_memory=(40_000, 10_000))
    with pytest.raises(ConfigError, match="enable_prefix_caching"):
        PoolOptions.from_properties({"enable_prefix_caching": "maybe"})
