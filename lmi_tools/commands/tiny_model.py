"""``lmi tiny-model``: build a small model locally (random weights, a tokenizer trained here)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("tiny-model")(tiny_model)


def tiny_model(out_dir: Path = typer.Argument(..., help="Where to write the model"),
               preset: str = typer.Option("tiny", help="tiny (tests, demo) or bench-115m (benchmark)")) -> None:
    """Build a small Llama-family model with random weights and a locally trained tokenizer."""
    from ..errors import UsageError
    from ..models.tiny import PRESETS, build_tiny_model
    from ..outputs import check_writable

    if preset not in PRESETS:
        raise UsageError(f"unknown preset {preset!r}", hint=f"use one of {', '.join(PRESETS)}")
    check_writable(out_dir, folder=True)
    typer.echo(f"building the {preset} model in {out_dir}: training a tokenizer, writing random weights "
               "(seconds for tiny, about a minute for bench-115m)", err=True)
    typer.echo(f"wrote {build_tiny_model(out_dir, preset)}")
