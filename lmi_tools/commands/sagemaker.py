"""``lmi upload / deploy / invoke / delete / components / scale``: models on SageMaker endpoints, from S3 to
teardown, with autoscaling and inference components.

Each command parses its options and calls ``lmi_tools.sagemaker``; progress and status go to stderr,
results (the artifact URI, the endpoint, the generated text, ``--dry-run`` JSON) to stdout.
``AWS_ENDPOINT_URL`` (and ``AWS_ENDPOINT_URL_S3`` / ``_SAGEMAKER`` / ``_SAGEMAKER_RUNTIME``) are honoured by
boto3 itself, which is how tests point these commands at moto and ``lmi serve``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

REGION = typer.Option(None, "--region", help="AWS region (default: AWS_DEFAULT_REGION / your profile's)")
PROFILE = typer.Option(None, "--profile", help="AWS profile from ~/.aws/config")


def register(app: typer.Typer) -> None:
    app.command("upload")(upload)
    app.command("deploy")(deploy)
    app.command("invoke")(invoke)
    app.command("delete")(delete)
    app.command("components")(components)
    app.command("scale")(scale)


def stderr_console():
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)


def upload(source: Path = typer.Argument(..., help="model.tar.gz, or a model directory to upload uncompressed"),
           destination: str = typer.Argument(..., help="s3://bucket/prefix/ (or a full object URI for a file)"),
           part_size: int = typer.Option(64, help="Multipart part size in MiB (at least 5)"),
           replace: bool = typer.Option(False, "--replace", help="Directory upload: delete the prefix's other "
                                                                 "objects first (they would be deployed too)"),
           region: Optional[str] = REGION, profile: Optional[str] = PROFILE) -> None:
    """Upload model.tar.gz (one object) or a directory (one object per file, keys = relative paths) to S3."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from ..sagemaker import aws
    from ..sagemaker.upload import MIB, plan_upload
    from ..sagemaker.upload import upload as send

    plan = plan_upload(source, destination)
    s3 = aws.client(aws.session(region, profile), "s3")
    columns = ("{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=stderr_console()) as progress:
        task = progress.add_task(f"{len(plan.files)} file(s)", total=plan.total_bytes)
        send(s3, plan, lambda sent: progress.update(task, advance=sent), part_size * MIB, replace)
    typer.echo(f"uploaded {len(plan.files)} file(s), {plan.total_bytes / MIB:.1f} MiB", err=True)
    typer.echo(str(plan.uri))


def env_pairs(pairs: list[str], option: str = "--env", example: str = "OPTION_DTYPE=fp16") -> dict[str, str]:
    from ..errors import UsageError

    environment = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} {pair.split('=')[0]!r} is not KEY=VALUE", hint=f"e.g. {option} {example}")
        environment[key] = value
    return environment


def _read_spec(ctx: typer.Context, _param, path: Optional[Path]) -> Optional[Path]:
    """``--spec FILE``: a TOML (or JSON) file of deploy settings named like the options (``instance_count = 2``,
    ``autoscale = "1:4"``, ``env = ["OPTION_DTYPE=fp16"]``); they become the options' defaults, so options on the
    command line still win. ``model_dir`` is relative to the file."""
    if path is None:
        return None
    from ..errors import UsageError
    from ..modeldir.spec import tomllib

    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except OSError as exc:
        raise UsageError(f"--spec {path}: {exc.strerror or exc}") from None
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"--spec {path} is not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {exc}") from None
    settings = sorted(p.name for p in ctx.command.params if p.name not in ("spec", "dry_run", "help"))
    unknown = sorted(set(data) - set(settings))
    if unknown:
        raise UsageError(f"--spec {path}: {unknown[0]!r} is not a deploy setting",
                         hint=f"settings (the options' names with _): {', '.join(settings)}")
    if "model_dir" in data:
        data["model_dir"] = str(path.parent / data["model_dir"])
    ctx.default_map = {**(ctx.default_map or {}), **data}
    return path


