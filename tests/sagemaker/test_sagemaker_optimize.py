"""lmi optimize: the create_optimization_job request for each technique (botocore's Stubber checks every shape
against the installed service model; moto has no optimization jobs), waiting and failure reasons, stopping,
deploying a COMPLETED job's output, and usage errors through the CLI."""

import datetime
import json

import pytest

from lmi_tools.cli import main
from lmi_tools.errors import AwsError, UsageError
from lmi_tools.sagemaker import deploy as deployment
from lmi_tools.sagemaker import optimize as lib

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
ARN = "arn:aws:sagemaker:us-east-1:123456789012:optimization-job/llama-awq"
GPU_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:0.29.0-lmi11.0.0-cu124"
NEURON_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:0.29.0-neuronx-sdk2.19.1"


def spec(**changes) -> lib.OptimizationSpec:
    base = dict(name="llama-awq", model="s3://models/llama", instance="ml.g5.12xlarge", role=ROLE,
                output="s3://models/optimized/", region="us-east-1")
    return lib.OptimizationSpec(**{**base, **changes})


def description(status="COMPLETED", params=None, reason=None, image=GPU_IMAGE) -> dict:
    params = params or lib.plan_job(spec(quantize="awq", environment={"OPTION_DTYPE": "fp16"}))
    answer = {**params, "OptimizationJobArn": ARN, "OptimizationJobStatus": status, "CreationTime": NOW,
              "LastModifiedTime": NOW}
    if image:
        answer["OptimizationOutput"] = {"RecommendedInferenceImage": image}
    return {**answer, "FailureReason": reason} if reason else answer


def test_quantization_job_request(stubbed):
    sm, stubber = stubbed
    params = lib.plan_job(spec(quantize="awq", environment={"OPTION_DTYPE": "fp16"}, max_runtime_s=7200))
    assert params == {
        "OptimizationJobName": "llama-awq", "RoleArn": ROLE, "ModelSource": {"S3": {"S3Uri": "s3://models/llama/"}},
        "DeploymentInstanceType": "ml.g5.12xlarge",
        "OptimizationConfigs": [{"ModelQuantizationConfig": {"Image": GPU_IMAGE,
                                                             "OverrideEnvironment": {"OPTION_QUANTIZE": "awq"}}}],
        "OutputConfig": {"S3OutputLocation": "s3://models/optimized/"},
        "StoppingCondition": {"MaxRuntimeInSeconds": 7200}, "OptimizationEnvironment": {"OPTION_DTYPE": "fp16"}}
    stubber.add_response("create_optimization_job", {"OptimizationJobArn": ARN}, expected_params=params)
    assert lib.start(sm, params) == ARN


def test_neuron_compilation_and_eagle_requests_pass_botocore_validation(stubbed):
    sm, stubber = stubbed
    compiled = lib.plan_job(spec(instance="ml.inf2.48xlarge", compile=True, accept_eula=True,
                                 compile_environment={"OPTION_TENSOR_PARALLEL_DEGREE": "24",
                                                      "OPTION_N_POSITIONS": "8192"}))
    assert compiled["OptimizationConfigs"] == [{"ModelCompilationConfig": {
        "Image": NEURON_IMAGE,
        "OverrideEnvironment": {"OPTION_TENSOR_PARALLEL_DEGREE": "24", "OPTION_N_POSITIONS": "8192"}}}]
    assert compiled["ModelSource"]["S3"]["ModelAccessConfig"] == {"AcceptEula": True}
    eagle = lib.plan_job(spec(speculative="eagle", speculative_data="s3://data/chats/"))
    assert eagle["OptimizationConfigs"] == [{"ModelSpeculativeDecodingConfig": {
        "Technique": "EAGLE", "TrainingDataSource": {"S3Uri": "s3://data/chats/", "S3DataType": "S3Prefix"}}}]
    manifest = lib.plan_job(spec(speculative="eagle", speculative_data="s3://data/train.manifest"))
    assert manifest["OptimizationConfigs"][0]["ModelSpeculativeDecodingConfig"]["TrainingDataSource"][
        "S3DataType"] == "ManifestFile"
    for params in (compiled, eagle, manifest):  # the Stubber validates each request against the service model
        stubber.add_response("create_optimization_job", {"OptimizationJobArn": ARN}, expected_params=params)
        lib.start(sm, params)


@pytest.mark.parametrize("changes, message", [
    (dict(quantize="gptq"), "--quantize 'gptq' is not a method"),
    (dict(quantize="awq", instance="ml.inf2.48xlarge"), "SageMaker quantizes for GPU instances"),
    (dict(quantize="awq", instance="ml.c5.xlarge"), "not a target of SageMaker optimization jobs"),
    (dict(speculative="medusa"), "--speculative 'medusa' is not a technique"),
    (dict(speculative_data="s3://d/x/"), "--speculative-data needs --speculative"),
    (dict(compile_environment={"A": "1"}), "--compile-env needs --compile"),
    (dict(), "no optimization was asked for"),
    (dict(compile=True, model="s3://b/model.tar.gz"), "is a tarball"),
    (dict(compile=True, name="bad_name"), "not a valid SageMaker name"),
    (dict(compile=True, role="admin"), "not an IAM role ARN"),
    (dict(compile=True, environment={f"K{i}": "v" for i in range(26)}), "at most 25"),
    (dict(compile=True, environment={"AWS_SECRET_ACCESS_KEY": "x"}), "AWS credentials must not be passed"),
])
def test_bad_specs_are_usage_errors_naming_the_option(changes, message):
    with pytest.raises(UsageError, match=message):
        lib.plan_job(spec(**changes))


