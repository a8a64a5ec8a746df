"""Inference components and their autoscaling: sizing from lmi validate, the fit check, and the exact request
sequences of a deploy, a scale and a teardown (botocore Stubber: moto emulates neither inference components nor
Application Auto Scaling on them)."""

import datetime
import json
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from lmi_tools.cli import main
from lmi_tools.errors import AwsError, UsageError, ValidationFailed
from lmi_tools.sagemaker import components as lib
from lmi_tools.sagemaker.delete import delete, plan_component_teardown, plan_teardown
from lmi_tools.sagemaker.deploy import EndpointSpec
from lmi_tools.sagemaker.scaling import Autoscaling

from ..tools.model_shapes import LLAMA_2_7B, LLAMA_2_13B

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
ARN = "arn:aws:sagemaker:us-east-1:123456789012:"
NEURON = {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint", "option.backend": "neuronx",
          "option.rolling_batch": "disable", "option.dtype": "fp16", "option.n_positions": "2048"}


def model_dir(root: Path, config: dict, **props) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "serving.properties").write_text("".join(f"{k}={v}\n" for k, v in {**NEURON, **props}.items()))
    (root / "config.json").write_text(json.dumps(config))
    return root


def endpoint(**changes) -> EndpointSpec:
    base = dict(artifact="s3://lmi-test-artifacts/llama/model.tar.gz", instance="ml.inf2.48xlarge", role=ROLE,
                name="pool", region="us-east-1")
    return EndpointSpec(**{**base, **changes})


def test_validate_sizes_a_copy_tp_degree_neuroncores_and_the_memory_to_load_it(tmp_path):
    resources = lib.size_model(model_dir(tmp_path, LLAMA_2_7B, **{"option.tensor_parallel_degree": "8"}),
                               "ml.inf2.48xlarge")
    assert resources.accelerators == 8
    assert 12_000 < resources.memory_mb < 13_500  # 6.7 B parameters in fp16
    assert resources.as_params() == {"NumberOfAcceleratorDevicesRequired": 8.0,
                                     "MinMemoryRequiredInMb": resources.memory_mb}


def test_a_model_that_fails_validate_is_refused_before_any_call(tmp_path):
    with pytest.raises(ValidationFailed, match="fails lmi validate on ml.inf2.xlarge"):
        lib.size_model(model_dir(tmp_path, LLAMA_2_13B, **{"option.tensor_parallel_degree": "2",
                                                            "option.n_positions": "4096", "batch_size": "8"}),
                       "ml.inf2.xlarge")


@pytest.mark.parametrize("copies, resources, message", [
    (4, lib.Resources(8, 13_000), r"--copies 4 of 8 NeuronCores each need 32 NeuronCores; 1 x inf2.48xlarge have 24"),
    (1, lib.Resources(32, 13_000), "a copy of llama needs 32 NeuronCores; inf2.48xlarge has 24"),
    (1, lib.Resources(8, 900_000), "needs 900000 MiB of host memory"),
    (1, lib.Resources(0, 1024), "at least 1 accelerator"),
])
def test_copies_that_cannot_fit_the_instances_are_refused(copies, resources, message):
    with pytest.raises(UsageError, match=message):
        lib.plan_component(lib.ComponentSpec(endpoint(), "llama", resources, copies))


def test_three_copies_of_tp_8_fit_one_inf2_48xlarge():
    plan = lib.plan_component(lib.ComponentSpec(endpoint(), "llama", lib.Resources(8, 13_000), 3))
    assert plan.calls[1].params["RuntimeConfig"] == {"CopyCount": 3}


def plan_two_components():
    scaling = Autoscaling(1, 4, 2.0, "concurrency")
    chat = lib.plan_component(lib.ComponentSpec(endpoint(autoscaling=scaling), "chat", lib.Resources(8, 13_000)))
    code = lib.plan_component(lib.ComponentSpec(endpoint(artifact="s3://lmi-test-artifacts/code/"), "code",
                                                lib.Resources(2, 4096), 2))
    return chat, code


