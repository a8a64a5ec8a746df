"""One request's failure - parsing, tokenizing, decoding - is its own answer in a rolling batch; its neighbours
finish with the text they get alone, and a long prompt is tokenized while the others keep stepping (issue 12)."""

import json
import os
import re
import threading

import pytest

from lmi_tools.serving.worker.frontend import batch_input, request_input

from .test_handler_contract import JSON, JavaLoop, content, loaded

GOOD = {"a": {"inputs": "a", "parameters": {"max_new_tokens": 6}},
        "s": {"inputs": "b", "stream": True, "parameters": {"max_new_tokens": 5}},
        "c": {"messages": [{"role": "user", "content": "c"}], "max_tokens": 4, "temperature": 0}}
MALFORMED = {
    "surrogate": b'{"inputs": "a\\ud800b"}',
    "digits": b'{"inputs": "x", "parameters": {"max_new_tokens": ' + b"9" * 5000 + b"}}",
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "utf8": b'{"inputs": "\xff"}',
    "blank": b'{"inputs": "   "}',
    "name": b'{"messages": [{"role": "user", "content": "x", "name": 5}]}',
    "n": b'{"messages": [{"role": "user", "content": "x"}], "n": true}',
    "many": json.dumps({"inputs": ["x"] * 200}).encode(),
}


def answer(body):
    return re.sub(r'"(id|created)":[^,]+,', "", body)  # a chat answer's id and time differ from run to run


def alone(tmp_path, name):
    loop = JavaLoop(loaded(tmp_path, rolling_batch="scheduler"))
    loop.submit(name, GOOD[name])
    while loop.active:
        loop.step()
    return answer(loop.bodies[name])


def run_mixed(tmp_path, bad, prepare=None, **options):
    handler = loaded(tmp_path, rolling_batch="scheduler", **options)
    if prepare:
        prepare(handler)
    loop = JavaLoop(handler)
    for name, payload in GOOD.items():
        loop.submit(name, payload)
    loop.step()
    for name, raw in bad.items():  # they arrive while the good ones are generating
        loop.loop.add(type(loop.active[0])(request_input(JSON, raw), seed=7, key=name))
        loop.bodies[name] = ""
    while loop.active:
        loop.step()
    return loop


def test_malformed_requests_fail_alone(tmp_path):
    loop = run_mixed(tmp_path, MALFORMED)
    assert loop.codes == {name: 400 for name in MALFORMED}, loop.bodies
    for name in GOOD:
        assert answer(loop.bodies[name]) == alone(tmp_path, name)
    assert "lone surrogate" in loop.bodies["surrogate"] and "nested too deeply" in loop.bodies["deep"]
    assert "messages[0].name" in loop.bodies["name"] and "at most 64 prompts" in loop.bodies["many"]


def test_a_tokenizer_failure_fails_its_request_alone(tmp_path):
    def breaking_tokenizer(handler):
        encode = handler.backend.tokenizer.encode

        def encode_or_fail(text):
            if "boom" in text:
                raise RuntimeError("tokenizer exploded")
            return encode(text)
        handler.backend.tokenizer.encode = encode_or_fail

    loop = run_mixed(tmp_path, {"boom": b'{"inputs": "boom"}'}, breaking_tokenizer)
    assert loop.codes == {"boom": 424} and "tokenizer exploded" in loop.bodies["boom"]
    assert all(answer(loop.bodies[name]) == alone(tmp_path, name) for name in GOOD)


def test_a_decoding_failure_fails_its_sequence_alone(tmp_path):
    def breaking_decoder(handler):
        decode, prompt = handler.backend.tokenizer.decode, handler.backend.tokenizer.encode("x")

        def decode_or_fail(ids):
            if list(ids) != prompt and prompt[-1] in ids:  # generated text after the prompt "x"
                raise ValueError("bad bytes")
            return decode(ids)
        handler.backend.tokenizer.decode = decode_or_fail

    loop = run_mixed(tmp_path, {"x": b'{"inputs": "x", "parameters": {"max_new_tokens": 3}}'}, breaking_decoder)
    assert loop.codes == {"x": 424} and "bad bytes" in loop.bodies["x"]
    assert all(answer(loop.bodies[name]) == alone(tmp_path, name) for name in GOOD)


def test_a_long_prompt_is_tokenized_while_the_others_step(tmp_path):
    release = threading.Event()

    def slow_tokenizer(handler):
        encode = handler.backend.tokenizer.encode

        def encode_slowly(text):
            if len(text) > 100_000:
                assert release.wait(30), "the step loop never finished the short requests"
            return encode(text)
        handler.backend.tokenizer.encode = encode_slowly

    handler = loaded(tmp_path, rolling_batch="scheduler", scripted_max_sequence_length=300_000)
    slow_tokenizer(handler)
    loop = JavaLoop(handler)
    loop.submit("long", {"inputs": "y" * 200_000, "parameters": {"max_new_tokens": 2}})
    loop.submit("a", GOOD["a"])
    while "a" in {r.key for r in loop.active}:
        loop.step()  # would block here, inside the tokenizer, if the long prompt were prepared in the step
    assert answer(loop.bodies["a"]) == alone(tmp_path, "a") and loop.bodies["long"] == ""
    release.set()
    while loop.active:
        loop.step()
    assert json.loads(loop.bodies["long"]) == {"generated_text": " T"}


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's scheduling classes")
def test_requests_are_prepared_in_the_idle_class_beside_our_engine_and_niced_beside_vllms():
    # Beside our engine a preparing thread that preempted a torch worker mid-product would hold up the whole step;
    # beside vLLM's busy engine processes one in the idle class would hardly ever run (rolling.preparation_pool).
    from lmi_handlers.rolling import PREPARE_NICENESS, preparation_pool

    def policy_and_nice():
        return os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    base = os.getpriority(os.PRIO_PROCESS, 0)
    for beside_ours, want in ((True, (os.SCHED_IDLE, base)),
                              (False, (os.SCHED_OTHER, min(19, base + PREPARE_NICENESS)))):
        pool = preparation_pool(beside_ours)
        try:
            assert pool.submit(policy_and_nice).result(10) == want
        finally:
            pool.shutdown()
    assert policy_and_nice() == (os.SCHED_OTHER, base)  # the step loop's thread keeps its own


@pytest.mark.parametrize("name", ["surrogate", "digits", "deep"])
def test_the_issues_three_inputs_are_400s_in_every_mode(tmp_path, name):
    """Issue 12 #1: each used to be a 424 for its whole batch; now a 400 naming what is wrong, in every mode."""
    raw = MALFORMED[name]
    single = loaded(tmp_path).handle(request_input(JSON, raw))
    assert single.code == 400, content(single)
    handler = loaded(tmp_path, batch_size=3)
    good = request_input(JSON, json.dumps(GOOD["a"]).encode())
    out = handler.handle(batch_input([good, request_input(JSON, raw), good]))
    assert out.code == 200 and json.loads(content(out, 1))["code"] == 400
    assert content(out, 0) == content(out, 2) == content(handler.handle(good))
