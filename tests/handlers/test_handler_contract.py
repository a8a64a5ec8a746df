"""The handler answers every Input layout DJLServing sends (reference/djl-contract.md §1.6-1.7, §2.3, §3, §4),
driven through lmi_tools.serving.worker.frontend exactly as the Java front end builds them. Scripted backend: no
weights."""

import importlib
import json

import pytest

from lmi_handlers.handler import Handler
from lmi_tools.serving.worker.frontend import (RollingBatchLoop, RollingRequest, batch_input, init_input, request_input)

JSON = [("Content-Type", "application/json")]


def body(**payload):
    return json.dumps(payload).encode()


def loaded(tmp_path, **options):
    handler = Handler()
    props = {"engine": "Python", "entryPoint": "lmi_handlers.entrypoint", "backend": "scripted",
             "model_dir": str(tmp_path), **{k: str(v) for k, v in options.items()}}
    assert handler.handle(init_input(props)) is None
    return handler


def content(output, index=0):
    return bytes(output.content.value_at(index)).decode()


def test_init_call_loads_and_returns_none(tmp_path):
    handler = loaded(tmp_path)
    assert handler.initialized and handler.backend.name == "scripted"


@pytest.mark.parametrize("payload, field", [
    ({"inputs": "hi", "parameters": {"min_p": 0.1}}, "parameters.min_p"),
    ({"inputs": "hi", "parameters": {"logit_bias": {"5": -100}}}, "parameters.logit_bias"),
    ({"messages": [{"role": "user", "content": "hi"}], "presence_penalty": 1.5}, "presence_penalty"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 2}, "top_logprobs"),
])
def test_sampling_fields_a_backend_does_not_honour_are_refused_by_name(tmp_path, payload, field):
    out = loaded(tmp_path).handle(request_input(JSON, body(**payload)))
    assert out.code == 400 and field in content(out) and "not supported by the scripted backend" in content(out)


def test_their_off_values_are_accepted_everywhere(tmp_path):
    payload = {"messages": [{"role": "user", "content": "hi"}], "presence_penalty": 0, "frequency_penalty": 0.0,
               "top_logprobs": 0, "max_tokens": 2}
    assert loaded(tmp_path).handle(request_input(JSON, body(**payload))).code == 200


def test_later_calls_carry_only_headers(tmp_path):
    handler = loaded(tmp_path, max_new_tokens=5)
    out = handler.handle(request_input(JSON, body(inputs="hi")))
    assert out.code == 200 and out.properties["content-type"] == "application/json"
    assert json.loads(content(out)) == {"generated_text": " The "}  # option.max_new_tokens from the init call


def test_init_failure_is_reported_and_retried(tmp_path):
    handler = Handler()
    out = handler.handle(init_input({"backend": "scripted", "model_dir": str(tmp_path), "dtype": "fp8"}))
    assert out.code == 400 and "option.dtype='fp8' is invalid" in content(out)
    assert not handler.initialized
    out = handler.handle(init_input({"backend": "scripted", "model_dir": str(tmp_path),
                                     "scripted_fail_load": "true"}))
    assert out.code == 424 and "model failed to load" in content(out)
    assert handler.handle(init_input({"backend": "scripted", "model_dir": str(tmp_path)})) is None


def test_djl_test_harness_style_first_call_with_merged_properties(tmp_path):
    # djl_python's TestHandler resets module._service.initialized and sends no empty init call.
    entrypoint = importlib.import_module("lmi_handlers.entrypoint")
    entrypoint._service.initialized = False
    props = {"backend": "scripted", "model_dir": str(tmp_path), "Content-Type": "application/json"}
    out = entrypoint.handle(request_input(props.items(), body(inputs="x", parameters={"max_new_tokens": 2})))
    assert json.loads(content(out)) == {"generated_text": " T"}
    entrypoint._service.initialized = False


