"""The paged engine's own figures, each against a baseline measured in the same run.

    .venv/bin/python benchmarks/engine.py capacity   # concurrent sequences in one KV budget: paged vs contiguous
    .venv/bin/python benchmarks/engine.py prefix     # TTFT with a 1,000-token shared system prompt, cold vs warm
    .venv/bin/python benchmarks/engine.py decode     # one decode step vs the model's bare forward (generate's loop)
    .venv/bin/python benchmarks/engine.py chunked    # running streams' inter-token latency while long prompts arrive
    .venv/bin/python benchmarks/engine.py projection # decode step with the output projection in vocabulary slices
    .venv/bin/python benchmarks/engine.py packed     # SmolLM2 steps: one packed forward vs decodes and prompts apart
    .venv/bin/python benchmarks/engine.py linear     # SmolLM2 decode step: stock linear layers, oneDNN, compiled
    .venv/bin/python benchmarks/engine.py kernels    # SmolLM2 engine steps under each choice of CPU kernels
    .venv/bin/python benchmarks/engine.py widths     # SmolLM2's layer products by row count: torch, oneDNN, compiled
    .venv/bin/python benchmarks/engine.py sampling   # token selection over a 49,152-token vocabulary, by kind of row
                                                     # (first in all: it compares glibc's malloc settings)
    .venv/bin/python benchmarks/engine.py all

Everything runs in process, through ``Handler`` and its ``Engine`` (the code a rolling-batch step runs), on
random-weight models built locally (``lmi_tools.models.tiny``): the 2-layer tiny model for capacity and
decode overhead, the 115M Llama shape (2,048 positions) for prefix reuse and chunked prefill. Figures, not
assertions: nothing here fails on speed. One torch thread unless ``--threads`` says otherwise, as the figures in
docs/engine.md were taken (and as ``serve_sweep.py`` runs every server): on a 2-CPU machine torch's default of
every CPU competes with whatever else runs there and moves the figures.

``peers`` prints the command lines for the GPU comparison (vLLM and transformers serve against ``lmi serve``
with ``lmi bench``, same model, same concurrency sweep); it needs an NVIDIA GPU and was not run here.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from lmi_handlers.backends.hf.backend import cache_keyword  # noqa: E402
from lmi_handlers.handler import Handler  # noqa: E402
from lmi_handlers.request import GenerationRequest, SamplingParams, Schema, StoppingParams  # noqa: E402
from lmi_handlers.sequence import SequenceState  # noqa: E402
from lmi_tools.models.tiny import TinySpec, build_tiny_model  # noqa: E402
from lmi_tools.serving.worker.frontend import init_input  # noqa: E402

OUT = Path("out")


def model_dir(spec: str) -> Path:
    path = OUT / {"bench-115m": "bench-115m", "tiny": "bench-tiny", "tiny-2k": "bench-tiny-2k"}[spec]
    if not (path / "config.json").exists():
        print(f"building the {spec} model into {path} ...", flush=True)
        build_tiny_model(path, TinySpec(max_position_embeddings=2048) if spec == "tiny-2k" else spec)
    return path


def load(path: Path, **options: object) -> Handler:
    """The handler on ``path``; the stock CPU path unless ``options`` name kernels: the baselines here are the stock
    model, and the kernels' own comparisons (``linear``, ``kernels``, ``widths``) name theirs."""
    handler = Handler()
    props = {"model_id": str(path.resolve()), "model_dir": tempfile.mkdtemp(), "rolling_batch": "scheduler",
             "cpu_linear_kernel": "stock", "cpu_attention_kernel": "torch", **{k: str(v) for k, v in options.items()}}
    assert handler.handle(init_input(props)) is None, "the model did not load"
    return handler


def sequence(handler: Handler, prompt: list[int], new_tokens: int) -> SequenceState:
    request = GenerationRequest(Schema.LMI, "ids", SamplingParams(),
                                StoppingParams(max_new_tokens=new_tokens, ignore_eos=True))
    return SequenceState(request, prompt, decode=handler.backend.tokenizer.decode)


def ids(rng: torch.Generator, count: int, vocab: int) -> list[int]:
    return torch.randint(3, vocab, (count,), generator=rng).tolist()


