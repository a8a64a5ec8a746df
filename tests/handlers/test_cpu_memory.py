"""Memory for the hf backend on the CPU (``backends/hf/cpu/memory.py``): glibc's malloc keeps freed memory for reuse,
and ``huge_page_empty`` (the compiled linear kernel's packed weights) is backed by huge pages."""

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_kilobytes_at(address):
    """AnonHugePages of the mapping of this process that holds ``address`` (/proc/self/smaps)."""
    for mapping in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", Path("/proc/self/smaps").read_text()):
        start, end = (int(x, 16) for x in mapping.split(" ", 1)[0].split("-"))
        if start <= address < end:
            return int(re.search(r"AnonHugePages:\s+(\d+)", mapping).group(1))
    raise AssertionError(f"no mapping holds {address:#x}")


def test_on_the_cpu_the_backend_keeps_freed_memory_for_reuse(tiny_model_dir, tmp_path, monkeypatch):
    from lmi_handlers.backends.hf import backend as hf
    from lmi_handlers.backends.hf.cpu import memory as cpu_memory

    from .test_hf_backend import loaded

    calls = []
    monkeypatch.setattr(hf, "keep_freed_memory", lambda: calls.append(1) or cpu_memory.keep_freed_memory())
    loaded(tiny_model_dir, tmp_path)
    assert calls == [1]
    assert cpu_memory.keep_freed_memory()  # this Linux runs glibc, which takes both settings


def test_a_huge_page_buffer_is_aligned_writable_and_kept_alive_by_its_tensor():
    from lmi_handlers.backends.hf.cpu.memory import HUGE_PAGE, huge_page_empty

    pool = huge_page_empty(torch, (3, 1000, 64), torch.bfloat16)
    assert pool.shape == (3, 1000, 64) and pool.dtype == torch.bfloat16 and pool.data_ptr() % HUGE_PAGE == 0
    pool.fill_(2.5)
    view = pool[1]
    del pool  # the view still holds the mapping
    assert torch.all(view == 2.5)
    assert huge_page_empty(torch, (0, 4), torch.float32).shape == (0, 4)


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(), reason="this kernel offers no huge pages")
def test_a_huge_page_buffer_is_backed_by_huge_pages_once_written():
    from lmi_handlers.backends.hf.cpu.memory import huge_page_empty

    weights = huge_page_empty(torch, (4 << 20,), torch.float32)  # 16 MB
    weights.fill_(1.0)
    assert huge_kilobytes_at(weights.data_ptr()) >= 8 << 10  # most of it; Linux may fall back where memory is short
    if "[madvise]" in THP.read_text():  # the common default: memory not advised stays on 4 KB pages
        assert huge_kilobytes_at(torch.ones(4 << 20).data_ptr()) == 0