def test_djl_test_harness_style_rolling_batch_without_an_init_call(tmp_path):
    # TestHandler.inference_rolling_batch sends the step layout (batch_size=2, batch_NNN_data) as the first call.
    handler = Handler()
    steps = RollingBatchLoop(max_size=4)
    for name, tokens in (("a", 3), ("b", 2)):
        steps.add(RollingRequest(request_input(JSON, body(inputs=name, parameters={"max_new_tokens": tokens})),
                                 seed=1, key=name))
    first = steps.next_input()
    first.properties.update({"backend": "scripted", "model_dir": str(tmp_path), "rolling_batch": "auto"})
    out = handler.handle(first)
    assert out.code == 200 and out.content.size() == 2 and handler.rolling is not None
    assert handler.config.properties.get("batch_size") is None


def test_accept_header_selects_sse_streaming(tmp_path):
    handler = loaded(tmp_path)
    out = handler.handle(request_input(JSON + [("Accept", "text/event-stream")],
                                       body(inputs="x", parameters={"max_new_tokens": 3})))
    assert out.properties["content-type"] == "text/event-stream"
    chunks = list(out.stream_content)
    assert len(chunks) == 3 and all(c.startswith("data: ") for c in chunks)


def test_custom_attributes_become_properties():
    inputs = request_input([("X-Amzn-SageMaker-Custom-Attributes", "a=1; b=two"), ("x-request-id", "r1")], b"{}")
    assert inputs.get_property("a") == "1" and inputs.get_property("b") == "two"
    assert inputs.get_property("requestId") == "r1"
    assert inputs.get_property("X-Amzn-SageMaker-Custom-Attributes") is None


def test_dynamic_batch_answers_each_request_and_isolates_bad_ones(tmp_path):
    handler = loaded(tmp_path, batch_size=4)
    batch = batch_input([
        request_input(JSON, body(inputs="a", parameters={"max_new_tokens": 2})),
        request_input(JSON, b"{not json"),
        request_input(JSON, body(inputs=["b", "c"], parameters={"max_new_tokens": 3})),
        request_input(JSON, body(inputs="d", parameters={"top_p": 7})),
    ])
    assert batch.get_property("batch_size") == "4" and batch.get_property("batch_000.Content-Type")
    out = handler.handle(batch)
    assert out.code == 200 and out.content.get_keys() == [f"batch_{i}.data" for i in range(4)]
    assert json.loads(content(out, 0)) == {"generated_text": " T"}
    bad = json.loads(content(out, 1))
    assert bad["code"] == 400 and "not valid JSON" in bad["error"]
    assert json.loads(content(out, 2)) == [{"generated_text": " Th"}, {"generated_text": " Th"}]
    assert "parameters.top_p" in json.loads(content(out, 3))["error"]


def test_a_batch_of_one_is_sent_unwrapped(tmp_path):
    single = batch_input([request_input(JSON, body(inputs="a"))])
    assert not single.is_batch() and single.get_property("handler") == "handle"


def test_single_request_errors_are_status_codes(tmp_path):
    handler = loaded(tmp_path)
    out = handler.handle(request_input(JSON, b"[1, 2]"))
    assert out.code == 400 and json.loads(content(out))["error"].startswith("body: expected a JSON object")
    out = handler.handle(request_input(JSON, body(inputs="x", parameters={"max_new_tokens": 5000})))
    assert out.code == 400 and "parameters.max_new_tokens" in json.loads(content(out))["error"]
    out = handler.handle(request_input(JSON, body(inputs="[[fail@2]]", parameters={"max_new_tokens": 5})))
    assert out.code == 424 and "scripted failure" in json.loads(content(out))["error"]
    out = handler.handle(request_input(JSON, body(inputs="[[oom@1]]")))
    assert out.code == 507


def test_streaming_failure_ends_the_stream_with_an_error_line(tmp_path):
    handler = loaded(tmp_path)
    out = handler.handle(request_input(JSON, body(inputs="[[fail@3]]", stream=True)))
    lines = [json.loads(line) for chunk in out.stream_content for line in chunk.splitlines()]
    assert [line.get("token", {}).get("text") for line in lines[:2]] == [" ", "T"]
    assert lines[2]["code"] == 424 and "scripted failure" in lines[2]["error"]
    # The handler keeps serving afterwards.
    out = handler.handle(request_input(JSON, body(inputs="ok", parameters={"max_new_tokens": 1})))
    assert out.code == 200


