"""LMI's handler in AWS's vLLM container against vLLM's own OpenAI route, on one server, in one run.

    .venv/bin/python benchmarks/vllm_container.py                          # SmolLM2, C = 16 and 64
    .venv/bin/python benchmarks/vllm_container.py --model tiny --concurrency 2 --requests-per-client 1 --new-tokens 8

One server: ``lmi serve --container vllm``, vLLM's own OpenAI server with the ``model.py`` ``lmi render`` writes, as
AWS's vLLM container runs it (vLLM's CPU build here, run by the vLLM environment's Python, ``--vllm-venv``, made on
first use by ``scripts/setup.sh --vllm``). Two request shapes on it, each a closed loop from ``lmi bench``'s load
generator with the same prompts (every request its own ``UNIQUE_TOKENS``-token prompt, so no two share a cached
prefix) and exactly ``--new-tokens`` new tokens (``ignore_eos``), streamed:

* ``lmi``: LMI's ``{"inputs", "parameters", "stream": true}`` on ``/invocations`` (the handler's jsonlines);
* ``openai``: OpenAI's completions on the same server's ``/v1/completions`` (vLLM's own handler).

At each concurrency the two shapes take turns ``--repeats`` times (each turn after a warm-up of its own prompts);
the table keeps each shape's best turn and prints LMI over OpenAI: output tokens/s and TTFT p50. Figures, not
assertions; on a shared machine the absolute numbers move with the load, the ratios of one run less so. Results also
go to ``out/vllm_container.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.serve_sweep import (MAX_ROWS, OUT, VLLM_ENV, NotRun, Model, running, smollm2_unique,  # noqa: E402
                                    unique_prompts, vllm_python)
from lmi_tools.answers.messages import Api  # noqa: E402
from lmi_tools.bench.apis import RequestShape  # noqa: E402
from lmi_tools.bench.local_server import free_port  # noqa: E402
from lmi_tools.bench.prompts import TokenCounter  # noqa: E402
from lmi_tools.bench.runner import BenchPlan, LoadSettings, run_bench  # noqa: E402
from lmi_tools.bench.targets import BenchTarget  # noqa: E402

SHAPES = {"lmi": (Api.LMI, "/invocations"), "openai": (Api.OPENAI_COMPLETIONS, "/v1/completions")}


def tiny() -> Model:
    from lmi_tools.models.tiny import TinySpec, build_tiny_model

    path = OUT / "vllm-container-tiny"
    if not (path / "config.json").exists():
        build_tiny_model(path, TinySpec(hidden_size=128, intermediate_size=256))
    return Model("tiny", path.resolve(), Api.OPENAI_COMPLETIONS, True, 512, unique=True)


def container_command(model: Model, port: int, workdir: Path, venv: Path) -> tuple[list[str], dict[str, str], str]:
    """``lmi serve --container vllm`` on ``model`` with vLLM's server's settings of the sweep."""
    model_dir = workdir / f"vllm-container-{model.name}"
    model_dir.mkdir(parents=True, exist_ok=True)
    properties = {"option.model_id": model.path, "option.max_rolling_batch_size": MAX_ROWS,
                  "option.max_model_len": model.max_len, "option.dtype": "fp32", "option.disable_log_stats": "true"}
    (model_dir / "serving.properties").write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
    shutil.copy(ROOT / "model_templates" / "model.py.j2", model_dir / "model.py")
    argv = [str(vllm_python(venv)), "-m", "lmi_tools", "serve", "--container", "vllm", f"{model.name}={model_dir}",
            "--port", str(port)]
    return argv, {**VLLM_ENV, "PYTHONPATH": str(ROOT)}, "/ping"


def turn(base: str, shape: str, model: Model, counter: TokenCounter, level: int, per_client: int, new_tokens: int,
         tag: str) -> dict[str, Any]:
    """One closed-loop run of ``shape`` at ``level`` after a warm-up; its figures."""
    api, path = SHAPES[shape]
    target = BenchTarget(api, True, base + path)
    request = RequestShape(new_tokens, stream=True, ignore_eos=True, model=model.name)
    warm = LoadSettings((level,), requests=level, warmup=0, request_timeout=600.0)
    run_bench(BenchPlan(target, request, unique_prompts(counter, level, f"warm-up {tag}-"), warm, counter))
    load = LoadSettings((level,), requests=per_client * level, warmup=0, request_timeout=600.0)
    summary = run_bench(BenchPlan(target, request, unique_prompts(counter, per_client * level, f"{tag}-"), load,
                                  counter))[0].summary
    ttft = (summary["latency_s"]["time_to_first_token"] or {}).get("p50")
    return {"ok": summary["requests"]["ok"], "errors": summary["requests"]["errors"],
            "output_tokens_per_s": summary["output_tokens_per_s"] or 0.0, "ttft_p50": ttft}


def compare(base: str, model: Model, levels: list[int], per_client: int, new_tokens: int,
            repeats: int) -> list[dict[str, Any]]:
    counter = TokenCounter.load(model.path)
    rows = []
    for level in levels:
        best: dict[str, dict[str, Any]] = {}
        for repeat in range(repeats):
            for shape in SHAPES:  # the shapes take turns, so that the load of the machine falls on both
                result = turn(base, shape, model, counter, level, per_client, new_tokens, f"{shape}{level}.{repeat}")
                print(f"  C={level} {shape} #{repeat + 1}: {result['output_tokens_per_s']:.1f} tok/s, TTFT p50 "
                      f"{(result['ttft_p50'] or 0) * 1000:.0f} ms, {result['errors']} errors", flush=True)
                if shape not in best or result["output_tokens_per_s"] > best[shape]["output_tokens_per_s"]:
                    best[shape] = result
        rows.append({"concurrency": level, **{shape: best[shape] for shape in SHAPES}})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| C | LMI on /invocations tok/s | OpenAI on /v1/completions tok/s | tok/s LMI / OpenAI | TTFT p50 LMI "
             "(ms) | TTFT p50 OpenAI (ms) | TTFT LMI / OpenAI |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        lmi, oai = row["lmi"], row["openai"]
        speed = lmi["output_tokens_per_s"] / oai["output_tokens_per_s"] if oai["output_tokens_per_s"] else None
        ttft = lmi["ttft_p50"] / oai["ttft_p50"] if lmi["ttft_p50"] and oai["ttft_p50"] else None
        lines.append(f"| {row['concurrency']} | {lmi['output_tokens_per_s']:.1f} | {oai['output_tokens_per_s']:.1f} | "
                     f"{'-' if speed is None else f'{speed:.3f}x'} | {(lmi['ttft_p50'] or 0) * 1000:.0f} | "
                     f"{(oai['ttft_p50'] or 0) * 1000:.0f} | {'-' if ttft is None else f'{ttft:.3f}x'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--concurrency", default="16,64", help="comma-separated levels")
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="turns of each shape per level (best kept)")
    parser.add_argument("--vllm-venv", type=Path, default=ROOT / ".venv-vllm")
    args = parser.parse_args()
    model = smollm2_unique() if args.model == "smollm2" else tiny()
    levels = [int(level) for level in args.concurrency.split(",")]
    workdir = OUT / "vllm_container"
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    try:
        argv, env, ready = container_command(model, port, workdir, args.vllm_venv)
        with running(argv, env, ready, port, workdir / "server.log") as base:
            rows = compare(base, model, levels, args.requests_per_client, args.new_tokens, args.repeats)
    except NotRun as exc:
        sys.exit(f"the container server did not run: {exc}")
    print(f"\n{model.name}, {args.new_tokens} new tokens per request, best of {args.repeats} turns per shape:")
    print(table(rows))
    (OUT / "vllm_container.json").write_text(json.dumps({"model": model.name, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
