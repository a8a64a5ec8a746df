"""What running in a fleet costs and keeps (issue 47), measured in one run each.

``overhead``: tokens/s of the hf engine at concurrency 16 (``rolling_batch.py``'s closed loop through DJL's step
protocol, its 115M model or ``--model-dir``) with everything fleets read off, against the same with it all on: KV
events (a subscriber drains them), OpenTelemetry spans over OTLP/HTTP to a local receiver, and DJL's ``[METRICS]`` lines
(the gauges and the engine counters are sent with every step either way). The two alternate, best of ``--repeats``,
and the ratio on / off is printed (the target: at least 0.97).

``drain``: ``lmi serve`` on the scripted backend (``--step-ms`` a step), ``--streams`` concurrent streams; once each has
its first token, SIGTERM. Prints how many ended with their whole text (against the same request answered before),
how long the drain took, the exit status, and that /ping answered 503 meanwhile.

    .venv/bin/python benchmarks/fleet.py overhead              # the quiet machine's figure
    .venv/bin/python benchmarks/fleet.py drain --streams 64
    .venv/bin/python benchmarks/fleet.py overhead --model-dir out/tiny --per-client 1 --new-tokens 8 --repeats 1

Figures, not assertions: nothing here fails on speed.
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Sink(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that accepts and drops spans."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def _drain_subscriber(port: int, stop: threading.Event) -> threading.Thread:
    import zmq

    def run() -> None:
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.connect(f"tcp://127.0.0.1:{port}")
        sub.subscribe(b"")
        while not stop.is_set():
            if sub.poll(50):
                sub.recv_multipart()
        sub.close(linger=0)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def overhead(args: argparse.Namespace) -> None:
    from rolling_batch import handler_run, make_prompts
    from transformers import AutoTokenizer

    from lmi_handlers.handler import Handler
    from lmi_tools.models.tiny import build_tiny_model
    from lmi_tools.serving.worker.frontend import init_input

    model_dir = args.model_dir or Path("out/bench-115m")
    if not (model_dir / "config.json").exists():
        build_tiny_model(model_dir, "bench-115m")
    prompts = make_prompts(AutoTokenizer.from_pretrained(model_dir), 64, args.prompt_tokens)
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    events_port, stop = free_port(), threading.Event()
    base = {"model_id": str(model_dir), "rolling_batch": "auto", "max_rolling_batch_size": args.concurrency,
            "enable_prefix_caching": "true"}
    fleet = {**base, "kv_events_config": json.dumps({"enable_kv_cache_events": True,
                                                     "endpoint": f"tcp://*:{events_port}", "topic": "kv@bench"}),
             "otlp_traces_endpoint": f"http://127.0.0.1:{sink.server_address[1]}/v1/traces"}
    handlers = {}
    for name, options in (("off", base), ("on", fleet)):
        handlers[name] = Handler()
        handlers[name].handle(init_input(options))
    if handlers["off"].rolling is not None:
        handlers["off"].rolling.djl_metrics = None  # no [METRICS] lines: the "off" side
    with open(os.devnull, "w") as null:
        handlers["on"].rolling.djl_metrics.out = null
        _drain_subscriber(events_port, stop)
        best = {"off": 0.0, "on": 0.0}
        for repeat in range(args.repeats):
            for name in ("off", "on") if repeat % 2 == 0 else ("on", "off"):
                rate = handler_run(handlers[name], prompts, args.concurrency, args.per_client,
                                   args.new_tokens)["tokens_per_s"]
                best[name] = max(best[name], rate)
                print(f"  repeat {repeat + 1} {name:>3}: {rate:8.1f} tokens/s", flush=True)
    stop.set()
    ratio = best["on"] / best["off"]
    print(f"concurrency {args.concurrency}: off {best['off']:.1f} tokens/s, on {best['on']:.1f} tokens/s, "
          f"ratio on/off {ratio:.3f} (target >= 0.97: {'met' if ratio >= 0.97 else 'NOT met'})")


async def _streams(url: str, count: int, tokens: int, process: subprocess.Popen) -> tuple[list, int, float]:
    import httpx

    body = {"inputs": "hello", "stream": True, "parameters": {"max_new_tokens": tokens}}
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=count + 4)) as client:
        whole = (await client.post(url + "/invocations", json=body)).text.strip().splitlines()[-1]
        firsts = [asyncio.Event() for _ in range(count)]

        async def one(first: asyncio.Event) -> str:
            lines = []
            async with client.stream("POST", url + "/invocations", json=body) as response:
                async for line in response.aiter_lines():
                    if line.strip():
                        lines.append(line)
                        first.set()
            return lines[-1] if lines else ""

        tasks = [asyncio.create_task(one(first)) for first in firsts]
        await asyncio.gather(*(first.wait() for first in firsts))
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.2)
        ping = (await client.get(url + "/ping")).status_code
        lasts = await asyncio.gather(*tasks)
    complete = [json.loads(last).get("generated_text") == json.loads(whole)["generated_text"] for last in lasts]
    return complete, ping, signalled


def drain(args: argparse.Namespace) -> None:
    import httpx

    directory = Path(args.work) / "scripted"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "serving.properties").write_text(
        "engine=Python\noption.entryPoint=lmi_handlers.entrypoint\noption.backend=scripted\n"
        f"option.rolling_batch=auto\nmax_rolling_batch_size={args.streams}\n"
        f"option.scripted_step_delay_ms={args.step_ms}\n")
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "lmi_tools", "serve", str(directory), "--port", str(port),
                                "--management-port", str(free_port()), "--log-level", "warning"], cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(url + "/ping", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    complete, ping, signalled = asyncio.run(_streams(url, args.streams, args.tokens, process))
    status = process.wait(timeout=60)
    took = time.monotonic() - signalled
    print(f"drain: {sum(complete)}/{len(complete)} streams complete with their whole text; /ping during the drain "
          f"{ping}; exit status {status}; {took:.1f} s from SIGTERM to exit")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cost = commands.add_parser("overhead", help="tokens/s with metrics, KV events and traces on, against off")
    cost.add_argument("--model-dir", type=Path, help="default: out/bench-115m (built if missing)")
    cost.add_argument("--concurrency", type=int, default=16)
    cost.add_argument("--per-client", type=int, default=4)
    cost.add_argument("--prompt-tokens", type=int, default=100)
    cost.add_argument("--new-tokens", type=int, default=64)
    cost.add_argument("--repeats", type=int, default=3)
    stop = commands.add_parser("drain", help="concurrent streams through a SIGTERM")
    stop.add_argument("--streams", type=int, default=64)
    stop.add_argument("--tokens", type=int, default=64)
    stop.add_argument("--step-ms", type=int, default=20)
    stop.add_argument("--work", default="out/fleet-drain")
    args = parser.parse_args()
    overhead(args) if args.command == "overhead" else drain(args)


if __name__ == "__main__":
    main()