def test_request_shapes_of_a_component_endpoint():
    chat, code = plan_two_components()
    config, create = (call.params for call in chat.endpoint_calls)
    assert config == {"EndpointConfigName": "pool", "ExecutionRoleArn": ROLE, "ProductionVariants": [{
        "VariantName": "AllTraffic", "InstanceType": "ml.inf2.48xlarge", "InitialInstanceCount": 1,
        "RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}, "VolumeSizeInGB": 256,
        # 4 copies of 8 NeuronCores need two instances of 24
        "ManagedInstanceScaling": {"Status": "ENABLED", "MinInstanceCount": 1, "MaxInstanceCount": 2}}]}
    assert create == {"EndpointName": "pool", "EndpointConfigName": "pool"}
    model, component = (call.params for call in chat.calls)
    assert model["ModelName"] == "chat" and model["PrimaryContainer"]["ModelDataUrl"].endswith("llama/model.tar.gz")
    assert component == {
        "InferenceComponentName": "chat", "EndpointName": "pool", "VariantName": "AllTraffic",
        "Specification": {"ModelName": "chat", "StartupParameters": {"ModelDataDownloadTimeoutInSeconds": 1800,
                                                                     "ContainerStartupHealthCheckTimeoutInSeconds": 1800},
                          "ComputeResourceRequirements": {"NumberOfAcceleratorDevicesRequired": 8.0,
                                                          "MinMemoryRequiredInMb": 13_000}},
        "RuntimeConfig": {"CopyCount": 1}}
    register, policy = (call.params for call in chat.scaling)
    assert register == {"ServiceNamespace": "sagemaker", "ResourceId": "inference-component/chat",
                        "ScalableDimension": "sagemaker:inference-component:DesiredCopyCount",
                        "MinCapacity": 1, "MaxCapacity": 4}
    assert policy["TargetTrackingScalingPolicyConfiguration"]["PredefinedMetricSpecification"] == {
        "PredefinedMetricType": "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution"}
    assert code.calls[0].params["PrimaryContainer"]["ModelDataSource"]["S3DataSource"]["S3Uri"].endswith("code/")
    assert not code.scaling and "ManagedInstanceScaling" not in code.endpoint_calls[0].params["ProductionVariants"][0]


@pytest.fixture
def clients():
    sm = boto3.client("sagemaker", region_name="us-east-1")
    scaler = boto3.client("application-autoscaling", region_name="us-east-1")
    with Stubber(sm) as sm_stub, Stubber(scaler) as scaling_stub:
        yield sm, sm_stub, scaler, scaling_stub
        sm_stub.assert_no_pending_responses()
        scaling_stub.assert_no_pending_responses()


def not_found(stub, method, params, what):
    stub.add_client_error(method, "ValidationException", f"Could not find {what}.", 400, expected_params=params)


def endpoint_description(status):
    return {"EndpointName": "pool", "EndpointArn": ARN + "endpoint/pool", "EndpointConfigName": "pool",
            "EndpointStatus": status, "CreationTime": NOW, "LastModifiedTime": NOW}


def component_description(name, status, copies=1, current=1):
    return {"InferenceComponentName": name, "InferenceComponentArn": ARN + f"inference-component/{name}",
            "EndpointName": "pool", "EndpointArn": ARN + "endpoint/pool", "VariantName": "AllTraffic",
            "InferenceComponentStatus": status, "CreationTime": NOW, "LastModifiedTime": NOW,
            "Specification": {"ModelName": name, "ComputeResourceRequirements": {
                "NumberOfAcceleratorDevicesRequired": 8.0, "MinMemoryRequiredInMb": 13_000}},
            "RuntimeConfig": {"DesiredCopyCount": copies, "CurrentCopyCount": current}}


