"""The ``lmi`` command. Each command module parses arguments and calls library functions; this
module only assembles them and is the one place where errors become messages and exit codes."""

from __future__ import annotations

import sys
from importlib import import_module

import typer

from .errors import ToolError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Build, validate, serve, package, deploy and benchmark LLM handlers for DJLServing / "
                       "AWS LMI containers.")

# One module per command group; each defines register(app).
COMMAND_MODULES = [
    "lmi_tools.commands.tiny_model",
    "lmi_tools.commands.serve",
    "lmi_tools.commands.render",
    "lmi_tools.commands.validate",
    "lmi_tools.commands.package",
    "lmi_tools.commands.compile",
    "lmi_tools.commands.docker",
    "lmi_tools.commands.sagemaker",
    "lmi_tools.commands.optimize",
    "lmi_tools.commands.bench",
]

for _name in COMMAND_MODULES:
    import_module(_name).register(app)


def main(argv: list[str] | None = None) -> int:
    try:
        result = app(args=argv, standalone_mode=False)
        return result if isinstance(result, int) else 0
    except ToolError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        if exc.hint:
            typer.secho(f"hint: {exc.hint}", fg="yellow", err=True)
        return exc.exit_code
    except typer.Abort:
        typer.echo("aborted", err=True)
        return 130
    except typer.Exit as exc:
        return exc.exit_code
    except typer.TyperException as exc:
        # The installed typer raises its own copy of click's exceptions (typer._click); TyperException is
        # their public base. Usage errors show the usage line and exit 2, never a traceback.
        show = getattr(exc, "show", None)
        if show:
            show()
        else:
            typer.secho(f"error: {exc.format_message()}", fg="red", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        return 130

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