def test_wait_polls_until_completed(stubbed):
    sm, stubber = stubbed
    for status in ("STARTING", "INPROGRESS", "COMPLETED"):
        stubber.add_response("describe_optimization_job", description(status), {"OptimizationJobName": "llama-awq"})
    seen = []
    done = lib.wait(sm, "llama-awq", poll_s=0, on_status=lambda s, _: seen.append(s))
    assert done["OptimizationJobStatus"] == "COMPLETED" and seen == ["STARTING", "INPROGRESS", "COMPLETED"]


def test_wait_reports_the_failure_reason_and_times_out(stubbed):
    sm, stubber = stubbed
    stubber.add_response("describe_optimization_job", description("FAILED", reason="AWQ needs a GPU with 24 GB"),
                         {"OptimizationJobName": "llama-awq"})
    with pytest.raises(AwsError, match="FAILED: AWQ needs a GPU with 24 GB"):
        lib.wait(sm, "llama-awq", poll_s=0)
    ticks = iter([0.0, 100.0])
    stubber.add_response("describe_optimization_job", description("INPROGRESS"), {"OptimizationJobName": "llama-awq"})
    with pytest.raises(AwsError, match="still INPROGRESS after 100 s") as caught:
        lib.wait(sm, "llama-awq", timeout_s=120, poll_s=60, clock=lambda: next(ticks))
    assert caught.value.kind == "timeout" and "lmi optimize stop llama-awq" in caught.value.hint


def test_stop_and_a_missing_job(stubbed):
    sm, stubber = stubbed
    stubber.add_response("stop_optimization_job", {}, {"OptimizationJobName": "llama-awq"})
    lib.stop(sm, "llama-awq")
    stubber.add_client_error("describe_optimization_job", "ResourceNotFound", "Could not find job llama-x")
    with pytest.raises(AwsError) as caught:
        lib.describe(sm, "llama-x")
    assert caught.value.kind == "not-found"


def test_deploy_uses_the_output_prefix_recommended_image_and_merged_environment(stubbed):
    sm, stubber = stubbed
    endpoint = lib.deploy_spec(description(), None, "llama-fast", "us-east-1", {"OPTION_MAX_ROLLING_BATCH_SIZE": "8"})
    plan = deployment.plan_deployment(endpoint)
    model, config, _ = (call.params for call in plan.calls)
    assert model == {"ModelName": "llama-fast", "ExecutionRoleArn": ROLE, "PrimaryContainer": {
        "Image": GPU_IMAGE,
        "ModelDataSource": {"S3DataSource": {"S3Uri": "s3://models/optimized/", "S3DataType": "S3Prefix",
                                             "CompressionType": "None"}},
        "Environment": {"OPTION_DTYPE": "fp16", "OPTION_QUANTIZE": "awq", "OPTION_MAX_ROLLING_BATCH_SIZE": "8"}}}
    assert config["ProductionVariants"][0]["InstanceType"] == "ml.g5.12xlarge"
    for call in plan.calls:  # the Stubber checks the create_* shapes too
        stubber.add_response(call.method, {"create_model": {"ModelArn": ARN}, "create_endpoint_config": {
            "EndpointConfigArn": ARN}, "create_endpoint": {"EndpointArn": ARN}}[call.method], call.params)
    deployment.create(sm, plan)


def test_deploy_refuses_a_job_that_is_not_completed():
    with pytest.raises(UsageError, match="INPROGRESS, not COMPLETED"):
        lib.deploy_spec(description("INPROGRESS"), None, "llama-fast", "us-east-1")


def test_cli_dry_run_and_errors(capsys):
    argv = ["optimize", "start", "--model", "s3://models/llama/", "--instance", "ml.inf2.48xlarge", "--role", ROLE,
            "--output", "s3://models/out/", "--name", "llama-neuron", "--compile", "--compile-env",
            "OPTION_TENSOR_PARALLEL_DEGREE=24"]
    assert main(argv + ["--dry-run"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["method"] == "create_optimization_job"
    assert printed["params"]["OptimizationConfigs"][0]["ModelCompilationConfig"]["OverrideEnvironment"] == {
        "OPTION_TENSOR_PARALLEL_DEGREE": "24"}
    assert main(argv + ["--quantize", "awq", "--dry-run"]) == 2
    assert "SageMaker quantizes for GPU instances" in capsys.readouterr().err
