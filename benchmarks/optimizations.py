"""Inference optimizations against plain decoding, measured in the same run, with the source's method.

The SageMaker optimization-toolkit posts measure long prompts (500-1,000 tokens, OpenOrca), 250 new tokens, and
report throughput = (1 / p50 inter-token latency) x concurrency and a blended price per 1M tokens at a 3:1
input:output ratio: (1 - discount) x hourly price / (throughput x 3600 / 1e6) / 4. This script runs each
technique ``option`` set through ``handle()`` with DJLServing's rolling-batch step protocol (closed-loop
clients, ``benchmarks/rolling_batch.py``'s driver), on SmolLM2-135M-Instruct, for two workloads:

* ``long``: a question about a ~600-token passage (the source's prompt shape; OpenOrca is not available here);
* ``grounded``: "copy out the passage" - an input-grounded task, where the answer repeats the prompt.

For each it prints output tokens/s (wall clock), p50 inter-token latency, TTFT p50, the source's throughput
estimate, the blended $/1M tokens, and the model's weight memory, beside plain decoding at the same concurrency.
Speculative rows (prompt lookup, a draft model, and prompt lookup on int8 weights) add the draft acceptance rate
and whether their greedy text equals that of the same weights without speculation (plain, or int8), on the same
prompts. A speculating stream delivers tokens
in bursts (several per step, arriving together), so its median gap says nothing: its C/ITL uses the mean gap.

Then the quality of int8 weights against full precision on a fixed text set: greedy-token agreement (the int8
model's greedy choice at each position of the full-precision greedy continuation, and whole continuations that
match) and the mean log-likelihood per token of fixed texts under both.

    .venv/bin/python benchmarks/optimizations.py --model-dir out/smollm2 [--new-tokens 250] [--concurrency 1,8]
        [--techniques plain,ngram]

Figures, not assertions. The machine is shared; run it twice before trusting a ratio under 1.2x.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from lmi_handlers.backends.hf.quantize import model_bytes, quantize_weights  # noqa: E402
from lmi_handlers.handler import Handler  # noqa: E402
from lmi_tools.bench.metrics import blended_price_3_to_1  # noqa: E402
from lmi_tools.serving.worker.frontend import RollingBatchLoop, RollingRequest, init_input, request_input  # noqa: E402
from rolling_batch import handler_run  # noqa: E402

#: The techniques: name -> serving.properties options on top of plain continuous batching ("{model}" is the model
#: directory: SmolLM2's own int8 copy is the draft, the only smaller model of its tokenizer here).
TECHNIQUES = {"plain": {}, "int8": {"quantize": "static_int8"},
              "ngram": {"speculative_draft_model": "[ngram]"},
              "draft": {"speculative_draft_model": "{model}", "speculative_draft_quantize": "static_int8"},
              "int8+ngram": {"quantize": "static_int8", "speculative_draft_model": "[ngram]"}}

# A fixed text set written for this benchmark (no data set can be downloaded here): varied, ordinary prose.
TEXTS = [
    "The harbour town woke slowly. Fishing boats came in with the tide, and the market stalls opened one by one "
    "as the sun climbed over the hills. By nine the square was full of people buying bread, fish and flowers.",
    "To make a simple tomato sauce, warm olive oil in a pan, add chopped garlic and cook it until it smells sweet. "
    "Add crushed tomatoes, a pinch of salt and a few basil leaves, then let it simmer for twenty minutes.",
    "Photosynthesis is the process by which plants use sunlight, water and carbon dioxide to make glucose and "
    "oxygen. It takes place mostly in the leaves, inside small structures called chloroplasts.",
    "The library opens at eight in the morning and closes at six in the evening. Members may borrow up to five "
    "books at a time for three weeks. Late returns cost ten cents per book per day.",
    "Python is a programming language known for its readable syntax. It is used for web development, data "
    "analysis, automation and machine learning, and it has a large standard library.",
    "During the winter the lake freezes over, and families skate on it every weekend. The ice is checked each "
    "morning by the park staff, who put up a red flag when it is not safe.",
    "A good night's sleep helps memory and mood. Experts suggest going to bed at the same time every night, "
    "keeping the bedroom dark and quiet, and avoiding screens for an hour before sleep.",
    "The train to the coast leaves every hour from platform four. The journey takes two hours and ten minutes, "
    "and tickets bought online are cheaper than those bought at the station.",
]
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis briefly.",
             "List three uses of Python.", "Who wrote Hamlet?", "Give me a recipe for pancakes.",
             "What is 12 times 13?", "Describe a cat in two sentences."]


JSON = [("Content-Type", "application/json")]


def chat(tokenizer, content: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=True)


def workloads(tokenizer, count: int, prompt_tokens: int) -> dict[str, list[str]]:
    """``count`` distinct prompts per workload, each with a passage of about ``prompt_tokens`` tokens."""
    out: dict[str, list[str]] = {"long": [], "grounded": []}
    for i in range(count):
        texts, passage = TEXTS[i % len(TEXTS):] + TEXTS[:i % len(TEXTS)], ""
        while len(tokenizer(passage).input_ids) < prompt_tokens:
            passage += " ".join(texts) + " "
        passage = tokenizer.decode(tokenizer(passage).input_ids[:prompt_tokens])
        out["long"].append(chat(tokenizer, f"{passage}\n\nQuestion: what is this text about, and what details "
                                           "does it give? Answer in detail."))
        out["grounded"].append(chat(tokenizer, f"Copy the following text exactly, word for word:\n\n{passage}"))
    return out


def load(model_dir: Path, concurrency: int, max_len: int, options: dict[str, str]) -> Handler:
    handler = Handler()
    # max_model_len sizes the KV buffers: SmolLM2's 8192 positions would make every decode step attend over them.
    props = {"model_id": str(model_dir.resolve()), "model_dir": str(model_dir), "rolling_batch": "scheduler",
             "max_rolling_batch_size": str(concurrency), "max_model_len": str(max_len), **options}
    assert handler.handle(init_input(props)) is None
    return handler


def measure(args, prompts: dict[str, list[str]], max_len: int) -> list[dict]:
    rows, texts_of = [], {}
    for technique in args.techniques:
        options = {k: v.format(model=args.model_dir.resolve()) for k, v in TECHNIQUES[technique].items()}
        handler = load(args.model_dir, max(args.concurrency), max_len, options)
        memory = model_bytes(handler.backend.model)
        speculating = handler.backend.speculator is not None
        handler_run(handler, prompts["long"], 1, 1, 4)  # warm-up
        for workload, texts in prompts.items():
            greedy = texts_of[technique, workload] = greedy_texts(handler, texts[:2], min(args.new_tokens, 64))
            base = texts_of.get((_without_speculation(technique), workload))
            for c in args.concurrency:
                before = handler.engine.stats()
                result = handler_run(handler, texts, c, args.per_client if c == 1 else 1, args.new_tokens)
                itl = result["itl_mean"] if speculating else result["itl_p50"]
                throughput = c / itl
                price = (1 - args.discount) * args.price_per_hour
                rows.append({"workload": workload, "technique": technique, "concurrency": c,
                             "tokens_per_s": result["tokens_per_s"], "itl_p50_ms": result["itl_p50"] * 1000,
                             "itl_basis": "mean" if speculating else "p50",
                             "ttft_p50_s": result["ttft_p50"], "throughput_from_itl": throughput,
                             "usd_per_1m_blended": blended_price_3_to_1(throughput, price),
                             "weights_mib": memory / 2**20,
                             "acceptance": _acceptance(before, handler.engine.stats()) if speculating else None,
                             "same_text": greedy == base if base is not None and speculating else None})
                print(_line(rows[-1], rows), flush=True)
    return rows


def _without_speculation(technique: str) -> str | None:
    """The technique with the same weights and no speculation (whose greedy text a speculating one must equal)."""
    from lmi_handlers.backends.hf.speculative import SPECULATIVE_KEYS

    options = {k: v for k, v in TECHNIQUES[technique].items() if k not in SPECULATIVE_KEYS}
    return next((name for name, other in TECHNIQUES.items() if other == options), None)


def greedy_texts(handler: Handler, prompts: list[str], new_tokens: int) -> list[str]:
    """Each prompt's greedy text (all in one rolling batch), to compare a technique's with plain decoding's."""
    payloads = [{"inputs": prompt, "parameters": {"max_new_tokens": new_tokens, "ignore_eos": True}} for prompt in prompts]
    bodies = RollingBatchLoop(max_size=len(prompts)).run(handler, [
        (0, RollingRequest(request_input(JSON, json.dumps(payload).encode()), seed=i, key=i))
        for i, payload in enumerate(payloads)])
    return [json.loads(bodies[i])["generated_text"] for i in range(len(prompts))]


