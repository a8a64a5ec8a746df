"""The vllm backend's step loop around an engine that stops or would stop: a recording stand-in for vLLM's
``LLMEngine`` (its three calls the loop makes), so that the failure paths run in milliseconds."""

from types import SimpleNamespace

import pytest

from lmi_handlers.backends.vllm.engine import VllmLoop
from lmi_handlers.events import ErrorEvent
from lmi_handlers.request import parse_payload
from lmi_handlers.sequence import SequenceState

pytest.importorskip("vllm", reason="the vllm backend's tests run in the vLLM environment (scripts/test.sh)")


class Engine:
    """Records what the loop asks; ``step`` raises ``fail_with`` when set."""

    def __init__(self, fail_with=None):
        self.added, self.aborted, self.fail_with = {}, [], fail_with

    def add_request(self, request_id, prompt, params, lora_request=None, priority=0, trace_headers=None):
        self.added[request_id] = params

    def abort_request(self, request_ids):
        self.aborted += request_ids

    def step(self):
        if self.fail_with is not None:
            raise self.fail_with
        return []


def loop_over(engine, seeds_stop_engine=False):
    backend = SimpleNamespace(llm=engine, tokenizer=SimpleNamespace(eos_ids=(2,)), vocab_size=100,
                              seeds_stop_engine=seeds_stop_engine, vllm_stats={})
    loop = VllmLoop(backend)
    loop.exits = 0

    def exit_soon():
        loop.exits += 1

    loop.exit_soon = exit_soon
    return loop


def sequence(uid, body):
    request = parse_payload(body, 30).requests[0]
    # As job.py seeds it: the client's own seed, else one the server drew
    seed = request.sampling.seed if request.sampling.seed is not None else 1234
    seq = SequenceState(request, [5, 6, 7], decode=lambda ids: "", eos_ids=(2,), seed=seed)
    seq.uid = uid
    return seq


def sampled(uid, **parameters):
    return sequence(uid, {"inputs": "x", "parameters": {"do_sample": True, "max_new_tokens": 4, **parameters}})


def test_a_stopped_engine_fails_every_request_with_a_503_and_ends_the_worker():
    from vllm.v1.engine.exceptions import EngineDeadError

    engine = Engine(fail_with=EngineDeadError())
    loop = loop_over(engine)
    running = [sampled(1), sampled(2)]
    for seq in running:
        loop.add(seq)
    events = loop.step()
    assert set(events) == {1, 2} and loop.exits == 1 and loop.idle
    for [error] in events.values():
        assert isinstance(error, ErrorEvent) and error.code == 503
        assert "vLLM's engine stopped (EngineDeadError)" in error.message and "restarts" in error.message
    late = sampled(3)
    loop.add(late)  # until the process ends, a new request is refused at once, never left waiting
    assert loop.step() == {3: [ErrorEvent(503, loop.stopped)]} and late.finished
    loop.reset()
    assert engine.aborted == [] and loop.exits == 1  # nothing asked of the dead engine; one exit


def test_a_request_vllm_refuses_because_its_engine_died_stops_the_loop_too():
    from vllm.v1.engine.exceptions import EngineDeadError

    class DeadOnAdd(Engine):
        def add_request(self, *args, **kwargs):
            raise EngineDeadError()

    loop = loop_over(DeadOnAdd())
    loop.add(sampled(1))
    assert loop.step()[1][0].code == 503 and loop.exits == 1


def test_only_the_clients_own_seed_reaches_vllm():
    engine = Engine()
    loop = loop_over(engine)
    loop.add(sampled(1))
    loop.add(sampled(2, seed=7))
    assert engine.added["1"].seed is None and engine.added["2"].seed == 7


def test_a_seed_that_would_stop_vllms_cpu_engine_gets_its_own_400():
    engine = Engine()
    loop = loop_over(engine, seeds_stop_engine=True)
    loop.add(sampled(1, seed=7))
    openai = sequence(2, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "seed": 7})
    loop.add(openai)
    loop.add(sampled(3))
    events = loop.step()
    assert events[1][0].code == 400 and events[1][0].message.startswith("parameters.seed: vLLM's CPU build")
    assert "option.enable_chunked_prefill=false" in events[1][0].message and events[2][0].message.startswith("seed:")
    assert list(engine.added) == ["3"] and loop.exits == 0