def expect_component_deploy(sm_stub, scaling_stub, plan, endpoint_exists):
    """The sequence ``deploy_component(check=False)`` sends (the checks of the artifact and names come first)."""
    name = plan.spec.component
    if endpoint_exists:
        sm_stub.add_response("describe_endpoint", endpoint_description("InService"), {"EndpointName": "pool"})
        sm_stub.add_response("describe_endpoint_config", {
            "EndpointConfigName": "pool", "EndpointConfigArn": ARN + "endpoint-config/pool", "CreationTime": NOW,
            "ProductionVariants": [{"VariantName": "AllTraffic", "InstanceType": "ml.inf2.48xlarge"}]},
            {"EndpointConfigName": "pool"})
    else:
        not_found(sm_stub, "describe_endpoint", {"EndpointName": "pool"}, "endpoint")
        sm_stub.add_response("create_endpoint_config", {"EndpointConfigArn": ARN + "endpoint-config/pool"},
                             plan.endpoint_calls[0].params)
        sm_stub.add_response("create_endpoint", {"EndpointArn": ARN + "endpoint/pool"}, plan.endpoint_calls[1].params)
        sm_stub.add_response("describe_endpoint", endpoint_description("Creating"), {"EndpointName": "pool"})
    sm_stub.add_response("describe_endpoint", endpoint_description("InService"), {"EndpointName": "pool"})
    sm_stub.add_response("create_model", {"ModelArn": ARN + f"model/{name}"}, plan.calls[0].params)
    sm_stub.add_response("create_inference_component", {"InferenceComponentArn": ARN + f"inference-component/{name}"},
                         plan.calls[1].params)
    sm_stub.add_response("describe_inference_component", component_description(name, "Creating"),
                         {"InferenceComponentName": name})
    sm_stub.add_response("describe_inference_component", component_description(name, "InService"),
                         {"InferenceComponentName": name})
    for call in plan.scaling:
        scaling_stub.add_response(call.method, {"PolicyARN": "arn:aws:autoscaling:policy", "Alarms": []}
                                  if call.method == "put_scaling_policy" else {}, call.params)


