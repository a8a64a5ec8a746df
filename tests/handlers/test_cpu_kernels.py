"""The CPU kernel options (``option.cpu_linear_kernel``, ``option.cpu_attention_kernel``): the init call refuses
what cannot run, naming the option and the value, before the weights load; and each vector build of the compiled
kernels, not only the one this machine dispatches to, equals float64."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def refusal(tiny_model_dir, tmp_path, monkeypatch, options):
    from lmi_handlers.handler import Handler
    from lmi_tools.serving.worker.frontend import init_input

    # refused before the weights load: a big model's load would be minutes spent for nothing
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("loaded"))
    out = Handler().handle(init_input({"model_id": str(tiny_model_dir), "model_dir": str(tmp_path), **options}))
    assert out is not None and out.code >= 400
    return bytes(out.content.value_at(0)).decode()


@pytest.mark.parametrize("options, words", [
    ({"cpu_linear_kernel": "mkl"}, ("cpu_linear_kernel", "mkl", "stock, onednn, compiled")),
    ({"cpu_linear_kernel": "onednn", "dtype": "fp16"}, ("cpu_linear_kernel", "onednn", "float32 or bfloat16")),
    ({"cpu_linear_kernel": "compiled", "dtype": "fp16"}, ("cpu_linear_kernel", "compiled", "float32")),
    ({"cpu_attention_kernel": "flash"}, ("cpu_attention_kernel", "flash", "torch, compiled")),
    ({"cpu_attention_kernel": "compiled", "dtype": "fp16"}, ("cpu_attention_kernel", "compiled", "float32"))])
def test_the_init_call_refuses_what_cannot_run_with_the_option_and_the_value(tiny_model_dir, tmp_path, options, words,
                                                                            monkeypatch):
    body = refusal(tiny_model_dir, tmp_path, monkeypatch, options)
    assert all(word in body for word in words), body


@pytest.mark.parametrize("key", ["cpu_linear_kernel", "cpu_attention_kernel"])
def test_a_kernel_that_cannot_be_built_is_refused_saying_why(tiny_model_dir, tmp_path, monkeypatch, key):
    import torch.utils.cpp_extension

    def no_ninja(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_ninja)
    body = refusal(tiny_model_dir, tmp_path, monkeypatch, {key: "compiled"})
    assert all(word in body for word in (key, "compiled", "Ninja is required", "compiler")), body


# The float64 tests of both kernels, and the linear kernel's register width against torch's capability.
FLOAT64_TESTS = ["tests/handlers/test_compiled_linear.py", "tests/handlers/test_decode_attention.py"]


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler: the kernels cannot be built")
@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_the_avx2_and_plain_builds_pass_the_float64_tests_too(capability):
    # A CPU with AVX-512 builds only that variant in the other tests; AMD's EPYCs before Zen 4 have no AVX-512.
    # torch dispatches to a lower capability where ATEN_CPU_CAPABILITY says so, and the build follows torch, so the
    # same tests run again in a process told so (each variant built once into its own folder, about 20 s a kernel).
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "float64 or vectors",
                          *FLOAT64_TESTS], cwd=root, env={**os.environ, "ATEN_CPU_CAPABILITY": capability},
                         capture_output=True, text=True, timeout=480, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    passed = re.search(r"(\d+) passed", run.stdout)
    assert passed and int(passed.group(1)) >= 11 and "skipped" not in run.stdout, run.stdout[-2000:]


def load(tiny_model_dir, tmp_path, **options):
    from lmi_handlers.handler import Handler
    from lmi_tools.serving.worker.frontend import init_input

    handler = Handler()
    props = {"model_id": str(tiny_model_dir), "model_dir": str(tmp_path), "dtype": "fp32", **options}
    assert handler.handle(init_input(props)) is None
    return handler


@pytest.fixture
def fresh_choice(monkeypatch):
    """Forget the choices this process logged, so this test sees its own line."""
    from lmi_handlers.backends.hf.cpu import kernels

    monkeypatch.setattr(kernels, "_logged", set())


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler: auto takes oneDNN, tested below")
def test_auto_is_the_default_and_takes_both_compiled_kernels_where_they_build(tiny_model_dir, tmp_path, fresh_choice,
                                                                              caplog):
    caplog.set_level("INFO", logger="lmi_handlers")
    handler = load(tiny_model_dir, tmp_path, rolling_batch="scheduler")
    backend = handler.backend
    assert backend.decode_kernel is not None
    layer = next(m for m in backend.model.modules() if type(m).__name__ == "Linear")
    assert "compiled_forward" in layer.forward.__qualname__
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("CPU kernels:")]
    assert "linear layers compiled, decode attention compiled" in line and "built and checked" in line
    load(tiny_model_dir, tmp_path / "again", rolling_batch="scheduler")  # a second load in the process: not again
    assert sum(r.getMessage().startswith("CPU kernels:") for r in caplog.records) == 1


def test_under_auto_a_failed_build_falls_back_saying_why_and_the_model_loads(tiny_model_dir, tmp_path, monkeypatch,
                                                                            fresh_choice, caplog):
    import torch
    import torch.utils.cpp_extension

    def no_ninja(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_ninja)
    caplog.set_level("INFO", logger="lmi_handlers")
    handler = load(tiny_model_dir, tmp_path, rolling_batch="scheduler")
    assert handler.backend.decode_kernel is None
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("CPU kernels:")]
    want = "onednn" if torch.backends.mkldnn.is_available() else "stock"
    assert f"linear layers {want}, decode attention torch" in line and line.count("Ninja is required") == 2, line
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("cpu_linear_kernel=auto" in w and "Ninja is required" in w for w in warnings), warnings


def test_under_auto_a_kernel_failing_its_load_check_is_not_used(tiny_model_dir, tmp_path, monkeypatch, fresh_choice,
                                                               caplog):
    from lmi_handlers.backends.hf.cpu import decode_attention

    monkeypatch.setattr(decode_attention, "load_check", lambda torch, kernel, dtype: "a row of 5 positions: error 1e-2")
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler: nothing builds to check")
    caplog.set_level("INFO", logger="lmi_handlers")
    handler = load(tiny_model_dir, tmp_path, rolling_batch="scheduler")
    assert handler.backend.decode_kernel is None
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("CPU kernels:")]
    assert "decode attention torch" in line and "load check failed (a row of 5 positions" in line


def test_auto_is_the_stock_path_off_float32_and_bfloat16_without_building_anything(monkeypatch, fresh_choice):
    import torch
    import torch.utils.cpp_extension

    from lmi_handlers.backends.hf.cpu.kernels import CpuKernels, check_target, choose

    monkeypatch.setattr(torch.utils.cpp_extension, "load", lambda *a, **k: pytest.fail("built"))
    check_target(CpuKernels(), "cuda", "fp16")  # auto is never refused
    for dtype in (None, "fp16"):  # (None: not on the CPU)
        chosen = choose(torch, CpuKernels(), cpu_dtype=dtype, quantized=False)
        assert (chosen.linear, chosen.attention) == ("stock", "torch")
        assert "not float32 or bfloat16 on the CPU" in chosen.reasons[0]
    assert choose(torch, CpuKernels(attention="torch"), cpu_dtype="fp32", quantized=True).linear == "stock"


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler: the compiled kernel is no candidate")
def test_auto_in_bfloat16_measures_the_linear_kernels_that_run_here_and_takes_the_fastest(monkeypatch, fresh_choice):
    import torch

    from lmi_handlers.backends.hf.cpu import kernels
    from lmi_handlers.backends.hf.cpu.compiled_linear import build_kernel

    candidates = {"stock", *(["compiled"] if build_kernel(torch).bfloat16 else []),
                  *(["onednn"] if torch.ops.mkldnn._is_mkldnn_bf16_supported() else [])}
    chosen = kernels.choose(torch, kernels.CpuKernels(), cpu_dtype="bf16", quantized=False)  # measured here
    [reason] = [r for r in chosen.reasons if r.startswith("linear ")]
    assert reason.startswith(f"linear {chosen.linear}: the fastest bfloat16 product here, ms at 1/16/64 rows: ")
    assert {part.split()[0] for part in reason.split(": ")[-1].split("; ")} == candidates
    for winner in candidates:
        monkeypatch.setattr(kernels, "fastest_linear", lambda torch, kernel, names: {
            name: [1.0 if name == winner else 2.0] * 3 for name in ("stock", *names)})
        chosen = kernels.choose(torch, kernels.CpuKernels(attention="torch"), cpu_dtype="bf16", quantized=False)
        assert chosen.linear == winner and (chosen.linear_kernel is not None) == (winner == "compiled")


def test_the_options_default_to_auto_and_take_it_by_name():
    from lmi_handlers.backends.hf.cpu.kernels import CpuKernels, parse_kernels

    assert parse_kernels({}) == CpuKernels("auto", "auto")
    assert parse_kernels({"cpu_linear_kernel": "AUTO", "cpu_attention_kernel": "torch"}) == CpuKernels("auto", "torch")


def test_builds_are_kept_per_environment_and_torch_version(monkeypatch):
    import torch

    from lmi_handlers.backends.hf.cpu.common import environment_key

    here = environment_key(torch)
    monkeypatch.setattr(sys, "prefix", "/elsewhere/.venv-compat")
    assert environment_key(torch) != here
    monkeypatch.setattr(torch, "__version__", "2.0.0")
    assert len({here, environment_key(torch)}) == 2


class StubTorch:
    """torch's per-thread count, for one thread."""

    def __init__(self, count: int):
        self.count = count

    def get_num_threads(self) -> int:
        return self.count

    def set_num_threads(self, count: int) -> None:
        self.count = count


