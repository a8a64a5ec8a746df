"""SageMaker's inference-optimization jobs: quantize, compile or train a speculative-decoding head for a model
on S3, wait for the job, stop it, and deploy what it wrote.

``plan_job`` turns an ``OptimizationSpec`` into the exact ``create_optimization_job`` request without touching
AWS (so ``--dry-run`` prints what ``start`` sends); the shapes and the allowed deployment instance types come
from botocore's own service model, so they follow the installed botocore. ``deploy_spec`` turns a COMPLETED
job's description into an ``EndpointSpec`` the way the sagemaker SDK builds its optimized model: the output
location as an uncompressed S3 prefix, the job's recommended image, its instance type, and its environment
with each technique's overrides (the container reads ``OPTION_QUANTIZE`` and the compile settings from them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Mapping

from ..errors import UsageError
from ..instances import HostingInstance
from .aws import aws_errors
from .deploy import EndpointSpec, validate_environment, validate_name_and_role
from .images import resolve_image
from .polling import StatusCallback, Waitable, wait_for
from .upload import S3Uri

#: What ``--quantize`` accepts: the ``option.quantize`` values LMI's quantization jobs run (OPTION_QUANTIZE).
QUANTIZE_METHODS = ("awq", "fp8")
#: The job's states (botocore's OptimizationJobStatus), split by whether waiting can end.
DONE_STATES = frozenset({"COMPLETED", "FAILED", "STOPPED"})
DEFAULT_MAX_RUNTIME_S = 36000
ENVIRONMENT_LIMIT = 25  # OptimizationJobEnvironmentVariables: at most 25 entries per map


@lru_cache(maxsize=1)
def _service_model():
    import botocore.session

    return botocore.session.get_session().get_service_model("sagemaker")


def deployment_instance_types() -> tuple[str, ...]:
    """The instance types an optimization job can target, from botocore's model (OptimizationJobDeploymentInstanceType)."""
    return tuple(_service_model().shape_for("OptimizationJobDeploymentInstanceType").enum)


def speculative_techniques() -> tuple[str, ...]:
    return tuple(_service_model().shape_for("ModelSpeculativeDecodingTechnique").enum)


@dataclass(frozen=True)
class OptimizationSpec:
    """One optimization job: the model on S3, the instance it is optimized for, the techniques, and the output."""

    name: str
    model: str
    instance: str
    role: str
    output: str
    region: str
    #: ``option.quantize`` method (``QUANTIZE_METHODS``): a ModelQuantizationConfig with OPTION_QUANTIZE.
    quantize: str | None = None
    #: Ahead-of-time compilation (Neuron SDK on inf2/trn1, TensorRT-LLM on GPUs): a ModelCompilationConfig.
    compile: bool = False
    #: Settings for the compilation (OPTION_TENSOR_PARALLEL_DEGREE, OPTION_N_POSITIONS...): its OverrideEnvironment.
    compile_environment: Mapping[str, str] = field(default_factory=dict)
    #: Speculative-decoding technique (botocore's ModelSpeculativeDecodingTechnique: EAGLE) and its training data.
    speculative: str | None = None
    speculative_data: str | None = None
    #: OptimizationEnvironment: the container environment of the job (and of the deployment after it).
    environment: Mapping[str, str] = field(default_factory=dict)
    image: str | None = None
    lmi_version: str | None = None
    max_runtime_s: int = DEFAULT_MAX_RUNTIME_S
    accept_eula: bool = False


def plan_job(spec: OptimizationSpec) -> dict:
    """The ``create_optimization_job`` parameters for ``spec``; every field checked first (UsageError naming
    the option). No AWS call."""
    _validate(spec)
    host = HostingInstance.parse_any(spec.instance)
    image = resolve_image(host, spec.region, spec.image, spec.lmi_version).uri
    configs = []
    if spec.quantize:
        if host.kind == "neuron":
            raise UsageError(f"--quantize {spec.quantize} cannot target {spec.instance}: SageMaker quantizes for "
                             "GPU instances", hint="use --compile for inf2/trn1, or a GPU instance (ml.g5, ml.p4d...)")
        configs.append({"ModelQuantizationConfig": {"Image": image,
                                                    "OverrideEnvironment": {"OPTION_QUANTIZE": spec.quantize}}})
    if spec.compile:
        configs.append({"ModelCompilationConfig": {"Image": image,
                                                   "OverrideEnvironment": dict(spec.compile_environment)}})
    if spec.speculative:
        speculative: dict = {"Technique": spec.speculative.upper()}
        if spec.speculative_data:
            data = S3Uri.parse(spec.speculative_data, "--speculative-data")
            speculative["TrainingDataSource"] = {"S3Uri": str(data),
                                                 "S3DataType": "S3Prefix" if data.is_prefix else "ManifestFile"}
        configs.append({"ModelSpeculativeDecodingConfig": speculative})
    if not configs:
        raise UsageError("no optimization was asked for", hint="give --quantize, --compile and/or --speculative")
    source: dict = {"S3Uri": str(_prefix(spec.model, "--model"))}
    if spec.accept_eula:
        source["ModelAccessConfig"] = {"AcceptEula": True}
    params = {"OptimizationJobName": spec.name, "RoleArn": spec.role, "ModelSource": {"S3": source},
              "DeploymentInstanceType": spec.instance, "OptimizationConfigs": configs,
              "OutputConfig": {"S3OutputLocation": str(_prefix(spec.output, "--output"))},
              "StoppingCondition": {"MaxRuntimeInSeconds": spec.max_runtime_s}}
    if spec.environment:
        params["OptimizationEnvironment"] = dict(spec.environment)
    return params


