"""The ``lmi`` command. Each command module parses arguments and calls library functions; this
module only assembles them and is the one place where errors become messages and exit codes."""

from __future__ import annotations

import json
import sys
from importlib import import_module

import typer

from .errors import ToolError
from .outputs import describe


def _flag_type_hidden() -> None:
    """typer 0.29's rich --help prints a flag's type as if it took a value (``--force <bool>``), where its plain
    help and click print none: print none there either."""
    from typer.core import TyperOption

    display_type_rich = TyperOption.display_type_rich

    def without_flags(self: TyperOption, ctx) -> str | None:
        return None if self.is_flag or self.count else display_type_rich(self, ctx)

    TyperOption.display_type_rich = without_flags


_flag_type_hidden()
app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Build, validate, serve, package, deploy and benchmark LLM handlers for DJLServing / "
                       "AWS LMI containers.")

# One module per command group; each defines register(app).
COMMAND_MODULES = [
    "lmi_tools.commands.tiny_model",
    "lmi_tools.commands.model",
    "lmi_tools.commands.serve",
    "lmi_tools.commands.render",
    "lmi_tools.commands.validate",
    "lmi_tools.commands.package",
    "lmi_tools.commands.compile",
    "lmi_tools.commands.docker",
    "lmi_tools.commands.stack",
    "lmi_tools.commands.sagemaker",
    "lmi_tools.commands.optimize",
    "lmi_tools.commands.bench",
]

for _name in COMMAND_MODULES:
    import_module(_name).register(app)

# One or two typical command lines per command, shown at the end of its --help (tests/tools/test_cli_usage.py
# parses each one, so they stay true to the options).
EXAMPLES = {
    "tiny-model": ["lmi tiny-model out/tiny"],
    "model smollm2": ["lmi model smollm2", "lmi model smollm2 out/smollm2"],
    "model minilm": ["lmi model minilm", "lmi model minilm out/minilm"],
    "model from-gguf": ["lmi model from-gguf ./qwen2-0.5b-instruct-q8_0.gguf out/qwen2"],
    "serve": ["lmi serve out/demo/model --port 8080", "lmi serve chat=./llama code=./codellama"],
    "new": ["lmi new --preset llama-3-8b-inf2-xlarge model/"],
    "render": ["lmi render my-spec.toml model/"],
    "presets": ["lmi presets"],
    "validate": ["lmi validate model/ --instance inf2.xlarge", "lmi validate model/ --json"],
    "package": ["lmi package model/ -o model.tar.gz", "lmi package model/ --uncompressed out/model-tree"],
    "inspect": ["lmi inspect model.tar.gz"],
    "compile": ["lmi compile model/ --instance inf2.xlarge"],
    "docker-run": ["lmi docker-run model/ --instance inf2.xlarge", "lmi docker-run model/ --exec"],
    "upload": ["lmi upload model.tar.gz s3://my-bucket/llama/"],
    "deploy": ["lmi deploy --artifact s3://my-bucket/llama/model.tar.gz --instance ml.inf2.xlarge "
               "--role arn:aws:iam::111122223333:role/SageMakerExecution --name llama --region us-east-1 --dry-run"],
    "invoke": ["lmi invoke llama --prompt 'What is Inferentia2?' --stream"],
    "delete": ["lmi delete llama --all --dry-run"],
    "components": ["lmi components pool"],
    "scale": ["lmi scale chat 2", "lmi scale code 0 --no-wait"],
    "bench": ["lmi bench http://127.0.0.1:8080/predictions/model -c 4 -n 100",
              "lmi bench --serve out/demo/model --sweep 1,4,16",
              "lmi bench http://127.0.0.1:8080/v1/embeddings -c 16 -n 400"],
    "chat-stack": ["lmi chat-stack llama=s3://my-bucket/llama/model.tar.gz --wheel "
                   "s3://my-bucket/lmi_handlers-0.1.0-py3-none-any.whl --key-name my-key --instance inf2.xlarge"],
    "optimize start": ["lmi optimize start --name llama-awq --model s3://my-bucket/llama/ "
                       "--output s3://my-bucket/llama-awq/ --instance ml.g5.12xlarge "
                       "--role arn:aws:iam::111122223333:role/SageMakerRole --quantize awq --dry-run"],
    "optimize wait": ["lmi optimize wait llama-awq"],
    "optimize stop": ["lmi optimize stop llama-awq"],
    "optimize deploy": ["lmi optimize deploy llama-awq --name llama-awq"],
}


def _commands(typer_app: typer.Typer, prefix: str = ""):
    """(full name, CommandInfo) of every command, those of groups included."""
    for info in typer_app.registered_commands:
        yield prefix + (info.name or info.callback.__name__.replace("_", "-")), info
    for group in typer_app.registered_groups:
        yield from _commands(group.typer_instance, f"{prefix}{group.name} ")


for _full_name, _info in _commands(app):
    if _full_name in EXAMPLES:
        _info.epilog = "Examples:\n\n" + "\n\n".join(f"  {line}" for line in EXAMPLES[_full_name])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        try:
            result = app(args=args, standalone_mode=False)
        except OSError as exc:  # the file system refused what no command checked first: a message, not a traceback
            raise ToolError(describe(exc)) from None
        return result if isinstance(result, int) else 0
    except ToolError as exc:
        if "--json" in args:  # a caller that asked for JSON gets JSON on stdout, failures included
            typer.echo(json.dumps({"ok": False, "error": str(exc), "hint": exc.hint or None}, indent=2))
            return exc.exit_code
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
