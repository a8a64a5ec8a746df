"""Two models as inference components on one endpoint, end to end and offline.

The tiny model is packaged (validated, runtime vendored) and uploaded twice to moto's S3; ``lmi validate`` sizes
a copy; two components are deployed on one new endpoint (one with autoscaling); the test plays SageMaker (reads
each component's model data from S3 and serves both with ``lmi serve --endpoint pool``), invokes each by
component name through a real boto3 ``sagemaker-runtime`` client, plain and streamed, scales one, and tears
everything down. The control-plane calls (SageMaker, Application Auto Scaling) go to botocore Stubbers, since
moto emulates neither inference components nor their scaling; every request is recorded, and the test checks
that each resource the deploy created is deleted by the teardown.
"""

from __future__ import annotations

import datetime
import re
import shutil
from dataclasses import replace

import boto3
import httpx
import pytest
from botocore.stub import Stubber

from lmi_tools.packaging.artifact import unpack
from lmi_tools.packaging.package import build
from lmi_tools.sagemaker import components as lib
from lmi_tools.sagemaker import invoke as invoke_lib
from lmi_tools.sagemaker.delete import delete, plan_teardown
from lmi_tools.sagemaker.deploy import EndpointSpec
from lmi_tools.sagemaker.scaling import Autoscaling
from lmi_tools.sagemaker.upload import S3Uri, plan_upload, upload

BUCKET = "lmi-components-e2e"
ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
ARN = "arn:aws:sagemaker:us-east-1:123456789012:"
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
INSTANCE = "ml.g5.12xlarge"  # 4 GPUs: chat (1 copy, up to 2) and code (2 copies) of 1 GPU each
PROMPT, PARAMETERS = "The quick brown fox", {"max_new_tokens": 12}
SERVING_PROPERTIES = ("engine=Python\noption.entryPoint=lmi_handlers.entrypoint\noption.rolling_batch=scheduler\n"
                      "option.tensor_parallel_degree=1\noption.max_new_tokens=12\n")
CREATES = {"create_endpoint_config": ("delete_endpoint_config", "EndpointConfigName"),
           "create_endpoint": ("delete_endpoint", "EndpointName"), "create_model": ("delete_model", "ModelName"),
           "create_inference_component": ("delete_inference_component", "InferenceComponentName"),
           "register_scalable_target": ("deregister_scalable_target", "ResourceId"),
           "put_scaling_policy": ("delete_scaling_policy", "PolicyName")}


@pytest.fixture(scope="module")
def moto_s3():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    server.stop()


class ControlPlane:
    """Stubbed SageMaker and Application Auto Scaling clients that record every request they get."""

    def __init__(self):
        self.sm = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="testing",
                               aws_secret_access_key="testing")
        self.scaler = boto3.client("application-autoscaling", region_name="us-east-1", aws_access_key_id="testing",
                                   aws_secret_access_key="testing")
        self.stubs = {"sm": Stubber(self.sm), "scaler": Stubber(self.scaler)}
        self.sent: list[tuple[str, dict]] = []
        for client in (self.sm, self.scaler):
            client.meta.events.register("provide-client-params.*.*", self._record)

    def _record(self, params, model, **_):
        self.sent.append((model.name, params))

    def expect(self, client: str, method: str, response: dict, params: dict) -> None:
        self.stubs[client].add_response(method, response, params)

    def missing(self, method: str, params: dict) -> None:
        self.stubs["sm"].add_client_error(method, "ValidationException", "Could not find it.", 400,
                                          expected_params=params)


def endpoint_description(status: str) -> dict:
    return {"EndpointName": "pool", "EndpointArn": ARN + "endpoint/pool", "EndpointConfigName": "pool",
            "EndpointStatus": status, "CreationTime": NOW, "LastModifiedTime": NOW}


def component(name: str, status: str, copies: int) -> dict:
    return {"InferenceComponentName": name, "InferenceComponentArn": ARN + f"inference-component/{name}",
            "EndpointName": "pool", "EndpointArn": ARN + "endpoint/pool", "VariantName": "AllTraffic",
            "InferenceComponentStatus": status, "CreationTime": NOW, "LastModifiedTime": NOW,
            "Specification": {"ModelName": name}, "RuntimeConfig": {"DesiredCopyCount": copies,
                                                                    "CurrentCopyCount": copies}}


