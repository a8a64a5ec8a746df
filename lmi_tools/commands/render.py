"""``lmi new`` / ``lmi render`` / ``lmi presets``: model directories from presets and specs."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("new")(new)
    app.command("render")(render)
    app.command("presets")(presets)


def new(out_dir: Path = typer.Argument(..., help="Model directory to create"),
        preset: str = typer.Option(..., "--preset", "-p", help="Preset name (see lmi presets)"),
        spec_file: Optional[Path] = typer.Option(None, "--spec", help="Where to write the preset's spec, to edit and "
                                                                      "render again [default: DIR/spec.toml]"),
        force: bool = typer.Option(False, "--force", help="Overwrite existing files")) -> None:
    """Create a model directory from a preset: serving.properties, model.py, requirements.txt, and the preset's
    spec (edit it, then lmi render SPEC DIR --force)."""
    from ..errors import UsageError
    from ..modeldir.render import write_model_dir
    from ..modeldir.resources import preset_spec
    from ..modeldir.spec import load_spec
    from ..outputs import check_writable

    source = preset_spec(preset)
    spec_file = spec_file or out_dir / "spec.toml"
    if spec_file.exists() and not force:
        raise UsageError(f"{spec_file} already exists", hint="pass --force to overwrite it, or --spec elsewhere")
    check_writable(out_dir, folder=True)
    check_writable(spec_file, hint="give --spec a file to write")
    written = write_model_dir(load_spec(source), out_dir, f"preset {preset}", force, spec_file)
    spec_file.parent.mkdir(parents=True, exist_ok=True)
    spec_file.write_bytes(source.read_bytes())
    _report([*written, spec_file], out_dir)


def render(spec_path: Path = typer.Argument(..., help="Spec file (.toml or .json)"),
           out_dir: Path = typer.Argument(..., help="Model directory to write"),
           force: bool = typer.Option(False, "--force", help="Overwrite existing files")) -> None:
    """Render a spec into a model directory."""
    from ..modeldir.render import write_model_dir
    from ..modeldir.spec import load_spec

    _report(write_model_dir(load_spec(spec_path), out_dir, f"spec {spec_path.name}", force, spec_path), out_dir)


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