def deploy(artifact: str = typer.Option(..., help="s3://.../model.tar.gz, or s3://.../prefix/ (uncompressed)"),
           instance: str = typer.Option(..., help="SageMaker instance type: ml.inf2.48xlarge, ml.g5.12xlarge..."),
           role: str = typer.Option(..., help="Execution role ARN SageMaker assumes (S3 read, ECR pull)"),
           image: Optional[str] = typer.Option(None, help="Container image URI (default: the LMI image for "
                                                          "the instance, of the release --model-dir's "
                                                          "'# lmi: image=' line names)"),
           lmi_version: Optional[str] = typer.Option(None, help="LMI release for the default image (0.29.0...)"),
           name: Optional[str] = typer.Option(None, help="Name of the model, endpoint config and endpoint "
                                                         "(default: lmi-<artifact>-<time>)"),
           instance_count: int = typer.Option(1, help="Instances behind the endpoint"),
           env: list[str] = typer.Option([], "--env", help="Container environment KEY=VALUE (repeatable)"),
           download_timeout: int = typer.Option(1800, help="ModelDataDownloadTimeoutInSeconds (60-3600)"),
           startup_timeout: int = typer.Option(1800, help="ContainerStartupHealthCheckTimeoutInSeconds (60-3600)"),
           volume_size: Optional[int] = typer.Option(None, help="VolumeSizeInGB on EBS-only instances (default "
                                                                "256; refused where the instance has local NVMe)"),
           wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait until the endpoint is InService"),
           wait_timeout: int = typer.Option(3600, help="Seconds to wait before giving up (the endpoint stays)"),
           poll_interval: int = typer.Option(30, help="Seconds between status checks"),
           check: bool = typer.Option(True, "--check/--no-check", help="Check the artifact and the names first"),
           autoscale: Optional[str] = typer.Option(None, help="MIN:MAX instances (copies with --component) that "
                                                              "Application Auto Scaling keeps"),
           target_metric: str = typer.Option("concurrency", help="What autoscaling tracks: concurrency (requests "
                                                                 "in flight per model or copy) or invocations (per "
                                                                 "minute per instance or copy)"),
           target_value: Optional[float] = typer.Option(None, help="The --target-metric value to hold"),
           scale_in_cooldown: int = typer.Option(600, help="Seconds after a scale-in before the next one"),
           scale_out_cooldown: int = typer.Option(300, help="Seconds after a scale-out before the next one"),
           component: Optional[str] = typer.Option(None, help="Deploy as this inference component onto endpoint "
                                                              "--name (created if missing)"),
           copies: int = typer.Option(1, help="With --component: copies of the model"),
           model_dir: Optional[Path] = typer.Option(None, help="The packaged model directory: its '# lmi: image=' "
                                                               "line picks the default LMI image, whose DJL must have "
                                                               "the async engine where its handler needs it; with "
                                                               "--component, lmi validate sizes a copy from it; with "
                                                               "--container vllm, its serving.properties is the "
                                                               "container's environment"),
           accelerators: Optional[int] = typer.Option(None, help="With --component and no --model-dir: "
                                                                 "NeuronCores or GPUs per copy"),
           memory_mb: int = typer.Option(1024, help="With --accelerators: host memory per copy in MiB"),
           adapter: list[str] = typer.Option([], "--adapter", help="With --component: NAME=s3://.../adapter.tar.gz, a "
                                                                  "LoRA adapter component on it (repeatable); an "
                                                                  "existing --component only gets the adapters"),
           spec: Optional[Path] = typer.Option(None, is_eager=True, callback=_read_spec,
                                               help="TOML/JSON file of these settings (keys: the option names "
                                                    "with _); options given here win"),
           dry_run: bool = typer.Option(False, "--dry-run", help="Print the API calls as JSON; call nothing"),
           container: str = typer.Option("lmi", "--container",
                                         help="lmi (LMI's DJLServing image) or vllm (AWS's vLLM container; its "
                                              "environment from --model-dir's serving.properties)"),
           vllm_version: Optional[str] = typer.Option(None, help="With --container vllm: the vLLM release of the "
                                                                 "image (default: the newest in lmi's table)"),
           region: Optional[str] = REGION, profile: Optional[str] = PROFILE) -> None:
    """Create a SageMaker model, endpoint config and endpoint for an artifact, and wait until InService; or, with
    --component, a model as an inference component on a (new or existing) endpoint."""
    from ..containers import check_container
    from ..sagemaker import aws
    from ..sagemaker import deploy as lib
    from ..sagemaker.scaling import Autoscaling

    environment = env_pairs(env)
    package = None
    if check_container(container) == "vllm":
        environment = _vllm_environment(model_dir, instance, environment)
    elif model_dir is not None:
        from ..sagemaker.package_image import read_package

        package = read_package(model_dir)
    sess = aws.session(region, profile)
    scaling = Autoscaling.parse(autoscale, target_metric, target_value, scale_in_cooldown, scale_out_cooldown) \
        if autoscale else None
    if name is None and component:
        from ..errors import UsageError

        raise UsageError("--component needs --name, the endpoint that hosts it", hint="e.g. --name llm-pool")
    spec = lib.EndpointSpec(artifact=artifact, instance=instance, role=role, name=name or lib.default_name(artifact),
                          region=aws.region_of(sess), image=image, lmi_version=lmi_version,
                          instance_count=instance_count, environment=environment,
                          download_timeout=download_timeout, startup_timeout=startup_timeout, volume_size=volume_size,
                          autoscaling=scaling, container=container, vllm_version=vllm_version, package=package)
    if component:
        _deploy_component(sess, spec, component, copies, model_dir, accelerators, memory_mb, wait_timeout,
                          poll_interval, check, dry_run,
                          env_pairs(adapter, "--adapter", "a1=s3://bucket/adapters/a1.tar.gz"))
        return
    if adapter:
        from ..errors import UsageError

        raise UsageError("--adapter needs --component, the base component the adapters go on",
                         hint="e.g. --name llm-pool --component base --adapter a1=s3://bucket/a1.tar.gz")
    plan = lib.plan_deployment(spec)
    if dry_run:
        typer.echo(json.dumps(plan.as_json(), indent=2))
        return
    console = stderr_console()
    console.print(f"image: {plan.image.uri} ({plan.image.source})")
    sm, s3 = aws.client(sess, "sagemaker"), aws.client(sess, "s3")
    scaler = aws.client(sess, "application-autoscaling") if plan.scaling else None
    seen: list[str] = []
    with console.status(f"creating {spec.name}") as status:
        def on_status(state: str, elapsed: float) -> None:
            status.update(f"endpoint {spec.name}: {state} ({elapsed:.0f} s)")
            if not seen or seen[-1] != state:  # print each change once; the spinner shows the waiting
                console.print(f"endpoint {spec.name}: {state} after {elapsed:.0f} s")
                seen.append(state)

        result = lib.deploy(sm, s3, plan, wait=wait, timeout_s=wait_timeout, poll_s=poll_interval,
                            on_step=lambda message: console.print(message), on_status=on_status, check=check,
                            autoscaling=scaler)
    typer.echo(json.dumps({"EndpointName": spec.name, "EndpointArn": result.get("EndpointArn"),
                           "EndpointStatus": result.get("EndpointStatus", "Creating")}))


