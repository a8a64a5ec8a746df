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


class Finishing(Engine):
    """Each request gets ``tokens`` in one step, finished by vLLM with ``reason`` (None: not finished)."""

    def __init__(self, tokens, reason):
        super().__init__()
        self.tokens, self.reason = tokens, reason

    def step(self):
        return [SimpleNamespace(request_id=request_id, finished=self.reason is not None, outputs=[SimpleNamespace(
            token_ids=list(self.tokens), logprobs=None, finish_reason=self.reason)]) for request_id in self.added]


def constrained(uid, matcher=None):
    seq = sequence(uid, {"inputs": "x", "parameters": {"max_new_tokens": 8, "guided_regex": "[a-z]{2}"}})
    seq.grammar = matcher
    return seq


def run_one(engine, seq):
    loop = loop_over(engine)
    loop.add(seq)
    return loop.step()[seq.uid]


@pytest.mark.parametrize("reason", ["error", "abort"])
def test_a_request_vllm_ends_as_an_error_fails_alone_never_as_a_finished_answer(reason):
    events = run_one(Finishing([40, 41], reason), constrained(1))
    assert isinstance(events[-1], ErrorEvent) and events[-1].code == 400
    assert events[-1].message.startswith("generation failed (vLLM): parameters.guided_regex: vLLM's grammar engine "
                                         "could not follow this constraint")
    events = run_one(Finishing([40, 41], reason), sequence(2, {"inputs": "x", "parameters": {"max_new_tokens": 8}}))
    assert isinstance(events[-1], ErrorEvent) and events[-1].code == 424
    events = run_one(Finishing([40, 41], "length"), sequence(3, {"inputs": "x", "parameters": {"max_new_tokens": 8}}))
    assert events[-1].finish_reason.value == "length"  # vLLM's own limit (the model's length): the answer so far


@pytest.mark.parametrize("accepting, last", [(True, "eos_token"), (False, None)])
def test_a_constrained_answer_that_ends_short_of_its_grammar_fails(accepting, last):
    """vLLM's matcher ends a request whose grammar failed while masking with end-of-sequence."""
    consumed = []
    matcher = SimpleNamespace(consume_tokens=lambda tokens: consumed.append(tokens) or True,
                              is_accepting=lambda: accepting)
    events = run_one(Finishing([40, 2], "stop"), constrained(4, matcher))
    assert consumed == [[40]]  # the answer without its end-of-sequence
    if last is not None:
        assert events[-1].finish_reason.value == last
    else:
        assert isinstance(events[-1], ErrorEvent) and events[-1].code == 400
        assert "the answer ended before the constraint was met" in events[-1].message


@pytest.mark.parametrize("prompt, tokens, checked", [
    ([5, 6, 7], [30, 50, 31, 40, 2], [[40]]),  # the grammar starts after the answer's end of reasoning
    ([5, 30, 31], [40, 2], [[40]]),  # the prompt closed the reasoning: the grammar holds from the start
    ([5, 6, 7], [30, 50, 2], []),  # the reasoning never ended: vLLM's grammar never began, nothing to check
])
def test_with_a_reasoning_parser_the_end_is_checked_where_vllms_grammar_starts(prompt, tokens, checked):
    import dataclasses

    from lmi_handlers.structured.reasoning import Reasoning

    consumed = []
    matcher = SimpleNamespace(consume_tokens=lambda ids: consumed.append(ids) or True, is_accepting=lambda: True)
    seq = constrained(5, matcher)
    seq.prompt_ids = prompt
    seq.request = dataclasses.replace(seq.request, reasoning=Reasoning("qwen3", "<think>", "</think>", 30, 31, False))
    events = run_one(Finishing(tokens, "stop"), seq)
    assert consumed == checked and events[-1].finish_reason.value == "eos_token"