class JavaLoop:
    """Drives the handler with the Java-side rolling-batch loop and collects each request's answer."""

    def __init__(self, handler):
        self.handler, self.loop = handler, RollingBatchLoop(max_size=64)
        self.bodies, self.headers, self.codes = {}, {}, {}

    @property
    def active(self):
        return self.loop.active

    def submit(self, name, payload, headers=JSON):
        inputs = request_input(headers, json.dumps(payload).encode())
        self.loop.add(RollingRequest(inputs, seed=len(self.bodies) + 1, key=name))
        self.bodies[name] = ""

    def step(self):
        out = self.handler.handle(self.loop.next_input())
        items = [out.content.value_at(i) for i in range(out.content.size())]
        for item in self.loop.apply(out.code, out.properties, items):
            name = item.request.key
            self.headers.setdefault(name, item.content_type)
            if item.code is not None:
                self.codes[name] = item.code
                self.bodies[name] += item.error or ""
            else:
                self.bodies[name] += item.data
            if item.last:
                assert item.data or item.code is not None, "the last step must carry data"
        return out


def test_rolling_batch_step_protocol(tmp_path):
    handler = loaded(tmp_path, rolling_batch="auto", max_rolling_batch_size=4)
    loop = JavaLoop(handler)
    loop.submit("a", {"inputs": "a", "parameters": {"max_new_tokens": 4}})
    loop.step()
    loop.submit("b", {"inputs": "b", "stream": True, "parameters": {"max_new_tokens": 2}})
    loop.submit("bad", {"inputs": "c", "parameters": {"top_k": "x"}})
    loop.step()
    assert loop.codes == {"bad": 400} and "parameters.top_k" in loop.bodies["bad"]
    while loop.active:
        loop.step()
    assert json.loads(loop.bodies["a"]) == {"generated_text": " The"}
    lines = [json.loads(line) for line in loop.bodies["b"].splitlines()]
    assert lines[-1]["generated_text"] == " T"
    assert loop.headers == {"a": "application/json", "b": "application/jsonlines", "bad": "application/json"}


def test_rolling_steps_carry_the_engine_counters_outside_the_batch_headers(tmp_path):
    handler = loaded(tmp_path, rolling_batch="auto", max_rolling_batch_size=4)
    loop = JavaLoop(handler)
    loop.submit("a", {"inputs": "a", "parameters": {"max_new_tokens": 3}})
    loop.submit("b", {"inputs": "b", "parameters": {"max_new_tokens": 3}})
    out = loop.step()
    # No batch_ prefix: DJLServing drops it; our server reads it for /metrics.
    # kv_cache_usage: the scripted backend's slots in use (2 of 4).
    counters = {"running": 2, "waiting": 0, "preemptions": 0, "kv_cache_usage": 0.5}
    assert json.loads(out.properties["lmi_engine_stats"]) == counters
    assert loop.loop.engine_stats == counters
    while loop.active:
        loop.step()
    assert loop.loop.engine_stats["running"] == 0
    assert loop.loop.apply(200, {"lmi_engine_stats": "{not json"}, []) == []  # a garbled property fails nothing
    assert loop.loop.engine_stats == {"running": 0, "waiting": 0, "preemptions": 0, "kv_cache_usage": 0}


def test_rolling_batch_failure_fails_that_step_only_and_recovers(tmp_path):
    handler = loaded(tmp_path, rolling_batch="scheduler")
    loop = JavaLoop(handler)
    loop.submit("a", {"inputs": "a", "parameters": {"max_new_tokens": 3}})
    loop.submit("boom", {"inputs": "[[fail@2]]", "parameters": {"max_new_tokens": 3}})
    while loop.active:
        loop.step()
    # A backend failure fails every sequence of that step with 424; the handler then serves new work.
    assert loop.codes == {"a": 424, "boom": 424}
    loop.submit("c", {"inputs": "c", "parameters": {"max_new_tokens": 2}})
    while loop.active:
        loop.step()
    assert json.loads(loop.bodies["c"]) == {"generated_text": " T"}


def test_reset_rollingbatch_clears_state(tmp_path):
    handler = loaded(tmp_path, rolling_batch="auto")
    loop = JavaLoop(handler)
    loop.submit("a", {"inputs": "a", "parameters": {"max_new_tokens": 50}})
    loop.step()
    loop.loop.active, loop.loop.reset_next = [], True
    loop.submit("b", {"inputs": "b", "parameters": {"max_new_tokens": 1}})
    loop.step()
    assert json.loads(loop.bodies["b"]) == {"generated_text": " "} and not loop.active
    assert handler.engine.idle


