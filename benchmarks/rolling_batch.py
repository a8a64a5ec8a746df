"""Rolling-batch throughput of the handler against ``model.generate``, measured in the same run.

The 115M-parameter Llama shape of issue 4 (hidden 576, 30 layers, 9 heads, 3 KV heads, intermediate
1536, vocabulary 8192 from a locally trained tokenizer, random fp32 weights), prompts of about 100
tokens, 64 new tokens, greedy. Baselines: ``model.generate`` one prompt at a time, and a static batch
of C prompts. Ours: closed-loop clients (each sends its next request as soon as the previous one is
answered) served through ``handle()`` with DJLServing's rolling-batch step protocol, exactly as the
Java front end drives it (``lmi_tools.serving.worker.frontend.RollingBatchLoop``), streaming jsonlines.

    .venv/bin/python benchmarks/rolling_batch.py                  # concurrency 1, 4, 16
    .venv/bin/python benchmarks/rolling_batch.py --model smollm2  # the real model, real EOS

``--model smollm2`` serves SmolLM2-135M-Instruct (the same shape, real weights: ``lmi model smollm2``) with chat
questions that end on the model's EOS, so answers have their own lengths; every rate counts the tokens actually
generated (up to and with the EOS), for the handler and the baselines alike. The 115M random model stays the
throughput comparison that needs exactly N tokens per request.

The handler runs with default options (the CPU kernels ``auto`` picks, logged at its load) unless ``--option``
adds some (``--option cpu_linear_kernel=stock --option cpu_attention_kernel=torch`` for the stock path); the
baselines run torch's stock model. Both run on one thread count, the handler's where ``OMP_NUM_THREADS`` is
unset (``kernels.default_threads``: every CPU), or ``--threads``: the
comparison is of engines, not thread policies (``threads.py`` measures the handler's own policy).

Prints output tokens/s, time to first token p50/p90 and inter-token latency per concurrency, beside
the baselines, and the ratios against the issue's targets. Figures, not assertions: nothing here fails on speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from lmi_handlers.backends.hf.cpu.kernels import default_threads  # noqa: E402
from lmi_handlers.handler import Handler  # noqa: E402
from lmi_tools.serving.worker.frontend import RollingBatchLoop, RollingRequest, init_input, request_input  # noqa: E402
from lmi_tools.models.smollm2 import convert_smollm2  # noqa: E402
from lmi_tools.models.tiny import build_tiny_model, corpus  # noqa: E402

JSON = [("Content-Type", "application/json")]


def make_prompts(tokenizer, count: int, tokens: int) -> list[str]:
    """Distinct prompts of about ``tokens`` tokens each, cut from the tokenizer's own corpus."""
    text = " ".join(corpus(seed=1, words=20_000)[100:])
    ids = tokenizer(text, add_special_tokens=False).input_ids
    prompts = []
    for i in range(count):
        window = ids[i * tokens:(i + 1) * tokens - 1]  # BOS makes it `tokens`
        prompts.append(tokenizer.decode(window))
    return prompts


# Short facts and longer explanations, alternating, so answers of different lengths share every batch.
QUESTIONS = [question for country, topic in zip(
    ("France", "Germany", "Japan", "Italy", "Spain", "Canada", "Egypt", "Brazil"),
    ("photosynthesis", "gravity", "the water cycle", "how a rainbow forms", "what a database index is",
     "why the sky is blue", "how vaccines work", "what inflation is"))
    for question in (f"What is the capital of {country}?", f"Explain {topic} in a few sentences.")]


def chat_prompts(tokenizer, count: int) -> list[str]:
    """``count`` chat prompts (short facts and longer explanations), rendered with the model's template."""
    return [tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                          tokenize=False, add_generation_prompt=True) for i in range(count)]


def generated_count(row: list[int], eos_ids: set[int]) -> int:
    """Tokens a sequence generated: up to and with its first EOS (padding after it is not output)."""
    for i, token in enumerate(row):
        if token in eos_ids:
            return i + 1
    return len(row)


