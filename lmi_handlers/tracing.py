"""OpenTelemetry spans per request, so that operators follow a request from their gateway into the engine.

Each sequence our engine runs (``engine.Engine``: the hf, neuronx and scripted backends) ends as one ``llm_request``
span (kind SERVER, from its arrival at the handler to its last token) with three children: ``queued`` (until the
scheduler admits it), ``prefill`` (until its first token) and ``decode`` (until its last). The span's parent is the
client's W3C ``traceparent`` (and ``tracestate``) header where it sent one. Attributes use vLLM's names
(``vllm/tracing/utils.py``: ``gen_ai.request.id``, ``gen_ai.usage.prompt_tokens``, ``gen_ai.latency.*``...), plus
``gen_ai.request.model`` (the model) and ``lmi.lora_adapter`` (the adapter, if any); a sequence that fails or is
cancelled ends with an error status. Spans are recorded with their own start and end times when the sequence ends,
so a step costs nothing more than a few timestamps.

Tracing is on when ``option.otlp_traces_endpoint`` is set (vLLM's engine argument; the vllm backend passes it to vLLM,
which exports its own span) or when the standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``
variables are, unless ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``. The OpenTelemetry SDK reads the
other ``OTEL_*`` variables itself (service name and resource, sampler, batch processor, headers). The protocol is
OTLP/HTTP with protobuf, the OpenTelemetry default; ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc`` (vLLM's default) uses
gRPC where its exporter is installed. The SDK and exporter are the ``tracing`` extra, imported only when tracing is on.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import ConfigError

TRACE_HEADERS = ("traceparent", "tracestate")
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
#: The option this module reads: vLLM's engine argument.
KEYS = ("otlp_traces_endpoint",)


def enabled(props: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> bool:
    """Whether requests are traced: ``option.otlp_traces_endpoint``, or the standard variables."""
    if environ.get("OTEL_SDK_DISABLED", "").lower() == "true" or environ.get("OTEL_TRACES_EXPORTER") == "none":
        return False
    return bool(str(props.get("otlp_traces_endpoint") or "").strip() or any(environ.get(k) for k in ENDPOINT_VARIABLES))


def trace_headers(item: Any) -> dict[str, str] | None:
    """The W3C trace context headers of a request (DJL passes headers as properties, in the case they came)."""
    found = {key.lower(): str(value) for key, value in item.get_properties().items() if key.lower() in TRACE_HEADERS}
    return found or None


@dataclass
class _Times:
    context: Any
    arrived: int
    admitted: int | None = None
    first_token: int | None = None


class Tracer:
    """Records each sequence's times (``begin``, ``admitted``, ``progress``) and ends its spans (``end``)."""

    def __init__(self, model: str, provider: Any):
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.model = model
        self.provider = provider
        self.tracer = provider.get_tracer("lmi_handlers")
        self.propagator = TraceContextTextMapPropagator()

    @classmethod
    def from_config(cls, model: str, props: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> "Tracer":
        """A tracer exporting over OTLP as the option and the ``OTEL_*`` variables say."""
        endpoint = str(props.get("otlp_traces_endpoint") or "").strip() or None
        protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") \
            or "http/protobuf"
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            if protocol == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            elif protocol == "http/protobuf":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            else:
                raise ConfigError("otlp_traces_endpoint", protocol, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: allowed are "
                                  "http/protobuf (the default) and grpc")
        except ImportError as exc:
            raise ConfigError("otlp_traces_endpoint", endpoint or "(OTEL_* variables)",
                              f"tracing needs the OpenTelemetry SDK and its OTLP {protocol} exporter ({exc.name} is "
                              "missing): pip install 'lmi-handlers[tracing]'") from None
        named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
        provider = TracerProvider(resource=Resource.create({} if named else {"service.name": "lmi-handlers"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        return cls(model, provider)

    def begin(self, seq: Any) -> None:
        seq.trace = _Times(self.propagator.extract(seq.trace_headers) if seq.trace_headers else None, time.time_ns())

    def progress(self, seq: Any, now: int) -> None:
        """After a step that ran ``seq``: its first token's time, and its spans if it finished."""
        times = seq.trace
        if times.first_token is None and seq.generated:
            times.first_token = now
        if seq.finished:
            self.end(seq)

    def end(self, seq: Any, error: str | None = None) -> None:
        """``seq`` ended (``error``: how it failed): its spans, with the times recorded."""
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        times, seq.trace = seq.trace, None
        if times is None:
            return
        now = time.time_ns()
        admitted = times.admitted or now
        first = times.first_token or now
        request, sampling = seq.request, seq.request.sampling
        attributes = {
            "gen_ai.request.id": str(seq.uid), "gen_ai.request.model": self.model, "gen_ai.response.model": self.model,
            "gen_ai.usage.prompt_tokens": len(seq.prompt_ids), "gen_ai.usage.completion_tokens": len(seq.generated),
            "gen_ai.request.max_tokens": seq.max_new_tokens, "gen_ai.request.n": request.n,
            "gen_ai.request.temperature": sampling.temperature if sampling.do_sample else 0.0,
            "gen_ai.request.top_p": sampling.top_p,
            "gen_ai.latency.time_in_queue": (admitted - times.arrived) / 1e9,
            "gen_ai.latency.time_to_first_token": (first - times.arrived) / 1e9,
            "gen_ai.latency.e2e": (now - times.arrived) / 1e9}
        if seq.adapter is not None:
            attributes["lmi.lora_adapter"] = seq.adapter.name
        span = self.tracer.start_span("llm_request", context=times.context, kind=SpanKind.SERVER,
                                      start_time=times.arrived, attributes=attributes)
        inside = trace.set_span_in_context(span)
        for name, start, end, counts in (("queued", times.arrived, admitted, {}),
                                         ("prefill", admitted, first, {"gen_ai.usage.prompt_tokens":
                                                                       len(seq.prompt_ids)}),
                                         ("decode", first, now, {"gen_ai.usage.completion_tokens":
                                                                 len(seq.generated)})):
            self.tracer.start_span(name, context=inside, start_time=start, attributes=counts).end(end_time=end)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=now)

    def close(self) -> None:
        self.provider.shutdown()
