"""Inference components: several models on one endpoint, each with its own accelerators, memory and copies.

An endpoint of inference components is an instance pool: its config's variant names an instance type and count
but no model (and the config carries the execution role). Each model is then a component on it
(``create_inference_component``): the model, ``ComputeResourceRequirements`` per copy, and a copy count that
Application Auto Scaling can change (``scaling.py``). Invocations name the component
(``InferenceComponentName``, sent as ``X-Amzn-SageMaker-Inference-Component``). Parking a model is scaling its
component in; switching the model an endpoint serves is adding one component and deleting another.

LoRA adapters are components of their own on a base component (``plan_adapters``): each names the base
(``BaseInferenceComponentName``) and its adapter's artifact (a tar.gz of the adapter's folder), takes no
accelerators of its own, and is called by its name like any component; SageMaker hands the container the adapter
and, per request, its name in ``X-Amzn-SageMaker-Adapter-Identifier``.

Sizing comes from ``lmi validate``: the model directory that was packaged is validated on the instance type,
its TP degree is the number of accelerators per copy (NeuronCores on inf2/trn1, GPUs on G5, the unit
``lmi_tools/instances.py`` counts), and the host RAM to load one copy is its memory. A plan whose copies cannot
fit the instances is refused before any AWS call.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import AwsError, UsageError, ValidationFailed
from ..instances import Instance, lookup
from .aws import aws_errors
from .calls import ApiCall, run
from .deploy import (VARIANT, EndpointSpec, check_artifact, create_all, model_call, validate,
                     volume, wait_in_service)
from .polling import StatusCallback, Waitable, wait_for
from .scaling import SERVICE as AUTOSCALING
from .scaling import component_resource
from .upload import S3Uri

MIB = 1024**2
#: Floor for MinMemoryRequiredInMb: the container's Python, tokenizer and server need room besides the weights
#: (our choice; the API's own minimum is 128).
MIN_MEMORY_MB = 1024
COMPONENT_FAILED = frozenset({"Failed"})
#: SageMaker's resource names (``InferenceComponentName``).
NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")


@dataclass(frozen=True)
class Resources:
    """What one copy needs: accelerators (NeuronCores or GPUs) and host memory."""

    accelerators: int
    memory_mb: int
    #: Where the figures come from, for the plan's printout.
    source: str = "given"

    def as_params(self) -> dict:
        return {"NumberOfAcceleratorDevicesRequired": float(self.accelerators), "MinMemoryRequiredInMb": self.memory_mb}


def size_model(model_dir: str | Path, instance: str) -> Resources:
    """Validate ``model_dir`` on ``instance`` as ``lmi validate`` does; its TP degree and the host RAM to load one
    copy size a copy. ``ValidationFailed`` when validate reports an error."""
    from ..validation.checks import run_checks
    from ..validation.findings import flag
    from ..validation.fit import copies, loading_bytes
    from ..validation.validate import load_target

    target, findings = load_target(Path(model_dir), instance, None)
    findings += run_checks(target)
    errors = [f for f in findings if f.level == "error"]
    if errors:
        raise ValidationFailed(f"{model_dir} fails lmi validate on {instance}: {errors[0].message}",
                               hint=errors[0].hint or f"run: lmi validate {model_dir} --instance {instance}")
    per_copy = 0
    if target.arch is not None and target.config is not None:
        per_copy = loading_bytes(target) // (copies(target) if flag(target.props, "parallel_loading") else 1)
    memory_mb = max(MIN_MEMORY_MB, math.ceil(per_copy / MIB))
    return Resources(target.tp, memory_mb, f"lmi validate {model_dir}: TP {target.tp}, {memory_mb} MiB to load")


@dataclass(frozen=True)
class ComponentSpec:
    """A model as component ``component`` on the endpoint ``endpoint.name``; ``endpoint`` also says how to create
    that endpoint if it does not exist (instance type and count), and ``endpoint.autoscaling`` scales copies."""

    endpoint: EndpointSpec
    component: str
    resources: Resources
    copies: int = 1


@dataclass(frozen=True)
class ComponentPlan:
    spec: ComponentSpec
    #: Made only when no endpoint of that name exists yet.
    endpoint_calls: tuple[ApiCall, ...]
    calls: tuple[ApiCall, ...]
    scaling: tuple[ApiCall, ...]
    image: str

    def as_json(self) -> dict:
        name, component = self.spec.endpoint.name, self.spec.component
        plan = {"region": self.spec.endpoint.region, "image": self.image,
                "sizing": self.spec.resources.source,
                "if_endpoint_missing": [call.as_json() for call in self.endpoint_calls],
                "then": f"describe_endpoint(EndpointName={name!r}) until InService",
                "calls": [call.as_json() for call in self.calls],
                "then_component": f"describe_inference_component(InferenceComponentName={component!r}) until "
                                  "InService"}
        if self.scaling:
            plan["when_in_service"] = [call.as_json() for call in self.scaling]
        return plan


def check_fit(spec: ComponentSpec, instance: Instance) -> None:
    """Refuse copies that cannot fit: one copy on one instance, and the initial copies on the instances."""
    need, unit = spec.resources, "NeuronCores" if instance.kind == "neuron" else "GPUs"
    if need.accelerators < 1 or need.memory_mb < 128:
        raise UsageError(f"--accelerators {need.accelerators} / --memory-mb {need.memory_mb}: a copy needs at least "
                         "1 accelerator and 128 MiB", hint="SageMaker's minimums for ComputeResourceRequirements")
    if need.accelerators > instance.cores:
        raise UsageError(f"a copy of {spec.component} needs {need.accelerators} {unit}; {instance.name} has "
                         f"{instance.cores}", hint="pick a larger instance type, or a smaller TP degree")
    if need.memory_mb > instance.host_memory_gib * 1024:
        raise UsageError(f"a copy of {spec.component} needs {need.memory_mb} MiB of host memory; {instance.name} "
                         f"has {instance.host_memory_gib} GiB", hint="pick an instance type with more memory")
    per_instance = instance.cores // need.accelerators
    count = spec.endpoint.instance_count
    if spec.copies > per_instance * count:
        raise UsageError(f"--copies {spec.copies} of {need.accelerators} {unit} each need "
                         f"{spec.copies * need.accelerators} {unit}; {count} x {instance.name} have "
                         f"{count * instance.cores}",
                         hint=f"at most {per_instance * count} copies fit; raise --instance-count or lower --copies")


def plan_component(spec: ComponentSpec) -> ComponentPlan:
    """The calls for ``spec`` (no AWS call); ``UsageError`` for a bad field or copies that cannot fit."""
    endpoint = spec.endpoint
    validate(endpoint)
    if not 1 <= spec.copies <= 1000:
        raise UsageError(f"--copies {spec.copies} is out of range", hint="allowed: 1 to 1000")
    scaling = endpoint.autoscaling
    if scaling and not scaling.minimum <= spec.copies <= scaling.maximum:
        raise UsageError(f"--copies {spec.copies} is outside --autoscale {scaling.minimum}:{scaling.maximum}",
                         hint="start within the bounds autoscaling keeps")
    instance = lookup(endpoint.instance)
    check_fit(spec, instance)
    _, host, image, model = model_call(endpoint, spec.component)
    variant = {"VariantName": VARIANT, "InstanceType": endpoint.instance,
               "InitialInstanceCount": endpoint.instance_count,
               "RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}, **volume(endpoint, host)}
    if scaling:  # room for the most copies: SageMaker adds and removes instances as copies need them
        most = max(endpoint.instance_count,
                   math.ceil(scaling.maximum / (instance.cores // spec.resources.accelerators)))
        variant["ManagedInstanceScaling"] = {"Status": "ENABLED", "MinInstanceCount": endpoint.instance_count,
                                             "MaxInstanceCount": most}
    endpoint_calls = (ApiCall("create_endpoint_config", {"EndpointConfigName": endpoint.name,
                                                         "ExecutionRoleArn": endpoint.role,
                                                         "ProductionVariants": [variant]}),
                      ApiCall("create_endpoint", {"EndpointName": endpoint.name,
                                                  "EndpointConfigName": endpoint.name}))
    component = ApiCall("create_inference_component", {
        "InferenceComponentName": spec.component, "EndpointName": endpoint.name, "VariantName": VARIANT,
        "Specification": {"ModelName": spec.component,
                          "StartupParameters": {"ModelDataDownloadTimeoutInSeconds": endpoint.download_timeout,
                                                "ContainerStartupHealthCheckTimeoutInSeconds":
                                                    endpoint.startup_timeout},
                          "ComputeResourceRequirements": spec.resources.as_params()},
        "RuntimeConfig": {"CopyCount": spec.copies}})
    scaling_calls = scaling.calls(component_resource(spec.component), "component") if scaling else ()
    return ComponentPlan(spec, endpoint_calls, (model, component), scaling_calls, image.uri)


def plan_adapters(endpoint: str, base: str, adapters: dict[str, str]) -> tuple[ApiCall, ...]:
    """One adapter component per ``name -> s3://.../adapter.tar.gz`` on the component ``base`` of ``endpoint``."""
    calls = []
    for name, uri in adapters.items():
        if not NAME.fullmatch(name) or name == base:
            raise UsageError(f"--adapter {name}={uri}: {name!r} is not a component name of its own",
                             hint="1-63 letters, digits and hyphens, not the base component's name")
        S3Uri.parse(uri, f"--adapter {name}")
        calls.append(ApiCall("create_inference_component", {
            "InferenceComponentName": name, "EndpointName": endpoint,
            "Specification": {"BaseInferenceComponentName": base, "Container": {"ArtifactUrl": uri}}}))
    return tuple(calls)