def generate_rate(model, tokenizer, prompts: list[str], new_tokens: int, real_eos: bool = False) -> float:
    """Output tokens/s of one ``model.generate`` call over ``prompts`` as a static (left-padded) batch."""
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=not real_eos)
    began = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**{k: batch[k] for k in ("input_ids", "attention_mask")}, max_new_tokens=new_tokens,
                             min_new_tokens=None if real_eos else new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    elapsed = time.perf_counter() - began
    rows = out[:, batch["input_ids"].shape[1]:].tolist()
    tokens = sum(generated_count(row, {tokenizer.eos_token_id}) for row in rows) if real_eos else len(rows) * new_tokens
    assert real_eos or all(len(row) == new_tokens for row in rows)
    return tokens / elapsed


def hf_continuous_batching_rate(model, tokenizer, prompts: list[str], new_tokens: int, real_eos: bool = False) -> float:
    """Output tokens/s of transformers' own continuous batching (``generate_batch``) over ``prompts``."""
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False,
                              eos_token_id=tokenizer.eos_token_id if real_eos else -1,
                              pad_token_id=tokenizer.pad_token_id)
    ids = [tokenizer(p, add_special_tokens=not real_eos).input_ids for p in prompts]
    # It runs its own generation thread and warm-up (included in the time, as a caller would see it).
    began = time.perf_counter()
    out = model.generate_batch(ids, generation_config=config)
    elapsed = time.perf_counter() - began
    tokens = sum(len(result.generated_tokens) for result in out.values())
    assert real_eos or tokens == len(prompts) * new_tokens
    return tokens / elapsed


@dataclass
class Request:
    client: int
    submitted: float
    token_times: list[float] = field(default_factory=list)


