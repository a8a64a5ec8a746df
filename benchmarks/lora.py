"""LoRA adapters on the hf engine: tokens/s and decode step time at concurrency 16 with 0, 1 and 4 distinct adapters.

    .venv/bin/python benchmarks/lora.py                          # SmolLM2-135M-Instruct, C=16, 64 new tokens each
    .venv/bin/python benchmarks/lora.py --tokens 4 --concurrency 4 --rank 8   # a quick check that it runs

One run, in process, through ``Handler`` and its ``Engine`` (the code a rolling-batch step runs), on SmolLM2 (``lmi
model smollm2``) with adapters made here by peft (random factors on every linear layer of the decoder). Each
setting runs the same prompts: every sequence is admitted at once, then decoded to its token budget; the decode
step time is the median over the steps where every row decodes. Figures, not assertions; one torch thread unless
``--threads`` says otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from lmi_handlers.handler import Handler  # noqa: E402
from lmi_handlers.protocol import Input  # noqa: E402
from lmi_handlers.request import GenerationRequest, SamplingParams, Schema, StoppingParams  # noqa: E402
from lmi_handlers.sequence import SequenceState  # noqa: E402
from lmi_tools.models import smollm2  # noqa: E402
from lmi_tools.serving.worker.frontend import init_input  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapters(base: Path, out: Path, count: int, rank: int) -> list[Path]:
    import peft
    import transformers

    paths = []
    for i in range(count):
        torch.manual_seed(i)
        model = transformers.AutoModelForCausalLM.from_pretrained(base)
        model = peft.get_peft_model(model, peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS,
                                                           init_lora_weights=False))
        paths.append(out / f"a{i}")
        model.save_pretrained(paths[-1])
    return paths


def run(handler: Handler, adapters: list, concurrency: int, prompt_tokens: int, tokens: int) -> dict[str, float]:
    engine, vocab = handler.engine, 40_000
    request = GenerationRequest(Schema.LMI, "ids", SamplingParams(), StoppingParams(tokens, ignore_eos=True))
    seqs = []
    for i in range(concurrency):
        seq = SequenceState(request, [(97 * i + 13 * j) % vocab + 100 for j in range(prompt_tokens)],
                            decode=handler.backend.tokenizer.decode, max_new_tokens=tokens)
        seq.adapter = adapters[i % len(adapters)] if adapters else None
        seqs.append(seq)
        engine.add(seq)
    steps, began = [], time.perf_counter()
    while not engine.idle:
        decoding = not engine.waiting and all(s.num_cached >= s.length - 1 for s in engine.running)
        start = time.perf_counter()
        engine.step()
        if decoding:
            steps.append(time.perf_counter() - start)
    elapsed = time.perf_counter() - began
    generated = sum(len(s.generated) for s in seqs)
    return {"tokens_per_s": generated / elapsed, "decode_step_ms": 1000 * statistics.median(steps) if steps else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per sequence")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = smollm2.convert_smollm2(smollm2.default_dir(), say=lambda line: None)
    work = Path(tempfile.mkdtemp(prefix="lmi-lora-bench-"))
    paths = make_adapters(base, work, 4, args.rank)
    handler = Handler()
    handler.handle(init_input({"model_id": str(base), "model_dir": str(work), "rolling_batch": "scheduler",
                               "max_rolling_batch_size": str(args.concurrency), "enable_lora": "true",
                               "max_lora_rank": str(args.rank)}))
    for path in paths:
        out = handler.manage_adapter(Input({"name": path.name, "src": str(path)}), "register")
        assert out.code == 200, bytes(out.content.value_at(0))
    adapters = [handler.adapters.get(p.name) for p in paths]
    run(handler, [], args.concurrency, args.prompt_tokens, 2)  # warm-up
    rows = [(n, run(handler, adapters[:n], args.concurrency, args.prompt_tokens, args.tokens)) for n in (0, 1, 4)]
    base_step = rows[0][1]["decode_step_ms"] or 1.0
    print(f"SmolLM2-135M, C={args.concurrency}, {args.prompt_tokens}-token prompts, {args.tokens} new tokens, "
          f"rank {args.rank} on {len(TARGETS)} modules, {args.threads} thread(s)")
    print("| distinct adapters | tokens/s | decode step (ms) | step vs base |\n|---|---|---|---|")
    for n, figures in rows:
        print(f"| {n} | {figures['tokens_per_s']:.1f} | {figures['decode_step_ms']:.1f} | "
              f"{figures['decode_step_ms'] / base_step:.2f}x |")


if __name__ == "__main__":
    main()