def deploy_adapters(sm, calls: tuple[ApiCall, ...], timeout_s: float = 3600, poll_s: float = 30,
                    on_step: Callable[[str], None] | None = None, on_status: StatusCallback | None = None) -> list[dict]:
    """Create the adapter components, then wait for each until InService; their last descriptions."""
    create_all(sm, calls, on_step)
    return [wait_component(sm, call.params["InferenceComponentName"], timeout_s, poll_s, on_status)
            for call in calls]


# --- talking to AWS -------------------------------------------------------------------------------

def describe_component(sm, name: str) -> dict:
    with aws_errors(f"describing inference component {name}"):
        return sm.describe_inference_component(InferenceComponentName=name)


def list_components(sm, endpoint: str) -> list[dict]:
    """The summaries of every inference component on ``endpoint``."""
    found, token = [], None
    while True:
        with aws_errors(f"listing the inference components of {endpoint}"):
            answer = sm.list_inference_components(EndpointNameEquals=endpoint, **({"NextToken": token} if token
                                                                                  else {}))
        found += answer.get("InferenceComponents", [])
        token = answer.get("NextToken")
        if not token:
            return found


def components_table(sm, endpoint: str) -> list[dict]:
    """One row per component: name, status, model, copies (desired / current), accelerators and memory per copy."""
    rows = []
    for summary in list_components(sm, endpoint):
        description = describe_component(sm, summary["InferenceComponentName"])
        specification, runtime = description.get("Specification", {}), description.get("RuntimeConfig", {})
        needs = specification.get("ComputeResourceRequirements", {})
        rows.append({"component": description["InferenceComponentName"],
                     "status": description["InferenceComponentStatus"], "model": specification.get("ModelName"),
                     "copies": runtime.get("DesiredCopyCount"), "current_copies": runtime.get("CurrentCopyCount"),
                     "accelerators": needs.get("NumberOfAcceleratorDevicesRequired"),
                     "memory_mb": needs.get("MinMemoryRequiredInMb"),
                     **({"failure": description["FailureReason"]} if description.get("FailureReason") else {})})
    return rows


