"""``lmi bench`` against small local servers that speak TGI's and OpenAI's wire formats over real sockets.

The servers are aiohttp.web apps (a different HTTP stack from the bench's client), answering with the shapes
those servers send: TGI ``/generate`` JSON and ``/generate_stream`` SSE (``data:{...}`` per token, the last
carrying ``generated_text`` and ``details``); OpenAI ``text_completion`` / ``chat.completion.chunk`` SSE with a
``usage`` chunk when ``stream_options.include_usage`` is set, and ``data: [DONE]``.
"""

import asyncio
import json
import threading
import time

import pytest
from aiohttp import web

from lmi_tools.cli import main

MAX_NEW = 5


def words(text: str) -> int:
    return len(text.split())


def tgi_app(seen: list, input_length: bool) -> web.Application:
    def tokens(n):
        return [{"id": 100 + i, "text": f" w{i}", "logprob": -0.5, "special": False} for i in range(n)]

    async def parse(request):
        body = await request.json()
        seen.append(body)
        params = body.get("parameters") or {}
        if not isinstance(body.get("inputs"), str) or not isinstance(params.get("max_new_tokens"), int):
            raise web.HTTPUnprocessableEntity(text=json.dumps({"error": "Input validation error",
                                                               "error_type": "validation"}),
                                              content_type="application/json")
        return body["inputs"], params["max_new_tokens"]

    async def generate(request):
        _, n = await parse(request)
        toks = tokens(n)
        return web.json_response({"generated_text": "".join(t["text"] for t in toks),
                                  "details": {"finish_reason": "length", "generated_tokens": n, "seed": None,
                                              "prefill": [], "tokens": toks}})

    async def generate_stream(request):
        prompt, n = await parse(request)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        toks = tokens(n)
        for i, token in enumerate(toks):
            last = i == n - 1
            details = {"finish_reason": "length", "generated_tokens": n, "seed": None}
            if input_length:
                details["input_length"] = words(prompt)
            event = {"index": i + 1, "token": token,
                     "generated_text": "".join(t["text"] for t in toks) if last else None,
                     "details": details if last else None}
            await response.write(b"data:" + json.dumps(event).encode() + b"\n\n")
            await asyncio.sleep(0.002)
        return response

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_post("/generate_stream", generate_stream)
    return app


def openai_app(seen: list) -> web.Application:
    async def completions(request):
        body = await request.json()
        seen.append(body)
        chat = request.path.endswith("/chat/completions")
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        n, kind = body["max_tokens"], "chat.completion" if chat else "text_completion"
        usage = {"prompt_tokens": words(prompt), "completion_tokens": n, "total_tokens": words(prompt) + n}
        texts = [f" w{i}" for i in range(n)]
        if not body.get("stream"):
            choice = ({"index": 0, "message": {"role": "assistant", "content": "".join(texts)}} if chat
                      else {"index": 0, "text": "".join(texts), "logprobs": None})
            return web.json_response({"id": "x", "object": kind, "created": 1, "model": body.get("model", "m"),
                                      "choices": [{**choice, "finish_reason": "length"}], "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)

        async def send(choices, **extra):
            chunk = {"id": "x", "object": f"{kind}.chunk" if chat else kind, "created": 1, "model": "m",
                     "choices": choices, **extra}
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")

        if chat:  # vLLM's first chunk carries only the role
            await send([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        for i, text in enumerate(texts):
            part = {"delta": {"content": text}} if chat else {"text": text, "logprobs": None}
            await send([{"index": 0, **part, "finish_reason": "length" if i == n - 1 else None}])
            await asyncio.sleep(0.002)
        if (body.get("stream_options") or {}).get("include_usage"):
            await send([], usage=usage)
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    return app


class ThreadServer:
    """An aiohttp.web app on 127.0.0.1:<free port>, on its own event loop in a thread."""

    def __init__(self, app: web.Application):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner = web.AppRunner(app)
        asyncio.run_coroutine_threadsafe(self.runner.setup(), self.loop).result(10)
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        asyncio.run_coroutine_threadsafe(site.start(), self.loop).result(10)
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def start():
    servers = []

    def make(app):
        servers.append(ThreadServer(app))
        return servers[-1]

    yield make
    for server in servers:
        server.stop()


def bench(tmp_path, *args):
    out = tmp_path / f"out-{time.monotonic_ns()}"
    assert main(["bench", *args, "--no-progress", "--no-plots", "-o", str(out), "--max-new-tokens", str(MAX_NEW),
                 "--prompt-tokens", "12", "-c", "3", "-n", "6"]) == 0
    report = json.loads((out / "report.json").read_text())
    log = [json.loads(line) for line in (out / report["runs"][0]["log"]).read_text().splitlines()[1:]]
    return report["runs"][0]["summary"], log


def test_tgi_generate_stream(start, tmp_path):
    seen = []
    server = start(tgi_app(seen, input_length=True))
    summary, log = bench(tmp_path, server.url + "/generate_stream")
    assert summary["requests"]["ok"] == 6 and summary["tokens"]["output"] == 6 * MAX_NEW
    assert summary["tokens"]["sources"] == {"input": {"server": 6}, "output": {"server": 6}}
    assert all(len(r["token_times"]) == MAX_NEW and r["input_tokens"] == 12 for r in log)  # 12 words
    assert seen[0] == {"inputs": seen[0]["inputs"], "parameters": {"max_new_tokens": MAX_NEW, "details": True}}


def test_tgi_without_prompt_counts_falls_back_to_the_tokenizer(start, tmp_path, tiny_model_dir):
    server = start(tgi_app([], input_length=False))
    summary, log = bench(tmp_path, server.url + "/generate_stream", "--tokenizer", str(tiny_model_dir))
    assert summary["tokens"]["sources"] == {"input": {"tokenizer": 6}, "output": {"server": 6}}
    assert all(r["input_tokens"] == 12 for r in log)  # 12 tokens of the tiny tokenizer


def test_tgi_generate_is_not_streamed(start, tmp_path):
    server = start(tgi_app([], input_length=False))
    summary, log = bench(tmp_path, server.url + "/generate")
    assert summary["streaming"] is False and summary["tokens"]["output"] == 6 * MAX_NEW
    assert all(r["token_times"] == [] and r["first_token"] == r["end"] for r in log)
    assert summary["tokens"]["input"] is None and summary["tokens_per_minute"] is None  # nobody counted input


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_openai_streams_with_usage(start, tmp_path, path):
    seen = []
    server = start(openai_app(seen))
    summary, log = bench(tmp_path, server.url + path, "--model", "tiny")
    assert summary["requests"]["ok"] == 6
    assert summary["tokens"]["sources"] == {"input": {"server": 6}, "output": {"server": 6}}
    assert all(len(r["token_times"]) == MAX_NEW and r["output_tokens"] == MAX_NEW for r in log)
    assert seen[0]["stream_options"] == {"include_usage": True} and seen[0]["model"] == "tiny"
    assert seen[0]["ignore_eos"] is True


def test_openai_without_streaming(start, tmp_path):
    server = start(openai_app([]))
    summary, log = bench(tmp_path, server.url, "--api", "openai-completions", "--no-stream", "--no-ignore-eos")
    assert summary["streaming"] is False and summary["tokens"]["output"] == 6 * MAX_NEW
    assert all(r["first_token"] == r["end"] for r in log)
