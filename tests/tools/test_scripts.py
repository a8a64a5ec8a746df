"""scripts/*.sh as a newcomer meets them: where torch comes from, and where files land outside the clone."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def fake_python(tmp_path: Path) -> tuple[Path, Path]:
    """An executable that records its arguments, one call a line, in place of a venv's python."""
    calls = tmp_path / "calls"
    python = tmp_path / "venv/bin/python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    python.chmod(0o755)
    return python, calls


def run_setup(tmp_path: Path, **env: str) -> list[str]:
    python, calls = fake_python(tmp_path)
    base = {k: v for k, v in os.environ.items() if k not in ("TORCH_INDEX_URL", "TORCH_VERSION")}
    subprocess.run(["bash", str(ROOT / "scripts/setup.sh")], env={**base, "VENV": str(python.parents[1]), **env},
                   check=True, capture_output=True, text=True, timeout=60)
    return calls.read_text().splitlines()


def test_setup_installs_torch_first_from_torch_index_url(tmp_path):
    calls = run_setup(tmp_path, TORCH_INDEX_URL="https://download.pytorch.org/whl/cpu", TORCH_VERSION="2.13.0")
    torch_calls = [call for call in calls if "torch==" in call]
    assert torch_calls == ["-m pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0"]
    assert calls.index(torch_calls[0]) < next(i for i, call in enumerate(calls) if "-e .[" in call)


def test_setup_without_torch_index_url_uses_the_default_index(tmp_path):
    calls = run_setup(tmp_path)
    assert "-m pip install torch==2.13.0" in calls
    assert not any("--index-url" in call for call in calls)


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
    assert "apt-get remove --autoremove chromium" in README and "INSTALL_CHROMIUM=0" in README
    assert "TORCH_INDEX_URL" in README
