"""Usage errors through the installed ``lmi`` entry point: a usage line and one error, exit 2, no traceback."""

from __future__ import annotations

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
