"""The new/render/presets/validate/package/inspect commands, in process and as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmi_tools.cli import main

ROOT = Path(__file__).resolve().parents[2]


def run_lmi(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "lmi_tools", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_every_command_is_registered_once():
    from lmi_tools.cli import app

    names = [command.name for command in app.registered_commands]
    assert len(names) == len(set(names)) == 18
    assert [group.name for group in app.registered_groups] == ["optimize"]


def test_presets_lists_every_preset(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "opt-13b-inf2-48xlarge" in out and "llama-2-13b-chat-g5-12xlarge" in out


def test_new_then_validate_json(tmp_path, capsys):
    assert main(["new", "--preset", "opt-13b-inf2-48xlarge", str(tmp_path / "opt")]) == 0
    assert "next: lmi validate" in capsys.readouterr().out
    assert main(["validate", str(tmp_path / "opt"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["instance"] == "inf2.48xlarge"


def test_new_refuses_to_overwrite(tmp_path, capsys):
    assert main(["new", "-p", "gpt-j-6b-inf2-8xlarge", str(tmp_path)]) == 0
    assert main(["new", "-p", "gpt-j-6b-inf2-8xlarge", str(tmp_path)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["new", "-p", "gpt-j-6b-inf2-8xlarge", str(tmp_path), "--force"]) == 0


def test_render_a_spec_and_report_spec_errors(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text('model_id = "facebook/opt-13b"\ninstance_type = "inf2.48xlarge"\ntensor_parallel_degree = 8\n'
                    "n_positions = 512\n")
    assert main(["render", str(spec), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.py").is_file()
    spec.write_text('instance_type = "inf2.48xlarge"\ntensor_paralel_degree = 8\n')
    assert main(["render", str(spec), str(tmp_path / "out2")]) == 2
    assert "tensor_paralel_degree: is not a spec field" in capsys.readouterr().err


def test_validate_table_and_exit_code(tmp_path, capsys):
    main(["new", "-p", "opt-13b-inf2-48xlarge", str(tmp_path / "opt")])
    capsys.readouterr()
    assert main(["validate", str(tmp_path / "opt"), "--instance", "inf2.24xlarge"]) == 0
    out = capsys.readouterr().out
    assert "inf2.24xlarge" in out and "0 error(s)" in out
    assert main(["validate", str(tmp_path / "opt"), "--instance", "inf2.xlarge"]) == 3
    captured = capsys.readouterr()
    assert "needs 8 NeuronCores" in captured.err and "hint:" in captured.err


def test_package_then_inspect(tmp_path, capsys):
    main(["new", "-p", "opt-13b-inf2-48xlarge", str(tmp_path / "opt")])
    out = tmp_path / "model.tar.gz"
    assert main(["package", str(tmp_path / "opt"), "-o", str(out), "--uncompressed", str(tmp_path / "s3")]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out} (sha256 " in printed and (tmp_path / "s3" / "lmi_handlers" / "entrypoint.py").is_file()
    assert main(["inspect", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["entry_point"].endswith("(inside the model)")
    assert main(["inspect", str(out)]) == 0
    assert "sha256" in capsys.readouterr().out


def test_package_refuses_an_invalid_model_unless_told(tmp_path, capsys):
    main(["new", "-p", "opt-13b-inf2-48xlarge", str(tmp_path / "opt")])
    props = tmp_path / "opt" / "serving.properties"
    props.write_text(props.read_text().replace("tensor_parallel_degree=8", "tensor_parallel_degree=3"))
    assert main(["package", str(tmp_path / "opt"), "-o", str(tmp_path / "a.tar.gz")]) == 3
    assert "--no-validate" in capsys.readouterr().err
    assert main(["package", str(tmp_path / "opt"), "-o", str(tmp_path / "a.tar.gz"), "--no-validate"]) == 0


def test_validate_subprocess_exit_codes(tmp_path):
    """Done-when: the OPT-13B preset passes with TP 8 on inf2.48xlarge and fails with TP 3, saying why."""
    assert run_lmi("new", "--preset", "opt-13b-inf2-48xlarge", "opt", cwd=tmp_path).returncode == 0
    ok = run_lmi("validate", "opt", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "0 error(s)" in ok.stdout
    props = tmp_path / "opt" / "serving.properties"
    props.write_text(props.read_text().replace("tensor_parallel_degree=8", "tensor_parallel_degree=3"))
    failed = run_lmi("validate", "opt", cwd=tmp_path)
    assert failed.returncode == 3
    assert "tensor_parallel_degree=3 is not a degree the Neuron runtime supports" in failed.stderr
    assert "hint: TP degrees that fit on inf2.48xlarge: 2, 4, 8, 24" in failed.stderr


@pytest.mark.parametrize("args, code", [(["validate", "missing-dir"], 2), (["inspect", "missing.tar.gz"], 2)])
def test_usage_errors_exit_2(tmp_path, args, code):
    result = run_lmi(*args, cwd=tmp_path)
    assert result.returncode == code and result.stderr.startswith("error:")