def _vllm_environment(model_dir: Optional[Path], instance: str, given: dict[str, str]) -> dict[str, str]:
    """AWS's vLLM container's environment from the packaged directory's serving.properties (``--env`` wins)."""
    from ..containers.vllm.launch import deploy_environment
    from ..errors import UsageError

    if model_dir is None:
        raise UsageError("--container vllm needs --model-dir, the directory you packaged: its serving.properties "
                         "becomes the container's SM_VLLM_* environment", hint="e.g. --model-dir ./my-model")
    return deploy_environment(model_dir, instance, given)


def _deploy_component(sess, spec, component: str, copies: int, model_dir: Optional[Path],
                      accelerators: Optional[int], memory_mb: int, wait_timeout: int, poll_interval: int, check: bool,
                      dry_run: bool, adapters: dict[str, str]) -> None:
    from ..errors import UsageError
    from ..sagemaker import aws
    from ..sagemaker import components as lib

    if (model_dir is None) == (accelerators is None):
        raise UsageError("--component needs either --model-dir (sized by lmi validate) or --accelerators",
                         hint="--model-dir DIR: the directory you packaged; --accelerators N: NeuronCores or GPUs "
                              "per copy")
    resources = lib.size_model(model_dir, spec.instance) if model_dir else \
        lib.Resources(accelerators, memory_mb, f"--accelerators {accelerators} --memory-mb {memory_mb}")
    plan = lib.plan_component(lib.ComponentSpec(spec, component, resources, copies))
    adapter_calls = lib.plan_adapters(spec.name, component, adapters)
    if dry_run:
        extra = {"then_adapters": [call.as_json() for call in adapter_calls]} if adapter_calls else {}
        typer.echo(json.dumps({**plan.as_json(), **extra}, indent=2))
        return
    console = stderr_console()
    sm, s3 = aws.client(sess, "sagemaker"), aws.client(sess, "s3")
    scaler = aws.client(sess, "application-autoscaling") if plan.scaling else None
    with console.status(f"deploying {component} on {spec.name}") as status:
        on_status = lambda state, elapsed: status.update(f"{state} ({elapsed:.0f} s)")  # noqa: E731
        if adapter_calls and lib.component_exists(sm, component):
            result = lib.describe_component(sm, component)  # the base is there: add the adapters to it
        else:
            result = lib.deploy_component(sm, s3, plan, scaler, wait_timeout, poll_interval,
                                          on_step=lambda message: console.print(message), on_status=on_status,
                                          check=check)
        added = lib.deploy_adapters(sm, adapter_calls, wait_timeout, poll_interval,
                                    on_step=lambda message: console.print(message), on_status=on_status)
    typer.echo(json.dumps({"EndpointName": spec.name, "InferenceComponentName": component,
                           "InferenceComponentStatus": result.get("InferenceComponentStatus"),
                           **({"Adapters": {d["InferenceComponentName"]: d.get("InferenceComponentStatus")
                                            for d in added}} if added else {})}))


