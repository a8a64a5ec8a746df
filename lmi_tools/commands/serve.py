"""``lmi serve``: run model directories locally behind DJLServing's HTTP API."""

from __future__ import annotations

import logging
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


LOOPBACK = ("127.0.0.1", "localhost", "::1")
LOG_LEVELS = ("debug", "info", "warning", "error")
#: What makes a directory servable without serving.properties, as DJLServing serves it: its own entry point, or a
#: model's config.json (the handler then loads the directory itself).
SERVABLE = ("serving.properties", "model.py", "config.json")


def serve(models: list[str] = typer.Argument(..., help="Model directories ([NAME=]DIR); the name defaults to the "
                                                        "directory's name"),
          host: str = typer.Option("127.0.0.1", help="Address to bind (DJLServing's default is loopback too)"),
          port: int = typer.Option(8080, min=1, max=65535, help="Port for the inference and SageMaker APIs"),
          management_host: str = typer.Option("127.0.0.1", help="Address of the management API (/models): keep it "
                                                                 "on loopback, it can load and run model code"),
          management_port: int = typer.Option(None, min=1, max=65535, help="Port of the management API (default: --port + 1; the "
                                                         "same as --port serves both on one listener, as DJLServing "
                                                         "does by default)"),
          model_url_pattern: str = typer.Option(None, help="Regular expression a directory's resolved path must "
                                                           "match for POST /models?url= to load it (default: loading "
                                                           "by URL is refused)"),
          engine: str = typer.Option("auto", help="Worker: auto (DJL's engine where djl_python and its "
                                                  "djl_python_engine.py are found, else ours; the log says which), "
                                                  "lmi (ours) or djl (DJL's, else the load fails saying what is "
                                                  "missing)"),
          job_queue_size: int = typer.Option(None, help="Default queue length per model (SERVING_JOB_QUEUE_SIZE)"),
          read_timeout: float = typer.Option(60.0, help="Seconds to wait for a request's headers, and for each "
                                                        "next part of its body, before answering 408"),
          max_header_bytes: int = typer.Option(16 * 1024, help="Largest size of a request's headers in bytes "
                                                               "(431 above it)"),
          one_at_a_time: bool = typer.Option(False, "--one-at-a-time", help="Load only the first model; the chat "
                                                                             "page's Activate loads another and "
                                                                             "unloads the current one (one "
                                                                             "accelerator's memory)"),
          sagemaker_part_size: int = typer.Option(0, help="Largest SageMaker PayloadPart in bytes (0: one per "
                                                          "chunk); small values exercise clients' reassembly"),
          endpoint: str = typer.Option(None, help="Play a SageMaker endpoint of inference components with this "
                                                  "name: SageMaker Runtime calls must name a model as "
                                                  "InferenceComponentName"),
          drain_timeout: float = typer.Option(25.0, help="Seconds the requests already accepted get to finish after "
                                                         "SIGTERM or Ctrl-C, while /ping and new requests answer "
                                                         "503 (under SageMaker's 30 s); a second signal stops at "
                                                         "once"),
          log_level: str = typer.Option("info", help="debug, info, warning, error"),
          container: str = typer.Option("lmi", "--container", help="lmi (DJLServing's API) or vllm (vLLM's own "
                                                                   "OpenAI server as AWS's vLLM container runs it: one "
                                                                   "model; --host and --port apply)")) -> None:
    """Serve MODEL directories with the same HTTP API as DJLServing (Ctrl-C drains, twice stops)."""
    import re

    from ..containers import check_container
    from ..errors import UsageError

    if check_container(container) == "vllm":
        given = {"--management-port": management_port, "--model-url-pattern": model_url_pattern,
                 "--job-queue-size": job_queue_size, "--endpoint": endpoint}
        _serve_container(models, host, port, [name for name, value in given.items() if value is not None])
        return
    from ..serving.app import INFERENCE, MANAGEMENT, create_app, listen, serve as run
    from ..serving.store import ModelStore, ServerConfig

    if engine not in ("auto", "lmi", "djl"):
        raise UsageError(f"--engine {engine!r} is not one of auto, lmi, djl")
    if log_level.lower() not in LOG_LEVELS:
        raise UsageError(f"--log-level {log_level!r} is not one of {', '.join(LOG_LEVELS)}")
    log_level = log_level.lower()
    for name, value in (("--job-queue-size", job_queue_size), ("--read-timeout", read_timeout),
                        ("--max-header-bytes", max_header_bytes), ("--drain-timeout", drain_timeout)):
        if value is not None and value <= 0:
            raise UsageError(f"{name} {value:g} is invalid: expected a number > 0")
    if model_url_pattern is not None:
        try:
            re.compile(model_url_pattern)
        except re.error as exc:
            raise UsageError(f"--model-url-pattern {model_url_pattern!r} is not a regular expression: {exc}") from None
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = ServerConfig.from_env()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    config.engine, config.sagemaker_part_size, config.sagemaker_endpoint = engine, sagemaker_part_size, endpoint
    config.drain_timeout = drain_timeout
    config.read_timeout, config.max_header_bytes, config.model_url_pattern = (read_timeout, max_header_bytes,
                                                                              model_url_pattern)
    if job_queue_size is not None:
        config.job_queue_size = job_queue_size
    management_port = port + 1 if management_port is None else management_port
    if management_port > 65535:
        raise UsageError(f"--port {port} leaves no port for the management API (--port + 1 is past 65535)",
                         hint="pass --management-port, or a lower --port")
    if management_port == port and management_host != host:
        raise UsageError(f"--management-port {port} is --port's on another address (--host {host}, --management-host "
                         f"{management_host}): one port serves both APIs only on one listener",
                         hint=f"pass --management-host {host} too (one listener, as DJLServing's default), or another "
                              "--management-port")
    targets = _targets(models)  # every mistake in them refused before a socket or a worker exists
    _warn_exposed(host, management_host, model_url_pattern)
    one_listener = (management_host, management_port) == (host, port)
    sockets = [listen(host, port)]
    if not one_listener:
        try:
            sockets.append(listen(management_host, management_port))
        except UsageError:
            sockets[0].close()
            raise
    store = ModelStore(config)
    store.one_at_a_time = one_at_a_time
    try:
        for i, (name, path) in enumerate(targets):
            store.offer(name, str(path), load=i == 0 or not one_at_a_time)
    except BaseException as exc:  # no worker started for an earlier model outlives a failed start
        store.close()
        if isinstance(exc, ValueError):  # a bad number in a serving.properties
            raise UsageError(str(exc)) from None
        raise
    if one_listener:
        listeners = [(create_app(store), sockets[0])]
    else:
        listeners = [(create_app(store, INFERENCE), sockets[0]),
                     (create_app(store, MANAGEMENT, owns_store=False), sockets[1])]
    typer.echo(f"lmi serve: http://{host}:{port}  management: http://{management_host}:{management_port}  "
               f"models: {', '.join(store.catalog)}  (GET /ping until 200; chat page: http://{host}:{port}/)")
    try:
        run(listeners, log_level)
    finally:  # however the server ends (a listener that fails to start too), no worker process outlives it
        store.close()