def capacity(args: argparse.Namespace) -> None:
    """Concurrent sequences within one KV budget, for prompt-length mixes and two max_model_len, 64 new tokens.

    The contiguous cache this replaced reserved one ``max_model_len`` row per sequence (the model's own
    positions unless ``option.max_model_len`` lowers them), so it holds budget // max_model_len sequences
    whatever their real lengths; the paged pool holds what the sequences really use, in 16-token blocks.
    """
    budget_tokens, block = 8192, 16
    print(f"\nKV budget {budget_tokens} tokens ({budget_tokens // block} blocks of {block}), 96 requests of 64 new "
          "tokens; the contiguous cache keeps one max_model_len row per sequence")
    print("| max_model_len | prompts | contiguous | paged: mean while requests wait | paged: peak | ratio (mean) | "
          "preemptions |")
    print("|---|---|---|---|---|---|---|")
    for spec, max_len, low, high in (("tiny", 512, 16, 400), ("tiny", 512, 16, 128), ("tiny-2k", 2048, 16, 400),
                                     ("tiny-2k", 2048, 16, 1600)):
        handler = load(model_dir(spec), num_gpu_blocks_override=budget_tokens // block, block_size=block,
                       max_rolling_batch_size=256, max_model_len=max_len)
        rng = torch.Generator().manual_seed(0)
        engine, counts = handler.engine, []
        for length in torch.randint(low, high, (96,), generator=rng).tolist():
            engine.add(sequence(handler, ids(rng, length, 2000), 64))
        while not engine.idle:
            engine.step()
            if engine.waiting:  # saturated: the pool, not the arrivals, sets how many run
                counts.append(len(engine.running))
        contiguous = budget_tokens // max_len
        mean = statistics.mean(counts)
        print(f"| {max_len} | {low}-{high} tokens | {contiguous} | {mean:.1f} | {max(counts)} | "
              f"{mean / contiguous:.2f}x | {engine.scheduler.preemptions} |")


def prefix(args: argparse.Namespace) -> None:
    """TTFT of a request whose first 1,000 tokens are a system prompt seen before (warm) or not (cold)."""
    path = model_dir("bench-115m")
    handler = load(path, enable_prefix_caching="true", max_rolling_batch_size=4)
    rng = torch.Generator().manual_seed(1)
    cold, warm = [], []
    for trial in range(args.trials):
        system = ids(rng, 1000, 8000)
        for bucket in (cold, warm):  # the first time the system prompt is new, the second time it is cached
            seq = sequence(handler, system + ids(rng, 24, 8000), 1)
            began = time.perf_counter()
            handler.engine.add(seq)
            while not seq.generated:
                handler.engine.step()
            bucket.append(time.perf_counter() - began)
            while not handler.engine.idle:
                handler.engine.step()
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"\n115M model, 1,000-token system prompt + 24-token question, median of {args.trials}")
    print("| prefix cache | TTFT | ratio |\n|---|---|---|")
    print(f"| cold (first request with this prompt) | {c * 1000:.0f} ms | 1.00x |")
    print(f"| warm (same system prompt again) | {w * 1000:.0f} ms | {c / w:.1f}x lower |")
    print(f"(hit rate {handler.engine.stats()['prefix_cache_hit_rate']})")