def test_two_components_on_a_new_endpoint_then_teardown_of_everything(clients):
    sm, sm_stub, scaler, scaling_stub = clients
    chat, code = plan_two_components()
    expect_component_deploy(sm_stub, scaling_stub, chat, endpoint_exists=False)
    expect_component_deploy(sm_stub, scaling_stub, code, endpoint_exists=True)
    steps = []
    for plan in (chat, code):
        answer = lib.deploy_component(sm, None, plan, scaler, poll_s=0, on_step=steps.append, check=False)
        assert answer["InferenceComponentStatus"] == "InService"
    assert steps == ["create_endpoint_config: pool", "create_endpoint: pool", "create_model: chat",
                     "create_inference_component: chat", "register_scalable_target: inference-component/chat",
                     "put_scaling_policy: lmi-concurrency-target-tracking", "create_model: code",
                     "create_inference_component: code"]

    # lmi delete pool --all: autoscaling, then components (waited for), endpoint, config, models.
    sm_stub.add_response("describe_endpoint", endpoint_description("InService"), {"EndpointName": "pool"})
    sm_stub.add_response("describe_endpoint_config", {
        "EndpointConfigName": "pool", "EndpointConfigArn": ARN + "endpoint-config/pool", "CreationTime": NOW,
        "ProductionVariants": [{"VariantName": "AllTraffic", "InstanceType": "ml.inf2.48xlarge"}]},
        {"EndpointConfigName": "pool"})
    sm_stub.add_response("list_inference_components", {"InferenceComponents": [
        {k: component_description(n, "InService")[k] for k in ("InferenceComponentName", "InferenceComponentArn",
         "EndpointName", "EndpointArn", "InferenceComponentStatus", "CreationTime", "LastModifiedTime",
         "VariantName")} for n in ("chat", "code")]}, {"EndpointNameEquals": "pool"})
    for name in ("chat", "code"):
        sm_stub.add_response("describe_inference_component", component_description(name, "InService"),
                             {"InferenceComponentName": name})
    resources = ["endpoint/pool/variant/AllTraffic", "inference-component/chat", "inference-component/code"]
    chat_target = {"ServiceNamespace": "sagemaker", "ResourceId": "inference-component/chat",
                   "ScalableDimension": "sagemaker:inference-component:DesiredCopyCount"}
    scaling_stub.add_response("describe_scalable_targets", {"ScalableTargets": [
        {**chat_target, "MinCapacity": 1, "MaxCapacity": 4, "RoleARN": ROLE, "CreationTime": NOW}]},
        {"ServiceNamespace": "sagemaker", "ResourceIds": resources})
    scaling_stub.add_response("describe_scaling_policies", {"ScalingPolicies": [
        {"PolicyARN": "arn:aws:autoscaling:policy", "PolicyName": "lmi-concurrency-target-tracking",
         "PolicyType": "TargetTrackingScaling", "CreationTime": NOW, **chat_target}]}, chat_target)
    for name in ("chat", "code"):
        sm_stub.add_response("describe_model", {"ModelName": name, "ModelArn": ARN + f"model/{name}",
                                                "CreationTime": NOW}, {"ModelName": name})
    teardown = plan_teardown(sm, "pool", config=True, model=True, autoscaling=scaler)
    assert teardown.as_json() == {
        "scaling": ["delete_scaling_policy lmi-concurrency-target-tracking",
                    "deregister_scalable_target inference-component/chat"],
        "components": ["chat", "code"], "endpoint": "pool", "endpoint_config": "pool", "models": ["chat", "code"],
        "artifacts": []}
    scaling_stub.add_response("delete_scaling_policy", {}, {"PolicyName": "lmi-concurrency-target-tracking",
                                                            **chat_target})
    scaling_stub.add_response("deregister_scalable_target", {}, chat_target)
    for name in ("chat", "code"):
        sm_stub.add_response("delete_inference_component", {}, {"InferenceComponentName": name})
    sm_stub.add_response("describe_inference_component", component_description("chat", "Deleting"),
                         {"InferenceComponentName": "chat"})
    not_found(sm_stub, "describe_inference_component", {"InferenceComponentName": "chat"}, "inference component")
    not_found(sm_stub, "describe_inference_component", {"InferenceComponentName": "code"}, "inference component")
    sm_stub.add_response("delete_endpoint", {}, {"EndpointName": "pool"})
    sm_stub.add_response("delete_endpoint_config", {}, {"EndpointConfigName": "pool"})
    for name in ("chat", "code"):
        sm_stub.add_response("delete_model", {}, {"ModelName": name})
    done = []
    delete(sm, None, teardown, done.append, autoscaling=scaler, poll_s=0)
    assert done == ["delete_scaling_policy: lmi-concurrency-target-tracking",
                    "deregister_scalable_target: inference-component/chat", "deleting inference component chat",
                    "deleting inference component code", "deleted inference component chat",
                    "deleted inference component code", "deleted endpoint pool", "deleted endpoint config pool",
                    "deleted model chat", "deleted model code"]


def test_a_failed_component_reports_sagemakers_reason(clients):
    sm, sm_stub, *_ = clients
    sm_stub.add_response("describe_inference_component", {
        **component_description("chat", "Failed"), "FailureReason": "Insufficient accelerators on the endpoint"},
        {"InferenceComponentName": "chat"})
    with pytest.raises(AwsError, match="chat is Failed: Insufficient accelerators") as info:
        lib.wait_component(sm, "chat", poll_s=0)
    assert "lmi delete --component chat" in info.value.hint


def test_a_component_cannot_go_on_an_endpoint_that_serves_a_model(clients):
    sm, sm_stub, *_ = clients
    chat, _ = plan_two_components()
    sm_stub.add_response("describe_endpoint", endpoint_description("InService"), {"EndpointName": "pool"})
    sm_stub.add_response("describe_endpoint_config", {
        "EndpointConfigName": "pool", "EndpointConfigArn": ARN + "endpoint-config/pool", "CreationTime": NOW,
        "ProductionVariants": [{"VariantName": "AllTraffic", "ModelName": "pool", "InstanceType": "ml.inf2.48xlarge"}]},
        {"EndpointConfigName": "pool"})
    with pytest.raises(UsageError, match="serves a model directly"):
        lib.deploy_component(sm, None, chat, check=False, poll_s=0)