@pytest.mark.parametrize("env, cpus, async_mode, step, loader", [
    ({"OMP_NUM_THREADS": "3"}, 8, False, 3, 3), ({"OMP_NUM_THREADS": "3"}, 8, True, 3, 1),
    ({}, 2, False, 2, 2), ({}, 8, False, 8, 8), ({}, 1, False, 1, 1), ({}, 2, True, 2, 1), ({}, 8, True, 8, 1)])
def test_a_step_runs_on_every_cpu_unless_omp_num_threads_says_and_async_modes_loading_thread_keeps_one(
        monkeypatch, env, cpus, async_mode, step, loader):
    from lmi_handlers.backends.hf.cpu import kernels

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(kernels.os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    torch = StubTorch(int(env.get("OMP_NUM_THREADS", 1)))  # torch's count follows OMP_NUM_THREADS
    assert kernels.step_threads(torch, async_mode) == step
    assert torch.get_num_threads() == loader


def test_a_threads_count_holds_after_another_thread_sets_its_own():
    # torch gives a thread, on its first read or parallel work, the count any thread set last.
    import threading

    import torch

    from lmi_handlers.backends.hf.cpu.kernels import set_threads

    seen = []

    def mine() -> None:
        set_threads(torch, 1)
        other = threading.Thread(target=torch.set_num_threads, args=(2,))
        other.start()
        other.join()
        torch.ones(1 << 22).exp().sum()  # parallel work
        seen.append(torch.get_num_threads())

    before = torch.get_num_threads()
    try:
        thread = threading.Thread(target=mine)
        thread.start()
        thread.join()
    finally:
        torch.set_num_threads(before)
    assert seen == [1]


@pytest.mark.parametrize("async_mode", [False, True])
def test_every_step_runs_on_every_cpu_from_a_thread_of_its_own(tiny_model_dir, tmp_path, monkeypatch, async_mode):
    # torch keeps a thread count per thread: a step loop on another thread than the load's (async mode's engine
    # thread) still gets the step's count, and in async mode the loading thread (the event loop's) keeps one, so that
    # it holds no pool of torch workers beside the engine thread's (cpu/kernels.py).
    import threading

    import torch

    from lmi_handlers.backends.hf.cpu import kernels
    from lmi_handlers.backends.hf.cpu.common import WIDE_ROWS
    from lmi_handlers.request import GenerationRequest, SamplingParams, Schema, StoppingParams
    from lmi_handlers.sequence import SequenceState

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(kernels.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    before = torch.get_num_threads()
    try:
        handler = load(tiny_model_dir, tmp_path, rolling_batch="scheduler", max_model_len=512,
                       async_mode=str(async_mode).lower())
        assert torch.get_num_threads() == (1 if async_mode else 2)
        backend, seen = handler.backend, []
        step = backend.runner.step
        monkeypatch.setattr(backend.runner, "step", lambda batch: seen.append(torch.get_num_threads()) or step(batch))

        def run() -> None:
            torch.set_num_threads(1)  # what this thread had before the engine's first step
            for length in (8, WIDE_ROWS):
                request = GenerationRequest(Schema.LMI, "ids", SamplingParams(),
                                            StoppingParams(max_new_tokens=2, ignore_eos=True))
                list(handler.engine.run([SequenceState(request, [5] * length, decode=backend.tokenizer.decode)]))

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        assert seen == [2, 2, 2, 2], seen  # a prompt of 8, its decode; a wide prompt, its decode
    finally:
        torch.set_num_threads(before)


def test_a_wide_step_gives_the_same_logits_on_one_thread_as_on_two(tiny_model_dir):
    # The thread count may change no answer: torch's products and attention split rows across threads.
    import torch

    from lmi_handlers.backends.hf.cpu.common import WIDE_ROWS

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = torch.randint(3, model.config.vocab_size, (2, WIDE_ROWS), generator=torch.Generator().manual_seed(0))
    before = torch.get_num_threads()
    try:
        with torch.inference_mode():
            logits = []
            for threads in (1, 2):
                torch.set_num_threads(threads)
                logits.append(model(input_ids=ids).logits)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(*logits)


@pytest.mark.parametrize("kind", ["onednn", "compiled"])
def test_wide_rows_go_through_torchs_product_on_the_stock_weights(kind):
    import torch

    from lmi_handlers.backends.hf.cpu.common import WIDE_ROWS

    if kind == "compiled":
        if shutil.which("c++") is None:
            pytest.skip("no C++ compiler")
        from lmi_handlers.backends.hf.cpu.compiled_linear import build_kernel, compile_linears

        route = lambda model: compile_linears(torch, build_kernel(torch), model)  # noqa: E731
    else:
        if not torch.backends.mkldnn.is_available():
            pytest.skip("no oneDNN in this torch")
        from lmi_handlers.backends.hf.cpu.onednn_linear import prepack_linears

        route = lambda model: prepack_linears(torch, model)  # noqa: E731
    layer = torch.nn.Linear(40, 24)
    model = torch.nn.Sequential(layer)
    route(model)
    with torch.inference_mode():
        wide = torch.randn(2, WIDE_ROWS // 2, 40)  # a prefill's rows, whatever the leading shape
        assert torch.equal(model(wide), torch.nn.functional.linear(wide, layer.weight, layer.bias))
        narrow = wide[:1, :WIDE_ROWS - 1]  # decode's few rows: the prepacked kernel, the same product to rounding
        assert torch.allclose(model(narrow), torch.nn.functional.linear(narrow, layer.weight, layer.bias), atol=1e-5)


def test_a_lock_left_by_a_killed_build_does_not_stall_the_next_load(tmp_path):
    """torch's ``lock`` file stays behind when a build is killed; the next load removes it instead of waiting."""
    import torch
    from torch.utils.cpp_extension import _get_build_directory

    from lmi_handlers.backends.hf.cpu import decode_attention
    from lmi_handlers.backends.hf.cpu.common import build_target, environment_key

    decode_attention.build_kernel(torch)  # built (or found built) first, so the second load only checks and imports
    target, _ = build_target(torch)
    folder = Path(_get_build_directory(f"lmi_decode_attention_{target}_{environment_key(torch)}", False))
    (folder / "lock").touch()
    script = "import torch; from lmi_handlers.backends.hf.cpu import decode_attention; " \
             "print(decode_attention.build_kernel(torch).__name__)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert "decode_attention" in done.stdout and "left by a kernel build that did not finish" in done.stderr
    assert not (folder / "lock").exists()