def handler_run(handler: Handler, prompts: list[str], concurrency: int, per_client: int, new_tokens: int,
                real_eos: bool = False) -> dict:
    """Closed loop: ``concurrency`` clients, ``per_client`` requests each, through the step protocol."""
    loop = RollingBatchLoop(max_size=concurrency)
    remaining = {c: per_client for c in range(concurrency)}
    done: list[Request] = []
    began = time.perf_counter()
    ready = [(c, began) for c in range(concurrency)]  # clients with a request to send, and when they sent it
    counter = 0
    while ready or loop.active:
        for client, sent in ready:
            payload = {"inputs": prompts[counter % len(prompts)], "stream": True,
                       "parameters": {"max_new_tokens": new_tokens, "ignore_eos": not real_eos}}
            counter += 1
            remaining[client] -= 1
            loop.add(RollingRequest(request_input(JSON, json.dumps(payload).encode()), seed=counter,
                                    key=Request(client, sent)))
        ready = []
        out = handler.handle(loop.next_input())
        now = time.perf_counter()
        for item in loop.apply(out.code, out.properties, [out.content.value_at(i) for i in range(out.content.size())]):
            request = item.request.key
            assert item.code is None, item.error
            request.token_times += [now] * item.data.count("\n")
            if item.last:
                done.append(request)
                if remaining[request.client]:
                    ready.append((request.client, now))
    elapsed = time.perf_counter() - began
    tokens = sum(len(r.token_times) for r in done)
    assert real_eos or tokens == len(done) * new_tokens
    ttft = sorted(r.token_times[0] - r.submitted for r in done)
    gaps = [b - a for r in done for a, b in zip(r.token_times, r.token_times[1:])]
    return {"tokens_per_s": tokens / elapsed, "ttft_p50": _pct(ttft, 50), "ttft_p90": _pct(ttft, 90),
            "itl_mean": statistics.fmean(gaps), "itl_p50": statistics.median(gaps), "requests": len(done),
            "tokens": tokens, "seconds": elapsed}


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["bench-115m", "smollm2"], default="bench-115m",
                        help="bench-115m: random weights, exactly --new-tokens per request; smollm2: the real "
                             "model, chat questions ending on its EOS")
    parser.add_argument("--model-dir", type=Path, help="default: out/bench-115m, or lmi's cache for smollm2")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--per-client", type=int, default=4, help="requests each client sends")
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--skip-hf-continuous-batching", action="store_true",
                        help="skip the transformers generate_batch baseline")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="one more option for the handler (repeatable); default: none, the default options")
    parser.add_argument("--threads", type=int, help="torch threads for both (default: what the handler sets)")
    args = parser.parse_args()
    if bad := [option for option in args.option if "=" not in option]:
        parser.error(f"--option wants KEY=VALUE, got {bad[0]!r}")
    # One thread count for the handler and the baselines alike (OMP_NUM_THREADS set: the handler leaves it as is).
    policy = default_threads()
    threads = args.threads or (policy.wide if policy else torch.get_num_threads())
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    real_eos = args.model == "smollm2"
    if real_eos:
        args.model_dir = convert_smollm2(args.model_dir)
    else:
        args.model_dir = args.model_dir or Path("out/bench-115m")
        if not (args.model_dir / "config.json").exists():
            print(f"building the 115M model in {args.model_dir} ...", flush=True)
            build_tiny_model(args.model_dir, "bench-115m")
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir).eval()
    levels = [int(c) for c in args.concurrency.split(",")]
    prompts = (chat_prompts(tokenizer, max(levels) * 2) if real_eos
               else make_prompts(tokenizer, max(levels) * 2, args.prompt_tokens))
    lengths = [len(tokenizer(p).input_ids) for p in prompts]
    print(f"model: {args.model}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, fp32, "
          f"{torch.get_num_threads()} threads; prompts {min(lengths)}-{max(lengths)} tokens, "
          + (f"answers up to {args.new_tokens} tokens, ending on EOS" if real_eos else f"{args.new_tokens} new tokens")
          + ", greedy", flush=True)

    generate_rate(model, tokenizer, prompts[:2], 8)  # warm-up
    # One at a time over as many prompts as a concurrency-1 client sends, so both see the same work.
    single = statistics.fmean(generate_rate(model, tokenizer, [p], args.new_tokens, real_eos)
                              for p in prompts[:args.per_client])
    static = {c: generate_rate(model, tokenizer, prompts[:c], args.new_tokens, real_eos) for c in levels if c > 1}
    print(f"model.generate, one at a time: {single:.1f} tok/s; static batch: "
          + ", ".join(f"{c}: {r:.1f} tok/s" for c, r in static.items()), flush=True)
    hf_cb = None
    if not args.skip_hf_continuous_batching and hasattr(model, "generate_batch"):
        hf_cb = hf_continuous_batching_rate(model, tokenizer, prompts[:max(levels)], args.new_tokens, real_eos)
        print(f"transformers generate_batch (its continuous batching), {max(levels)} prompts at once: "
              f"{hf_cb:.1f} tok/s", flush=True)

    handler = Handler()
    options = dict(option.split("=", 1) for option in args.option)
    assert handler.handle(init_input({"model_id": str(args.model_dir.resolve()), "rolling_batch": "auto",
                                      "max_rolling_batch_size": str(max(levels)), "model_dir": str(args.model_dir),
                                      **options})) is None
    print(f"handler: {', '.join(args.option) or 'default options'}, {torch.get_num_threads()} threads", flush=True)
    handler_run(handler, prompts, 2, 1, 8)  # warm-up
    rows = []
    for c in levels:
        result = handler_run(handler, prompts, c, args.per_client, args.new_tokens, real_eos)
        baseline = single if c == 1 else static[c]
        rows.append({"concurrency": c, **result, "baseline_tokens_per_s": baseline,
                     "ratio": result["tokens_per_s"] / baseline})
        print(f"handler, concurrency {c:>2}: {result['tokens_per_s']:6.1f} tok/s = {rows[-1]['ratio']:.2f}x "
              f"{'single' if c == 1 else 'static-batch'} generate; TTFT p50 {result['ttft_p50']:.2f} s, "
              f"p90 {result['ttft_p90']:.2f} s; inter-token {result['itl_mean'] * 1000:.0f} ms; "
              f"{result['tokens'] / result['requests']:.1f} tokens per answer", flush=True)
    targets = [("concurrency 16 >= 1.0x static generate", next((r["ratio"] >= 1.0 for r in rows if r["concurrency"] == 16), None)),
               ("concurrency 1 >= 0.95x single generate", next((r["ratio"] >= 0.95 for r in rows if r["concurrency"] == 1), None)),
               ("TTFT p50 at concurrency 16 < 4 s", next((r["ttft_p50"] < 4 for r in rows if r["concurrency"] == 16), None))]
    for name, met in targets:
        if met is not None:
            print(f"target {name}: {'met' if met else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps({"single_generate": single, "static_generate": static,
                                         "hf_generate_batch": hf_cb, "handler": rows}, indent=2))


if __name__ == "__main__":
    main()
