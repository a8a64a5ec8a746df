"""LoRA adapters as SageMaker inference components on a base component: the calls, their order and waiting
(botocore Stubber: moto emulates no inference components), and ``lmi deploy --adapter``."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber

from lmi_tools.cli import main
from lmi_tools.errors import AwsError, UsageError
from lmi_tools.sagemaker import components as lib

from ..tools.model_shapes import LLAMA_2_7B
from .test_sagemaker_components import ARN, ROLE, component_description, model_dir

ADAPTERS = {"french": "s3://b/adapters/french.tar.gz", "sql": "s3://b/adapters/sql.tar.gz"}


def test_one_adapter_component_per_adapter_names_the_base_and_the_artifact():
    calls = lib.plan_adapters("pool", "chat", ADAPTERS)
    assert [c.as_json()["params"] for c in calls] == [
        {"InferenceComponentName": name, "EndpointName": "pool",
         "Specification": {"BaseInferenceComponentName": "chat", "Container": {"ArtifactUrl": uri}}}
        for name, uri in ADAPTERS.items()]


@pytest.mark.parametrize("adapters, message", [
    ({"chat": "s3://b/a.tar.gz"}, "'chat' is not a component name of its own"),
    ({"bad_name": "s3://b/a.tar.gz"}, "'bad_name' is not a component name"),
    ({"french": "/local/french"}, "--adapter french '/local/french' is not an s3:// URI"),
])
def test_bad_adapters_are_refused_before_any_call(adapters, message):
    with pytest.raises(UsageError, match=message):
        lib.plan_adapters("pool", "chat", adapters)


@pytest.fixture
def sagemaker():
    sm = boto3.client("sagemaker", region_name="us-east-1")
    with Stubber(sm) as stub:
        yield sm, stub
        stub.assert_no_pending_responses()


def test_adapter_components_are_created_then_each_waited_for(sagemaker):
    sm, stub = sagemaker
    calls = lib.plan_adapters("pool", "chat", ADAPTERS)
    for call in calls:
        name = call.params["InferenceComponentName"]
        stub.add_response("create_inference_component", {"InferenceComponentArn": ARN + f"inference-component/{name}"},
                          call.params)
    for name in ADAPTERS:
        for status in ("Creating", "InService"):
            stub.add_response("describe_inference_component", component_description(name, status),
                              {"InferenceComponentName": name})
    described = lib.deploy_adapters(sm, calls, poll_s=0)
    assert [d["InferenceComponentStatus"] for d in described] == ["InService", "InService"]


def test_a_failed_adapter_component_reports_sagemakers_reason(sagemaker):
    sm, stub = sagemaker
    calls = lib.plan_adapters("pool", "chat", {"french": ADAPTERS["french"]})
    stub.add_response("create_inference_component", {"InferenceComponentArn": ARN + "inference-component/french"},
                      calls[0].params)
    stub.add_response("describe_inference_component", {**component_description("french", "Failed"),
                                                        "FailureReason": "adapter rank 64 exceeds max_lora_rank 16"},
                      {"InferenceComponentName": "french"})
    with pytest.raises(AwsError, match="rank 64 exceeds max_lora_rank 16"):
        lib.deploy_adapters(sm, calls, poll_s=0)


def test_cli_dry_run_plans_the_base_component_then_its_adapters(tmp_path, capsys):
    directory = model_dir(tmp_path, LLAMA_2_7B, **{"option.tensor_parallel_degree": "8"})
    code = main(["deploy", "--artifact", "s3://b/llama/model.tar.gz", "--instance", "ml.inf2.48xlarge", "--role", ROLE,
                 "--name", "pool", "--component", "chat", "--model-dir", str(directory), "--dry-run",
                 *[arg for name, uri in ADAPTERS.items() for arg in ("--adapter", f"{name}={uri}")]])
    out, err = capsys.readouterr()
    assert code == 0, err
    plan = json.loads(out)
    assert [c["method"] for c in plan["calls"]] == ["create_model", "create_inference_component"]
    assert [c["params"]["Specification"]["BaseInferenceComponentName"] for c in plan["then_adapters"]] == ["chat"] * 2


@pytest.mark.parametrize("argv, message", [
    (["--adapter", "french=s3://b/f.tar.gz"], "--adapter needs --component"),
    (["--component", "chat", "--accelerators", "1", "--adapter", "french"], "--adapter 'french' is not KEY=VALUE"),
])
def test_cli_adapter_usage_errors_name_the_option(argv, message, capsys):
    deploy = ["deploy", "--artifact", "s3://b/m.tar.gz", "--instance", "ml.g5.12xlarge", "--role", ROLE, "--name",
              "pool", "--dry-run"]
    assert main(deploy + argv) == UsageError.exit_code
    assert message in capsys.readouterr().err
