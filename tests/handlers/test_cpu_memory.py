"""glibc's malloc keeps freed memory for reuse when the hf backend loads on the CPU (``backends/cpu_memory.py``)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_on_the_cpu_the_backend_keeps_freed_memory_for_reuse(tiny_model_dir, tmp_path, monkeypatch):
    from lmi_handlers.backends import cpu_memory, hf

    from .test_hf_backend import loaded

    calls = []
    monkeypatch.setattr(hf, "keep_freed_memory", lambda: calls.append(1) or cpu_memory.keep_freed_memory())
    loaded(tiny_model_dir, tmp_path)
    assert calls == [1]
    assert cpu_memory.keep_freed_memory()  # this Linux runs glibc, which takes both settings