def test_scaling_copies_and_parking_a_model(clients):
    sm, sm_stub, *_ = clients
    for copies in (3, 0):
        sm_stub.add_response("update_inference_component_runtime_config", {"InferenceComponentArn": ARN + "x"},
                             {"InferenceComponentName": "chat", "DesiredRuntimeConfig": {"CopyCount": copies}})
        sm_stub.add_response("describe_inference_component", component_description("chat", "InService", copies,
                                                                                   copies), {"InferenceComponentName": "chat"})
        assert lib.scale_component(sm, "chat", copies, poll_s=0)["RuntimeConfig"]["CurrentCopyCount"] == copies
    with pytest.raises(UsageError, match="--copies -1 is out of range"):
        lib.scale_component(sm, "chat", -1)


def test_delete_one_component_keeps_the_endpoint(clients):
    sm, sm_stub, scaler, scaling_stub = clients
    sm_stub.add_response("describe_inference_component", component_description("code", "InService"),
                         {"InferenceComponentName": "code"})
    scaling_stub.add_response("describe_scalable_targets", {"ScalableTargets": []},
                              {"ServiceNamespace": "sagemaker", "ResourceIds": ["inference-component/code"]})
    sm_stub.add_response("describe_model", {"ModelName": "code", "ModelArn": ARN + "model/code", "CreationTime": NOW,
                                            "PrimaryContainer": {"ModelDataUrl": "s3://b/code/model.tar.gz"}},
                         {"ModelName": "code"})
    plan = plan_component_teardown(sm, "code", model=True, artifacts=True, autoscaling=scaler)
    assert plan.as_json() == {"scaling": [], "components": ["code"], "endpoint": None, "endpoint_config": None,
                              "models": ["code"], "artifacts": ["s3://b/code/model.tar.gz"]}


