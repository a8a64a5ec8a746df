"""Request priority (issue 47): vLLM's ``priority`` field, lower first, with ``option.scheduling_policy=priority``.

The scheduler alone on a small block pool (admission order, the preemption victim, preemption for a more urgent
request), then the handler under a full rolling batch: a high-priority request's first token comes before those of
the requests queued ahead of it, and in DJL's async mode an urgent request's answer before theirs. Ordering only, never
timing."""

import asyncio
from collections import deque

import pytest

from lmi_handlers.config import ConfigError
from lmi_handlers.request import GenerationRequest, SamplingParams, Schema, StoppingParams, parse_payload
from lmi_handlers.scheduler import Scheduler, priority_scheduling
from lmi_handlers.sequence import SequenceState

from .test_handler_contract import JavaLoop, loaded
from .test_scheduler import FakeBackend


def seq(prompt, priority=0, new_tokens=4):
    stopping = StoppingParams(max_new_tokens=new_tokens, ignore_eos=True)
    request = GenerationRequest(Schema.LMI, "", SamplingParams(), stopping, priority=priority)
    return SequenceState(request, prompt, decode=lambda ids: "")


def step(scheduler, waiting, running):
    chunks = scheduler.schedule(waiting, running)
    for chunk in chunks:
        if chunk.sample:
            chunk.seq.append(7, 0.0)
        chunk.seq.num_cached = chunk.end
        if chunk.seq.finished:
            scheduler.backend.release(chunk.seq)
    running[:] = [s for s in running if not s.finished]
    return [chunk.seq for chunk in chunks]


def test_the_queue_is_ordered_by_priority_then_arrival():
    scheduler, waiting = Scheduler(FakeBackend(blocks=64, rows=1), by_priority=True), deque()
    late, urgent, first, urgent_too = seq([1] * 3, 5), seq([2] * 3, -1), seq([3] * 3, 0), seq([4] * 3, -1)
    for s in (late, urgent, first, urgent_too):
        scheduler.enqueue(waiting, s)
    assert list(waiting) == [urgent, urgent_too, first, late]
    fcfs, plain = Scheduler(FakeBackend(blocks=64)), deque()
    for s in (late, urgent):
        fcfs.enqueue(plain, s)
    assert list(plain) == [late, urgent]


def test_a_dry_pool_preempts_the_least_urgent_not_the_youngest():
    scheduler, waiting, running = Scheduler(FakeBackend(blocks=5), by_priority=True), deque(), []
    background, urgent = seq(list(range(7)), priority=3, new_tokens=6), seq(list(range(10, 17)), -2, new_tokens=6)
    scheduler.enqueue(waiting, background)
    step(scheduler, waiting, running)
    scheduler.enqueue(waiting, urgent)  # younger, but more urgent
    while not scheduler.preemptions:
        step(scheduler, waiting, running)
    assert list(waiting) == [background] and urgent in running


def test_an_urgent_request_takes_blocks_from_a_less_urgent_running_one():
    scheduler, waiting, running = Scheduler(FakeBackend(blocks=4), by_priority=True), deque(), []
    background = seq(list(range(11)), priority=1, new_tokens=8)  # 11 + 1 tokens: 3 of the 4 blocks
    scheduler.enqueue(waiting, background)
    step(scheduler, waiting, running)
    urgent = seq(list(range(20, 27)), priority=0)  # needs 2 blocks: only 1 is free
    scheduler.enqueue(waiting, urgent)
    assert step(scheduler, waiting, running) == [urgent]  # the background request's decode chunk is withdrawn
    assert running == [urgent] and list(waiting) == [background] and scheduler.preemptions == 1
    equal = Scheduler(FakeBackend(blocks=4), by_priority=False)  # first come, first served: it waits instead
    waiting, running = deque([seq(list(range(11)), new_tokens=8)]), []
    step(equal, waiting, running)
    equal.enqueue(waiting, seq(list(range(20, 27))))
    assert len(step(equal, waiting, running)) == 1 and equal.preemptions == 0 and len(waiting) == 1


def test_under_a_full_batch_an_urgent_request_gets_its_first_token_before_the_queue(tmp_path):
    handler = loaded(tmp_path, rolling_batch="scheduler", max_rolling_batch_size=2, scheduling_policy="priority")
    loop = JavaLoop(handler)
    for name, tokens in (("run1", 4), ("run2", 6)):  # one row frees at a time
        loop.submit(name, {"inputs": name, "stream": True, "parameters": {"max_new_tokens": tokens}})
    loop.step()
    for name in ("q1", "q2", "q3"):
        loop.submit(name, {"inputs": name, "stream": True, "parameters": {"max_new_tokens": 3}})
    loop.submit("urgent", {"inputs": "urgent", "stream": True, "parameters": {"max_new_tokens": 3, "priority": -5}})
    first_token, steps = {}, 0
    while loop.active:
        loop.step()
        steps += 1
        for name, body in loop.bodies.items():
            if body and name not in first_token:
                first_token[name] = steps
    assert all(first_token["urgent"] < first_token[q] for q in ("q1", "q2", "q3")), first_token
    assert not loop.codes


def test_a_priority_without_priority_scheduling_is_refused_naming_the_field(tmp_path):
    loop = JavaLoop(loaded(tmp_path, rolling_batch="scheduler"))
    loop.submit("lmi", {"inputs": "x", "parameters": {"priority": 2}})
    loop.submit("chat", {"messages": [{"role": "user", "content": "x"}], "priority": -1})
    loop.submit("zero", {"inputs": "x", "parameters": {"priority": 0, "max_new_tokens": 2}})
    while loop.active:
        loop.step()
    assert loop.codes == {"lmi": 400, "chat": 400}
    assert "parameters.priority" in loop.bodies["lmi"] and "option.scheduling_policy=priority" in loop.bodies["lmi"]
    assert "priority: " in loop.bodies["chat"] and loop.bodies["zero"]


@pytest.mark.parametrize("value", ["high", 1.5, True, 2**31])
def test_a_priority_must_be_a_32_bit_integer(value):
    with pytest.raises(Exception, match="parameters.priority"):
        parse_payload({"inputs": "x", "parameters": {"priority": value}}, 8)


def test_the_policy_option_takes_vllms_names():
    assert priority_scheduling({"scheduling_policy": "priority"}) and not priority_scheduling({})
    with pytest.raises(ConfigError, match="fcfs, priority"):
        priority_scheduling({"scheduling_policy": "lifo"})


def test_in_async_mode_an_urgent_request_overtakes_the_queue_too():
    """DJL's async mode: our engine on its own thread schedules by priority as the rolling batch does."""
    from .test_async_mode import call, items, loaded
    from .test_async_mode import request as async_request

    module = loaded("ours", max_rolling_batch_size="2", scheduling_policy="priority", scripted_step_delay_ms="10")
    done = []

    async def ask(name, tokens, priority=0):
        outputs = await call("ours", module, async_request(
            {"inputs": name, "parameters": {"max_new_tokens": tokens, "priority": priority}}, name))
        assert "error" not in items(outputs)[-1], items(outputs)
        done.append(name)

    async def scenario():
        running = [asyncio.ensure_future(ask(name, tokens)) for name, tokens in (("run1", 4), ("run2", 6))]
        await asyncio.sleep(0.03)  # both rows taken; those below wait for one
        queued = [asyncio.ensure_future(ask(name, 3)) for name in ("q1", "q2", "q3")]
        await asyncio.gather(*running, *queued, ask("urgent", 3, priority=-5))

    module.run(scenario())
    assert done.index("urgent") < min(done.index(name) for name in ("q1", "q2", "q3")), done
