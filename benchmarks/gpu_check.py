"""The hf backend on a GPU: a random-weight Llama-3-8B-shaped model in bf16, served through the handler's rolling
batch on CUDA, against ``model.generate`` with static batches of the same prompts, in the same run.

Needs only torch, transformers and tokenizers (no ``lmi`` command, no network, no download). The model directory is
written to a temporary folder and loaded through ``from_pretrained`` exactly as a served model is: Llama-3-8B's shape
(hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate 14336, vocabulary 128256, RoPE theta 500000), seeded
random weights (std 0.02), a byte-level BPE tokenizer trained here and padded to the vocabulary with plain-text
tokens, so every id the model can produce decodes. The output rows of the special tokens are zero, so no answer ends
early: every request gets exactly ``--new-tokens`` tokens from both paths.

At each concurrency C (1, 16, 64) the same C prompts of about 100 tokens go through ``model.generate`` (one
static, left-padded batch; at C = 1 three prompts one at a time) and through ``handle()`` (C requests joining at
the first step, streamed as jsonlines, driven with DJLServing's rolling-batch step protocol in process), greedy.
Prints output tokens/s of both and their ratio, and compares token ids: the handler's answers alone and inside
the busy batch against ``generate`` one prompt at a time (the first three prompts are in every batch) and against
the static batch of the same composition. With bf16 on a GPU, different batch shapes round differently, so greedy
paths may part where two tokens nearly tie; each divergence is reported with its position and with how an
uncached forward of the common prefix scores the two tokens (a gap of a few hundredths is such a tie; a large
gap is a bug).

    python3 benchmarks/gpu_check.py                # CUDA, the 8B shape in bf16 (about 16 GB of weights)
    python3 benchmarks/gpu_check.py --dtype fp32   # the same in float32 (32 GB): greedy paths must not part
    python3 benchmarks/gpu_check.py --tiny         # CPU, a tiny model in float32, under a minute

Exits 1 when any handler answer differs in float32; in bf16 it reports. Random weights over a 128k vocabulary put
the best two logits of most steps within a few hundredths of each other, a few bf16 steps at their size, so bf16
greedy paths part early whatever serves them (``generate``'s own static batch parts from ``generate`` alone).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import transformers  # noqa: E402

from lmi_handlers.handler import Handler  # noqa: E402
from lmi_tools.models.tiny import TinySpec, corpus, train_tokenizer  # noqa: E402 (stdlib-only at import)
from lmi_tools.serving.worker.frontend import RollingBatchLoop, RollingRequest, init_input, request_input  # noqa: E402

LLAMA3_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5}
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 4096, "max_position_embeddings": 512, "rms_norm_eps": 1e-5}
ROPE_THETA = 500000.0
JSON = [("Content-Type", "application/json")]
ALONE = 3  # prompts generated one at a time at concurrency 1; they lead every batch


def make_tokenizer(vocab_size: int):
    """The tiny model's trained BPE tokenizer, its vocabulary filled up to ``vocab_size`` with ids BPE never produces
    but the model may generate: plain ASCII (``~<id>``), so every id decodes to text."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    base = train_tokenizer(TinySpec(vocab_size=min(vocab_size, 8192)))
    state = json.loads(base.backend_tokenizer.to_str())
    vocab = state["model"]["vocab"]
    for i in range(len(vocab), vocab_size):
        vocab[f"~{i}"] = i
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(state)), bos_token=base.bos_token,
                                   eos_token=base.eos_token, pad_token=base.pad_token)


