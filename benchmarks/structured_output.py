"""The cost of a grammar per step on the hf engine: decode tokens/s at concurrency 1 and 16, with and without a
JSON schema, all in one run (so every figure shares the machine's state).

    .venv/bin/python benchmarks/structured_output.py                      # SmolLM2-135M-Instruct, 128 tokens
    .venv/bin/python benchmarks/structured_output.py --tokens 16 --rounds 1   # a quick check that it runs

In process, through the ``Engine`` a rolling-batch step runs, on SmolLM2-135M-Instruct (``lmi model smollm2``;
its real 49,152-token vocabulary is what the grammar masks). Every row samples (seeded) and ignores EOS, so both
sides generate the same number of tokens; the schema (a list of up to 200 small objects) keeps the grammar live
for the whole answer. Rows alternate free and constrained runs, round by round; the figure is the median.
One torch thread, as the other benchmarks. Figures, not assertions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from lmi_handlers.deployment import resolve  # noqa: E402
from lmi_handlers.engine import Engine  # noqa: E402
from lmi_handlers.request import parse_payload  # noqa: E402
from lmi_handlers.sequence import SequenceState  # noqa: E402

SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "maxItems": 200, "items": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 24}, "qty": {"type": "integer"}},
    "required": ["name", "qty"]}}}, "required": ["items"]}


def tokens_per_second(engine: Engine, concurrency: int, tokens: int, constrained: bool) -> float:
    """Decode tokens/s of ``concurrency`` sequences generating ``tokens`` each (their prefill not counted)."""
    backend = engine.backend
    params = {"max_new_tokens": tokens, "do_sample": True, "ignore_eos": True,
              **({"guided_json": SCHEMA} if constrained else {})}
    seqs = []
    for i in range(concurrency):
        request = parse_payload({"inputs": f"Order {i} as JSON:", "parameters": {**params, "seed": i}},
                                tokens).requests[0]
        seqs.append(SequenceState(request, backend.tokenizer.encode(request.prompt), decode=backend.tokenizer.decode,
                                  eos_ids=backend.tokenizer.eos_ids, seed=i))
        engine.add(seqs[-1])
    engine.step()  # every prompt, and each row's first token
    began = time.perf_counter()
    while not engine.idle:
        engine.step()
    return sum(len(seq.generated) - 1 for seq in seqs) / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model directory (default: lmi model smollm2's)")
    parser.add_argument("--tokens", type=int, default=128, help="tokens each sequence generates")
    parser.add_argument("--concurrency", default="1,16", help="comma-separated concurrencies")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.model is None:
        from lmi_tools.models import smollm2

        args.model = str(smollm2.convert_smollm2(smollm2.default_dir(), say=print)
                         if not (smollm2.default_dir() / "config.json").exists() else smollm2.default_dir())
    levels = [int(c) for c in args.concurrency.split(",")]
    engine = Engine(resolve({"model_id": args.model, "rolling_batch": "scheduler",
                             "max_rolling_batch_size": max(levels)}).load())
    tokens_per_second(engine, 1, 4, constrained=True)  # the tokenizer's one-time conversion for the grammar
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {args.tokens} tokens per sequence, "
          f"{args.rounds} rounds, {args.threads} torch thread(s)")
    print(f"{'concurrency':>11} {'free tok/s':>11} {'json_schema tok/s':>18} {'cost':>7}")
    for level in levels:
        runs: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for constrained in (False, True):
                runs[constrained].append(tokens_per_second(engine, level, args.tokens, constrained))
        free, constrained = statistics.median(runs[False]), statistics.median(runs[True])
        print(f"{level:>11} {free:>11.1f} {constrained:>18.1f} {1 - constrained / free:>7.1%}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