def component_exists(sm, name: str) -> bool:
    try:
        describe_component(sm, name)
    except AwsError as exc:
        if _not_found(exc):
            return False
        raise
    return True


def _not_found(exc: AwsError) -> bool:
    return exc.kind == "not-found"


def wait_component(sm, name: str, timeout_s: float = 3600, poll_s: float = 30,
                   on_status: StatusCallback | None = None, sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.monotonic) -> dict:
    """Poll ``describe_inference_component`` until InService; ``AwsError`` on Failed (with the reason) or timeout."""
    target = Waitable(f"inference component {name}", lambda: describe_component(sm, name), "InferenceComponentStatus",
                      "InService", COMPONENT_FAILED,
                      failed_hint=f"it stays for inspection; remove it with lmi delete --component {name} --model",
                      timeout_hint="it keeps going: check it with lmi components ENDPOINT")
    return wait_for(target, timeout_s, poll_s, on_status, sleep, clock)


def wait_component_gone(sm, name: str, poll_s: float = 15, timeout_s: float = 1800,
                        sleep: Callable[[float], None] = time.sleep) -> None:
    waited = 0.0
    while waited <= timeout_s:
        try:
            describe_component(sm, name)
        except AwsError as exc:
            if _not_found(exc):
                return
            raise
        sleep(poll_s)
        waited += poll_s
    raise AwsError(f"inference component {name} is still there after {timeout_s:.0f} s", code="WaitTimeout",
                   kind="timeout", hint="run lmi delete again later")


