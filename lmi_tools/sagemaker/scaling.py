"""Autoscaling with Application Auto Scaling: a scalable target and one target-tracking policy per resource.

SageMaker scales two things (botocore's ``application-autoscaling`` service model, ``ScalableDimension``):

* an endpoint variant's instances, ``sagemaker:variant:DesiredInstanceCount`` on ``endpoint/<name>/variant/<v>``;
* an inference component's copies, ``sagemaker:inference-component:DesiredCopyCount`` on
  ``inference-component/<name>``.

The policy tracks a predefined metric (``--target-metric``): ``invocations`` per instance (or per copy) and
minute, or ``concurrency``, the high-resolution count of requests in flight per model (or per copy), which suits
LLMs whose requests last seconds. Cooldowns damp the loop: after scaling in, wait ``scale_in_cooldown`` seconds
before the next scale-in, so a short lull does not drop an instance that takes minutes to come back.

Removal (``teardown``): the policies first, then the targets. AWS deletes a target's policies when it is
deregistered; deleting them first leaves nothing behind if deregistering fails half way.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from .aws import aws_errors
from .calls import ApiCall

SERVICE = "application-autoscaling"
NAMESPACE = "sagemaker"
DIMENSIONS = {"variant": "sagemaker:variant:DesiredInstanceCount",
              "component": "sagemaker:inference-component:DesiredCopyCount"}
# --target-metric -> the predefined metric for each kind of scalable resource.
METRICS = {
    "invocations": {"variant": "SageMakerVariantInvocationsPerInstance",
                    "component": "SageMakerInferenceComponentInvocationsPerCopy"},
    "concurrency": {"variant": "SageMakerVariantConcurrentRequestsPerModelHighResolution",
                    "component": "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution"},
}
TARGET_MEANING = {"invocations": "invocations per minute per instance (per copy for a component)",
                  "concurrency": "requests in flight per model (per copy for a component)"}
POLICY_NAME = "lmi-{metric}-target-tracking"


@dataclass(frozen=True)
class Autoscaling:
    """``--autoscale MIN:MAX --target-metric M --target-value V``: instances of a variant, copies of a component."""

    minimum: int
    maximum: int
    target_value: float
    metric: str = "concurrency"
    scale_in_cooldown: int = 600
    scale_out_cooldown: int = 300

    @classmethod
    def parse(cls, bounds: str, metric: str, target_value: float | None, scale_in_cooldown: int = 600,
              scale_out_cooldown: int = 300) -> Autoscaling:
        low, sep, high = bounds.partition(":")
        if not (sep and low.strip().isdigit() and high.strip().isdigit()):
            raise UsageError(f"--autoscale {bounds!r} is not MIN:MAX", hint="e.g. --autoscale 1:4")
        if target_value is None:
            raise UsageError("--autoscale needs --target-value", hint="the value of --target-metric to hold: "
                             + "; ".join(f"{k}: {v}" for k, v in TARGET_MEANING.items()))
        scaling = cls(int(low), int(high), target_value, metric, scale_in_cooldown, scale_out_cooldown)
        scaling.validate()
        return scaling

    def validate(self) -> None:
        if self.metric not in METRICS:
            raise UsageError(f"--target-metric {self.metric!r} is not one of {', '.join(METRICS)}",
                             hint="; ".join(f"{k}: {v}" for k, v in TARGET_MEANING.items()))
        if not 1 <= self.minimum <= self.maximum:
            raise UsageError(f"--autoscale {self.minimum}:{self.maximum}: MIN must be at least 1 and at most MAX",
                             hint="scaling to zero is not offered: a component at 0 copies needs a CloudWatch alarm "
                                  "and a step-scaling policy to come back, which lmi does not create")
        if not self.target_value > 0:
            raise UsageError(f"--target-value {self.target_value} must be above 0", hint=TARGET_MEANING[self.metric])
        for option, value in (("--scale-in-cooldown", self.scale_in_cooldown),
                              ("--scale-out-cooldown", self.scale_out_cooldown)):
            if not 0 <= value <= 86400:
                raise UsageError(f"{option} {value} is out of range", hint="allowed: 0 to 86400 seconds")

    def calls(self, resource_id: str, kind: str) -> tuple[ApiCall, ApiCall]:
        """Register ``resource_id`` (a ``variant`` or a ``component``) and put the target-tracking policy on it."""
        target = {"ServiceNamespace": NAMESPACE, "ResourceId": resource_id, "ScalableDimension": DIMENSIONS[kind]}
        policy = {"TargetValue": float(self.target_value),
                  "PredefinedMetricSpecification": {"PredefinedMetricType": METRICS[self.metric][kind]},
                  "ScaleInCooldown": self.scale_in_cooldown, "ScaleOutCooldown": self.scale_out_cooldown}
        return (ApiCall("register_scalable_target", {**target, "MinCapacity": self.minimum,
                                                     "MaxCapacity": self.maximum}, SERVICE),
                ApiCall("put_scaling_policy", {"PolicyName": POLICY_NAME.format(metric=self.metric), **target,
                                               "PolicyType": "TargetTrackingScaling",
                                               "TargetTrackingScalingPolicyConfiguration": policy}, SERVICE))


def variant_resource(endpoint: str, variant: str) -> str:
    return f"endpoint/{endpoint}/variant/{variant}"


def component_resource(component: str) -> str:
    return f"inference-component/{component}"


def teardown(autoscaling, resource_ids: list[str]) -> list[ApiCall]:
    """The calls that remove every scaling policy and scalable target on ``resource_ids`` (looked up now)."""
    if not resource_ids:
        return []
    with aws_errors("looking up scalable targets"):
        targets = _pages(autoscaling, "describe_scalable_targets", "ScalableTargets", ServiceNamespace=NAMESPACE,
                         ResourceIds=resource_ids)
    calls = []
    for target in targets:
        key = {"ServiceNamespace": NAMESPACE, "ResourceId": target["ResourceId"],
               "ScalableDimension": target["ScalableDimension"]}
        with aws_errors(f"looking up the scaling policies of {target['ResourceId']}"):
            policies = _pages(autoscaling, "describe_scaling_policies", "ScalingPolicies", **key)
        calls += [ApiCall("delete_scaling_policy", {"PolicyName": p["PolicyName"], **key}, SERVICE) for p in policies]
        calls.append(ApiCall("deregister_scalable_target", key, SERVICE))
    return calls


def _pages(client, method: str, key: str, **params) -> list[dict]:
    found, token = [], None
    while True:
        answer = getattr(client, method)(**params, **({"NextToken": token} if token else {}))
        found += answer.get(key, [])
        token = answer.get("NextToken")
        if not token:
            return found
