"""The wheel ships the templates, presets and reference configs, and they are found when installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from lmi_tools.modeldir.spec import tomllib

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "lmi_handlers", "lmi_tools", "model_templates", "serving_properties",
           "deploy")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Build from a copy so that build/ and *.egg-info never land in the worktree.
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif path.is_file():
            shutil.copy(path, src / name)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(src)], check=True, capture_output=True, timeout=300)
    [built] = out.glob("*.whl")
    return built


def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_templates_presets_and_configs_are_in_the_wheel(wheel):
    names = wheel_names(wheel)
    for template in (ROOT / "model_templates").glob("*.j2"):
        assert f"lmi_tools/model_templates/{template.name}" in names
    presets = sorted((ROOT / "serving_properties").glob("*/spec.toml"))
    assert len(presets) == 12
    for spec in presets:
        assert f"lmi_tools/serving_properties/{spec.parent.name}/spec.toml" in names
    for config in (ROOT / "serving_properties" / "model_configs").glob("*.json"):
        assert f"lmi_tools/serving_properties/model_configs/{config.name}" in names
    assert "lmi_tools/deploy/chat-host.yaml" in names  # lmi chat-stack's template
    for page in ("index.html", "chat.js", "chat.css"):  # the chat page
        assert f"lmi_tools/serving/page/{page}" in names


def test_every_module_is_in_the_wheel(wheel):
    names = wheel_names(wheel)
    for package in ("lmi_handlers", "lmi_tools"):
        for pattern in ("*.py", "*.cpp"):  # the C++ kernels are built at load (hf/cpu/kernels.py)
            for module in (ROOT / package).rglob(pattern):
                if "__pycache__" not in module.parts:
                    assert module.relative_to(ROOT).as_posix() in names


def test_pyproject_lists_every_package():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    for package in ("lmi_handlers", "lmi_tools"):
        for init in (ROOT / package).rglob("__init__.py"):
            assert ".".join(init.parent.relative_to(ROOT).parts) in listed


def test_installed_wheel_finds_its_data(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    script = ("from lmi_tools.modeldir.resources import preset_names, resource_dir\n"
              "print(resource_dir('model_templates'))\nprint(len(preset_names()))\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                            check=True, timeout=60)
    templates, count = result.stdout.split()
    assert Path(templates) == site / "lmi_tools" / "model_templates"
    assert count == "12"
    new = subprocess.run([sys.executable, "-m", "lmi_tools", "new", "-p", "opt-13b-inf2-48xlarge", "opt"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert new.returncode == 0, new.stderr
    assert (tmp_path / "opt" / "serving.properties").is_file()