def _endpoint_state(sm, spec: ComponentSpec) -> dict | None:
    """The endpoint's description if it exists (and hosts components on the right instance type), else None."""
    name = spec.endpoint.name
    try:
        with aws_errors(f"describing endpoint {name}"):
            found = sm.describe_endpoint(EndpointName=name)
    except AwsError as exc:
        if _not_found(exc):
            return None
        raise
    with aws_errors(f"describing endpoint config {found['EndpointConfigName']}"):
        variants = sm.describe_endpoint_config(EndpointConfigName=found["EndpointConfigName"])["ProductionVariants"]
    if any(v.get("ModelName") for v in variants):
        raise UsageError(f"endpoint {name} serves a model directly, not inference components",
                         hint="deploy the component onto a new endpoint (another --name)")
    types = {v.get("InstanceType") for v in variants}
    if spec.endpoint.instance not in types:
        raise UsageError(f"--instance {spec.endpoint.instance}: endpoint {name} runs {', '.join(sorted(types))}",
                         hint="size the component for the endpoint's instance type")
    return found


def deploy_component(sm, s3, plan: ComponentPlan, autoscaling=None, timeout_s: float = 3600, poll_s: float = 30,
                     on_step: Callable[[str], None] | None = None, on_status: StatusCallback | None = None,
                     check: bool = True) -> dict:
    """Create the endpoint if missing (and wait), the model and the component (and wait), then the component's
    autoscaling; returns the last ``describe_inference_component`` answer."""
    spec = plan.spec
    if check:
        check_artifact(s3, S3Uri.parse(spec.endpoint.artifact), spec.endpoint.region)
        _check_component_free(sm, spec.component)
    if _endpoint_state(sm, spec) is None:
        create_all(sm, plan.endpoint_calls, on_step)
    wait_in_service(sm, spec.endpoint.name, timeout_s, poll_s, on_status)
    create_all(sm, plan.calls, on_step)
    description = wait_component(sm, spec.component, timeout_s, poll_s, on_status)
    run({AUTOSCALING: autoscaling}, plan.scaling, on_step)
    return description


def _check_component_free(sm, name: str) -> None:
    for what, method, param in (("inference component", "describe_inference_component", "InferenceComponentName"),
                                ("model", "describe_model", "ModelName")):
        try:
            with aws_errors(f"checking for an existing {what} {name}"):
                getattr(sm, method)(**{param: name})
        except AwsError as exc:
            if _not_found(exc):
                continue
            raise
        raise AwsError(f"a SageMaker {what} named {name} already exists", code="AlreadyExists", kind="in-use",
                       hint=f"choose another --component, or remove the old one: lmi delete --component {name} "
                            "--model")


def scale_component(sm, name: str, copies: int, wait: bool = True, timeout_s: float = 3600, poll_s: float = 30,
                    on_status: StatusCallback | None = None) -> dict:
    """Set the component's copy count (``update_inference_component_runtime_config``) and wait until InService."""
    if not 0 <= copies <= 1000:
        raise UsageError(f"--copies {copies} is out of range", hint="allowed: 0 (park the model) to 1000")
    with aws_errors(f"scaling inference component {name}"):
        sm.update_inference_component_runtime_config(InferenceComponentName=name,
                                                     DesiredRuntimeConfig={"CopyCount": copies})
    return wait_component(sm, name, timeout_s, poll_s, on_status) if wait else describe_component(sm, name)
