"""Deploy an artifact on S3 to a SageMaker real-time endpoint on an LMI image, with boto3 alone.

``plan_deployment`` turns a ``EndpointSpec`` into the exact API calls (``create_model``,
``create_endpoint_config``, ``create_endpoint``) without touching AWS, so ``--dry-run`` prints precisely
what ``create`` later sends. ``deploy`` checks the artifact and the names, makes the calls (removing what it
created if a later call fails) and polls ``describe_endpoint`` until ``InService``, or raises with
SageMaker's ``FailureReason``. All three resources share one name (``EndpointSpec.name``). With
``EndpointSpec.autoscaling`` the plan also registers the variant with Application Auto Scaling once the endpoint
is InService (``scaling.py``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Callable, Mapping

from ..errors import AwsError, UsageError
from ..instances import HostingInstance
from .aws import aws_errors
from .calls import ApiCall, run
from .images import FRAMEWORKS, ImageChoice, resolve_image
from .package_image import Package
from .polling import StatusCallback, Waitable, wait_for
from .scaling import SERVICE as AUTOSCALING, Autoscaling, variant_resource
from .upload import S3Uri, list_keys

NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")
ROLE_ARN = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+")
AWS_CREDENTIAL_ENV = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                                "AWS_SECURITY_TOKEN"})
VARIANT = "AllTraffic"
DEFAULT_TIMEOUT_S = 1800
DEFAULT_VOLUME_GB = 256
FAILED_STATES = frozenset({"Failed", "UpdateRollbackFailed", "OutOfService", "Deleting"})
# GetBucketLocation answers null for us-east-1 and "EU" for some old eu-west-1 buckets.
LEGACY_LOCATIONS = {"": "us-east-1", "EU": "eu-west-1"}


@dataclass(frozen=True)
class EndpointSpec:
    """What to deploy: the artifact (``s3://.../model.tar.gz`` or an uncompressed ``s3://.../prefix/``), where
    (instance type and count, region), as whom (the execution role) and under which name."""

    artifact: str
    instance: str
    role: str
    name: str
    region: str
    image: str | None = None
    #: LMI release for the image table (``0.29.0``...); ignored with ``image``.
    lmi_version: str | None = None
    instance_count: int = 1
    #: Container environment (``OPTION_*``, ``HF_MODEL_ID``...): at most 100 entries of 1024 bytes.
    environment: Mapping[str, str] = field(default_factory=dict)
    #: ModelDataDownloadTimeoutInSeconds (download and extraction), 60-3600.
    download_timeout: int = DEFAULT_TIMEOUT_S
    #: ContainerStartupHealthCheckTimeoutInSeconds (until /ping answers 200), 60-3600.
    startup_timeout: int = DEFAULT_TIMEOUT_S
    #: VolumeSizeInGB, 1-512, only on instances without local NVMe; None: DEFAULT_VOLUME_GB there.
    volume_size: int | None = None
    #: Instances scale between its bounds (Application Auto Scaling), once the endpoint is InService.
    autoscaling: Autoscaling | None = None
    #: ``lmi`` (LMI's DJLServing images) or ``vllm`` (AWS's vLLM container: its image, ``vllm_version``'s).
    container: str = "lmi"
    vllm_version: str | None = None
    #: The packaged model directory (``--model-dir``) on an LMI image: the default image is its ``# lmi: image=``
    #: line's, and an image whose DJL lacks the async engine its handler needs is refused (``package_image.py``).
    package: Package | None = None


@dataclass(frozen=True)
class DeployPlan:
    """The API calls a deployment makes, and the image chosen for it."""

    spec: EndpointSpec
    artifact: S3Uri
    image: ImageChoice
    calls: tuple[ApiCall, ...]
    #: Application Auto Scaling calls, made once the endpoint is InService.
    scaling: tuple[ApiCall, ...] = ()

    def as_json(self) -> dict:
        plan = {"region": self.spec.region, "image": {"uri": self.image.uri, "source": self.image.source},
                "calls": [call.as_json() for call in self.calls],
                "then": f"describe_endpoint(EndpointName={self.spec.name!r}) until EndpointStatus is InService"}
        if self.scaling:
            plan["when_in_service"] = [call.as_json() for call in self.scaling]
        return plan


def default_name(artifact: str, now: datetime | None = None) -> str:
    """``lmi-<artifact name>-<UTC time>``, shortened and cleaned to SageMaker's name rules."""
    stem = artifact.rstrip("/").rsplit("/", 1)[-1].removesuffix(".tar.gz") or "model"
    stem = re.sub(r"[^a-zA-Z0-9]+", "-", stem).strip("-")[:32] or "model"
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")
    return f"lmi-{stem}-{stamp}"


def plan_deployment(spec: EndpointSpec) -> DeployPlan:
    """The calls for ``spec``; validates every field first (UsageError naming the option). No AWS call."""
    validate(spec)
    artifact, host, image, model = model_call(spec, spec.name)
    calls = (model,
             ApiCall("create_endpoint_config", {"EndpointConfigName": spec.name,
                                                "ProductionVariants": [_variant(spec, host)]}),
             ApiCall("create_endpoint", {"EndpointName": spec.name, "EndpointConfigName": spec.name}))
    scaling = spec.autoscaling.calls(variant_resource(spec.name, VARIANT), "variant") if spec.autoscaling else ()
    return DeployPlan(spec, artifact, image, calls, scaling)


def model_call(spec: EndpointSpec, model_name: str) -> tuple[S3Uri, HostingInstance, ImageChoice, ApiCall]:
    """The artifact, the instance, the image and the ``create_model`` call for ``spec``."""
    artifact = S3Uri.parse(spec.artifact, "--artifact")
    if not (artifact.is_prefix or artifact.key.endswith(".tar.gz")):
        raise UsageError(f"--artifact {spec.artifact} is neither a .tar.gz object nor a prefix ending in /",
                         hint="use s3://bucket/path/model.tar.gz, or s3://bucket/path/ for an uncompressed upload")
    host = HostingInstance.parse_any(spec.instance) if spec.image else HostingInstance.parse(spec.instance)
    image = _vllm_image(spec, host) if spec.container == "vllm" else _lmi_image(spec, host)
    container: dict = {"Image": image.uri}
    if artifact.is_prefix:
        container["ModelDataSource"] = {"S3DataSource": {"S3Uri": str(artifact), "S3DataType": "S3Prefix",
                                                         "CompressionType": "None"}}
    else:
        container["ModelDataUrl"] = str(artifact)
    if spec.environment:
        container["Environment"] = dict(spec.environment)
    call = ApiCall("create_model", {"ModelName": model_name, "ExecutionRoleArn": spec.role,
                                    "PrimaryContainer": container})
    return artifact, host, image, call


def _lmi_image(spec: EndpointSpec, host: HostingInstance) -> ImageChoice:
    """``--image`` or ``--lmi-version``, else the package's ``# lmi: image=`` line, else the table's default; checked
    against what the package's handler needs."""
    package = spec.package
    line = package.image if package is not None and not (spec.image or spec.lmi_version) else None
    if package is None or line is None:
        image = resolve_image(host, spec.region, spec.image, spec.lmi_version)
    else:
        asked_by = f"# lmi: image={line} in {package.source}"
        if line.name != FRAMEWORKS.get(host.kind):
            raise UsageError(f"{asked_by}: {spec.instance} runs {FRAMEWORKS.get(host.kind, 'no LMI image')}, not "
                             f"{line.name}", hint="render the directory for this instance type (lmi render), or "
                                                  "pass --lmi-version or --image")
        image = resolve_image(host, spec.region, lmi_version=line.version, asked_by=asked_by)
        image = replace(image, source=f"{image.source}, for {asked_by}")
    if package is not None:
        package.check_image(image)
    return image


def _vllm_image(spec: EndpointSpec, host: HostingInstance) -> ImageChoice:
    from ..containers.vllm.images import vllm_image

    if host.kind != "gpu" and not spec.image:
        raise UsageError(f"--instance {spec.instance}: AWS's vLLM container runs on NVIDIA GPU instances",
                         hint="use a GPU instance (ml.g5, ml.g6, ml.p4d...), or LMI's Neuron image (no --container)")
    if spec.lmi_version:
        raise UsageError("--lmi-version picks an LMI image; AWS's vLLM container takes --vllm-version")
    return vllm_image(spec.region, spec.image, spec.vllm_version)


def _variant(spec: EndpointSpec, host: HostingInstance) -> dict:
    variant = {"VariantName": VARIANT, "ModelName": spec.name, "InstanceType": spec.instance,
               "InitialInstanceCount": spec.instance_count,
               "ModelDataDownloadTimeoutInSeconds": spec.download_timeout,
               "ContainerStartupHealthCheckTimeoutInSeconds": spec.startup_timeout}
    return {**variant, **volume(spec, host)}


def volume(spec: EndpointSpec, host: HostingInstance) -> dict:
    """``VolumeSizeInGB`` where the instance takes one (EBS-only families), else nothing."""
    if host.accepts_volume_size:
        return {"VolumeSizeInGB": spec.volume_size or DEFAULT_VOLUME_GB}
    if spec.volume_size is not None:
        raise UsageError(f"--volume-size cannot be set on {spec.instance}: the {host.family} family has local NVMe "
                         "storage, which SageMaker uses instead of an EBS volume",
                         hint="drop --volume-size (see docs/sagemaker.md, 'Storage')")
    return {}


def validate_name_and_role(name: str, role: str, role_needs: str) -> None:
    """``--name`` and ``--role`` as SageMaker accepts them; ``role_needs`` says what the role must be allowed."""
    if not NAME.fullmatch(name):
        raise UsageError(f"--name {name!r} is not a valid SageMaker name",
                         hint="1-63 letters, digits and hyphens, starting with a letter or digit")
    if not ROLE_ARN.fullmatch(role):
        raise UsageError(f"--role {role!r} is not an IAM role ARN",
                         hint=f"arn:aws:iam::<account>:role/<name>, {role_needs}")


def validate(spec: EndpointSpec) -> None:
    validate_name_and_role(spec.name, spec.role, "a role SageMaker may assume with S3 and ECR read")
    for option, value, low, high in (("--download-timeout", spec.download_timeout, 60, 3600),
                                     ("--startup-timeout", spec.startup_timeout, 60, 3600),
                                     ("--instance-count", spec.instance_count, 1, 1000),
                                     ("--volume-size", spec.volume_size, 1, 512)):
        if value is not None and not low <= value <= high:
            raise UsageError(f"{option} {value} is out of range", hint=f"allowed: {low} to {high}")
    validate_environment(spec.environment)
    scaling = spec.autoscaling
    if scaling:
        scaling.validate()
        if not scaling.minimum <= spec.instance_count <= scaling.maximum:
            raise UsageError(f"--instance-count {spec.instance_count} is outside --autoscale "
                             f"{scaling.minimum}:{scaling.maximum}", hint="start within the bounds autoscaling keeps")


def validate_environment(environment: Mapping[str, str]) -> None:
    leaked = sorted(AWS_CREDENTIAL_ENV & set(environment))
    if leaked:
        raise UsageError(f"--env {leaked[0]}: AWS credentials must not be passed to the container",
                         hint="the endpoint acts with its execution role (--role); grant that role what it needs")
    if len(environment) > 100:
        raise UsageError(f"--env: {len(environment)} variables, SageMaker allows at most 100")
    for key, value in environment.items():
        if not key or len(key.encode()) > 1024 or len(value.encode()) > 1024:
            raise UsageError(f"--env {key[:40]!r}: names and values must be 1 to 1024 bytes")
    if sum(len(k.encode()) + len(v.encode()) for k, v in environment.items()) > 32 * 1024:
        raise UsageError("--env: the environment exceeds SageMaker's 32 KB limit")


# --- talking to AWS -------------------------------------------------------------------------------

def check_artifact(s3, artifact: S3Uri, region: str) -> None:
    """Fail now, not 20 minutes into endpoint creation: the artifact exists, in the endpoint's region, and a
    prefix holds no "folder" keys (SageMaker fails the deployment on them)."""
    with aws_errors(f"reading the location of bucket {artifact.bucket}"):
        constraint = s3.get_bucket_location(Bucket=artifact.bucket).get("LocationConstraint")
    location = LEGACY_LOCATIONS.get(constraint or "", constraint)
    if location != region:
        raise UsageError(f"bucket {artifact.bucket} is in {location}, the endpoint would be in {region}",
                         hint="SageMaker reads model data from its own region: upload there, or pass --region")
    if not artifact.is_prefix:
        try:
            with aws_errors(f"looking for {artifact}"):
                s3.head_object(Bucket=artifact.bucket, Key=artifact.key)
        except AwsError as exc:
            if exc.kind == "not-found":
                raise AwsError(f"{artifact} does not exist", hint="upload it first: lmi upload model.tar.gz "
                               f"s3://{artifact.bucket}/<prefix>/", code=exc.code, kind="not-found") from None
            raise
        return
    keys = list_keys(s3, artifact)
    if not keys:
        raise AwsError(f"{artifact} holds no objects", hint=f"upload the model directory first: lmi upload DIR "
                       f"{artifact}", code="NoSuchKey", kind="not-found")
    folders = [key for key in keys if key.endswith("/")]
    if folders:
        raise UsageError(f"{artifact} holds zero-byte folder keys ({folders[0]}...), on which SageMaker fails "
                         "the deployment", hint="delete them, or upload again to a new prefix with lmi upload")


def check_names_free(sm, name: str) -> None:
    """No model, endpoint config or endpoint called ``name`` exists yet (so nothing half-made is left behind)."""
    for what, method, param in (("model", "describe_model", "ModelName"),
                                ("endpoint config", "describe_endpoint_config", "EndpointConfigName"),
                                ("endpoint", "describe_endpoint", "EndpointName")):
        try:
            with aws_errors(f"checking for an existing {what} {name}"):
                getattr(sm, method)(**{param: name})
        except AwsError as exc:
            if exc.kind == "not-found":
                continue
            raise
        raise AwsError(f"a SageMaker {what} named {name} already exists", code="AlreadyExists", kind="in-use",
                       hint=f"choose another --name, or remove the old one: lmi delete {name} --config --model")


UNDO = {"create_model": ("delete_model", "ModelName"),
        "create_endpoint_config": ("delete_endpoint_config", "EndpointConfigName")}


def create(sm, plan: DeployPlan, on_step: Callable[[str], None] | None = None) -> str:
    """Make the plan's calls; returns the endpoint ARN. If a call fails, what this run created is deleted."""
    return create_all(sm, plan.calls, on_step).get("EndpointArn", "")


def create_all(sm, calls, on_step: Callable[[str], None] | None = None) -> dict:
    """Make ``calls`` in order; returns the last answer. If one fails, the models and endpoint configs made by the
    earlier ones are deleted (the error's hint says so)."""
    done: list[ApiCall] = []
    answer: dict = {}
    try:
        for call in calls:
            answer = run({"sagemaker": sm}, [call], on_step)[0]
            done.append(call)
    except AwsError as exc:
        undone = _undo(sm, done)
        if undone:
            exc.hint = f"{exc.hint + '; ' if exc.hint else ''}removed what this run created: {', '.join(undone)}"
        raise
    return answer


def _undo(sm, done: list[ApiCall]) -> list[str]:
    undone = []
    for call in reversed(done):
        if call.method not in UNDO:
            continue
        method, param = UNDO[call.method]
        try:
            with aws_errors(f"{method} {call.params[param]}"):
                getattr(sm, method)(**{param: call.params[param]})
            undone.append(f"{method.removeprefix('delete_').replace('_', ' ')} {call.params[param]}")
        except AwsError:
            pass  # best effort: the original error is the one to report
    return undone


def wait_in_service(sm, name: str, timeout_s: float = 3600, poll_s: float = 30,
                    on_status: StatusCallback | None = None, sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> dict:
    """Poll ``describe_endpoint`` until ``InService`` (returns the description); ``AwsError`` on a failed state
    (with SageMaker's FailureReason) or when ``timeout_s`` passes. ``on_status(status, elapsed_s)`` each poll."""
    def describe() -> dict:
        with aws_errors(f"describing endpoint {name}"):
            return sm.describe_endpoint(EndpointName=name)

    target = Waitable(f"endpoint {name}", describe, "EndpointStatus", "InService", FAILED_STATES,
                      failed_hint=f"the endpoint, its config and model stay for inspection; remove them with "
                                  f"lmi delete {name} --config --model",
                      timeout_hint=f"it keeps going (and billing): check it later with 'aws sagemaker "
                                   f"describe-endpoint --endpoint-name {name}', or lmi delete {name}")
    return wait_for(target, timeout_s, poll_s, on_status, sleep, clock)


def deploy(sm, s3, plan: DeployPlan, wait: bool = True, timeout_s: float = 3600, poll_s: float = 30,
           on_step: Callable[[str], None] | None = None, on_status: StatusCallback | None = None,
           check: bool = True, autoscaling=None) -> dict:
    """Check, create, and (``wait``) wait until InService, then apply the plan's autoscaling with the
    ``autoscaling`` client; returns the last ``describe_endpoint`` answer (or ``{"EndpointArn"}`` without waiting)."""
    if plan.scaling and not wait:
        raise UsageError("--autoscale needs --wait: the variant can be registered only once the endpoint is "
                         "InService", hint="drop --no-wait, or add autoscaling later")
    if check:
        check_artifact(s3, plan.artifact, plan.spec.region)
        check_names_free(sm, plan.spec.name)
    arn = create(sm, plan, on_step)
    if not wait:
        return {"EndpointArn": arn, "EndpointName": plan.spec.name}
    description = wait_in_service(sm, plan.spec.name, timeout_s, poll_s, on_status)
    run({AUTOSCALING: autoscaling}, plan.scaling, on_step)
    return description
