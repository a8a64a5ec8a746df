"""Usage errors through the installed ``lmi`` entry point: a usage line and one error, exit 2, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

LMI = Path(sys.executable).with_name("lmi")


def run_lmi(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "AWS_DEFAULT_REGION": "us-east-1"}
    return subprocess.run([str(LMI), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args,message", [
    (["deploy", "--artifact", "s3://b/p/model.tar.gz", "--instance", "ml.inf2.48xlarge", "--dry-run"],
     "Missing option '--role'"),
    (["validate", "--bogus", "."], "No such option: --bogus"),
    (["bench", "--concurrency", "abc", "http://127.0.0.1:9"], "Invalid value for '--concurrency'"),
    (["delpoy"], "No such command 'delpoy'. Did you mean 'deploy'?"),
    (["docker-run"], "Missing argument 'model_dir'"),
])
def test_usage_error_is_one_message_and_exit_2(args, message):
    assert LMI.is_file(), "the lmi entry point is installed next to the interpreter (scripts/setup.sh)"
    result = run_lmi(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Usage: lmi" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_docker_run_reads_the_recorded_instance_type(tmp_path):
    (tmp_path / "serving.properties").write_text("# lmi: instance_type=inf2.xlarge\noption.tensor_parallel_degree=2\n")
    result = run_lmi("docker-run", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "--device /dev/neuron0 " in result.stdout and "inf2.xlarge" in result.stderr


def test_docker_run_without_any_instance_type_says_where_to_put_one(tmp_path):
    (tmp_path / "serving.properties").write_text("option.tensor_parallel_degree=2\n")
    result = run_lmi("docker-run", str(tmp_path))
    assert result.returncode == 2
    assert "no instance type" in result.stderr and "# lmi: instance_type=" in result.stderr
    assert "Traceback" not in result.stderr


def test_every_command_shows_examples_that_parse():
    import shlex

    import typer.main

    from lmi_tools.cli import EXAMPLES, _commands, app

    names = [name for name, _ in _commands(app)]
    assert sorted(names) == sorted(EXAMPLES), "give each command an example in EXAMPLES (lmi_tools/cli.py)"
    root = typer.main.get_command(app)
    for name, lines in EXAMPLES.items():
        for line in lines:
            words = shlex.split(line)
            assert words[:1 + name.count(" ") + 1] == ["lmi", *name.split()]
            command = root
            for word in name.split():
                command = command.commands[word]
            command.make_context(name, words[1 + len(name.split()):])  # raises on an unknown option or bad value
    result = run_lmi("deploy", "--help")
    assert "Examples:" in result.stdout and "--dry-run" in result.stdout.split("Examples:")[1]


@pytest.mark.parametrize("args,message", [
    (["serve", ".", "--port", "99999"], "Invalid value for '--port'"),
    (["serve", ".", "--port", "0"], "Invalid value for '--port'"),
    (["serve", ".", "--management-port", "70000"], "Invalid value for '--management-port'"),
    (["serve", ".", "--port", "65535"], "--port 65535 leaves no port for the management API"),
    (["serve", "=."], "the name '' is not usable"),
    (["serve", "a/b=."], "the name 'a/b' is not usable"),
])
def test_serve_refuses_bad_ports_and_model_names_before_binding(args, message):
    result = run_lmi(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize("command", ["package", "serve", "new", "validate"])
def test_help_shows_no_type_after_a_flag(command):
    result = run_lmi(command, "--help")
    assert result.returncode == 0, result.stderr
    assert "<bool>" not in result.stdout
    assert "--help " in result.stdout


def test_validate_json_answers_json_on_every_outcome(tmp_path):
    missing = run_lmi("validate", str(tmp_path / "nowhere"), "--json")
    assert missing.returncode == 2 and missing.stderr == ""
    report = json.loads(missing.stdout)
    assert report["ok"] is False and "serving.properties does not exist" in report["error"] and report["hint"]

    (tmp_path / "serving.properties").write_text("engine=Python\noption.tensor_parallel_degree=3\n")
    failed = run_lmi("validate", str(tmp_path), "--json", "--instance", "inf2.xlarge")
    assert failed.returncode == 3 and failed.stderr == ""
    assert json.loads(failed.stdout)["ok"] is False


def test_inspect_on_a_non_archive_says_so_in_one_line(tmp_path):
    (tmp_path / "notes.tar.gz").write_text("not an archive")
    result = run_lmi("inspect", str(tmp_path / "notes.tar.gz"))
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == (f"error: {tmp_path / 'notes.tar.gz'} is not a tar archive (plain, gzip, "
                                             "bzip2 or xz): 14 bytes of something else")
    assert "ReadError" not in result.stderr
    as_json = run_lmi("inspect", str(tmp_path / "notes.tar.gz"), "--json")
    assert as_json.returncode == 2 and as_json.stderr == ""
    assert json.loads(as_json.stdout)["error"].endswith("is not a tar archive (plain, gzip, bzip2 or xz): 14 bytes "
                                                        "of something else")


def test_new_writes_the_spec_its_header_names_and_render_reproduces_the_directory(tmp_path):
    model = tmp_path / "model"
    assert run_lmi("new", "--preset", "opt-13b-inf2-48xlarge", str(model)).returncode == 0
    header = (model / "serving.properties").read_text().splitlines()[0]
    rerender = header.split("run: ", 1)[1]
    assert rerender == f"lmi render {model / 'spec.toml'} {model} --force"
    def contents() -> dict[str, list[str]]:  # the header's first line names the source: preset, then spec
        return {p.name: p.read_text().splitlines()[p.name == "serving.properties":] for p in model.iterdir()}

    before = contents()
    result = run_lmi(*rerender.split()[1:])
    assert result.returncode == 0, result.stderr
    assert contents() == before

    elsewhere = run_lmi("new", "--preset", "opt-13b-inf2-48xlarge", str(tmp_path / "other"),
                        "--spec", str(tmp_path / "opt.toml"))
    assert elsewhere.returncode == 0 and (tmp_path / "opt.toml").is_file()
    assert run_lmi("new", "--preset", "opt-13b-inf2-48xlarge", str(model)).returncode == 2  # no silent overwrite
