"""``lmi package`` and ``lmi inspect``: build a reproducible model.tar.gz, and check one."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("package")(package)
    app.command("inspect")(inspect)


def package(model_dir: Path = typer.Argument(..., help="Model directory (with serving.properties)"),
            output: Optional[Path] = typer.Option(None, "--output", "-o", help="The .tar.gz to write"),
            uncompressed: Optional[Path] = typer.Option(None, "--uncompressed",
                                                        help="Also (or only) lay the files out in this new folder, "
                                                             "for an uncompressed S3 prefix upload"),
            no_validate: bool = typer.Option(False, "--no-validate", help="Package even if lmi validate fails"),
            instance: Optional[str] = typer.Option(None, "--instance", "-i", help="Instance type for validation"),
            config: Optional[Path] = typer.Option(None, "--config", help="The model's config.json for validation"),
            ) -> None:
    """Validate, then package the model directory with the lmi_handlers runtime vendored beside model.py."""
    from ..outputs import check_writable
    from ..packaging.package import build

    if output is None and uncompressed is None:
        output = Path("model.tar.gz")
    if output is not None:  # before validating and packing, which take minutes on a large model
        check_writable(output, hint="give -o the .tar.gz file to write, e.g. -o model.tar.gz")
    if uncompressed is not None:
        check_writable(uncompressed, folder=True, hint="give --uncompressed a new or empty folder")
    with _byte_progress(output or uncompressed) as progress:
        artifact = build(model_dir, output, uncompressed, validate=not no_validate, instance=instance, config=config,
                         progress=progress)
    for warning in artifact.warnings:
        typer.secho(f"warning: {warning}", fg="yellow", err=True)
    if artifact.replaced_runtime:
        typer.secho(f"note: {model_dir}/lmi_handlers was replaced by the vendored runtime", fg="yellow", err=True)
    typer.echo(f"{len(artifact.files)} files, {artifact.total_bytes:,} bytes")
    if artifact.tarball:
        typer.echo(f"wrote {artifact.tarball} (sha256 {artifact.sha256})")
    if artifact.tree:
        typer.echo(f"wrote {artifact.tree}/ (upload it as an S3 prefix with CompressionType None)")


@contextlib.contextmanager
def _byte_progress(destination: Path):
    """A start line on stderr, then (on a terminal) a bar with bytes, speed and time left: compressing a large
    checkpoint takes minutes (about 40 MB/s)."""
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=console, transient=True) as bar:
        task = bar.add_task(f"writing {destination}", total=None)

        def progress(done: int, total: int) -> None:
            if not done:  # once per output: the tarball, then the uncompressed tree
                bar.update(task, total=(bar.tasks[0].total or 0) + total)
                console.print(f"writing {destination}: {total / 1e6:,.1f} MB to pack", markup=False, highlight=False)
            bar.advance(task, done)

        yield progress


def inspect(archive: Path = typer.Argument(..., help="A model.tar.gz"),
            as_json: bool = typer.Option(False, "--json", help="Print the report as JSON")) -> None:
    """List an artifact and check it (serving.properties, entry point, runtime, paths) without unpacking it."""
    from ..packaging.artifact import inspect_artifact
    from ..errors import ValidationFailed

    report = inspect_artifact(archive)
    if as_json:  # the report is the answer; its problems only set the exit status (lmi_tools/cli.py, --json)
        typer.echo(json.dumps(report.to_dict(), indent=2))
        if not report.ok:
            raise typer.Exit(ValidationFailed.exit_code)
        return
    _print(report)
    if not report.ok:
        raise ValidationFailed(f"{len(report.problems)} problem(s) in {archive}: {report.problems[0]}")


def _print(report) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    table = Table(title=escape(report.path))
    table.add_column("file", overflow="fold")
    table.add_column("bytes", justify="right")
    for name, size in report.files:
        table.add_row(escape(name), f"{size:,}")
    console.print(table)
    console.print(f"{len(report.files)} files, {report.total_bytes:,} bytes unpacked, "
                  f"{report.compressed_bytes:,} bytes packed")
    console.print(f"sha256 {report.sha256}")
    console.print(f"entry point: {escape(report.entry_point or '-')}")
    console.print(f"vendored lmi_handlers: {report.runtime_version or '-'}")
    for note in report.notes:
        console.print(f"[yellow]note[/]: {escape(note)}")
    for problem in report.problems:
        console.print(f"[bold red]problem[/]: {escape(problem)}")