def decode(args: argparse.Namespace) -> None:
    """One decode step against the model's own forward with its DynamicCache, same batch and lengths: the hf
    backend's step (paged inputs, forward, batched sampling) and the whole engine step (plus scheduling,
    detokenization, stop sequences and events, which generate's loop does not do), with the decode attention on
    torch's operators and on the compiled kernel (``option.cpu_attention_kernel``), all interleaved."""
    from transformers import AutoModelForCausalLM, DynamicCache

    path = model_dir("tiny")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    kernels = ("torch", "compiled")
    handlers = {k: load(path, max_rolling_batch_size=64, cpu_attention_kernel=k) for k in kernels}
    in_backend: list[float] = []

    def timed(backend_step):  # the engine calls it once per step; time it from the inside
        def step(batch):
            began = time.perf_counter()
            out = backend_step(batch)
            in_backend.append(time.perf_counter() - began)
            return out
        return step

    for handler in handlers.values():
        handler.backend.step = timed(handler.backend.step)
    rng = torch.Generator().manual_seed(2)
    print("\ntiny model (2 layers, hidden 64), prompts of 64 tokens, ms per decode step (median of 5 runs of "
          f"{args.steps} steps; ratios to the bare forward, in brackets those of the fastest runs)")
    print("| batch | model forward + argmax (generate's loop) | attention kernel | hf backend step | ratio | engine step "
          "| ratio |\n|---|---|---|---|---|---|---|")
    for rows in (1, 8, 32):
        prompts = [ids(rng, 64, 2000) for _ in range(rows)]
        bare, backend, ours = [], {k: [] for k in kernels}, {k: [] for k in kernels}
        for _ in range(5):
            bare.append(greedy_steps(model, DynamicCache(), torch.tensor(prompts), args.steps)[0])
            for kernel, handler in handlers.items():
                for seq in [sequence(handler, p, args.steps + 1) for p in prompts]:
                    handler.engine.add(seq)
                handler.engine.step()  # prefill
                in_backend.clear()
                began = time.perf_counter()
                for _ in range(args.steps):
                    handler.engine.step()
                ours[kernel].append((time.perf_counter() - began) / args.steps)
                backend[kernel].append(sum(in_backend) / args.steps)
                assert handler.engine.idle
        b = statistics.median(bare)
        for kernel in kernels:
            h, o = statistics.median(backend[kernel]), statistics.median(ours[kernel])
            # On a shared machine contention only adds time: the fastest runs come closest to the work itself.
            print(f"| {rows} | {b * 1000:.2f} | {kernel} | {h * 1000:.2f} | {h / b:.2f}x "
                  f"({min(backend[kernel]) / min(bare):.2f}x) | {o * 1000:.2f} | {o / b:.2f}x "
                  f"({min(ours[kernel]) / min(bare):.2f}x) |")


def chunked(args: argparse.Namespace) -> None:
    """Inter-token latency of 4 running streams while two 1,900-token prompts join, chunked or not."""
    path = model_dir("bench-115m")
    print("\n115M model: 4 streams decoding (64-token prompts), two 1,900-token prompts join; inter-token latency "
          "of the 4 streams while the long prompts are prefilled")
    print("| prefill | ITL p50 | ITL p99 | p99 / p50 | max stall |\n|---|---|---|---|---|")
    for label, options in (("whole prompts", {}),
                           ("chunked, 256 tokens a step", {"enable_chunked_prefill": "true",
                                                           "max_rolling_batch_prefill_tokens": 256})):
        handler = load(path, max_rolling_batch_size=8, **options)
        rng = torch.Generator().manual_seed(3)
        engine = handler.engine
        streams = [sequence(handler, ids(rng, 64, 8000), 10_000) for _ in range(4)]
        for seq in streams:
            engine.add(seq)
        engine.step()
        for _ in range(3):
            engine.step()
        longs = [sequence(handler, ids(rng, 1900, 8000), 4) for _ in range(2)]
        for seq in longs:
            engine.add(seq)
        gaps, last = [], time.perf_counter()
        while not all(seq.generated for seq in longs):
            engine.step()
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
        for _ in range(8):  # a few ordinary steps after, as a stream sees them
            engine.step()
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
        engine.reset()
        p50, p99 = statistics.median(gaps), sorted(gaps)[math.ceil(0.99 * len(gaps)) - 1]
        print(f"| {label} | {p50 * 1000:.0f} ms | {p99 * 1000:.0f} ms | {p99 / p50:.1f}x | {max(gaps) * 1000:.0f} ms |")


