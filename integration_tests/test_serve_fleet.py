"""What fleets read of ``lmi serve`` and how it stops (issue 47), with real processes, sockets and streams.

vLLM's gauges on ``/metrics`` while streams run, in rolling batch and in DJL's async mode; the drain on SIGTERM:
``/ping`` and new requests answer 503 at once, every accepted stream ends with its whole text, the server exits 0; a
stream still running at ``--drain-timeout`` ends with an error event in its protocol's framing; a second signal stops
at once. The scripted backend's step delay stands in for a model."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import ROOT

pytestmark = pytest.mark.timeout(180)


def gateway(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name.startswith("vllm:")
            and sample.labels.get("model_name") == "scripted"}


def lmi_stream(tokens: int) -> dict:
    return {"inputs": "hello", "stream": True, "parameters": {"max_new_tokens": tokens}}


async def read_stream(client: httpx.AsyncClient, url: str, body: dict, first: asyncio.Event | None = None,
                      path: str = "/invocations") -> tuple[int, list[str]]:
    """(status, the answer's lines) of a streamed request; ``first`` is set once its first line has arrived."""
    lines = []
    async with client.stream("POST", url + path, json=body) as response:
        async for line in response.aiter_lines():
            if line.strip():
                lines.append(line)
                if first is not None:
                    first.set()
    return response.status_code, lines


def text_of(lines: list[str]) -> str:
    return json.loads(lines[-1])["generated_text"]


def gateway_when(url: str, expected: dict[str, float], within: float) -> dict[str, float]:
    """The gauges once they show ``expected``, or as they are after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        gauges = gateway(url)
        if {key: gauges.get(key) for key in expected} == expected or time.monotonic() > deadline:
            return gauges
        time.sleep(0.1)


# DJL's async mode sends every request to the worker at once and our engine queues them (DJL's rolling batch and
# dynamic batching are off there); lmi serve reads the numbers once a second rather than with each step.
MODES = {"rolling": {"option.rolling_batch": "auto"}, "async": {"option.async_mode": "true"}}


@pytest.mark.parametrize("mode", MODES)
def test_vllms_gauges_follow_the_running_and_waiting_requests(serve, mode):
    server = serve([serve.scripted(**MODES[mode], **{"max_rolling_batch_size": "3",
                                                     "option.scripted_step_delay_ms": "100"})])
    full = {"vllm:num_requests_running": 3, "vllm:num_requests_waiting": 2, "vllm:kv_cache_usage_perc": 1.0}

    async def main() -> dict[str, float]:
        async with httpx.AsyncClient(timeout=60) as client:
            firsts = [asyncio.Event() for _ in range(5)]
            streams = [asyncio.create_task(read_stream(client, server.url, lmi_stream(20), first)) for first in firsts]
            await firsts[0].wait()
            await asyncio.sleep(0.5)
            during = await asyncio.to_thread(gateway_when, server.url, full, 2.0)
            await asyncio.gather(*streams)
            return during

    during = asyncio.run(main())
    # Three rows: three run, two wait (in the job queue, or in async mode in the engine's queue); the scripted
    # backend's slots are all in use.
    assert {key: during[key] for key in full} == full, during
    idle = dict.fromkeys(full, 0)
    after = gateway_when(server.url, idle, 3.0)
    assert {key: after[key] for key in idle} == idle, after


def test_sigterm_drains_every_accepted_stream_then_exits_0(serve):
    streams, tokens = 8, 24
    server = serve([serve.scripted(**{"option.rolling_batch": "auto", "option.scripted_step_delay_ms": "40"})])
    whole = httpx.post(server.url + "/invocations", json=lmi_stream(tokens), timeout=60).text.strip().splitlines()

    async def main():
        async with httpx.AsyncClient(timeout=60) as client:
            firsts = [asyncio.Event() for _ in range(streams)]
            tasks = [asyncio.create_task(read_stream(client, server.url, lmi_stream(tokens), first))
                     for first in firsts]
            await asyncio.gather(*(first.wait() for first in firsts))
            server.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            ping = await client.get(server.url + "/ping")
            refused = await client.post(server.url + "/invocations", json=lmi_stream(2))
            return await asyncio.gather(*tasks), ping, refused

    results, ping, refused = asyncio.run(main())
    assert ping.status_code == 503
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1" and "shutting down" in refused.text
    assert [code for code, _ in results] == [200] * streams
    assert all(text_of(lines) == text_of(whole) for _, lines in results)
    assert server.process.wait(timeout=30) == 0
    assert "drained" in server.logs()


def test_a_stream_cut_by_the_drain_timeout_ends_with_an_error_event(serve):
    server = serve([serve.scripted(**{"option.rolling_batch": "auto", "option.scripted_step_delay_ms": "50"})],
                   args=["--drain-timeout", "1"])
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 400, "stream": True}

    async def main():
        async with httpx.AsyncClient(timeout=60) as client:
            firsts = [asyncio.Event(), asyncio.Event()]
            lmi = asyncio.create_task(read_stream(client, server.url, lmi_stream(400), firsts[0]))
            openai = asyncio.create_task(read_stream(client, server.url, chat, firsts[1], "/v1/chat/completions"))
            await asyncio.gather(*(first.wait() for first in firsts))
            server.process.send_signal(signal.SIGTERM)
            return await lmi, await openai

    (_, lmi_lines), (_, sse_lines) = asyncio.run(main())
    last = json.loads(lmi_lines[-1])  # jsonlines: the last line is the error
    assert last["code"] == 503 and "drain timeout of 1 s" in last["error"]
    error = json.loads(next(line for line in sse_lines if "\"error\"" in line).partition("data:")[2])
    assert "drain timeout" in error["error"]["message"]
    assert server.process.wait(timeout=30) == 0


def test_a_second_signal_stops_at_once(serve):
    server = serve([serve.scripted(**{"option.rolling_batch": "auto", "option.scripted_step_delay_ms": "50"})])
    worker = httpx.get(server.management_url + "/models/scripted", timeout=10).json()[0]["workerGroups"][0]
    pid = worker["workers"][0]["id"]

    async def main():
        async with httpx.AsyncClient(timeout=60) as client:
            first = asyncio.Event()
            stream = asyncio.create_task(read_stream(client, server.url, lmi_stream(1000), first))
            await first.wait()
            server.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            began = time.monotonic()
            server.process.send_signal(signal.SIGINT)
            code = await asyncio.to_thread(server.process.wait, 20)
            await asyncio.gather(stream, return_exceptions=True)
            return code, time.monotonic() - began

    code, took = asyncio.run(main())
    assert took < 5, took  # the 1000-token stream would take 50 s
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_spans_reach_an_otlp_http_receiver_under_the_clients_trace(serve):
    trace_service = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
    received = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = trace_service.ExportTraceServiceRequest.FromString(body)
            received.extend((self.path, span) for resource in request.resource_spans
                            for scope in resource.scope_spans for span in scope.spans)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args):
            pass

    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{receiver.server_address[1]}/v1/traces"
    server = serve([serve.scripted(**{"option.rolling_batch": "auto", "option.otlp_traces_endpoint": endpoint})],
                   env={"OTEL_BSP_SCHEDULE_DELAY": "100"})
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    answer = httpx.post(server.url + "/invocations", json={"inputs": "hello", "parameters": {"max_new_tokens": 3}},
                        headers={"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"}, timeout=30)
    assert answer.status_code == 200
    deadline = time.monotonic() + 20
    while len(received) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    receiver.shutdown()
    spans = {span.name: span for _, span in received}
    assert set(spans) == {"llm_request", "queued", "prefill", "decode"} and {path for path, _ in received} == {
        "/v1/traces"}
    assert spans["llm_request"].trace_id.hex() == trace_id
    assert spans["llm_request"].parent_span_id.hex() == "b7ad6b7169203331"
    assert spans["decode"].parent_span_id == spans["llm_request"].span_id


def test_a_drain_timeout_must_be_positive(serve):
    result = subprocess.run([sys.executable, "-m", "lmi_tools", "serve", str(serve.scripted()), "--drain-timeout",
                             "0"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and "--drain-timeout 0 is invalid: expected a number > 0" in result.stderr
