"""``lmi docker-run``: print (or run) the ``docker run`` line for a model directory on an EC2 host."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Optional

import typer

from ..errors import ToolError, UsageError


def register(app: typer.Typer) -> None:
    app.command("docker-run")(docker_run)


def docker_run(
    model_dir: Path = typer.Argument(..., help="Model directory (serving.properties, weights); mounted at /opt/ml/model"),
    instance: Optional[str] = typer.Option(None, "--instance", "-i",
                                           help="EC2 instance type, e.g. inf2.48xlarge or g5.12xlarge; default: the "
                                                "'# lmi: instance_type=' line of serving.properties"),
    image: Optional[str] = typer.Option(None, help="Image to run (default: lmi-handlers:neuronx or lmi-handlers:gpu, "
                                                   "built from docker/)"),
    tp: Optional[int] = typer.Option(None, "--tp", help="Tensor parallel degree (default: serving.properties)"),
    copies: Optional[int] = typer.Option(None, help="Model copies to make room for: pass only the chips/GPUs they "
                                                    "need (default: all of them; DJL starts floor(cores/TP) copies)"),
    port: int = typer.Option(8080, help="Host port for the container's 8080"),
    compile_cache: str = typer.Option("/var/tmp/neuron-compile-cache", help="Host directory for the Neuron "
                                                                            "compile cache (inf2/trn1)"),
    loading_timeout: Optional[int] = typer.Option(None, help="MODEL_LOADING_TIMEOUT in seconds (default 3600 on "
                                                             "Neuron, where the first start compiles; 1800 on GPU)"),
    predict_timeout: int = typer.Option(240, help="PREDICT_TIMEOUT in seconds"),
    name: Optional[str] = typer.Option(None, help="Container name (default lmi-<model directory name>)"),
    execute: bool = typer.Option(False, "--exec", help="Run the command instead of printing it"),
    container: str = typer.Option("lmi", "--container", help="lmi (DJLServing, this project's images) or vllm (AWS's "
                                                             "vLLM container on a GPU host; its public image unless "
                                                             "--image)"),
) -> int:
    """Print the docker run line that serves MODEL_DIR with DJLServing on an inf2/trn1 or G5 host (or in AWS's vLLM
    container on a GPU host)."""
    from ..containers import check_container
    from ..ec2.docker_run import DockerOptions, plan_docker_run
    from ..modeldir.properties import instance_type, parse_properties, read_text

    if not model_dir.is_dir():
        raise UsageError(f"{model_dir} is not a directory", hint="give the model directory holding serving.properties")
    props_file = model_dir / "serving.properties"
    text = read_text(props_file) if props_file.is_file() else ""
    properties = parse_properties(text)
    instance = instance_type(model_dir, text, instance)
    if check_container(container) == "vllm":
        from ..containers.vllm.launch import docker_run as vllm_docker_run

        plan = vllm_docker_run(model_dir, instance, image, port, name)
        return _run(plan.notes, plan.command_line, plan.argv, execute)
    for label, value in (("--tp", tp), ("--copies", copies)):
        if value is not None and value < 1:
            raise UsageError(f"{label} must be at least 1, got {value}")
    plan = plan_docker_run(model_dir, properties, DockerOptions(
        instance=instance, image=image, tp=tp, copies=copies, port=port, compile_cache=compile_cache,
        loading_timeout=loading_timeout, predict_timeout=predict_timeout, name=name))
    return _run(plan.notes, plan.command_line, plan.argv, execute)


def _run(notes, command_line: str, argv: list[str], execute: bool) -> int:
    for note in notes:
        typer.echo(f"# {note}", err=True)
    if not execute:
        typer.echo(command_line)
        return 0
    if shutil.which("docker") is None:
        raise ToolError("docker is not installed or not on PATH", hint="run without --exec to print the command")
    return subprocess.run(argv, check=False).returncode