def expect_deploy(aws: ControlPlane, plan: lib.ComponentPlan, endpoint_exists: bool) -> None:
    name = plan.spec.component
    aws.missing("describe_inference_component", {"InferenceComponentName": name})
    aws.missing("describe_model", {"ModelName": name})
    config = {"EndpointConfigName": "pool", "EndpointConfigArn": ARN + "endpoint-config/pool", "CreationTime": NOW,
              "ProductionVariants": [{"VariantName": "AllTraffic", "InstanceType": INSTANCE}]}
    if endpoint_exists:
        aws.expect("sm", "describe_endpoint", endpoint_description("InService"), {"EndpointName": "pool"})
        aws.expect("sm", "describe_endpoint_config", config, {"EndpointConfigName": "pool"})
    else:
        aws.missing("describe_endpoint", {"EndpointName": "pool"})
        aws.expect("sm", "create_endpoint_config", {"EndpointConfigArn": ARN + "x"}, plan.endpoint_calls[0].params)
        aws.expect("sm", "create_endpoint", {"EndpointArn": ARN + "endpoint/pool"}, plan.endpoint_calls[1].params)
    aws.expect("sm", "describe_endpoint", endpoint_description("InService"), {"EndpointName": "pool"})
    aws.expect("sm", "create_model", {"ModelArn": ARN + "model/x"}, plan.calls[0].params)
    aws.expect("sm", "create_inference_component", {"InferenceComponentArn": ARN + "x"}, plan.calls[1].params)
    aws.expect("sm", "describe_inference_component", component(name, "InService", plan.spec.copies),
               {"InferenceComponentName": name})
    for call in plan.scaling:
        aws.expect("scaler", call.method, {"PolicyARN": ARN + "policy", "Alarms": []}
                   if call.method == "put_scaling_policy" else {}, call.params)


def expect_teardown(aws: ControlPlane, artifacts: dict[str, str]) -> None:
    aws.expect("sm", "describe_endpoint", endpoint_description("InService"), {"EndpointName": "pool"})
    aws.expect("sm", "describe_endpoint_config", {
        "EndpointConfigName": "pool", "EndpointConfigArn": ARN + "x", "CreationTime": NOW,
        "ProductionVariants": [{"VariantName": "AllTraffic", "InstanceType": INSTANCE}]}, {"EndpointConfigName": "pool"})
    summaries = [{k: v for k, v in component(n, "InService", 1).items() if k not in ("Specification", "RuntimeConfig")}
                 for n in artifacts]
    aws.expect("sm", "list_inference_components", {"InferenceComponents": summaries}, {"EndpointNameEquals": "pool"})
    for name in artifacts:
        aws.expect("sm", "describe_inference_component", component(name, "InService", 1),
                   {"InferenceComponentName": name})
    chat = {"ServiceNamespace": "sagemaker", "ResourceId": "inference-component/chat",
            "ScalableDimension": "sagemaker:inference-component:DesiredCopyCount"}
    aws.expect("scaler", "describe_scalable_targets", {"ScalableTargets": [
        {**chat, "MinCapacity": 1, "MaxCapacity": 2, "RoleARN": ROLE, "CreationTime": NOW}]},
        {"ServiceNamespace": "sagemaker", "ResourceIds": ["endpoint/pool/variant/AllTraffic",
                                                          *(f"inference-component/{n}" for n in artifacts)]})
    aws.expect("scaler", "describe_scaling_policies", {"ScalingPolicies": [
        {"PolicyARN": ARN + "policy", "PolicyName": "lmi-concurrency-target-tracking",
         "PolicyType": "TargetTrackingScaling", "CreationTime": NOW, **chat}]}, chat)
    for name, uri in artifacts.items():
        aws.expect("sm", "describe_model", {"ModelName": name, "ModelArn": ARN + "x", "CreationTime": NOW,
                                            "PrimaryContainer": {"ModelDataUrl": uri}}, {"ModelName": name})
    aws.expect("scaler", "delete_scaling_policy", {}, {"PolicyName": "lmi-concurrency-target-tracking", **chat})
    aws.expect("scaler", "deregister_scalable_target", {}, chat)
    for name in artifacts:
        aws.expect("sm", "delete_inference_component", {}, {"InferenceComponentName": name})
    for name in artifacts:
        aws.missing("describe_inference_component", {"InferenceComponentName": name})
    aws.expect("sm", "delete_endpoint", {}, {"EndpointName": "pool"})
    aws.expect("sm", "delete_endpoint_config", {}, {"EndpointConfigName": "pool"})
    for name in artifacts:
        aws.expect("sm", "delete_model", {}, {"ModelName": name})


