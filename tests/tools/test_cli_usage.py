"""Usage errors through the installed ``lmi`` entry point: a usage line and one error, exit 2, no traceback."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

LMI = Path(sys.executable).with_name("lmi")
PRESETS = Path(__file__).resolve().parents[2] / "serving_properties"


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


def lmi_main(capsys, monkeypatch, cwd: Path, *args: str) -> tuple[int, str]:
    """``lmi ARGS`` in this process (cli.main, the same code as the entry point's, without its start-up time):
    the exit code, and stdout + stderr; any exception cli.main lets through fails the test as a traceback would."""
    from lmi_tools.cli import main

    monkeypatch.chdir(cwd)
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize("args,message", [
    (["a=model", "a=model"], "the model name a is given twice (a=model and a=model)"),
    (["model", "model"], "the model name model is given twice"),
    (["a="], "model 'a=' names no directory after '='"),
    (["model/serving.properties"], "model/serving.properties is a file, not a model directory"),
    (["empty"], "empty has nothing to serve: no serving.properties, model.py or config.json"),
    (["missing"], "model directory missing does not exist"),
    (["model", "--log-level", "loud"], "--log-level 'loud' is not one of debug, info, warning, error"),
])
def test_serve_refuses_every_target_mistake_before_a_server_or_worker_starts(tmp_path, capsys, monkeypatch, args,
                                                                             message):
    (tmp_path / "model").mkdir()
    (tmp_path / "model/serving.properties").write_text("option.backend=scripted\n")
    (tmp_path / "empty").mkdir()
    monkeypatch.setattr("lmi_tools.serving.store.ModelStore.offer", None)  # nothing may load a model
    code, output = lmi_main(capsys, monkeypatch, tmp_path, "serve", *args, "--port", "9")  # never bound either
    assert code == 2 and f"error: {message}" in output, output
    assert "lmi serve:" not in output


def test_a_directory_without_serving_properties_is_accepted_when_the_environment_configures_it(tmp_path, capsys,
                                                                                              monkeypatch):
    """DJLServing's way: OPTION_* variables stand in for serving.properties."""
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("OPTION_MODEL_ID", str(tmp_path))
    with contextlib.closing(socket.socket()) as taken:  # the port, checked after the models, stops it there
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        code, output = lmi_main(capsys, monkeypatch, tmp_path, "serve", "empty", "--port", port)
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in output, output


@pytest.mark.parametrize("args,message", [
    (["package", "model", "-o", "/proc/lmi-test/model.tar.gz"],
     "cannot write /proc/lmi-test/model.tar.gz: /proc takes no new file"),
    (["package", "model", "-o", "model/serving.properties/model.tar.gz"],
     "cannot write model/serving.properties/model.tar.gz: model/serving.properties is a file, not a folder"),
    (["package", "model", "-o", "model"], "model is a folder: give the file to write"),
    (["package", "model", "--uncompressed", "model/serving.properties"],
     "model/serving.properties is a file, not a folder"),
    (["new", "--preset", "opt-13b-inf2-48xlarge", "/proc/lmi-test"],
     "cannot write /proc/lmi-test: /proc takes no new file"),
    (["new", "--preset", "opt-13b-inf2-48xlarge", "model/serving.properties/new"],
     "cannot write model/serving.properties/new: model/serving.properties is a file, not a folder"),
    (["render", "spec.toml", "/proc/lmi-test"], "cannot write /proc/lmi-test: /proc takes no new file"),
    (["tiny-model", "/proc/lmi-test"], "cannot write /proc/lmi-test: /proc takes no new file"),
    (["model", "from-gguf", "spec.toml", "model/serving.properties"],
     "model/serving.properties is a file, not a folder"),
])
def test_an_output_the_file_system_refuses_is_one_error_line_before_any_work(tmp_path, capsys, monkeypatch, args,
                                                                             message):
    (tmp_path / "model").mkdir()
    (tmp_path / "model/serving.properties").write_text("engine=Python\noption.model_id=/nowhere\n")
    (tmp_path / "spec.toml").write_text((PRESETS / "opt-13b-inf2-48xlarge/spec.toml").read_text())
    code, output = lmi_main(capsys, monkeypatch, tmp_path, *args)
    assert code in (1, 2) and f"error: {message}" in output, output
    assert "to pack" not in output and "wrote" not in output  # refused before validating or packing
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["model", "serving.properties", "spec.toml"]


def test_any_other_file_system_error_is_one_error_line(tmp_path, capsys, monkeypatch):
    """cli.main's last resort, for what no command checks first (a disk that fills up, a folder made read-only
    meanwhile): the path and the system's reason, exit 1."""
    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "model/serving.properties"))

    monkeypatch.setattr("lmi_tools.modeldir.render.write_model_dir", refused)
    code, output = lmi_main(capsys, monkeypatch, tmp_path, "new", "--preset", "opt-13b-inf2-48xlarge", "model")
    assert (code, output) == (1, f"error: {tmp_path}/model/serving.properties: Permission denied\n")


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