def invoke(endpoint: str = typer.Argument(..., help="Endpoint name"),
           prompt: str = typer.Option(..., help="The prompt"),
           stream: bool = typer.Option(False, "--stream", help="Print tokens as they arrive "
                                                               "(invoke_endpoint_with_response_stream)"),
           parameters: Optional[str] = typer.Option(None, help='Generation parameters as JSON, e.g. '
                                                               '\'{"max_new_tokens": 64}\''),
           chat: bool = typer.Option(False, "--chat", help="Send an OpenAI chat request (messages) instead"),
           raw: bool = typer.Option(False, "--raw", help="Without --stream: print the answer's body as is"),
           component: Optional[str] = typer.Option(None, help="The inference component to invoke "
                                                              "(InferenceComponentName)"),
           endpoint_url: Optional[str] = typer.Option(None, help="SageMaker Runtime URL, e.g. lmi serve's "
                                                                 "http://127.0.0.1:8080 (or "
                                                                 "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME)"),
           region: Optional[str] = REGION, profile: Optional[str] = PROFILE) -> None:
    """Send a prompt to an endpoint and print the generated text (token by token with --stream)."""
    from ..errors import ModelFailed, UsageError
    from ..sagemaker import aws
    from ..sagemaker import invoke as lib

    try:
        params = json.loads(parameters) if parameters else None
    except ValueError as exc:
        raise UsageError(f"--parameters is not JSON: {exc}", hint='e.g. --parameters \'{"max_new_tokens": 64}\'')
    if params is not None and not isinstance(params, dict):
        raise UsageError("--parameters must be a JSON object", hint='e.g. {"max_new_tokens": 64}')
    sess = aws.session(region, profile)
    local = bool(endpoint_url) and not aws.has_credentials(sess)  # lmi serve takes unsigned requests
    runtime = aws.client(sess, "sagemaker-runtime", endpoint_url, read_timeout=70, unsigned=local,
                         region=sess.region_name or ("us-east-1" if endpoint_url else None))
    body = lib.request_body(prompt, params, stream, chat)
    if not stream:
        typer.echo(lib.invoke(runtime, endpoint, body, raw=raw, component=component).text)
        return
    tokens = lib.invoke_stream(runtime, endpoint, body, component=component)
    try:
        for piece in tokens:
            typer.echo(piece, nl=False)
    except ModelFailed:
        typer.echo("")  # end the partial line; the error follows on stderr
        raise
    typer.echo("")


