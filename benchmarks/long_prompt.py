"""What a very long prompt costs the requests already generating, with and without tokenizing it off the step loop.

A stream of 64 greedy tokens runs through ``handle()`` with DJLServing's rolling-batch step protocol (the tiny
Llama, hf backend, CPU). At its fifth step a request with a long prompt arrives. Three ways to meet it, measured
in the same run:

* ``inline`` - the baseline, as before issue 12: the prompt is parsed and tokenized inside the step
  (``option.max_prompt_chars`` raised so it gets that far, large bodies kept in the step);
* ``thread`` - ours: a body over 32 KiB is tokenized on a thread beside the step loop;
* ``limit`` - ours with the default ``option.max_prompt_chars``: the prompt is refused before tokenizing.

    .venv/bin/python benchmarks/long_prompt.py [--prompt-mb 2]

Prints the running stream's longest and median gap between tokens and how long it took in all, and how long the
long request took to get its answer (a 400: too many tokens, or too many characters). Figures, not assertions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmi_handlers import rolling  # noqa: E402
from lmi_handlers.handler import Handler  # noqa: E402
from lmi_tools.models.tiny import build_tiny_model, corpus  # noqa: E402
from lmi_tools.serving.worker.frontend import RollingBatchLoop, RollingRequest, init_input, request_input  # noqa: E402

JSON = [("Content-Type", "application/json")]


def run(model_dir: Path, long_prompt: str, mode: str) -> dict[str, float]:
    options = {"model_id": str(model_dir), "backend": "hf", "rolling_batch": "scheduler", "model_dir": str(model_dir)}
    if mode != "limit":
        options["max_prompt_chars"] = str(len(long_prompt) + 1)
    rolling.INLINE_BODY_BYTES = 10**12 if mode == "inline" else 32 * 1024
    handler = Handler()
    assert handler.handle(init_input(options)) is None
    loop = RollingBatchLoop()
    stream = {"inputs": "the quick brown fox", "stream": True, "parameters": {"max_new_tokens": 64, "ignore_eos": True}}
    loop.add(RollingRequest(request_input(JSON, json.dumps(stream).encode()), seed=1, key="stream"))
    token_times, steps, answered = [], 0, None
    long_body = json.dumps({"inputs": long_prompt}).encode()
    began = time.perf_counter()
    while loop.active:
        if steps == 5:
            sent = time.perf_counter()
            loop.add(RollingRequest(request_input(JSON, long_body), seed=2, key="long"))
        out = handler.handle(loop.next_input())
        now = time.perf_counter()
        items = [out.content.value_at(i) for i in range(out.content.size())]
        for item in loop.apply(out.code, out.properties, items):
            if item.request.key == "stream" and item.data:
                token_times.append(now)
            elif item.request.key == "long" and item.last:
                answered = now - sent
                assert item.code == 400, (item.code, item.error)
        steps += 1
    gaps = [b - a for a, b in zip(token_times, token_times[1:])]
    return {"max_gap_ms": max(gaps) * 1000, "median_gap_ms": statistics.median(gaps) * 1000,
            "answer_s": answered or float("nan"), "stream_s": token_times[-1] - began}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-mb", type=float, default=2.0, help="size of the long prompt in MB")
    parser.add_argument("--model-dir", type=Path, default=None, help="a tiny model (built when absent)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir or Path(tmp) / "tiny"
        if not (model_dir / "config.json").is_file():
            build_tiny_model(model_dir, "tiny")
        words = " ".join(corpus(seed=3, words=200_000))
        long_prompt = (words * (1 + int(args.prompt_mb * 1e6) // len(words)))[:int(args.prompt_mb * 1e6)]
        results = {mode: run(model_dir, long_prompt, mode) for mode in ("inline", "thread", "limit")}
    print(f"long prompt: {len(long_prompt):,} characters; running stream: 64 tokens")
    print(f"{'mode':8} {'max token gap':>14} {'median gap':>11} {'long answered':>14} {'stream took':>12}")
    for mode, r in results.items():
        print(f"{mode:8} {r['max_gap_ms']:11.0f} ms {r['median_gap_ms']:8.1f} ms {r['answer_s']:12.2f} s "
              f"{r['stream_s']:10.2f} s")
    base = results["inline"]["max_gap_ms"]
    for mode in ("thread", "limit"):
        print(f"longest stall, inline / {mode}: {base / results[mode]['max_gap_ms']:.1f}x")


if __name__ == "__main__":
    main()