def projection(args: argparse.Namespace) -> None:
    """The output projection alone and the model's own decode step (forward with its DynamicCache, argmax), each
    with the stock product and with the vocabulary in slices (``backends/hf/output_projection.py``), interleaved in
    one process, on the 115M model (8,192 tokens) and SmolLM2 (49,152; converted on first use). The logits of
    both must be identical."""
    from transformers import AutoModelForCausalLM, DynamicCache

    from lmi_handlers.backends.hf.output_projection import sliced_forward
    from lmi_tools.models.smollm2 import convert_smollm2

    print("\nms, stock / sliced: the projection alone (median of 21 interleaved calls) and a decode step after "
          "32-token prompts (median of 5 interleaved runs of 8 steps)")
    print("| model | rows | projection | speed-up | decode step | speed-up | logits identical |\n"
          "|---|---|---|---|---|---|---|")
    for name, path in (("115M random (vocab 8,192)", model_dir("bench-115m")),
                       ("SmolLM2 (vocab 49,152)", convert_smollm2(say=lambda line: None))):
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        head = model.get_output_embeddings()
        sliced = sliced_forward(torch, head)
        if sliced is None:
            print(f"| {name} | | | | | | the load check kept the stock product |")
            continue
        for rows in (1, 4, 16, 64):
            prompt = torch.randint(3, head.out_features, (rows, 32), generator=torch.Generator().manual_seed(rows))
            hidden = torch.randn(rows, 1, head.in_features)
            alone = {"stock": [], "sliced": []}
            step = {"stock": [], "sliced": []}
            logits = {}
            for run in range(21):
                for label, forward in (("stock", head.forward), ("sliced", sliced)):
                    with torch.inference_mode():
                        began = time.perf_counter()
                        forward(hidden)
                        alone[label].append(time.perf_counter() - began)
                    if run < 5:
                        head.forward = forward  # what the model's own forward calls
                        seconds, logits[label] = greedy_steps(model, DynamicCache(), prompt, steps=8)
                        del head.forward
                        step[label].append(seconds)
            (a, b), (c, d) = ([statistics.median(x[k]) * 1000 for k in ("stock", "sliced")] for x in (alone, step))
            same = "yes" if torch.equal(logits["stock"], logits["sliced"]) else "NO"
            print(f"| {name} | {rows} | {a:.1f} / {b:.1f} | {a / b:.2f}x | {c:.1f} / {d:.1f} | {c / d:.2f}x | {same} |")


def packed(args: argparse.Namespace) -> None:
    """SmolLM2 engine steps with every chunk packed into one forward (``backends/hf/packed_attention.py``) against
    the same chunks run as two forwards, the decodes then the prompt, as the step ran before: same attention
    kernels, same inputs, interleaved in one process. A mixed step is the running streams' decodes plus one
    40-token chat prompt joining (it asks for one token, so the batch keeps its size)."""
    from lmi_tools.models.smollm2 import convert_smollm2

    handler = load(convert_smollm2(say=lambda line: None), max_rolling_batch_size=80)
    runner, engine = handler.backend.runner, handler.engine
    if not getattr(runner, "packed", False):
        print("\nthe packed step is not in use here (transformers < 4.48, or the load check refused it)")
        return
    one_forward = runner._forward

    def two_forwards(chunks, last=1):
        groups = [[i for i, c in enumerate(chunks) if (len(c.tokens) == 1) == single] for single in (True, False)]
        logits = [one_forward([chunks[i] for i in group], last) for group in groups if group]
        order = [i for group in groups for i in group]
        return torch.cat(logits)[torch.tensor(sorted(range(len(order)), key=order.__getitem__))]

    rng = torch.Generator().manual_seed(5)
    print(f"\nSmolLM2-135M-Instruct, streams with 40-token prompts decoding, ms per engine step (median of "
          f"{args.trials * 4} interleaved steps); two forwards / one packed forward")
    print("| streams | step | two forwards | packed | speed-up |\n|---|---|---|---|---|")
    for rows in (1, 16, 64):
        for seq in [sequence(handler, ids(rng, 40, 49_000), 10_000) for _ in range(rows)]:
            engine.add(seq)
        engine.step()  # their prefill
        timings = {(kind, mode): [] for kind in ("decode only", "decode + a prompt") for mode in ("two", "packed")}
        for _ in range(args.trials * 4):
            for mode, forward in (("two", two_forwards), ("packed", one_forward)):
                runner._forward = forward
                for kind in ("decode only", "decode + a prompt"):
                    if kind != "decode only":
                        engine.add(sequence(handler, ids(rng, 40, 49_000), 1))
                    began = time.perf_counter()
                    engine.step()
                    timings[kind, mode].append(time.perf_counter() - began)
        runner._forward = one_forward
        engine.reset()
        for kind in ("decode only", "decode + a prompt"):
            two, one = (statistics.median(timings[kind, mode]) * 1000 for mode in ("two", "packed"))
            print(f"| {rows} | {kind} | {two:.1f} | {one:.1f} | {two / one:.2f}x |")


