"""Tear down an endpoint and, on request, its endpoint config, its model(s) and their S3 artifacts.

Names are recovered before anything is deleted: the config from ``describe_endpoint``, the models from the
config's ``ProductionVariants``, the artifacts from each model's ``ModelDataUrl`` (one object) or
``ModelDataSource.S3DataSource.S3Uri`` (a prefix: every object under it). The order is endpoint, config,
models, artifacts; config and model deletion need not wait for the endpoint to be gone
(reference/sagemaker.md §2.3). When the endpoint no longer exists (a deployment that failed half way), the
config and model are looked up under the endpoint's name, which is how ``lmi deploy`` names them.

Before the endpoint go its autoscaling (policies, then scalable targets: ``scaling.py``) and, on an endpoint of
inference components (a variant without a model), every component, waited for until gone; their models count
as the endpoint's models. ``plan_component_teardown`` removes one component (and its scaling) and leaves the
endpoint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ..errors import AwsError, UsageError
from .aws import aws_errors
from .calls import ApiCall, run
from .components import describe_component, list_components, wait_component_gone
from .scaling import SERVICE as AUTOSCALING
from .scaling import component_resource, teardown, variant_resource
from .upload import S3Uri, delete_keys, list_keys


@dataclass
class Teardown:
    """What ``delete`` will remove; empty fields are left alone."""

    endpoint: str | None = None
    config: str | None = None
    models: list[str] = field(default_factory=list)
    artifacts: list[S3Uri] = field(default_factory=list)
    #: Application Auto Scaling calls removing policies and scalable targets (made first).
    scaling: list[ApiCall] = field(default_factory=list)
    #: Inference components (deleted, and waited for, before the endpoint).
    components: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        return {"scaling": [f"{call.method} {call.subject}" for call in self.scaling],
                "components": self.components, "endpoint": self.endpoint, "endpoint_config": self.config,
                "models": self.models, "artifacts": [str(uri) for uri in self.artifacts]}


def _describe(sm, method: str, **params) -> dict | None:
    """The description, or None when the resource does not exist."""
    try:
        with aws_errors(f"{method.replace('_', ' ')} {next(iter(params.values()))}"):
            return getattr(sm, method)(**params)
    except AwsError as exc:
        if exc.kind == "not-found":
            return None
        raise


def plan_teardown(sm, endpoint: str, config: bool = False, model: bool = False,
                  artifacts: bool = False, autoscaling=None) -> Teardown:
    """Look up the names to delete (read-only calls); ``AwsError`` when nothing called ``endpoint`` exists.
    With the ``autoscaling`` client, the endpoint's scaling policies and targets are removed first."""
    plan = Teardown()
    found = _describe(sm, "describe_endpoint", EndpointName=endpoint)
    config_name = found["EndpointConfigName"] if found else endpoint
    plan.endpoint = endpoint if found else None
    config_description = _describe(sm, "describe_endpoint_config", EndpointConfigName=config_name)
    if found is None and (config_description is None or not (config or model or artifacts)):
        raise AwsError(f"no endpoint {endpoint} exists" + ("" if config or model else " (nothing to delete)"),
                       hint="list endpoints with 'aws sagemaker list-endpoints'; check --region",
                       code="ValidationException", kind="not-found")
    if config and config_description:
        plan.config = config_name
    variants = (config_description or {}).get("ProductionVariants", [])
    names = [v["ModelName"] for v in variants if v.get("ModelName")]
    resources = [variant_resource(endpoint, v["VariantName"]) for v in variants] if found else []
    if found and any(not v.get("ModelName") for v in variants):  # an endpoint of inference components
        for summary in list_components(sm, endpoint):
            name = summary["InferenceComponentName"]
            plan.components.append(name)
            resources.append(component_resource(name))
            names.append(_model_of(describe_component(sm, name)))
    if autoscaling is not None:
        plan.scaling = teardown(autoscaling, resources)
    _add_models(sm, plan, names, model, artifacts)
    return plan


def plan_component_teardown(sm, component: str, model: bool = False, artifacts: bool = False,
                            autoscaling=None) -> Teardown:
    """One inference component, its scaling and, on request, its model and the model's data; the endpoint stays."""
    description = describe_component(sm, component)
    plan = Teardown(components=[component])
    if autoscaling is not None:
        plan.scaling = teardown(autoscaling, [component_resource(component)])
    _add_models(sm, plan, [_model_of(description)], model, artifacts)
    return plan


def _model_of(component: dict) -> str:
    """The component's model ("" when it was made from a container spec, not a model: nothing to delete)."""
    return component.get("Specification", {}).get("ModelName", "")


def _add_models(sm, plan: Teardown, names: list[str], model: bool, artifacts: bool) -> None:
    """The models named (with ``model``) and their S3 data (with ``artifacts``), where they still exist."""
    if not (model or artifacts):
        return
    for name in dict.fromkeys(filter(None, names)):
        description = _describe(sm, "describe_model", ModelName=name)
        if description is None:
            continue
        if model:
            plan.models.append(name)
        if artifacts:
            plan.artifacts.extend(model_artifacts(description))
    whole_bucket = next((uri for uri in plan.artifacts if not uri.key), None)
    if whole_bucket:
        raise UsageError(f"model data {whole_bucket} is a whole bucket; refusing to empty it",
                         hint="delete the objects yourself, or drop --artifacts")


def model_artifacts(description: dict) -> list[S3Uri]:
    """The S3 locations a model's containers load from (tarball objects and uncompressed prefixes)."""
    containers = [description["PrimaryContainer"]] if description.get("PrimaryContainer") else []
    containers += description.get("Containers", [])
    found = []
    for container in containers:
        source = (container.get("ModelDataSource") or {}).get("S3DataSource") or {}
        uri = container.get("ModelDataUrl") or source.get("S3Uri")
        if uri and uri.startswith("s3://"):
            found.append(S3Uri.parse(uri))
    return found


def delete(sm, s3, plan: Teardown, on_step: Callable[[str], None] | None = None, autoscaling=None,
           poll_s: float = 15, sleep: Callable[[float], None] = time.sleep) -> None:
    """Delete what ``plan`` names, in order; ``on_step(message)`` after each deletion. ``autoscaling`` is the
    Application Auto Scaling client (needed when the plan removes scaling)."""
    step = on_step or (lambda _: None)
    run({AUTOSCALING: autoscaling}, plan.scaling, step)
    for name in plan.components:
        with aws_errors(f"deleting inference component {name}"):
            sm.delete_inference_component(InferenceComponentName=name)
        step(f"deleting inference component {name}")
    for name in plan.components:
        wait_component_gone(sm, name, poll_s, sleep=sleep)
        step(f"deleted inference component {name}")
    if plan.endpoint:
        with aws_errors(f"deleting endpoint {plan.endpoint}"):
            sm.delete_endpoint(EndpointName=plan.endpoint)
        step(f"deleted endpoint {plan.endpoint}")
    if plan.config:
        with aws_errors(f"deleting endpoint config {plan.config}"):
            sm.delete_endpoint_config(EndpointConfigName=plan.config)
        step(f"deleted endpoint config {plan.config}")
    for name in plan.models:
        with aws_errors(f"deleting model {name}"):
            sm.delete_model(ModelName=name)
        step(f"deleted model {name}")
    for uri in plan.artifacts:
        keys = list_keys(s3, uri) if uri.is_prefix else [uri.key]
        delete_keys(s3, uri.bucket, keys)
        step(f"deleted {len(keys)} object(s) at {uri}")