def build_model_dir(out: Path, shape: dict, dtype: torch.dtype, device: str) -> None:
    """Config, seeded random safetensors and tokenizer in ``out``; the weights are drawn on ``device``."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = make_tokenizer(shape["vocab_size"])
    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
               "pad_token_id": tokenizer.pad_token_id}
    config = LlamaConfig(**shape, rope_theta=ROPE_THETA, tie_word_embeddings=False, **special)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.02, generator=generator)
        # Special tokens' logits 0, far below the best of 128k random logits: no answer stops early.
        model.get_output_embeddings().weight[tokenizer.all_special_ids] = 0.0
    model.generation_config = GenerationConfig(**special)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    del model


def make_prompts(tokenizer, count: int, tokens: int) -> list[str]:
    """Distinct prompts of about ``tokens`` tokens, cut from the tokenizer's training corpus."""
    ids = tokenizer(" ".join(corpus(seed=1, words=30_000)[100:]), add_special_tokens=False).input_ids
    return [tokenizer.decode(ids[i * tokens:(i + 1) * tokens - 1]) for i in range(count)]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def generate(model, tokenizer, prompts: list[list[int]], new_tokens: int, device: str) -> tuple[list[list[int]], float]:
    """Greedy ``model.generate`` over ``prompts`` (token ids) as one left-padded static batch: answers and seconds."""
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    sync(device)
    began = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
    answers = out[:, width:].tolist()
    return answers, time.perf_counter() - began


def serve(handler: Handler, prompts: list[str], new_tokens: int) -> tuple[list[list[int]], float]:
    """The prompts as requests joining one rolling batch at its first step, streamed as jsonlines: each answer's
    token ids and the seconds until the last finished."""
    joins = []
    for i, prompt in enumerate(prompts):
        body = {"inputs": prompt, "stream": True, "parameters": {"max_new_tokens": new_tokens, "ignore_eos": True}}
        joins.append((0, RollingRequest(request_input(JSON, json.dumps(body).encode()), seed=1, key=i)))
    began = time.perf_counter()
    bodies = RollingBatchLoop(max_size=len(prompts)).run(handler, joins)
    elapsed = time.perf_counter() - began
    answers = []
    for i in range(len(prompts)):
        lines = [json.loads(line) for line in bodies[i].splitlines() if line.strip()]
        answers.append([line["token"]["id"] for line in lines if "token" in line])
    return answers, elapsed


def first_divergence(a: list[int], b: list[int]) -> int | None:
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return at if at is not None or len(a) == len(b) else min(len(a), len(b))


def explain(model, prompt: list[int], ours: list[int], theirs: list[int], at: int, device: str,
            names: tuple[str, str]) -> str:
    """How an uncached forward of prompt + the common prefix scores the two tokens chosen at ``at``."""
    if at >= min(len(ours), len(theirs)):
        return f"lengths differ ({len(ours)} vs {len(theirs)})"
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + ours[:at]], device=device)).logits[0, -1].float()
    top = logits.topk(2)
    a, b = float(logits[ours[at]]), float(logits[theirs[at]])
    step = torch.finfo(model.dtype).eps * 2 ** math.floor(math.log2(max(abs(a), 1e-30)))  # the dtype's step there
    return (f"token {at}: {names[0]} {ours[at]} ({a:.4f}), {names[1]} {theirs[at]} ({b:.4f}), gap {abs(a - b):.4f} = "
            f"{abs(a - b) / step:.0f} {str(model.dtype).split('.')[-1]} steps; an uncached forward picks "
            f"{int(top.indices[0])}, its top-2 gap {float(top.values[0] - top.values[1]):.4f}")