def test_rolling_batch_out_of_step_fails_the_batch(tmp_path):
    handler = loaded(tmp_path, rolling_batch="auto")
    loop = JavaLoop(handler)
    loop.submit("a", {"inputs": "a", "parameters": {"max_new_tokens": 50}})
    loop.submit("b", {"inputs": "b", "parameters": {"max_new_tokens": 50}})
    loop.step()
    loop.loop.active = loop.active[:1]  # Java lost one without telling the handler
    out = loop.step()
    assert out.code == 424 and "out of step" in content(out)


def test_rolling_batch_cancel_frees_the_slot(tmp_path):
    handler = loaded(tmp_path, rolling_batch="auto")
    loop = JavaLoop(handler)
    loop.submit("a", {"inputs": "a", "stream": True, "parameters": {"max_new_tokens": 50}})
    loop.step()
    loop.active[0].cancelled = True
    loop.step()
    assert not loop.active and handler.engine.idle


def test_waiting_requests_beyond_capacity_stay_silent(tmp_path):
    handler = loaded(tmp_path, rolling_batch="auto", max_rolling_batch_size=1)
    loop = JavaLoop(handler)
    loop.submit("a", {"inputs": "a", "parameters": {"max_new_tokens": 2}})
    loop.submit("b", {"inputs": "b", "parameters": {"max_new_tokens": 2}})
    steps = 0
    while loop.active:
        loop.step()
        steps += 1
    assert steps == 4 and json.loads(loop.bodies["b"]) == {"generated_text": " T"}


@pytest.mark.parametrize("payload", [
    {"inputs": "x", "parameters": {"max_new_tokens": 3}},
    {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "stream": True},
    {"text": ["x", "y"], "seq_length": 6},
])
def test_every_schema_through_rolling_batch(tmp_path, payload):
    handler = loaded(tmp_path, rolling_batch="auto")
    loop = JavaLoop(handler)
    loop.submit("r", payload)
    while loop.active:
        loop.step()
    assert loop.codes == {} and loop.bodies["r"]


# DJL's integration client (tests/integration/llm/client.py, the huggingface case) sends a list of one prompt
# with "stream": true.
DJL_CLIENT = {"inputs": ["hi"], "stream": True, "parameters": {"max_new_tokens": 4}}


def test_a_list_with_stream_true_is_answered_as_a_json_list_without_rolling_batch(tmp_path):
    handler = loaded(tmp_path)
    out = handler.handle(request_input(JSON, json.dumps(DJL_CLIENT).encode()))
    assert out.code == 200 and out.properties["content-type"] == "application/json"
    assert json.loads(content(out)) == [{"generated_text": " The"}]
    out = handler.handle(request_input(JSON, body(inputs=["hi", "ho"], stream=True,
                                                  parameters={"max_new_tokens": 2})))
    assert json.loads(content(out)) == [{"generated_text": " T"}, {"generated_text": " T"}]


def test_a_list_with_stream_true_is_refused_in_a_rolling_batch_as_djl_does(tmp_path):
    loop = JavaLoop(loaded(tmp_path, rolling_batch="auto"))
    loop.submit("list", DJL_CLIENT)
    loop.step()
    assert loop.codes["list"] == 400
    assert loop.bodies["list"].startswith("inputs: with \"stream\": true and rolling batch, 'inputs' must be one "
                                          "string") and "got 'a list of 1 prompt'" in loop.bodies["list"]


def test_a_rolling_json_answer_arrives_in_pieces_that_form_djls_document(tmp_path):
    loop = JavaLoop(loaded(tmp_path, rolling_batch="auto"))
    loop.submit("json", {"inputs": "hi", "parameters": {"max_new_tokens": 4}})
    pieces = []
    while loop.active:
        before = loop.bodies["json"]
        loop.step()
        pieces.append(loop.bodies["json"][len(before):])
    assert pieces == ['{"generated_text": "', " T", "h", 'e"}'] and loop.headers["json"] == "application/json"
