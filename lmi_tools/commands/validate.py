"""``lmi validate``: check a model directory against its model and the instance before deploying."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

STYLES = {"error": "bold red", "warning": "yellow", "info": "cyan", "ok": "green"}


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)


def validate(model_dir: Path = typer.Argument(..., help="Model directory (with serving.properties)"),
             instance: Optional[str] = typer.Option(None, "--instance", "-i",
                                                    help="Instance type; default: the '# lmi: instance_type=' line"),
             config: Optional[Path] = typer.Option(None, "--config", help="The model's config.json"),
             as_json: bool = typer.Option(False, "--json", help="Print the report as JSON"),
             container: str = typer.Option("lmi", "--container", help="lmi (LMI's DJLServing images) or vllm (AWS's "
                                                                      "vLLM container: its engine, environment and "
                                                                      "model.py)")) -> None:
    """Check TP degree, heads, memory per core, sequence length, batching and dtype; exit 3 on errors."""
    from ..containers import check_container
    from ..errors import ValidationFailed
    from ..validation.validate import validate_model_dir

    if check_container(container) == "vllm":
        from ..containers.vllm.checks import validate_container

        report = validate_container(model_dir, instance, config)
    else:
        report = validate_model_dir(model_dir, instance, config)
    if as_json:  # the report is the answer; its errors only set the exit status (lmi_tools/cli.py, --json)
        typer.echo(json.dumps(report.to_dict(), indent=2))
        if not report.ok:
            raise typer.Exit(ValidationFailed.exit_code)
        return
    print_report(report)
    if not report.ok:
        first = report.errors[0]
        raise ValidationFailed(f"{len(report.errors)} error(s) in {model_dir}: {first.message}",
                               hint=first.hint or None)


def print_report(report) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    console.print(f"[bold]{escape(report.model_dir)}[/bold] on [bold]{report.instance}[/bold], "
                  f"backend {report.backend}")
    console.print(f"model: {escape(report.architecture)}")
    table = Table(show_lines=False)
    for column in ("check", "status", "detail"):
        table.add_column(column, overflow="fold")
    for finding in report.findings:
        detail = escape(finding.message) + (f"\n[dim]-> {escape(finding.hint)}[/dim]" if finding.hint else "")
        table.add_row(escape(finding.check), f"[{STYLES[finding.level]}]{finding.level}[/]", detail)
    console.print(table)
    if report.figures:
        figures = Table(title="figures", show_header=False)
        figures.add_column("figure")
        figures.add_column("value", overflow="fold")
        for name, value in report.figures.items():
            figures.add_row(escape(name), escape(value))
        console.print(figures)
    summary = f"{len(report.errors)} error(s), {len(report.warnings)} warning(s)"
    console.print(f"[{'bold red' if report.errors else 'green'}]{summary}[/]")
