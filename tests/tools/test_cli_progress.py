"""Long commands say what they are doing before they do it (the installed ``lmi``, as a user runs it)."""

from __future__ import annotations

import subprocess

from .test_cli_usage import LMI, run_lmi


def test_tiny_model_says_what_it_builds_first(tmp_path):
    process = subprocess.Popen([str(LMI), "tiny-model", str(tmp_path / "tiny")], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        first = process.stderr.readline()  # arrives while the model is still being built
        assert "building the tiny model" in first and process.poll() is None
    finally:
        process.kill()
        process.communicate()


def test_package_says_how_much_it_packs(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "serving.properties").write_text("engine=Python\noption.entryPoint=lmi_handlers.entrypoint\n")
    (model / "weights.bin").write_bytes(b"\0" * (2 << 20))
    result = run_lmi("package", str(model), "-o", str(tmp_path / "model.tar.gz"), "--no-validate")
    assert result.returncode == 0, result.stderr
    assert f"writing {tmp_path / 'model.tar.gz'}: 2." in result.stderr and "MB to pack" in result.stderr
