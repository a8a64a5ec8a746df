"""Every inference route of lmi serve, and the Input each one delivers, over real sockets."""

import json
import socket
import subprocess
import time

import httpx
import pytest


@pytest.fixture(scope="module")
def server(serve_module):
    return serve_module([serve_module.scripted(**{"option.max_new_tokens": 6}),
                         serve_module.echo(**{"option.custom_flag": "on", "batch_size": "1"})])


def post(server, path, payload=None, **kwargs):
    if payload is not None:
        kwargs.setdefault("json", payload)
    return httpx.post(server.url + path, timeout=30, **kwargs)


def test_ping_reports_every_model(server):
    response = httpx.get(server.url + "/ping")
    assert response.status_code == 200
    assert response.json() == {"scripted": {"status": "Healthy"}, "echo": {"status": "Healthy"}}


@pytest.mark.parametrize("path", ["/predictions/scripted", "/predictions/scripted/1", "/models/scripted/invoke",
                                  "/invocations?model_name=scripted"])
def test_prediction_routes(server, path):
    response = post(server, path, {"inputs": "hi"})
    assert response.status_code == 200, response.text
    assert response.json() == {"generated_text": " The q"}
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-request-id"] and response.headers["cache-control"].startswith("no-cache")


def test_chat_completions_route(server):
    response = post(server, "/v1/chat/completions?model_name=scripted",
                    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"] == " Th"


def test_invocations_needs_a_model_name_when_several_are_served(server):
    response = post(server, "/invocations", {"inputs": "hi"})
    assert response.status_code == 400 and response.json()["message"] == "Parameter model_name is required."


def test_streaming_arrives_in_chunks(server):
    with httpx.stream("POST", server.url + "/predictions/scripted", json={"inputs": "hi", "stream": True},
                      timeout=30) as response:
        assert response.headers["content-type"] == "application/jsonlines"
        assert response.headers.get("transfer-encoding") == "chunked"
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert [line["token"]["text"] for line in lines] == [" ", "T", "h", "e", " ", "q"]
    assert lines[-1]["generated_text"] == " The q"


def test_accept_header_gives_server_sent_events(server):
    response = post(server, "/predictions/scripted", {"inputs": "hi"}, headers={"Accept": "text/event-stream"})
    assert response.headers["content-type"] == "text/event-stream"
    assert all(event.startswith("data: {") for event in response.text.split("\n\n") if event)


def test_headers_become_properties_and_init_properties_are_kept(server):
    response = post(server, "/predictions/echo?x=1", content=b"raw body", headers={
        "X-Amzn-SageMaker-Custom-Attributes": "tenant=a;trace=on", "X-Request-Id": "rid-7"})
    report = response.json()
    assert report["properties"]["tenant"] == "a" and report["properties"]["trace"] == "on"
    assert report["properties"]["requestId"] == "rid-7"
    assert "X-Amzn-SageMaker-Custom-Attributes".lower() not in {k.lower() for k in report["properties"]}
    assert report["keys"] == ["x", "data"] and report["body"] == "raw body"  # query parameters come first
    assert report["init"]["custom_flag"] == "on" and report["init"]["engine"] == "Python"
    assert report["init"]["handler"] == "handle" and report["init"]["model_dir"].endswith("echo")
    assert "custom_flag" not in report["properties"]  # options travel on the init call only
    assert response.headers["x-request-id"] == "rid-7"


@pytest.mark.parametrize("body, status, fragment", [
    (b"{not json", 400, "request body is not valid JSON"),
    (b'{"inputs": "x", "parameters": {"top_p": 9}}', 400, "parameters.top_p"),
    (b'{"inputs": "x", "parameters": {"beam": 1}}', 400, "unknown field parameters.beam"),
])
def test_bad_requests_are_400_with_a_clear_message(server, body, status, fragment):
    response = post(server, "/predictions/scripted", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status and fragment in response.json()["error"]
    assert response.headers["connection"] == "close"


def test_unknown_model_is_404(server):
    response = post(server, "/predictions/nope", {"inputs": "x"})
    assert response.status_code == 404
    assert response.json() == {"code": 404, "type": "ModelNotFoundException", "message": "Model not found: nope"}


def test_handler_override_header_is_refused(server):
    response = post(server, "/predictions/scripted", {"inputs": "x"}, headers={"handler": "other"})
    assert response.status_code == 400 and "can't be overridden" in response.json()["message"]


def test_openapi_schema_is_served(server):
    schema = httpx.get(server.url + "/openapi.json").json()
    for path in ("/ping", "/predictions/{model_name}", "/invocations", "/v1/chat/completions",
                 "/endpoints/{endpoint}/invocations-response-stream"):
        assert path in schema["paths"]
    assert "/models" in httpx.get(server.management_url + "/openapi.json").json()["paths"]


def test_over_large_body_is_413(serve):
    server = serve([serve.scripted()], env={"SERVING_MAX_REQUEST_SIZE": "1024"})
    response = post(server, "/predictions/scripted", content=b"x" * 4096)
    assert response.status_code == 413 and "max_request_size" in response.json()["message"]


def test_curl_plain_and_streaming(server):
    """What a user types: curl against a real socket."""
    plain = subprocess.run(["curl", "-s", "-X", "POST", server.url + "/predictions/scripted", "-H",
                            "Content-Type: application/json", "-d", '{"inputs": "hi"}'],
                           capture_output=True, text=True, check=True)
    assert json.loads(plain.stdout) == {"generated_text": " The q"}
    stream = subprocess.run(["curl", "-sN", "-X", "POST", server.url + "/predictions/scripted", "-H",
                             "Content-Type: application/json", "-d", '{"inputs": "hi", "stream": true}'],
                            capture_output=True, text=True, check=True)
    assert len(stream.stdout.splitlines()) == 6


def test_oversized_headers_are_431(server):
    """Issue 12 #8: a 100 KB header is refused before any route runs."""
    response = post(server, "/predictions/scripted", {"inputs": "x"}, headers={"x-big": "a" * 100_000})
    assert response.status_code == 431 and "--max-header-bytes" in response.json()["message"]
    assert post(server, "/predictions/scripted", {"inputs": "x", "parameters": {"max_new_tokens": 1}},
                headers={"x-small": "a" * 1000}).status_code == 200


def test_a_half_sent_body_is_408(serve):
    """Issue 12 #8: a client that stops sending its body is answered 408 after --read-timeout, not held open."""
    server = serve([serve.scripted()], args=["--read-timeout", "1"])
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /predictions/scripted HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"inputs\": ")
        began = time.monotonic()
        answer = sock.recv(65536).decode()
    assert answer.startswith("HTTP/1.1 408") and time.monotonic() - began < 20


def test_headers_sent_slowly_are_408_after_read_timeout_and_the_connection_is_freed(serve):
    """A client that trickles its headers (one line a quarter second, never ending) or sends nothing is cut off after
    --read-timeout, as a front end with a header read timeout does; a keep-alive client is not."""
    server = serve([serve.scripted()], args=["--read-timeout", "1"])
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as slow, \
            socket.create_connection(("127.0.0.1", server.port), timeout=30) as silent:
        began = time.monotonic()
        slow.sendall(b"POST /predictions/scripted HTTP/1.1\r\nHost: x\r\n")
        answer = b""
        for i in range(40):  # 10 s of headers if nobody stops it
            try:
                slow.sendall(f"X-Slow-{i}: y\r\n".encode())
            except (BrokenPipeError, ConnectionResetError):
                break
            slow.settimeout(0.25)
            try:
                answer += slow.recv(65536)
            except TimeoutError:
                continue
            if answer:
                break
        assert answer.startswith(b"HTTP/1.1 408") and b"--read-timeout" in answer
        assert time.monotonic() - began < 5
        silent.settimeout(10)
        assert silent.recv(65536).startswith(b"HTTP/1.1 408")  # then closed
        assert silent.recv(65536) == b""
    with httpx.Client(base_url=server.url) as client:  # one keep-alive connection, idle between requests
        assert client.get("/ping").status_code == 200
        time.sleep(1.5)
        assert client.get("/ping").status_code == 200