def delete(endpoint: Optional[str] = typer.Argument(None, help="Endpoint name (not with --component)"),
           component: Optional[str] = typer.Option(None, help="Delete only this inference component (and its "
                                                              "scaling); the endpoint stays"),
           config: bool = typer.Option(False, "--config", help="Also delete its endpoint config"),
           model: bool = typer.Option(False, "--model", help="Also delete its model(s)"),
           artifacts: bool = typer.Option(False, "--artifacts", help="Also delete the models' S3 data"),
           everything: bool = typer.Option(False, "--all", help="Same as --config --model --artifacts"),
           dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be deleted; delete nothing"),
           region: Optional[str] = REGION, profile: Optional[str] = PROFILE) -> None:
    """Delete an endpoint (its autoscaling and inference components first) and, on request, its config, models and
    S3 artifacts; or, with --component, one inference component. Names are read from SageMaker."""
    from ..errors import UsageError
    from ..sagemaker import aws
    from ..sagemaker import delete as lib

    if (endpoint is None) == (component is None):
        raise UsageError("give an ENDPOINT or --component NAME (not both)",
                         hint="lmi delete my-endpoint --all, or lmi delete --component my-model --model")
    sess = aws.session(region, profile)
    sm, scaler = aws.client(sess, "sagemaker"), aws.client(sess, "application-autoscaling")
    if component:
        if config:
            raise UsageError("--config does not apply to --component: the endpoint and its config stay")
        plan = lib.plan_component_teardown(sm, component, model or everything, artifacts or everything, scaler)
    else:
        plan = lib.plan_teardown(sm, endpoint, config or everything, model or everything, artifacts or everything,
                                 scaler)
    if dry_run:
        typer.echo(json.dumps(plan.as_json(), indent=2))
        return
    s3 = aws.client(sess, "s3") if plan.artifacts else None
    lib.delete(sm, s3, plan, on_step=lambda message: typer.echo(message, err=True), autoscaling=scaler)
    typer.echo(json.dumps(plan.as_json()))


def components(endpoint: str = typer.Argument(..., help="Endpoint name"),
               as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON"),
               region: Optional[str] = REGION, profile: Optional[str] = PROFILE) -> None:
    """List an endpoint's inference components: status, model, copies, accelerators and memory per copy."""
    from rich.console import Console
    from rich.table import Table

    from ..sagemaker import aws
    from ..sagemaker.components import components_table

    rows = components_table(aws.client(aws.session(region, profile), "sagemaker"), endpoint)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"inference components of {endpoint}")
    for column in ("component", "status", "model", "copies", "accelerators", "memory"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["component"], row["status"] + (f": {row['failure']}" if row.get("failure") else ""),
                      str(row["model"]), f"{row['current_copies']} of {row['copies']}", str(row["accelerators"]),
                      f"{row['memory_mb']} MiB")
    Console(soft_wrap=True).print(table)


def scale(component: str = typer.Argument(..., help="Inference component name"),
          copies: int = typer.Argument(..., help="Copies to run (0 parks the model: it keeps its name, frees its "
                                                 "accelerators)"),
          wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait until the component is InService"),
          wait_timeout: int = typer.Option(3600, help="Seconds to wait before giving up"),
          poll_interval: int = typer.Option(30, help="Seconds between status checks"),
          region: Optional[str] = REGION, profile: Optional[str] = PROFILE) -> None:
    """Set how many copies of an inference component run (UpdateInferenceComponentRuntimeConfig)."""
    from ..sagemaker import aws
    from ..sagemaker.components import scale_component

    sm = aws.client(aws.session(region, profile), "sagemaker")
    result = scale_component(sm, component, copies, wait, wait_timeout, poll_interval)
    runtime = result.get("RuntimeConfig", {})
    typer.echo(json.dumps({"InferenceComponentName": component, "InferenceComponentStatus":
                           result.get("InferenceComponentStatus"), "DesiredCopyCount": runtime.get("DesiredCopyCount"),
                           "CurrentCopyCount": runtime.get("CurrentCopyCount")}))