def linear(args: argparse.Namespace) -> None:
    """SmolLM2's own decode step (forward with its DynamicCache, argmax) with torch's stock linear layers, with them
    through oneDNN with prepacked weights and through the compiled kernel (``option.cpu_linear_kernel``),
    interleaved in one process; how often each chooses the stock model's token and how far its logits are."""
    from transformers import AutoModelForCausalLM, DynamicCache

    from lmi_handlers.backends.hf.cpu.compiled_linear import build_kernel, compile_linears
    from lmi_handlers.backends.hf.cpu.onednn_linear import prepack_linears
    from lmi_tools.models.smollm2 import convert_smollm2

    path = convert_smollm2(say=lambda line: None)
    models = {k: AutoModelForCausalLM.from_pretrained(path).eval() for k in ("stock", "onednn", "compiled")}
    prepack_linears(torch, models["onednn"])
    compile_linears(torch, build_kernel(torch), models["compiled"])
    print(f"\nSmolLM2-135M-Instruct decode step after 40-token prompts, ms (median of {args.trials} interleaved runs "
          "of 8 steps), linear layers stock / oneDNN prepacked / compiled kernel")
    print("| rows | stock | oneDNN | compiled | compiled vs oneDNN | same greedy token as stock (oneDNN, compiled) "
          "| largest logit difference (oneDNN, compiled) |\n|---|---|---|---|---|---|---|")
    for rows in (1, 16, 64):
        prompt = torch.randint(3, 49_000, (rows, 40), generator=torch.Generator().manual_seed(rows))
        seconds: dict[str, list[float]] = {k: [] for k in models}
        logits = {}
        for _ in range(args.trials):
            for label, model in models.items():
                spent, logits[label] = greedy_steps(model, DynamicCache(), prompt, steps=8)
                seconds[label].append(spent)
        stock, onednn, compiled = (statistics.median(seconds[k]) * 1000 for k in models)
        same = [f"{(logits['stock'].argmax(-1) == logits[k].argmax(-1)).float().mean():.1%}" for k in models
                if k != "stock"]
        apart = [f"{(logits['stock'] - logits[k]).abs().max():.1e}" for k in models if k != "stock"]
        print(f"| {rows} | {stock:.1f} | {onednn:.1f} | {compiled:.1f} | {onednn / compiled:.2f}x | {', '.join(same)} "
              f"| {', '.join(apart)} |")


# SmolLM2's linear layers of one decoder layer (out, in): q, k, v, o, gate, up, down
SMOLLM2_LAYER = ((576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536))


