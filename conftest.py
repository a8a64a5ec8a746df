"""Fixtures shared by tests/ and integration_tests/: tiny models built locally, model directories."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama with random weights and a tokenizer trained here, saved with save_pretrained."""
    pytest.importorskip("torch")
    from lmi_tools.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