def _prefix(uri: str, option: str) -> S3Uri:
    """Model and output locations are prefixes (folders of files), whether or not the user wrote the slash."""
    if uri.endswith(".tar.gz"):
        raise UsageError(f"{option} {uri} is a tarball: optimization jobs read and write uncompressed folders",
                         hint="upload the model directory itself: lmi upload DIR s3://bucket/prefix/")
    return S3Uri.parse(uri if uri.endswith("/") else uri + "/", option)


def _validate(spec: OptimizationSpec) -> None:
    validate_name_and_role(spec.name, spec.role, "with S3 read/write and ECR pull")
    allowed = deployment_instance_types()
    if spec.instance not in allowed:
        families = sorted({name.split(".")[1] for name in allowed})
        raise UsageError(f"--instance {spec.instance!r} is not a target of SageMaker optimization jobs",
                         hint=f"families it accepts: {', '.join(families)} (e.g. ml.g5.12xlarge, ml.inf2.48xlarge)")
    if spec.quantize and spec.quantize not in QUANTIZE_METHODS:
        raise UsageError(f"--quantize {spec.quantize!r} is not a method optimization jobs run",
                         hint=f"allowed: {', '.join(QUANTIZE_METHODS)}")
    techniques = speculative_techniques()
    if spec.speculative and spec.speculative.upper() not in techniques:
        raise UsageError(f"--speculative {spec.speculative!r} is not a technique optimization jobs train",
                         hint=f"allowed: {', '.join(t.lower() for t in techniques)}")
    if spec.speculative_data and not spec.speculative:
        raise UsageError("--speculative-data needs --speculative", hint="e.g. --speculative eagle")
    if spec.compile_environment and not spec.compile:
        raise UsageError("--compile-env needs --compile")
    if spec.max_runtime_s < 1:
        raise UsageError(f"--max-runtime {spec.max_runtime_s} is out of range", hint="at least 1 second")
    for option, environment in (("--env", spec.environment), ("--compile-env", spec.compile_environment)):
        if len(environment) > ENVIRONMENT_LIMIT:
            raise UsageError(f"{option}: {len(environment)} variables, an optimization job takes at most "
                             f"{ENVIRONMENT_LIMIT}")
        if any(len(key) > 256 or len(value) > 256 for key, value in environment.items()):
            raise UsageError(f"{option}: names and values must be at most 256 characters")
        validate_environment(environment)


# --- talking to AWS -------------------------------------------------------------------------------

def start(sm, params: dict) -> str:
    """Create the job; returns its ARN."""
    with aws_errors(f"creating optimization job {params['OptimizationJobName']}"):
        return sm.create_optimization_job(**params)["OptimizationJobArn"]


def describe(sm, name: str) -> dict:
    with aws_errors(f"describing optimization job {name}"):
        return sm.describe_optimization_job(OptimizationJobName=name)


def stop(sm, name: str) -> None:
    with aws_errors(f"stopping optimization job {name}"):
        sm.stop_optimization_job(OptimizationJobName=name)


def wait(sm, name: str, timeout_s: float = 36000, poll_s: float = 60,
         on_status: StatusCallback | None = None, sleep: Callable[[float], None] = time.sleep,
         clock: Callable[[], float] = time.monotonic) -> dict:
    """Poll until the job is COMPLETED (returns its description); ``AwsError`` with SageMaker's FailureReason
    when it FAILED or was STOPPED, or when ``timeout_s`` passes (the job keeps running)."""
    target = Waitable(f"optimization job {name}", lambda: describe(sm, name), "OptimizationJobStatus", "COMPLETED",
                      DONE_STATES - {"COMPLETED"},
                      failed_hint="fix what the reason names and start a new job under another --name",
                      timeout_hint=f"it keeps running (and billing): lmi optimize wait {name} later, "
                                   f"or lmi optimize stop {name}")
    return wait_for(target, timeout_s, poll_s, on_status, sleep, clock)


def deploy_spec(description: dict, role: str | None, name: str, region: str,
                environment: Mapping[str, str] | None = None) -> EndpointSpec:
    """The endpoint for a COMPLETED job (``description`` from ``describe``): its output prefix, recommended
    image and instance type, its environment plus each technique's overrides, then ``environment``."""
    job = description["OptimizationJobName"]
    if description["OptimizationJobStatus"] != "COMPLETED":
        raise UsageError(f"optimization job {job} is {description['OptimizationJobStatus']}, not COMPLETED",
                         hint=f"lmi optimize wait {job} first")
    merged = dict(description.get("OptimizationEnvironment") or {})
    for config in description.get("OptimizationConfigs", []):
        for technique in config.values():
            merged.update(technique.get("OverrideEnvironment") or {})
    merged.update(environment or {})
    image = (description.get("OptimizationOutput") or {}).get("RecommendedInferenceImage")
    output = description["OutputConfig"]["S3OutputLocation"]
    return EndpointSpec(artifact=output if output.endswith("/") else output + "/",
                        instance=description["DeploymentInstanceType"], role=role or description["RoleArn"],
                        name=name, region=region, image=image, environment=merged)
