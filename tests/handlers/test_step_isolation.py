"""One sequence's failure inside a shared step ends it alone (issue 43): a hostile row beside a busy rolling batch of
good ones on the tiny model, failing at each per-row stage of the hf engine's step - its grammar's mask or advance,
its sampler's draw or the batched selection, its stop checks, its detokenizing, its adapter's rows in the forward.
The good rows' answers equal their answers alone; the hostile row gets its own error, naming its own cause, and no
other request's text reaches anyone."""

import json
import re

import pytest

from lmi_handlers.backends import sampler
from lmi_handlers.detokenize import IncrementalDetokenizer, StopMatcher

from .test_handler_contract import JavaLoop

pytest.importorskip("torch")
pytest.importorskip("llguidance")

SECRET = "SECRET-TOKEN-12345"
NUMBER = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["n"], "additionalProperties": False}
GOOD = {
    "greedy": {"inputs": "The quick brown fox", "parameters": {"max_new_tokens": 8}},
    "stream": {"inputs": "Hello world", "stream": True, "parameters": {"max_new_tokens": 8}},
    "sampled": {"inputs": "A story", "parameters": {"max_new_tokens": 8, "do_sample": True, "seed": 5,
                                                    "temperature": 0.9}},
    "digits": {"inputs": "My number is", "parameters": {"max_new_tokens": 8, "guided_regex": "[0-9]{6}"}},
    "json": {"messages": [{"role": "user", "content": "A number as JSON"}], "max_tokens": 12, "temperature": 0,
             "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": NUMBER}}},
    "adapted": {"inputs": "The quick brown fox", "adapters": "good", "parameters": {"max_new_tokens": 8}},
    # n seeded choices with penalties and top log probabilities: a selection run again row by row draws, counts and
    # ranks nothing twice
    "choices": {"messages": [{"role": "user", "content": "Say something"}], "max_tokens": 8, "n": 2,
                "temperature": 0.8, "seed": 3, "presence_penalty": 0.5, "frequency_penalty": 0.3,
                "repetition_penalty": 1.2, "logprobs": True, "top_logprobs": 2},
}
#: The hostile request of each stage: its own secret in its prompt, its grammar or its stop sequences.
HOSTILE = {
    "mask": {"inputs": SECRET, "parameters": {"max_new_tokens": 8, "guided_regex": f"{SECRET}[a-z]{{30}}"}},
    "advance": {"inputs": SECRET, "parameters": {"max_new_tokens": 8, "guided_regex": f"{SECRET}[a-z]{{30}}"}},
    "draw": {"inputs": SECRET, "parameters": {"max_new_tokens": 8, "do_sample": True, "seed": 9}},
    "selection": {"inputs": SECRET, "parameters": {"max_new_tokens": 8}},
    "stop": {"inputs": "x", "parameters": {"max_new_tokens": 8, "stop": [SECRET]}},
    "detokenize": {"inputs": SECRET, "parameters": {"max_new_tokens": 8}},
    "adapter": {"inputs": SECRET, "adapters": "broken", "parameters": {"max_new_tokens": 8}},
}


def answer(body):
    """The body without what differs from run to run (a chat answer's id and time) or batch to batch (a log
    probability's last digits): its text."""
    return re.sub(r'"(id|created)":[^,]+,|"(log_prob|logprob)":[-0-9.e]+', "", body)


@pytest.fixture(scope="module")
def handler(tiny_rolling_handler):
    return tiny_rolling_handler


def answers_alone(handler, requests):
    """Each of ``requests`` (by name) answered alone, as ``answer`` reads it."""
    answers = {}
    for name, payload in requests.items():
        loop = JavaLoop(handler)
        loop.submit(name, payload)
        while loop.active:
            loop.step()
        assert name not in loop.codes, loop.bodies[name]
        answers[name] = answer(loop.bodies[name])
    return answers


@pytest.fixture(scope="module")
def alone(handler):
    answers = answers_alone(handler, GOOD)
    json.loads(answers["json"])  # (the chat answer: valid whatever the model)
    return answers


def wrap_matchers(handler, monkeypatch, **failing):
    """The hostile request's matcher fails as a grammar does mid-generation: ``compute`` (its mask runs out of
    fuel) or ``consume`` (it refuses a token) at its third step."""
    compile_grammar = handler.backend.compile_grammar

    class Failing:
        def __init__(self, matcher):
            self.matcher, self.calls, self.broken = matcher, 0, False

        def __getattr__(self, name):
            return getattr(self.matcher, name)

        def unsafe_compute_mask_ptr(self, *args):
            self.calls += 1
            self.broken = self.broken or (failing.get("compute") == self.calls)
            return self.matcher.unsafe_compute_mask_ptr(*args)

        def consume_token(self, token):
            self.broken = self.broken or (failing.get("consume") == self.calls)
            return not self.broken and self.matcher.consume_token(token)

        def is_error(self):
            return self.broken

        def get_error(self):
            return f"lexer error: too many expressions constructed\n<state>{SECRET}</state>"

    monkeypatch.setattr(handler.backend, "compile_grammar", lambda constraint: (
        Failing if SECRET in constraint.spec else lambda m: m)(compile_grammar(constraint)))


def hostile_prompt(seqs):
    return any(SECRET in (seq.request.prompt or "") for seq in seqs)


def fail(error):
    raise error