def compare(name: str, model, prompts: list[list[int]], ours: list[list[int]], theirs: list[list[int]],
            device: str, names: tuple[str, str] = ("handler", "generate")) -> int:
    """Print how many answers are equal and, for each that is not, where and why; returns the mismatches."""
    mismatches = [(i, first_divergence(a, b)) for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    print(f"  {name}: {len(ours) - len(mismatches)}/{len(ours)} equal", flush=True)
    for i, at in mismatches[:8]:
        why = explain(model, prompts[i], ours[i], theirs[i], at, device, names)
        print(f"    MISMATCH request {i}: {why}", flush=True)
    if len(mismatches) > 8:
        print(f"    ... and {len(mismatches) - 8} more; first divergences at "
              f"{sorted(at for _, at in mismatches[8:])}", flush=True)
    return len(mismatches)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny model in float32 on the CPU (under a minute)")
    parser.add_argument("--device", help="default: cuda, or cpu with --tiny")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], help="default: bf16, or fp32 with --tiny")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    # The backend's load lines say which runner it chose and why (a failed self-check means the slow fallback).
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("lmi_handlers").setLevel(logging.INFO)
    transformers.utils.logging.disable_progress_bar()
    device = args.device or ("cpu" if args.tiny else "cuda")
    shape = TINY if args.tiny else LLAMA3_8B
    dtype_name = args.dtype or ("fp32" if args.tiny else "bf16")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    levels = [int(c) for c in args.concurrency.split(",")]
    started = time.perf_counter()
    gpu = torch.cuda.get_device_name() if device == "cuda" else "none"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, python {sys.version.split()[0]}, "
          f"device {device} ({gpu}), {dtype_name}", flush=True)

    folder = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    failures = 0
    try:
        build_model_dir(folder, shape, dtype, device)
        size = sum(f.stat().st_size for f in folder.iterdir()) / 2**30
        print(f"model directory written: {size:.2f} GiB in {time.perf_counter() - started:.1f} s", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()

        began = time.perf_counter()
        handler = Handler()
        out = handler.handle(init_input({"model_id": str(folder), "model_dir": str(folder), "rolling_batch": "auto",
                                         "device": device, "dtype": dtype_name, "max_model_len": "512",
                                         "max_rolling_batch_size": str(max(levels))}))
        if out is not None:
            raise SystemExit(f"the handler failed to load: {out.code} {out.message} {bytes(out.content.value_at(0))}")
        backend = handler.backend
        model = backend.model  # the same weights serve generate: one copy in memory
        print(f"handler loaded in {time.perf_counter() - began:.1f} s: {backend.runner.name} runner, "
              f"packed={getattr(backend.runner, 'packed', None)}, on {backend.device}, "
              f"{next(model.parameters()).dtype}, {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters, "
              f"attention {model.config._attn_implementation}", flush=True)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        texts = make_prompts(tokenizer, max(levels), args.prompt_tokens)
        prompts = [tokenizer(t).input_ids for t in texts]
        print(f"prompts: {min(map(len, prompts))}-{max(map(len, prompts))} tokens, {args.new_tokens} new tokens, "
              "greedy", flush=True)

        generate(model, tokenizer, prompts[:2], 4, device)  # warm-up, both paths
        serve(handler, texts[:2], 4)
        alone: list[list[int]] = []
        for c in levels:
            if c == 1:
                runs = [generate(model, tokenizer, [p], args.new_tokens, device) for p in prompts[:ALONE]]
                theirs, their_s = [r[0][0] for r in runs], sum(r[1] for r in runs)
                runs = [serve(handler, [t], args.new_tokens) for t in texts[:ALONE]]
                ours, our_s = [r[0][0] for r in runs], sum(r[1] for r in runs)
                alone = theirs
            else:
                theirs, their_s = generate(model, tokenizer, prompts[:c], args.new_tokens, device)
                ours, our_s = serve(handler, texts[:c], args.new_tokens)
            tokens = len(ours) * args.new_tokens
            assert all(len(a) == args.new_tokens for a in ours + theirs), "an answer stopped early"
            print(f"concurrency {c:>2}: handler {tokens / our_s:8.1f} tok/s, generate "
                  f"{'one at a time' if c == 1 else 'static batch'} {tokens / their_s:8.1f} tok/s, "
                  f"ratio {their_s / our_s:.2f}x", flush=True)
            if c == 1:
                failures += compare("handler alone vs generate alone", model, prompts, ours, theirs, device)
            else:
                failures += compare(f"handler in a batch of {c} vs generate alone (first {ALONE})", model, prompts,
                                    ours[:ALONE], alone, device)
                failures += compare(f"handler in a batch of {c} vs generate's static batch of {c}", model, prompts,
                                    ours, theirs, device)
                compare(f"(for scale) generate's static batch of {c} vs generate alone (first {ALONE})", model,
                        prompts, theirs[:ALONE], alone, device, ("static batch", "alone"))
        if device == "cuda":
            print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"total {time.perf_counter() - started:.0f} s; {failures} handler answers differ from generate", flush=True)
    return 1 if dtype == torch.float32 and failures else 0


if __name__ == "__main__":
    sys.exit(main())