def widths(args: argparse.Namespace) -> None:
    """One SmolLM2 decoder layer's linear products at each row count through torch's product, oneDNN's prepacked one
    and the compiled kernel, each called directly (past ``common.WIDE_ROWS`` the backend sends both prepacked
    kernels' rows to torch's product: this shows where that pays)."""
    from lmi_handlers.backends.hf.cpu import compiled_linear, onednn_linear
    from lmi_handlers.backends.hf.cpu.common import WIDE_ROWS

    compiled_linear.WIDE_ROWS = onednn_linear.WIDE_ROWS = 1 << 30  # the kernels themselves at every width
    kernel = compiled_linear.build_kernel(torch)
    layers = {kind: [torch.nn.Linear(n_in, n_out, bias=False) for n_out, n_in in SMOLLM2_LAYER]
              for kind in ("torch", "onednn", "compiled")}
    onednn_linear.prepack_linears(torch, torch.nn.Sequential(*layers["onednn"]))
    compiled_linear.compile_linears(torch, kernel, torch.nn.Sequential(*layers["compiled"]))
    print(f"\nSmolLM2 decoder layer's seven products, ms (median of {args.trials}); the backend's WIDE_ROWS is "
          f"{WIDE_ROWS}\n| rows | torch | oneDNN | compiled | fastest |\n|---|---|---|---|---|")
    with torch.inference_mode():
        for rows in args.rows:
            inputs = {n_in: torch.randn(rows, n_in) for _, n_in in SMOLLM2_LAYER}
            repeat = max(3, 2048 // rows)
            times = {kind: [] for kind in layers}
            for _ in range(args.trials):
                for kind, modules in layers.items():
                    began = time.perf_counter()
                    for _ in range(repeat):
                        for module in modules:
                            module(inputs[module.in_features])
                    times[kind].append((time.perf_counter() - began) / repeat * 1000)
            medians = {kind: statistics.median(spent) for kind, spent in times.items()}
            print(f"| {rows} | " + " | ".join(f"{value:.2f}" for value in medians.values())
                  + f" | {min(medians, key=medians.get)} |", flush=True)


# (option.cpu_linear_kernel, option.cpu_attention_kernel): each compiled kernel added in turn
KERNELS = (("onednn", "torch"), ("onednn", "compiled"), ("compiled", "compiled"))


def kernels(args: argparse.Namespace) -> None:
    """SmolLM2 engine decode steps under each choice of CPU kernels (``KERNELS``): the decode rows' attention on
    torch's operators (gather, two batched products) or the compiled kernel that reads the paged pool in place
    (``option.cpu_attention_kernel``), linear layers through oneDNN or the compiled kernel
    (``option.cpu_linear_kernel``), interleaved in one process."""
    from lmi_tools.models.smollm2 import convert_smollm2

    path = convert_smollm2(say=lambda line: None)
    handlers = {pair: load(path, max_rolling_batch_size=64, cpu_linear_kernel=pair[0], cpu_attention_kernel=pair[1])
                for pair in KERNELS}
    rng = torch.Generator().manual_seed(4)
    print(f"\nSmolLM2-135M-Instruct, ms per engine decode step (20 steps after the prompts, median of {args.trials} "
          "interleaved runs), by linear layers + decode attention kernel; speed-up against the first")
    print("| rows | context | " + " | ".join(f"{linear} + {attention}" for linear, attention in KERNELS) + " | "
          + " | ".join(f"{linear} + {attention}" for linear, attention in KERNELS[1:]) + " |\n"
          + "|---" * (2 * len(KERNELS) + 1) + "|")
    # 7 and 13 rows: what a server runs between full batches, a count no fixed row block fits
    for rows, context in ((1, 200), (7, 200), (13, 200), (16, 200), (64, 200), (64, 600)):
        prompts = [ids(rng, context, 49_000) for _ in range(rows)]
        seconds: dict[tuple[str, str], list[float]] = {pair: [] for pair in KERNELS}
        for _ in range(args.trials):
            for pair, handler in handlers.items():
                seqs = [sequence(handler, p, 21) for p in prompts]
                for seq in seqs:
                    handler.engine.add(seq)
                while not all(seq.generated for seq in seqs):  # the prompts
                    handler.engine.step()
                began, steps = time.perf_counter(), 0
                while not handler.engine.idle:
                    handler.engine.step()
                    steps += 1
                seconds[pair].append((time.perf_counter() - began) / steps)
        first, *rest = (statistics.median(seconds[pair]) * 1000 for pair in KERNELS)
        print(f"| {rows} | {context} | {first:.1f} | " + " | ".join(f"{ms:.1f}" for ms in rest) + " | "
              + " | ".join(f"{first / ms:.2f}x" for ms in rest) + " |")


def sampling(args: argparse.Namespace) -> None:
    """``select_tokens`` over SmolLM2-sized logits (49,152 tokens): greedy rows, rows sampled at temperature 1
    (what an OpenAI request without sampling fields asks for: drawn in vocabulary order) and rows with a top-p,
    which must sort their logits; the sorted rows are the baseline (every sampled row sorted before). Each with
    glibc's default malloc, then with freed memory kept for reuse as the hf backend sets it on the CPU
    (``backends/hf/cpu/memory.py``); so ``all`` runs this first, before any backend loads."""
    from lmi_handlers.backends.hf.cpu.memory import keep_freed_memory
    from lmi_handlers.backends.sampler import select_tokens

    kinds = {"greedy": {"do_sample": False}, "temperature": {"do_sample": True}, "top_p": {"do_sample": True,
                                                                                           "top_p": 0.95}}
    times: dict[tuple[str, int, str], float] = {}
    for memory in ("default", "kept"):
        if memory == "kept" and not keep_freed_memory():
            print("\n(this C library is not glibc: no second table)")
            break
        for rows in (1, 16, 64):
            logits = torch.randn(rows, 49_152, generator=torch.Generator().manual_seed(rows)) * 3
            for kind, params in kinds.items():
                request = GenerationRequest(Schema.LMI, "ids", SamplingParams(**params),
                                            StoppingParams(max_new_tokens=8))
                seqs = [SequenceState(request, [1], decode=str, seed=i) for i in range(rows)]
                calls = []
                for _ in range(11):
                    began = time.perf_counter()
                    select_tokens(torch, logits, seqs)
                    calls.append(time.perf_counter() - began)
                times[memory, rows, kind] = statistics.median(calls) * 1000
    print("\nselect_tokens over [rows, 49,152] float32 logits, ms (median of 11 calls), glibc's default malloc / "
          "freed memory kept")
    print("| rows | greedy | temperature 1 | top_p 0.95 (sorted) | temperature 1 vs sorted | temperature 1, "
          "default / kept |\n|---|---|---|---|---|---|")
    for rows in (1, 16, 64):
        cell = {kind: " / ".join(f"{times[m, rows, kind]:.2f}" for m in ("default", "kept") if (m, rows, kind) in times)
                for kind in kinds}
        kept = times.get(("kept", rows, "temperature"))
        print(f"| {rows} | {cell['greedy']} | {cell['temperature']} | {cell['top_p']} | "
              f"{times['default', rows, 'top_p'] / times['default', rows, 'temperature']:.1f}x faster | "
              + (f"{times['default', rows, 'temperature'] / kept:.2f}x |" if kept else "- |"))


def greedy_steps(model: object, cache: object, prompt: torch.Tensor, steps: int) -> tuple[float, torch.Tensor]:
    """Seconds per greedy decode step after prefilling ``prompt``, and the last-position logits of every step."""
    cache = {cache_keyword(model): cache}
    with torch.inference_mode():
        out = model(input_ids=prompt, **cache, use_cache=True, logits_to_keep=1)
        rows = [out.logits[:, -1]]
        began = time.perf_counter()
        for _ in range(steps):
            out = model(input_ids=rows[-1].argmax(-1, keepdim=True), **cache, use_cache=True)
            rows.append(out.logits[:, -1])
        return (time.perf_counter() - began) / steps, torch.stack(rows)


def peers(args: argparse.Namespace) -> None:
    print("""
# On a machine with an NVIDIA GPU (not run here: no GPU was lent). Same model, same sweep, one run; every server
# alone on the GPU in turn. MODEL: a model directory (SmolLM2: .venv/bin/lmi model smollm2 prints where it is).
python -m venv /tmp/vllm && /tmp/vllm/bin/pip install vllm
/tmp/vllm/bin/vllm serve MODEL --port 8001 --max-num-seqs 64 &
.venv/bin/lmi bench http://127.0.0.1:8001/v1/chat/completions --model MODEL --tokenizer MODEL --sweep 1,4,16,64 \\
    -n 256 --max-new-tokens 64 --no-ignore-eos -o out/gpu-vllm         # then stop vllm
.venv/bin/pip install 'transformers[serving]'
.venv/bin/transformers serve --port 8002 --continuous-batching &
.venv/bin/lmi bench http://127.0.0.1:8002/v1/chat/completions --model MODEL --tokenizer MODEL --sweep 1,4,16,64 \\
    -n 256 --max-new-tokens 64 --no-ignore-eos -o out/gpu-transformers  # then stop it
# MODEL_DIR/serving.properties: engine=Python, option.entryPoint=lmi_handlers.entrypoint, option.model_id=MODEL,
# option.rolling_batch=scheduler, option.device=cuda, option.max_rolling_batch_size=64, option.enable_prefix_caching=true
.venv/bin/lmi bench --serve MODEL_DIR --tokenizer MODEL --sweep 1,4,16,64 -n 256 --max-new-tokens 64 \\
    --no-ignore-eos -o out/gpu-lmi
.venv/bin/lmi bench --compare out/gpu-lmi/report.json out/gpu-vllm/report.json out/gpu-transformers/report.json
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    every = ("sampling", "capacity", "decode", "prefix", "chunked", "projection", "packed", "linear",
             "kernels", "widths")
    parser.add_argument("what", choices=(*every, "peers", "all"))
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--rows", type=lambda text: [int(r) for r in text.split(",")],
                        default=[1, 16, 32, 64, 96, 128, 192, 256, 384, 512], help="widths: the row counts")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(max(1, args.threads))  # so the handler leaves torch's threads as set here
    torch.set_num_threads(max(1, args.threads))
    for name in every if args.what == "all" else (args.what,):
        globals()[name](args)
    if args.what == "all":
        peers(args)


if __name__ == "__main__":
    main()
