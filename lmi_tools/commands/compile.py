"""``lmi compile``: ahead-of-time neuronx compilation of a model directory (artifacts kept beside the model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("compile")(compile_command)


def compile_command(model_dir: Path = typer.Argument(..., help="Model directory (with serving.properties)"),
                    instance: Optional[str] = typer.Option(None, "--instance", "-i",
                                                           help="Target instance type (default: the "
                                                                "'# lmi: instance_type=' line)"),
                    output: str = typer.Option("compiled", help="Folder inside the model directory for the "
                                                                "artifacts")) -> None:
    """Compile the neuronx graphs once, save them with their settings' manifest, and point
    option.compiled_graph_path at them; prints the compile and the reusing load times."""
    from ..packaging.compile import compile_model_dir

    result = compile_model_dir(model_dir, instance, output, on_step=lambda message: typer.echo(message, err=True))
    typer.echo(json.dumps(result.as_json()))
