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
    ({"cpu_linear_kernel": "onednn", "dtype": "bf16"}, ("cpu_linear_kernel", "onednn", "float32")),
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
