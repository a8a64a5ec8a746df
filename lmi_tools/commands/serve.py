"""``lmi serve``: run model directories locally behind DJLServing's HTTP API."""

from __future__ import annotations

import logging
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(models: list[str] = typer.Argument(..., help="Model directories ([NAME=]DIR); the name defaults to the "
                                                        "directory's name"),
          host: str = typer.Option("127.0.0.1", help="Address to bind (DJLServing's default is loopback too)"),
          port: int = typer.Option(8080, help="Port for the inference, management and SageMaker APIs"),
          engine: str = typer.Option("auto", help="Worker: auto (DJL's engine where djl_python is installed), "
                                                  "lmi (ours) or djl"),
          job_queue_size: int = typer.Option(None, help="Default queue length per model (SERVING_JOB_QUEUE_SIZE)"),
          sagemaker_part_size: int = typer.Option(0, help="Largest SageMaker PayloadPart in bytes (0: one per "
                                                          "chunk); small values exercise clients' reassembly"),
          endpoint: str = typer.Option(None, help="Play a SageMaker endpoint of inference components with this "
                                                  "name: SageMaker Runtime calls must name a model as "
                                                  "InferenceComponentName"),
          log_level: str = typer.Option("info", help="debug, info, warning, error")) -> None:
    """Serve MODEL directories with the same HTTP API as DJLServing (Ctrl-C stops)."""
    import uvicorn

    from ..errors import UsageError
    from ..serving.app import create_app
    from ..serving.store import ModelStore, ServerConfig, model_name_for, model_path_for

    if engine not in ("auto", "lmi", "djl"):
        raise UsageError(f"--engine {engine!r} is not one of auto, lmi, djl")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = ServerConfig.from_env()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    config.engine, config.sagemaker_part_size, config.sagemaker_endpoint = engine, sagemaker_part_size, endpoint
    if job_queue_size is not None:
        config.job_queue_size = job_queue_size
    store = ModelStore(config)
    for spec in models:
        path = Path(model_path_for(spec))
        if not path.is_dir():
            raise UsageError(f"model directory {path} does not exist",
                             hint="give a directory with serving.properties (lmi new / lmi render make one)")
        try:
            store.register(model_name_for(spec), str(path))
        except ValueError as exc:
            store.close()
            raise UsageError(str(exc)) from None
    typer.echo(f"lmi serve: http://{host}:{port}  models: {', '.join(store.models)}  (GET /ping until 200)")
    uvicorn.run(create_app(store), host=host, port=port, log_level=log_level, access_log=False)