def test_cli_dry_run_of_a_component_sized_by_validate(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    directory = model_dir(tmp_path, LLAMA_2_7B, **{"option.tensor_parallel_degree": "8"})
    code = main(["deploy", "--artifact", "s3://b/llama/model.tar.gz", "--instance", "ml.inf2.48xlarge", "--role", ROLE,
                 "--name", "pool", "--component", "chat", "--model-dir", str(directory), "--copies", "3",
                 "--autoscale", "1:6", "--target-value", "4", "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    plan = json.loads(out)
    assert [c["method"] for c in plan["if_endpoint_missing"]] == ["create_endpoint_config", "create_endpoint"]
    assert [c["method"] for c in plan["calls"]] == ["create_model", "create_inference_component"]
    assert [(c["service"], c["method"]) for c in plan["when_in_service"]] == [
        ("application-autoscaling", "register_scalable_target"), ("application-autoscaling", "put_scaling_policy")]
    assert plan["calls"][1]["params"]["RuntimeConfig"] == {"CopyCount": 3} and "TP 8" in plan["sizing"]


@pytest.mark.parametrize("argv, message", [
    (["--autoscale", "0:2", "--target-value", "1"], "MIN must be at least 1"),
    (["--autoscale", "2-4", "--target-value", "1"], "is not MIN:MAX"),
    (["--autoscale", "1:4"], "--autoscale needs --target-value"),
    (["--autoscale", "1:4", "--target-value", "1", "--target-metric", "cpu"], "--target-metric 'cpu' is not one of"),
    (["--autoscale", "2:4", "--target-value", "1"], "--instance-count 1 is outside --autoscale 2:4"),
    (["--component", "chat"], "--component needs either --model-dir"),
])
def test_cli_usage_errors_name_the_option(argv, message, capsys):
    deploy = ["deploy", "--artifact", "s3://b/m.tar.gz", "--instance", "ml.g5.12xlarge", "--role", ROLE, "--name",
              "pool", "--dry-run"]
    assert main(deploy + argv) == UsageError.exit_code
    assert message in capsys.readouterr().err


def test_a_deploy_spec_file_holds_the_same_settings_and_options_win(tmp_path, capsys):
    model_dir(tmp_path / "llama", LLAMA_2_7B, **{"option.tensor_parallel_degree": "8"})
    spec = tmp_path / "deploy.toml"
    spec.write_text(f'artifact = "s3://b/llama/model.tar.gz"\ninstance = "ml.inf2.48xlarge"\nrole = "{ROLE}"\n'
                    'name = "pool"\ncomponent = "chat"\nmodel_dir = "llama"\ncopies = 2\nautoscale = "1:3"\n'
                    'target_metric = "invocations"\ntarget_value = 30\nenv = ["OPTION_DTYPE=fp16"]\n')
    assert main(["deploy", "--spec", str(spec), "--copies", "3", "--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["calls"][1]["params"]["RuntimeConfig"] == {"CopyCount": 3}  # the option wins over the file
    assert plan["calls"][0]["params"]["PrimaryContainer"]["Environment"] == {"OPTION_DTYPE": "fp16"}
    assert "TP 8" in plan["sizing"]  # model_dir is relative to the file
    assert plan["when_in_service"][1]["params"]["TargetTrackingScalingPolicyConfiguration"][
        "PredefinedMetricSpecification"] == {"PredefinedMetricType": "SageMakerInferenceComponentInvocationsPerCopy"}
    spec.write_text(spec.read_text() + "min_copies = 1\n")
    assert main(["deploy", "--spec", str(spec), "--dry-run"]) == UsageError.exit_code
    assert "'min_copies' is not a deploy setting" in capsys.readouterr().err


def test_a_plan_with_autoscaling_needs_the_autoscaling_client():
    from lmi_tools.sagemaker.calls import run

    calls = Autoscaling(1, 2, 4.0).calls("inference-component/chat", "component")
    with pytest.raises(UsageError, match="register_scalable_target inference-component/chat needs an? "
                                         "application-autoscaling client"):
        run({"application-autoscaling": None}, calls)


def test_a_component_made_without_a_model_leaves_no_model_to_delete(clients):
    sm, sm_stub, *_ = clients
    made_from_container = {**component_description("raw", "InService"), "Specification": {}}
    sm_stub.add_response("describe_inference_component", made_from_container, {"InferenceComponentName": "raw"})
    assert plan_component_teardown(sm, "raw", model=True).models == []


def test_cli_lists_components_and_scales_one(clients, capsys, monkeypatch):
    sm, sm_stub, *_ = clients
    monkeypatch.setattr("lmi_tools.sagemaker.aws.client", lambda *args, **kwargs: sm)
    summary = {k: v for k, v in component_description("chat", "InService").items()
               if k not in ("Specification", "RuntimeConfig")}
    sm_stub.add_response("list_inference_components", {"InferenceComponents": [summary]}, {"EndpointNameEquals": "pool"})
    sm_stub.add_response("describe_inference_component", component_description("chat", "InService", 2, 1),
                         {"InferenceComponentName": "chat"})
    assert main(["components", "pool", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{
        "component": "chat", "status": "InService", "model": "chat", "copies": 2, "current_copies": 1,
        "accelerators": 8.0, "memory_mb": 13_000}]
    sm_stub.add_response("update_inference_component_runtime_config", {"InferenceComponentArn": ARN + "x"},
                         {"InferenceComponentName": "chat", "DesiredRuntimeConfig": {"CopyCount": 0}})
    sm_stub.add_response("describe_inference_component", component_description("chat", "InService", 0, 0),
                         {"InferenceComponentName": "chat"})
    assert main(["scale", "chat", "0", "--poll-interval", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["CurrentCopyCount"] == 0
