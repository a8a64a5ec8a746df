"""Fixtures shared by tests/ and integration_tests/: tiny models built locally, model directories."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama with random weights and a tokenizer trained here, saved with save_pretrained."""
    pytest.importorskip("torch")
    from lmi_tools.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture
def make_model_dir(tmp_path: Path):
    """Write a model directory holding ``serving.properties`` with the given keys; returns its path."""

    def make(properties: dict[str, object], name: str = "model") -> Path:
        directory = tmp_path / name
        directory.mkdir(parents=True, exist_ok=True)
        lines = [f"{key}={value}" for key, value in properties.items()]
        (directory / "serving.properties").write_text("\n".join(lines) + "\n")
        return directory

    return make