def predictions_text(server, name: str) -> str:
    answer = httpx.post(f"{server.url}/predictions/{name}", json={"inputs": PROMPT, "parameters": PARAMETERS},
                        timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()["generated_text"]


def test_two_components_deploy_invoke_scale_and_teardown(moto_s3, tiny_model_dir, serve, tmp_path):
    s3, aws = moto_s3, ControlPlane()
    s3.create_bucket(Bucket=BUCKET)
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    (model_dir / "serving.properties").write_text(SERVING_PROPERTIES)
    build(model_dir, tmp_path / "model.tar.gz", None, instance=INSTANCE.removeprefix("ml."))
    artifacts = {name: str(upload(s3, plan_upload(tmp_path / "model.tar.gz", f"s3://{BUCKET}/{name}/")).uri)
                 for name in ("chat", "code")}

    resources = lib.size_model(model_dir, INSTANCE)  # lmi validate: TP 1, so one GPU per copy
    assert resources.accelerators == 1 and resources.memory_mb == lib.MIN_MEMORY_MB
    endpoint = EndpointSpec(artifact=artifacts["chat"], instance=INSTANCE, role=ROLE, name="pool",
                            region="us-east-1", autoscaling=Autoscaling(1, 2, 4.0))
    plans = [lib.plan_component(lib.ComponentSpec(endpoint, "chat", resources)),
             lib.plan_component(lib.ComponentSpec(replace(endpoint, artifact=artifacts["code"], autoscaling=None),
                                                  "code", resources, 2))]
    for plan, exists in zip(plans, (False, True)):
        expect_deploy(aws, plan, exists)
    with aws.stubs["sm"], aws.stubs["scaler"]:
        for plan in plans:
            lib.deploy_component(aws.sm, s3, plan, aws.scaler, poll_s=0)

        # SageMaker's part: each component's model data, downloaded and untarred, served under the endpoint.
        served = []
        for name, uri in artifacts.items():
            location = S3Uri.parse(uri)
            s3.download_file(location.bucket, location.key, str(tmp_path / f"{name}.tar.gz"))
            served.append(unpack(tmp_path / f"{name}.tar.gz", tmp_path / "opt-ml" / name))
        server = serve(served, args=["--endpoint", "pool", "--sagemaker-part-size", "5"])
        runtime = boto3.client("sagemaker-runtime", endpoint_url=server.url, region_name="us-east-1",
                               aws_access_key_id="testing", aws_secret_access_key="testing")
        for name in artifacts:
            expected = predictions_text(server, name)
            plain = invoke_lib.invoke(runtime, "pool", invoke_lib.request_body(PROMPT, PARAMETERS), component=name)
            tokens = invoke_lib.invoke_stream(runtime, "pool", invoke_lib.request_body(PROMPT, PARAMETERS, True),
                                              component=name)
            assert plain.text == "".join(tokens) == expected and len(expected) > 0

        aws.expect("sm", "update_inference_component_runtime_config", {"InferenceComponentArn": ARN + "x"},
                   {"InferenceComponentName": "code", "DesiredRuntimeConfig": {"CopyCount": 1}})
        aws.expect("sm", "describe_inference_component", component("code", "InService", 1),
                   {"InferenceComponentName": "code"})
        assert lib.scale_component(aws.sm, "code", 1, poll_s=0)["RuntimeConfig"]["CurrentCopyCount"] == 1

        expect_teardown(aws, artifacts)
        teardown = plan_teardown(aws.sm, "pool", config=True, model=True, artifacts=True, autoscaling=aws.scaler)
        delete(aws.sm, s3, teardown, autoscaling=aws.scaler, poll_s=0)
        for stub in aws.stubs.values():
            stub.assert_no_pending_responses()

    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET)
    created = [(method, params) for method, params in _calls(aws) if method in CREATES]
    deleted = {(method, params.get(key)) for method, params in _calls(aws) for m, (d, key) in CREATES.items()
               if method == d}
    leftovers = [(m, p[CREATES[m][1]]) for m, p in created if (CREATES[m][0], p[CREATES[m][1]]) not in deleted]
    assert leftovers == [] and len(created) == 8  # config, endpoint, 2 models, 2 components, target, policy


def _calls(aws: ControlPlane) -> list[tuple[str, dict]]:
    """The recorded requests as (snake_case method, params)."""
    return [(re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower(), params) for name, params in aws.sent]