def inject(stage, handler, monkeypatch):
    if stage in ("mask", "advance"):
        wrap_matchers(handler, monkeypatch, **{"compute" if stage == "mask" else "consume": 3})
    elif stage == "draw":
        uniform = sampler._uniform
        monkeypatch.setattr(sampler, "_uniform", lambda torch, seq, device: (
            fail(OverflowError(f"seed out of range for {seq.request.prompt}"))
            if hostile_prompt([seq]) else uniform(torch, seq, device)))
    elif stage == "selection":
        choose = sampler._choose

        def fails_with_the_hostile_row(torch, logits, seqs):
            picks = choose(torch, logits, seqs)  # at its end, once every row has drawn
            if hostile_prompt(seqs):  # the batched selection fails: nothing says which row was at fault
                raise RuntimeError(f"probability tensor contains nan ({SECRET} row)")
            return picks
        monkeypatch.setattr(sampler, "_choose", fails_with_the_hostile_row)
    elif stage == "stop":
        feed = StopMatcher.feed
        monkeypatch.setattr(StopMatcher, "feed", lambda self, text: (
            fail(ValueError(f"stop check failed on {self._stops}")) if SECRET in self._stops
            else feed(self, text)))
    elif stage == "detokenize":
        add = IncrementalDetokenizer.add
        decode = handler.backend.tokenizer.decode
        monkeypatch.setattr(IncrementalDetokenizer, "add", lambda self, token: (
            fail(UnicodeDecodeError("utf-8", SECRET.encode(), 0, 1, "bad bytes"))
            if "12345" in decode(self._ids) else add(self, token)))
    elif stage == "adapter":
        modules = handler.adapters.get("broken").weights.modules  # one factor loses a column: its product fails
        name, (a, b, scaling) = next(iter(modules.items()))
        monkeypatch.setitem(modules, name, (a[:, :-1], b, scaling))


@pytest.mark.parametrize("stage, field, cause", [
    ("mask", "parameters.guided_regex", "too complex to compile within the grammar library's limits"),
    ("advance", "parameters.guided_regex", "too complex to compile within the grammar library's limits"),
    ("draw", None, "OverflowError"),
    ("selection", None, "RuntimeError"),
    ("stop", None, "ValueError"),
    ("detokenize", None, "UnicodeDecodeError"),
    ("adapter", None, "RuntimeError"),
])
def test_a_hostile_row_fails_alone_at_each_stage_and_its_neighbours_answer_as_alone(handler, alone, monkeypatch,
                                                                                    stage, field, cause):
    inject(stage, handler, monkeypatch)
    loop = JavaLoop(handler)
    for name, payload in GOOD.items():
        loop.submit(name, payload)
    loop.step()  # the good rows are generating when the hostile one joins
    loop.submit("hostile", HOSTILE[stage])
    while loop.active:
        loop.step()
    assert loop.codes == {"hostile": 400 if field else 424}, loop.bodies
    error = loop.bodies["hostile"]  # (after what it had sent: its own text so far)
    assert cause in error and (field is None or f"generation failed (grammar): {field}:" in error)
    for name in GOOD:
        assert answer(loop.bodies[name]) == alone[name], name
        assert SECRET not in loop.bodies[name]
    assert handler.engine.idle and handler.backend.kv.stats()["kv_blocks_used"] == 0


def test_a_failure_of_the_whole_step_tells_every_sequence_what_failed_and_quotes_no_request(handler, monkeypatch):
    from lmi_handlers.backends.hf.backend import PagedRunner

    def broken(self, chunks, last=1):
        raise RuntimeError(f"device lost while running {SECRET}")

    loop = JavaLoop(handler)
    for name in ("greedy", "sampled"):
        loop.submit(name, GOOD[name])
    loop.step()
    monkeypatch.setattr(PagedRunner, "_forward", broken)  # every row fails alone too: the model's failure
    while loop.active:
        loop.step()
    assert loop.codes == {"greedy": 424, "sampled": 424}
    for body in loop.bodies.values():
        assert body.endswith("generation failed: RuntimeError in the model's step (the server log has the details)")
        assert SECRET not in body


@pytest.mark.parametrize("rolling", [True, False])
def test_error_text_is_capped_for_the_client_and_the_log(tmp_path, monkeypatch, caplog, rolling):
    from lmi_handlers.errors import MAX_ERROR_CHARS, MAX_LOG_CHARS
    from lmi_tools.serving.worker.frontend import request_input

    from .test_handler_contract import JSON, content, loaded as scripted

    handler = scripted(tmp_path, rolling_batch="scheduler" if rolling else "disable")
    encode = handler.backend.tokenizer.encode
    monkeypatch.setattr(handler.backend.tokenizer, "encode", lambda text: (
        fail(RuntimeError("x" * 1_000_000)) if text == "boom" else encode(text)))
    if rolling:
        loop = JavaLoop(handler)
        loop.submit("boom", {"inputs": "boom"})
        loop.submit("ok", {"inputs": "ok", "parameters": {"max_new_tokens": 2}})
        while loop.active:
            loop.step()
        errors = [loop.bodies["boom"]]
        assert loop.codes == {"boom": 424}
    else:
        outputs = [handler.handle(request_input(JSON, json.dumps({"inputs": "boom", "stream": stream}).encode()))
                   for stream in (False, True)]
        errors = [json.loads(content(output))["error"] for output in outputs]
        assert [output.code for output in outputs] == [424, 424]
    assert all(len(error) == MAX_ERROR_CHARS and error.endswith("(cut: 1000014 characters in all)")
               for error in errors), [len(e) for e in errors]
    assert all(len(record.getMessage()) < 2 * MAX_LOG_CHARS + 200 for record in caplog.records)