def _serve_container(models: list[str], host: str, port: int, unused: list[str]) -> None:
    """vLLM's own server for one model directory, as AWS's vLLM container starts it (this process becomes it)."""
    from ..containers.vllm.launch import local_server, start
    from ..errors import UsageError

    if len(models) != 1 or unused:
        raise UsageError(f"lmi serve --container vllm serves one model directory with --host and --port; got "
                         f"{len(models)} directories" + (f" and {', '.join(unused)}" if unused else ""),
                         hint="lmi serve --container vllm [NAME=]DIR --port 8080")
    [(name, path)] = _targets(models)
    _warn_exposed(host, "127.0.0.1", None)
    launch = local_server(path, name, host, port)
    for note in launch.notes:
        typer.echo(f"note: {note}", err=True)
    typer.echo(f"lmi serve --container vllm: http://{host}:{port} (/ping, /invocations, /v1/...) model: {name}\n"
               f"{launch.shown()}", err=True)
    start(launch)


def _targets(specs: list[str]) -> list[tuple[str, Path]]:
    """(name, directory) of each ``[NAME=]DIR`` argument; a name given twice, or a directory that is missing, is a
    file or has nothing to serve, is refused."""
    from ..errors import UsageError
    from ..serving.store import model_path_for, model_properties

    hint = "give a model directory: serving.properties (lmi new / lmi render write one) and the model or model.py"
    targets: dict[str, tuple[str, Path]] = {}
    for spec in specs:
        name, where = _model_name(spec), model_path_for(spec)
        if name in targets:
            raise UsageError(f"the model name {name} is given twice ({targets[name][0]} and {spec})",
                             hint="give each model its own name: NAME=DIR")
        path = Path(where)
        if not where:
            raise UsageError(f"model {spec!r} names no directory after '='", hint=hint)
        if path.is_file():
            raise UsageError(f"{path} is a file, not a model directory", hint=hint)
        if not path.is_dir():
            raise UsageError(f"model directory {path} does not exist", hint=hint)
        props = model_properties(path)
        if not any((path / entry).is_file() for entry in SERVABLE) and not {"model_id", "entryPoint"} & props.keys():
            raise UsageError(f"{path} has nothing to serve: no {', '.join(SERVABLE[:-1])} or {SERVABLE[-1]}, and no "
                             "OPTION_MODEL_ID or OPTION_ENTRYPOINT in the environment", hint=hint)
        targets[name] = (spec, path)
    return [(name, path) for name, (_, path) in targets.items()]


def _model_name(spec: str) -> str:
    """The name a ``[NAME=]DIR`` argument serves under; an empty one, or one a URL path cannot hold, is refused."""
    from ..errors import UsageError
    from ..serving.store import model_name_for

    name = model_name_for(spec)
    if not name or "/" in name or name != name.strip():
        raise UsageError(f"model {spec!r}: the name {name!r} is not usable in /predictions/NAME",
                         hint="give NAME=DIR with a non-empty NAME without '/' or surrounding spaces, or DIR alone "
                              "(the name is then the directory's)")
    return name


def _warn_exposed(host: str, management_host: str, model_url_pattern: str | None) -> None:
    if management_host not in LOOPBACK:
        loading = (f"loads any directory matching {model_url_pattern!r} and runs its model.py"
                   if model_url_pattern else "unloads and inspects models")
        typer.secho(f"WARNING: the management API on {management_host} has no authentication: anyone who can reach "
                    f"it {loading}. Bind it to 127.0.0.1 unless this network is yours alone "
                    "(docs/serving.md, 'Security').", fg="red", bold=True, err=True)
    if host not in LOOPBACK:
        typer.secho(f"warning: the inference API on {host} has no authentication; anyone who can reach it can use "
                    "the models.", fg="yellow", err=True)
