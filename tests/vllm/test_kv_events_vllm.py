"""KV events against vLLM itself (issue 47): vLLM's own decoder reads the hf engine's events and vLLM's own block
hasher gives the same hashes; the vllm backend hands ``option.kv_events_config`` to vLLM's engine configuration."""

import json

import pytest

pytest.importorskip("vllm", reason="the vllm backend's tests run in the vLLM environment (scripts/test.sh)")


def test_vllms_decoder_and_hashes_rebuild_the_hf_engines_cached_blocks():
    import msgspec
    from vllm.distributed.kv_events import KVEventBatch
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils

    from tests.handlers.test_kv_events import check_random_workload

    kv_cache_utils.init_none_hash(sha256)
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    count, evictions = check_random_workload(
        decoder.decode, lambda parent, tokens: kv_cache_utils.hash_block_tokens(sha256, parent, tokens))
    assert count > 20 and evictions > 0


def test_the_vllm_backend_passes_kv_events_tracing_and_priority_to_vllm():
    from vllm import EngineArgs

    from lmi_handlers.backends.vllm.options import Options, engine_arg_defaults

    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv"}
    options = Options.from_properties({"kv_events_config": json.dumps(config), "scheduling_policy": "priority",
                                       "otlp_traces_endpoint": "http://127.0.0.1:4318/v1/traces"})
    args = options.engine_args("m", engine_arg_defaults(EngineArgs))
    assert args["kv_events_config"] == config and args["scheduling_policy"] == "priority"
    assert args["otlp_traces_endpoint"] == "http://127.0.0.1:4318/v1/traces"
