"""``lmi optimize start / wait / stop / deploy``: SageMaker's inference-optimization jobs, from a model folder
on S3 to an endpoint serving what the job wrote. Progress goes to stderr, results (JSON) to stdout."""

from __future__ import annotations

import json
from typing import Optional

import typer

from .sagemaker import PROFILE, REGION, env_pairs, stderr_console

optimize_app = typer.Typer(no_args_is_help=True, help="SageMaker optimization jobs: quantize, compile, or train "
                                                      "a speculative-decoding head; then deploy the result.")


def register(app: typer.Typer) -> None:
    app.add_typer(optimize_app, name="optimize")


@optimize_app.command("start")
def start(model: str = typer.Option(..., help="s3://bucket/prefix/ holding the model folder (uncompressed)"),
          instance: str = typer.Option(..., help="Instance type the result is optimized for: ml.g5.12xlarge, "
                                                 "ml.inf2.48xlarge..."),
          role: str = typer.Option(..., help="Execution role ARN (S3 read/write, ECR pull)"),
          output: str = typer.Option(..., help="s3://bucket/prefix/ the optimized model is written to"),
          name: str = typer.Option(..., help="Job name (1-63 letters, digits, hyphens)"),
          quantize: Optional[str] = typer.Option(None, help="Quantize weights: awq or fp8 (GPU instances)"),
          compile: bool = typer.Option(False, "--compile", help="Compile ahead of time (Neuron SDK on inf2/trn1, "
                                                                "TensorRT-LLM on GPUs)"),
          compile_env: list[str] = typer.Option([], "--compile-env", help="Compilation setting KEY=VALUE, e.g. "
                                                                          "OPTION_TENSOR_PARALLEL_DEGREE=2"),
          speculative: Optional[str] = typer.Option(None, help="Train a speculative-decoding head: eagle"),
          speculative_data: Optional[str] = typer.Option(None, help="s3:// training data for --speculative "
                                                                    "(a prefix, or a manifest file)"),
          env: list[str] = typer.Option([], "--env", help="Job (and later endpoint) environment KEY=VALUE"),
          image: Optional[str] = typer.Option(None, help="LMI image URI (default: the one for the instance)"),
          lmi_version: Optional[str] = typer.Option(None, help="LMI release for the default image"),
          max_runtime: int = typer.Option(36000, help="MaxRuntimeInSeconds: the job is stopped after this"),
          accept_eula: bool = typer.Option(False, "--accept-eula", help="Accept the model's end-user licence "
                                                                        "(gated models)"),
          dry_run: bool = typer.Option(False, "--dry-run", help="Print the request as JSON; call nothing"),
          region: Optional[str] = REGION, profile: Optional[str] = PROFILE) -> None:
    """Start an optimization job (create_optimization_job)."""
    from ..sagemaker import aws
    from ..sagemaker import optimize as lib

    sess = aws.session(region, profile)
    spec = lib.OptimizationSpec(name=name, model=model, instance=instance, role=role, output=output,
                                region=aws.region_of(sess), quantize=quantize, compile=compile,
                                compile_environment=env_pairs(compile_env), speculative=speculative,
                                speculative_data=speculative_data, environment=env_pairs(env), image=image,
                                lmi_version=lmi_version, max_runtime_s=max_runtime, accept_eula=accept_eula)
    params = lib.plan_job(spec)
    if dry_run:
        typer.echo(json.dumps({"method": "create_optimization_job", "params": params}, indent=2))
        return
    arn = lib.start(aws.client(sess, "sagemaker"), params)
    typer.echo(json.dumps({"OptimizationJobName": name, "OptimizationJobArn": arn}))


@optimize_app.command("wait")
def wait(name: str = typer.Argument(..., help="Job name"),
         timeout: int = typer.Option(36000, help="Seconds to wait before giving up (the job keeps running)"),
         poll_interval: int = typer.Option(60, help="Seconds between status checks"),
         region: Optional[str] = REGION, profile: Optional[str] = PROFILE) -> None:
    """Wait until the job is COMPLETED; print where its output is and the image to serve it with."""
    from ..sagemaker import aws
    from ..sagemaker import optimize as lib

    console = stderr_console()
    seen: list[str] = []

    def on_status(state: str, elapsed: float) -> None:
        if not seen or seen[-1] != state:
            console.print(f"optimization job {name}: {state} after {elapsed:.0f} s")
            seen.append(state)

    sm = aws.client(aws.session(region, profile), "sagemaker")
    description = lib.wait(sm, name, timeout, poll_interval, on_status)
    typer.echo(json.dumps({"OptimizationJobName": name, "OptimizationJobStatus": "COMPLETED",
                           "S3OutputLocation": description["OutputConfig"]["S3OutputLocation"],
                           "RecommendedInferenceImage": (description.get("OptimizationOutput") or {})
                           .get("RecommendedInferenceImage")}))


@optimize_app.command("stop")
def stop(name: str = typer.Argument(..., help="Job name"),
         region: Optional[str] = REGION, profile: Optional[str] = PROFILE) -> None:
    """Stop a running job (stop_optimization_job); what it wrote so far stays on S3."""
    from ..sagemaker import aws
    from ..sagemaker import optimize as lib

    lib.stop(aws.client(aws.session(region, profile), "sagemaker"), name)
    typer.echo(json.dumps({"OptimizationJobName": name, "OptimizationJobStatus": "STOPPING"}))


@optimize_app.command("deploy")
def deploy(job: str = typer.Argument(..., help="Name of a COMPLETED optimization job"),
           name: str = typer.Option(..., help="Name of the model, endpoint config and endpoint"),
           role: Optional[str] = typer.Option(None, help="Execution role ARN (default: the job's)"),
           env: list[str] = typer.Option([], "--env", help="Extra container environment KEY=VALUE"),
           wait_timeout: int = typer.Option(3600, help="Seconds to wait for InService"),
           poll_interval: int = typer.Option(30, help="Seconds between status checks"),
           dry_run: bool = typer.Option(False, "--dry-run", help="Print the API calls as JSON; create nothing"),
           region: Optional[str] = REGION, profile: Optional[str] = PROFILE) -> None:
    """Deploy a COMPLETED job's output on its instance type with its recommended image (as lmi deploy does)."""
    from ..sagemaker import aws
    from ..sagemaker import deploy as deployment
    from ..sagemaker import optimize as lib

    sess = aws.session(region, profile)
    sm = aws.client(sess, "sagemaker")
    spec = lib.deploy_spec(lib.describe(sm, job), role, name, aws.region_of(sess), env_pairs(env))
    plan = deployment.plan_deployment(spec)
    if dry_run:
        typer.echo(json.dumps(plan.as_json(), indent=2))
        return
    console = stderr_console()
    result = deployment.deploy(sm, aws.client(sess, "s3"), plan, timeout_s=wait_timeout, poll_s=poll_interval,
                               on_step=console.print,
                               on_status=lambda state, elapsed: console.print(f"endpoint {name}: {state} "
                                                                              f"({elapsed:.0f} s)"))
    typer.echo(json.dumps({"EndpointName": name, "EndpointArn": result.get("EndpointArn"),
                           "EndpointStatus": result.get("EndpointStatus")}))
