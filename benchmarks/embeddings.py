"""Embeddings per second: ``lmi serve`` (hf backend, dynamic batching) against vLLM's CPU build on the same model, in
one run.

    .venv/bin/python benchmarks/embeddings.py                          # C = 16, 400 requests each, both peers
    .venv/bin/python benchmarks/embeddings.py --concurrency 2 --requests 8 --peers lmi   # the smallest check

The model is all-MiniLM-L6-v2 (``lmi model minilm``). Every server gets the same OpenAI ``/v1/embeddings`` requests
from ``lmi bench``'s load generator (closed loop, one text of about ``--prompt-tokens`` tokens per request, one
warm-up request per client): requests per second are embeddings per second.

* ``lmi``: ``lmi serve`` with ``option.task=text-embedding`` on the hf backend, dynamic batches of up to
  ``--concurrency`` requests (``max_batch_delay`` 5 ms);
* ``vllm``: vLLM's own OpenAI server with its pooling runner (``--runner pooling``), in the vLLM environment that
  ``benchmarks/serve_sweep.py`` makes (``--vllm-venv``);

each at its server's default dtype (both bf16 on a CPU with native bf16: ``lmi_handlers/default_dtype.py``), and
``lmi-fp32``, ``vllm-fp32`` the same at float32, so one run compares them at their defaults and at equal dtype.

Each server runs its own thread policy. A peer that cannot start says why, and its row says "not run". Figures,
not assertions; the ratio of one run is the figure to read. Results also go to ``out/embeddings.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.serve_sweep import VLLM_ENV, NotRun, running, vllm_python  # noqa: E402
from lmi_tools.answers.messages import Api  # noqa: E402
from lmi_tools.bench.apis import RequestShape  # noqa: E402
from lmi_tools.bench.local_server import free_port  # noqa: E402
from lmi_tools.bench.prompts import TokenCounter, build_prompts  # noqa: E402
from lmi_tools.bench.runner import BenchPlan, LoadSettings, run_bench  # noqa: E402
from lmi_tools.bench.targets import BenchTarget  # noqa: E402
from lmi_tools.models.minilm import write_minilm  # noqa: E402

OUT = Path("out")


def lmi_command(model: Path, port: int, workdir: Path, batch: int,
                fp32: bool) -> tuple[list[str], dict[str, str], str]:
    model_dir = workdir / f"lmi-minilm{'-fp32' if fp32 else ''}"
    model_dir.mkdir(parents=True, exist_ok=True)
    properties = {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint", "option.model_id": model,
                  "option.task": "text-embedding", "option.backend": "hf", "batch_size": batch,
                  "max_batch_delay": 5, **({"option.dtype": "fp32"} if fp32 else {})}
    (model_dir / "serving.properties").write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
    return ([sys.executable, "-m", "lmi_tools", "serve", str(model_dir), "--port", str(port), "--management-port",
             str(free_port()), "--log-level", "warning"], {}, "/ping")


def vllm_command(model: Path, port: int, venv: Path, batch: int,
                 fp32: bool) -> tuple[list[str], dict[str, str], str]:
    python = vllm_python(venv)
    return ([str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--runner", "pooling",
             "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", str(max(batch, 16)),
             "--disable-log-stats", *(["--dtype", "float32"] if fp32 else [])], dict(VLLM_ENV), "/health")


def measure(base: str, model: Path, prompts: Any, counter: TokenCounter, concurrency: int,
            requests: int) -> dict[str, Any]:
    target = BenchTarget(Api.OPENAI_EMBEDDINGS, False, base + "/v1/embeddings")
    shape = RequestShape(1, stream=False, ignore_eos=False, model=str(model))
    load = LoadSettings((concurrency,), requests=requests, request_timeout=300.0)
    summary = run_bench(BenchPlan(target, shape, prompts, load, counter))[0].summary
    rate = (summary["requests_per_minute"] or 0) / 60
    latency = summary["latency_s"]["end_to_end"] or {}
    return {"ok": summary["requests"]["ok"], "errors": summary["requests"]["errors"],
            "error_kinds": summary["errors"], "embeddings_per_s": rate, "latency_p50": latency.get("p50"),
            "latency_p99": latency.get("p99"), "input_tokens_per_request": summary["tokens"]["input_per_request"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=400, help="measured requests per peer")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--peers", default="lmi,vllm,lmi-fp32,vllm-fp32")
    parser.add_argument("--vllm-venv", type=Path, default=Path(".venv-vllm"))
    args = parser.parse_args()
    model = write_minilm(say=lambda line: None)
    counter = TokenCounter.load(str(model))
    prompts = build_prompts(args.prompt_tokens, counter, None)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for peer in args.peers.split(","):
            port = free_port()
            try:
                server, fp32 = peer.removesuffix("-fp32"), peer.endswith("-fp32")
                argv, env, ready = (lmi_command(model, port, Path(tmp), args.concurrency, fp32) if server == "lmi"
                                    else vllm_command(model, port, args.vllm_venv, args.concurrency, fp32))
                with running(argv, env, ready, port, Path(tmp) / f"{peer}.log") as base:
                    results[peer] = measure(base, model, prompts, counter, args.concurrency, args.requests)
            except NotRun as exc:
                results[peer] = {"not_run": str(exc)}
            print(f"  {peer}: {results[peer]}", flush=True)
    print(f"\nall-MiniLM-L6-v2, {args.prompt_tokens}-token texts, concurrency {args.concurrency}\n")
    print("| server | embeddings/s | p50 latency (ms) | p99 latency (ms) | errors |\n|---|---:|---:|---:|---:|")
    for peer, row in results.items():
        if "not_run" in row:
            print(f"| {peer} | not run | | | |")
        else:
            print(f"| {peer} | {row['embeddings_per_s']:.1f} | {(row['latency_p50'] or 0) * 1000:.0f} | "
                  f"{(row['latency_p99'] or 0) * 1000:.0f} | {row['errors']} |")
    rates = {peer: row.get("embeddings_per_s") for peer, row in results.items()}
    for suffix, what in (("", "each at its default dtype"), ("-fp32", "both float32")):
        if rates.get("lmi" + suffix) and rates.get("vllm" + suffix):
            print(f"lmi{suffix} / vllm{suffix} ({what}): {rates['lmi' + suffix] / rates['vllm' + suffix]:.2f}x")
    OUT.mkdir(exist_ok=True)
    (OUT / "embeddings.json").write_text(json.dumps({"settings": vars(args) | {"vllm_venv": str(args.vllm_venv)},
                                                     "results": results}, indent=2))


if __name__ == "__main__":
    main()
