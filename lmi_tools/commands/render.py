"""``lmi new`` / ``lmi render`` / ``lmi presets``: model directories from presets and specs."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("new")(new)
    app.command("render")(render)
    app.command("presets")(presets)


def new(out_dir: Path = typer.Argument(..., help="Model directory to create"),
        preset: str = typer.Option(..., "--preset", "-p", help="Preset name (see lmi presets)"),
        force: bool = typer.Option(False, "--force", help="Overwrite existing files")) -> None:
    """Create a model directory from a preset: serving.properties, model.py, requirements.txt."""
    from ..modeldir.render import write_model_dir
    from ..modeldir.resources import preset_spec
    from ..modeldir.spec import load_spec

    spec = load_spec(preset_spec(preset))
    _report(write_model_dir(spec, out_dir, f"preset {preset}", force), out_dir)


def render(spec_path: Path = typer.Argument(..., help="Spec file (.toml or .json)"),
           out_dir: Path = typer.Argument(..., help="Model directory to write"),
           force: bool = typer.Option(False, "--force", help="Overwrite existing files")) -> None:
    """Render a spec into a model directory."""
    from ..modeldir.render import write_model_dir
    from ..modeldir.spec import load_spec

    _report(write_model_dir(load_spec(spec_path), out_dir, f"spec {spec_path.name}", force), out_dir)


def presets() -> None:
    """List the presets with what each one deploys."""
    from ..modeldir.resources import preset_names, preset_spec
    from ..modeldir.spec import load_spec

    for name in preset_names():
        typer.echo(f"{name:40} {load_spec(preset_spec(name)).description}")


def _report(written: list[Path], out_dir: Path) -> None:
    for path in written:
        typer.echo(f"wrote {path}")
    typer.echo(f"next: lmi validate {out_dir}")
