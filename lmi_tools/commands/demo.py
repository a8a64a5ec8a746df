"""``lmi demo``: build the tiny model, write its model directory and answer requests through the handler."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("tiny-model")(tiny_model)
    app.command("demo")(demo)


def tiny_model(out_dir: Path = typer.Argument(..., help="Where to write the model"),
               preset: str = typer.Option("tiny", help="tiny (tests, demo) or bench-115m (benchmark)")) -> None:
    """Build a small Llama-family model with random weights and a locally trained tokenizer."""
    from ..errors import UsageError
    from ..tiny_model import PRESETS, build_tiny_model

    if preset not in PRESETS:
        raise UsageError(f"unknown preset {preset!r}", hint=f"use one of {', '.join(PRESETS)}")
    typer.echo(f"wrote {build_tiny_model(out_dir, preset)}")


def demo(out_dir: Path = typer.Option(Path("out/demo"), help="Working directory for the demo"),
         prompt: str = typer.Option("The quick brown fox", help="Prompt to complete")) -> None:
    """Build the tiny model and run one plain and one streamed request through the handler."""
    from lmi_handlers.entrypoint import handle

    from ..djl_frontend import init_input, request_input
    from ..tiny_model import build_tiny_model

    model = build_tiny_model(out_dir / "tiny-model")
    model_dir = out_dir / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "serving.properties").write_text(
        f"engine=Python\noption.entryPoint=lmi_handlers.entrypoint\noption.model_id={model.resolve()}\n")
    options = {"engine": "Python", "entryPoint": "lmi_handlers.entrypoint", "model_id": str(model.resolve()),
               "model_dir": str(model_dir.resolve())}
    handle(init_input(options))
    body = json.dumps({"inputs": prompt, "parameters": {"max_new_tokens": 24}}).encode()
    out = handle(request_input([("Content-Type", "application/json")], body))
    typer.echo(f"plain:    {bytes(out.content.value_at(0)).decode()}")
    body = json.dumps({"inputs": prompt, "stream": True, "parameters": {"max_new_tokens": 24}}).encode()
    out = handle(request_input([("Content-Type", "application/json")], body))
    typer.echo("streamed:")
    for chunk in out.stream_content:
        typer.echo("  " + chunk.rstrip("\n"))
