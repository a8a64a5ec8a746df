"""The vllm backend's async driver (``AsyncVllmEngine``) around a stand-in for vLLM's ``AsyncLLM``: its one call the
driver makes (``generate``), recording what vLLM would abort, so that cancellation, stop sequences and a dead engine
run in milliseconds."""

import asyncio
from types import SimpleNamespace

import pytest

from lmi_handlers.backends.vllm.async_engine import AsyncVllmEngine
from lmi_handlers.events import ErrorEvent, GenerationResult, TokenEvent
from lmi_handlers.request import parse_payload
from lmi_handlers.sequence import SequenceState

pytest.importorskip("vllm", reason="the vllm backend's tests run in the vLLM environment (scripts/test.sh)")


class Client:
    """``generate`` yields one token per delta (``tokens``, then finished); a request left early is aborted."""

    def __init__(self, tokens=(5, 6, 7, 8), fail_with=None, delay=0.0):
        self.tokens, self.fail_with, self.delay = tokens, fail_with, delay
        self.aborted, self.requests, self.scheduling = [], {}, {}

    async def generate(self, prompt, params, request_id, lora_request=None, priority=0, trace_headers=None):
        self.requests[request_id] = params
        self.scheduling[request_id] = (priority, trace_headers)
        try:
            for i, token in enumerate(self.tokens):
                if self.fail_with is not None:
                    raise self.fail_with
                await asyncio.sleep(self.delay)
                last = i == len(self.tokens) - 1
                yield SimpleNamespace(request_id=request_id, finished=last,
                                      outputs=[SimpleNamespace(token_ids=[token], logprobs=None,
                                                               finish_reason="length" if last else None)])
        except (asyncio.CancelledError, GeneratorExit):
            self.aborted.append(request_id)  # what AsyncLLM.generate does on the way out
            raise


def engine_with(client):
    backend = SimpleNamespace(tokenizer=SimpleNamespace(eos_ids=(2,)), vocab_size=100, seeds_stop_engine=False,
                              vllm_stats={})
    engine = AsyncVllmEngine(backend, client)
    engine.exits = 0

    def exit_soon():
        engine.exits += 1

    engine.exit_soon = exit_soon
    return engine


def sequence(uid, **parameters):
    body = {"inputs": "x", "parameters": {"max_new_tokens": 10, **parameters}}
    seq = SequenceState(parse_payload(body, 30).requests[0], [1, 2, 3],
                        decode=lambda ids: "".join(chr(96 + i) for i in ids), eos_ids=(2,))
    seq.uid = uid
    return seq


async def run(engine, seqs, until_done=True, then=None):
    """Submit ``seqs``; every event delivered, by uid, once each has its terminal event (or after ``then()``)."""
    got = {seq.uid: [] for seq in seqs}
    queue = asyncio.Queue()
    engine.submit(seqs, queue.put_nowait)
    if then is not None:
        await asyncio.sleep(0.05)
        then()
        await asyncio.sleep(0.05)
    while until_done and not all(got[s.uid] and isinstance(got[s.uid][-1], (GenerationResult, ErrorEvent))
                                 for s in seqs):
        for uid, events in (await asyncio.wait_for(queue.get(), 5)).items():
            got[uid] += events
    while not queue.empty():
        for uid, events in queue.get_nowait().items():
            got[uid] += events
    return got


def test_each_sequence_is_one_generate_and_its_tokens_go_through_its_own_state():
    client = Client()
    got = asyncio.run(run(engine_with(client), [sequence(1), sequence(2, max_new_tokens=2)]))
    assert [e.token.id for e in got[1] if isinstance(e, TokenEvent)] == [5, 6, 7, 8]
    assert isinstance(got[1][-1], GenerationResult) and got[1][-1].text == "efgh"
    assert isinstance(got[2][-1], GenerationResult) and got[2][-1].text == "ef"  # our budget ends it first...
    assert client.aborted == ["2"]  # ...and vLLM is told
    assert client.requests["1"].max_tokens == 10 and client.requests["1"].detokenize is False


def test_priority_and_the_trace_context_reach_vllm_as_on_the_step_loop():
    client = Client()
    urgent = sequence(1, priority=-5)
    urgent.trace_headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    asyncio.run(run(engine_with(client), [urgent, sequence(2)]))
    assert client.scheduling == {"1": (-5, urgent.trace_headers), "2": (0, None)}


def test_a_stop_sequence_seen_first_aborts_the_request_in_vllm():
    client = Client()
    got = asyncio.run(run(engine_with(client), [sequence(1, stop=["fg"])]))
    assert got[1][-1].text == "e" and client.aborted == ["1"]


def test_cancelling_aborts_the_request_in_vllm_and_delivers_nothing_more():
    client = Client(tokens=range(10, 60), delay=0.01)
    engine = engine_with(client)
    seq = sequence(1, max_new_tokens=50)

    async def scenario():
        got = await run(engine, [seq], until_done=False, then=lambda: engine.cancel([seq]))
        await asyncio.sleep(0.1)
        return got

    got = asyncio.run(scenario())
    assert client.aborted == ["1"] and engine.stats()["running"] == 0
    assert not any(isinstance(e, (GenerationResult, ErrorEvent)) for e in got[1])


def test_a_dead_engine_fails_every_request_with_a_503_refuses_later_ones_and_ends_the_worker():
    from vllm.v1.engine.exceptions import EngineDeadError

    engine = engine_with(Client(fail_with=EngineDeadError()))
    got = asyncio.run(run(engine, [sequence(1), sequence(2)]))
    for uid in (1, 2):
        assert got[uid][-1].code == 503 and "vLLM's engine stopped (EngineDeadError)" in got[uid][-1].message
    assert engine.exits == 1
    late = asyncio.run(run(engine, [sequence(3)]))
    assert late[3] == [ErrorEvent(503, engine.stopped)] and engine.exits == 1


def test_a_request_vllm_refuses_fails_alone_with_a_400():
    client = Client()
    engine = engine_with(client)
    engine.backend.seeds_stop_engine = True  # vLLM's CPU build with chunked prefill: a seed would stop its engine
    got = asyncio.run(run(engine, [sequence(1, do_sample=True, seed=7), sequence(2)]))
    assert got[1] == [ErrorEvent(400, got[1][0].message)] and "parameters.seed" in got[1][0].message
    assert isinstance(got[2][-1], GenerationResult) and engine.exits == 0