def _acceptance(before: dict, after: dict) -> float | None:
    drafted = after["spec_draft_tokens"] - before["spec_draft_tokens"]
    return (after["spec_accepted_tokens"] - before["spec_accepted_tokens"]) / drafted if drafted else None


def _line(row: dict, rows: list[dict]) -> str:
    plain = next((r for r in rows if r["technique"] == "plain" and r["workload"] == row["workload"]
                  and r["concurrency"] == row["concurrency"]), None)
    ratio = f" = {row['tokens_per_s'] / plain['tokens_per_s']:.2f}x plain" if plain and plain is not row else ""
    speculation = ""
    if row["acceptance"] is not None or row["itl_basis"] == "mean":
        accepted = "none drafted" if row["acceptance"] is None else f"{row['acceptance']:.0%} accepted"
        same = {True: "same as", False: "DIFFERS from", None: "not compared with"}[row["same_text"]]
        speculation = f"; {accepted}, greedy text {same} {_without_speculation(row['technique'])}"
    return (f"{row['workload']:>8} c{row['concurrency']:<2} {row['technique']:>10}: {row['tokens_per_s']:6.2f} tok/s"
            f"{ratio}; ITL p50 {row['itl_p50_ms']:.0f} ms, TTFT p50 {row['ttft_p50_s']:.2f} s, "
            f"C/ITL({row['itl_basis']}) {row['throughput_from_itl']:.1f} tok/s, "
            f"${row['usd_per_1m_blended']:.2f}/1M blended, weights {row['weights_mib']:.0f} MiB{speculation}")


