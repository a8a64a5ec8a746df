"""OpenTelemetry spans per request (issue 47), caught by the SDK's in-memory exporter: one ``llm_request`` span
under the client's ``traceparent`` with ``queued``, ``prefill`` and ``decode`` children in order, token counts and the
model, in rolling batch and in DJL's async mode; a failed or cancelled sequence ends its span with an error. (Over
OTLP/HTTP, through ``lmi serve``: ``integration_tests/test_serve_fleet.py``.)"""

import pytest

from lmi_handlers import tracing
from lmi_handlers.config import ConfigError

from .test_handler_contract import JavaLoop, loaded

sdk = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
JSON = [("Content-Type", "application/json")]


@pytest.fixture
def traced(tmp_path):
    """A rolling-batch handler on the scripted backend whose spans go to memory."""
    handler = loaded(tmp_path, rolling_batch="scheduler", otlp_traces_endpoint="http://127.0.0.1:9/v1/traces")
    handler.engine.tracer.close()
    exporter, provider = InMemorySpanExporter(), sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    handler.engine.tracer = tracing.Tracer("scripted-model", provider)
    return handler, exporter


def by_name(spans):
    return {span.name: span for span in spans}


def test_a_request_is_one_span_under_the_clients_traceparent_with_its_phases(traced):
    handler, exporter = traced
    loop = JavaLoop(handler)
    loop.submit("a", {"inputs": "hello", "parameters": {"max_new_tokens": 5}},
                headers=JSON + [("traceparent", f"00-{TRACE_ID}-{PARENT}-01")])
    loop.submit("plain", {"inputs": "hi", "parameters": {"max_new_tokens": 2}})
    while loop.active:
        loop.step()
    spans = exporter.get_finished_spans()
    requests = [span for span in spans if span.name == "llm_request"]
    assert len(requests) == 2
    mine = next(span for span in requests if format(span.context.trace_id, "032x") == TRACE_ID)
    assert format(mine.parent.span_id, "016x") == PARENT and mine.kind.name == "SERVER"
    assert mine.attributes["gen_ai.usage.prompt_tokens"] == 6 and mine.attributes["gen_ai.usage.completion_tokens"] == 5
    assert mine.attributes["gen_ai.request.model"] == "scripted-model" and mine.status.is_ok
    children = by_name(span for span in spans if span.parent is not None and span.parent.span_id == mine.context.span_id)
    assert set(children) == {"queued", "prefill", "decode"}
    assert mine.start_time == children["queued"].start_time <= children["queued"].end_time == \
        children["prefill"].start_time <= children["prefill"].end_time == children["decode"].start_time <= \
        children["decode"].end_time == mine.end_time
    assert children["decode"].attributes["gen_ai.usage.completion_tokens"] == 5
    other = next(span for span in requests if span is not mine)
    assert other.parent is None  # no traceparent: a trace of its own


def test_a_failed_step_ends_its_spans_with_an_error(traced):
    handler, exporter = traced
    loop = JavaLoop(handler)
    loop.submit("boom", {"inputs": "x [[fail@2]]", "parameters": {"max_new_tokens": 5}})
    while loop.active:
        loop.step()
    span = by_name(exporter.get_finished_spans())["llm_request"]
    assert not span.status.is_ok and "scripted failure" in span.status.description


def test_tracing_follows_the_option_and_the_standard_variables():
    assert not tracing.enabled({}, {})
    assert tracing.enabled({"otlp_traces_endpoint": "http://collector:4318/v1/traces"}, {})
    assert tracing.enabled({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert not tracing.enabled({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})
    assert not tracing.enabled({"otlp_traces_endpoint": "http://c"}, {"OTEL_TRACES_EXPORTER": "none"})
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        tracing.Tracer.from_config("m", {"otlp_traces_endpoint": "x"}, {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "udp"})


def test_in_async_mode_the_engine_thread_traces_under_the_clients_traceparent():
    from .test_async_mode import call, loaded, request, text

    module = loaded("ours", otlp_traces_endpoint="http://127.0.0.1:9/v1/traces")
    engine = module.handler._async.engine.engine  # our engine, on the engine thread
    engine.tracer.close()
    exporter, provider = InMemorySpanExporter(), sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    engine.tracer = tracing.Tracer("scripted-model", provider)
    answer = module.run(call("ours", module, request({"inputs": "hello", "parameters": {"max_new_tokens": 3}}, "t",
                                                    headers=JSON + [("traceparent", f"00-{TRACE_ID}-{PARENT}-01")])))
    assert "generated_text" in text(answer)
    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {"llm_request", "queued", "prefill", "decode"}
    assert format(spans["llm_request"].context.trace_id, "032x") == TRACE_ID
    assert format(spans["llm_request"].parent.span_id, "016x") == PARENT
