"""What ``n`` choices cost: one request of ``n`` = 4 against one of ``n`` = 1, at concurrency 1, in the same run.

    .venv/bin/python benchmarks/choices.py                      # SmolLM2-135M-Instruct (lmi model smollm2)
    .venv/bin/python benchmarks/choices.py --model tiny --prompt-tokens 64 --max-new-tokens 8 --trials 1

Each request is one LMI body (``parameters.n``, sampled, ``ignore_eos`` so every choice has ``--max-new-tokens``
tokens) answered through ``Handler`` as a whole (``option.rolling_batch=disable``: the same engine and scheduler a
rolling batch steps, without the step protocol). The choices of one request share their prompt's KV blocks: the
first prefills the prompt, the others compute only its last partial block, then all decode in one batch. The
handler runs with default options otherwise (the CPU kernels ``auto`` picks). The two request kinds alternate,
``--trials`` times each; the table gives the fastest of each and their ratio (the target: 2.5x at most). Figures, not
assertions: nothing here fails on speed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmi_handlers.handler import Handler  # noqa: E402
from lmi_tools.models.smollm2 import convert_smollm2  # noqa: E402
from lmi_tools.models.tiny import build_tiny_model, corpus  # noqa: E402
from lmi_tools.serving.worker.frontend import init_input, request_input  # noqa: E402

JSON = [("Content-Type", "application/json")]
TARGET = 2.5


def model_dir(name: str) -> Path:
    if name == "smollm2":
        return convert_smollm2(say=lambda line: None)
    path = Path("out") / f"bench-{name}"
    if not (path / "config.json").exists():
        build_tiny_model(path, name)
    return path


def answer_seconds(handler: Handler, prompt: str, n: int, new_tokens: int, seed: int) -> float:
    body = {"inputs": prompt, "parameters": {"n": n, "do_sample": True, "seed": seed, "max_new_tokens": new_tokens,
                                             "ignore_eos": True, "details": True}}
    began = time.perf_counter()
    out = handler.handle(request_input(JSON, json.dumps(body).encode()))
    seconds = time.perf_counter() - began
    details = json.loads(bytes(out.content.value_at(0)))["details"]
    counts = [details["generated_tokens"]] + [c["generated_tokens"] for c in details.get("best_of_sequences", [])]
    assert counts == [new_tokens] * n, f"expected {n} choices of {new_tokens} tokens, got {counts}"
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("smollm2", "bench-115m", "tiny"), default="smollm2")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=256, help="about this many prompt tokens")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    path = model_dir(args.model)
    handler = Handler()
    assert handler.handle(init_input({"model_id": str(path.resolve()), "model_dir": tempfile.mkdtemp(),
                                      "rolling_batch": "disable"})) is None, "the model did not load"
    tokenizer = handler.backend.tokenizer
    words = " ".join(corpus(seed=2, words=4 * args.prompt_tokens))
    prompt = tokenizer.decode(tokenizer.encode(words)[:args.prompt_tokens])
    answer_seconds(handler, prompt, args.n, 4, seed=0)  # warm up: first-call allocations, kernel choices
    times: dict[int, list[float]] = {1: [], args.n: []}
    for trial in range(args.trials):
        for n in times:
            times[n].append(answer_seconds(handler, f"{trial} {prompt}", n, args.max_new_tokens, seed=trial))
    one, many = min(times[1]), min(times[args.n])
    print(f"\n{args.model}, {len(tokenizer.encode(prompt))}-token prompt, {args.max_new_tokens} new tokens per choice, "
          f"concurrency 1, fastest of {args.trials}")
    print("| request | seconds | tokens generated | ratio to n=1 |\n|---|---|---|---|")
    print(f"| n=1 | {one:.3f} | {args.max_new_tokens} | 1.00x |")
    print(f"| n={args.n} | {many:.3f} | {args.n * args.max_new_tokens} | {many / one:.2f}x "
          f"({'within' if many / one <= TARGET else 'over'} the {TARGET}x target) |")


if __name__ == "__main__":
    main()