def quality(model_dir: Path, new_tokens: int) -> dict:
    """int8 against full precision: greedy agreement on ``QUESTIONS`` and log-likelihood on ``TEXTS``."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    full = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    int8 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    quantize_weights(int8, "static_int8")
    agree = total = same = 0
    with torch.inference_mode():
        for question in QUESTIONS:
            ids = tokenizer(chat(tokenizer, question), return_tensors="pt").input_ids
            want = full.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                 do_sample=False)[0, ids.shape[1]:]
            choices = int8(torch.cat([ids[0], want])[None]).logits[0, ids.shape[1] - 1:-1].argmax(-1)
            agree, total = agree + int((choices == want).sum()), total + len(want)
            got = int8.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                do_sample=False)[0, ids.shape[1]:]
            same += int(torch.equal(got, want))
        nll = {}
        for name, model in (("full", full), ("int8", int8)):
            losses = [float(model(t, labels=t).loss) for t in
                      (tokenizer(text, return_tensors="pt").input_ids for text in TEXTS)]
            nll[name] = statistics.fmean(losses)
    return {"teacher_forced_agreement": agree / total, "tokens": total, "identical_continuations": same,
            "continuations": len(QUESTIONS), "nll_full": nll["full"], "nll_int8": nll["int8"],
            "nll_difference": nll["int8"] - nll["full"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=Path("out/smollm2"),
                        help="SmolLM2-135M-Instruct as a model directory (lmi model smollm2 DIR writes one)")
    parser.add_argument("--concurrency", default="1,8", type=lambda text: [int(c) for c in text.split(",")])
    parser.add_argument("--per-client", type=int, default=2, help="requests sent at concurrency 1")
    parser.add_argument("--prompt-tokens", type=int, default=600, help="passage length (the source: 622 on average)")
    parser.add_argument("--new-tokens", type=int, default=250, help="the source: 250")
    parser.add_argument("--price-per-hour", type=float, default=1.006, help="instance $/h (default ml.g5.xlarge's, "
                                                                            "from lmi_tools/instances.py)")
    parser.add_argument("--discount", type=float, default=0.0, help="the source's (1 - discount) factor")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch threads (on a busy shared machine 1 is steadier: spinning threads wait on each other)")
    parser.add_argument("--techniques", default=",".join(TECHNIQUES),
                        type=lambda text: [t for t in text.split(",") if t],
                        help=f"which to run, plain first for the ratios (default all: {', '.join(TECHNIQUES)})")
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    unknown = [t for t in args.techniques if t not in TECHNIQUES]
    if unknown or not args.techniques:
        parser.error(f"--techniques {','.join(unknown) or '(none)'}: choose from {', '.join(TECHNIQUES)}")
    if not (args.model_dir / "config.json").is_file():
        sys.exit(f"{args.model_dir} holds no model: write SmolLM2 there first (lmi model smollm2 {args.model_dir})")
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    prompts = workloads(tokenizer, max(args.concurrency) * 2, args.prompt_tokens)
    lengths = [len(tokenizer(p).input_ids) for texts in prompts.values() for p in texts]
    print(f"{args.model_dir}: prompts {min(lengths)}-{max(lengths)} tokens, {args.new_tokens} new tokens, greedy "
          f"(ignore_eos), {torch.get_num_threads()} threads, ${args.price_per_hour}/h x (1 - {args.discount})",
          flush=True)
    began = time.perf_counter()
    figures = {"speed": measure(args, prompts, max(lengths) + args.new_tokens)}
    if not args.skip_quality:
        figures["quality"] = quality(args.model_dir, min(args.new_tokens, 48))
        q = figures["quality"]
        print(f"int8 vs full precision: greedy agreement {q['teacher_forced_agreement']:.1%} of {q['tokens']} "
              f"tokens (teacher-forced), {q['identical_continuations']}/{q['continuations']} identical "
              f"continuations; mean NLL/token {q['nll_full']:.3f} -> {q['nll_int8']:.3f} "
              f"({q['nll_difference']:+.3f})", flush=True)
    print(f"done in {time.perf_counter() - began:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
