"""lmi deploy: request shapes for inf2/g5 (botocore Stubber: moto refuses those instance types), waiting,
failure reasons, timeouts and rollback (Stubber), and the artifact checks (moto)."""

import datetime

import pytest

from lmi_tools.errors import AwsError, UsageError
from lmi_tools.sagemaker import deploy as lib
from lmi_tools.sagemaker.upload import S3Uri

from .conftest import BUCKET

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def spec(**changes) -> lib.EndpointSpec:
    base = dict(artifact=f"s3://{BUCKET}/lmi/model.tar.gz", instance="ml.inf2.48xlarge", role=ROLE, name="llama",
                region="us-east-1")
    return lib.EndpointSpec(**{**base, **changes})


def describe(status, reason=None):
    answer = {"EndpointName": "llama", "EndpointArn": "arn:aws:sagemaker:us-east-1:123456789012:endpoint/llama",
              "EndpointConfigName": "llama", "EndpointStatus": status, "CreationTime": NOW, "LastModifiedTime": NOW}
    return {**answer, "FailureReason": reason} if reason else answer


def expect_creation(stubber, plan):
    arns = {"create_model": {"ModelArn": "arn:aws:sagemaker:us-east-1:123456789012:model/llama"},
            "create_endpoint_config": {"EndpointConfigArn": "arn:aws:sagemaker:us-east-1:123456789012:"
                                                            "endpoint-config/llama"},
            "create_endpoint": {"EndpointArn": describe("Creating")["EndpointArn"]}}
    for call in plan.calls:
        stubber.add_response(call.method, arns[call.method], expected_params=call.params)


def test_inf2_tarball_uses_neuronx_timeouts_and_an_ebs_volume(stubbed):
    sm, stubber = stubbed
    plan = lib.plan_deployment(spec(environment={"OPTION_TENSOR_PARALLEL_DEGREE": "24"}))
    model, config, endpoint = (call.params for call in plan.calls)
    assert model["PrimaryContainer"] == {
        "Image": "763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:0.29.0-neuronx-sdk2.19.1",
        "ModelDataUrl": f"s3://{BUCKET}/lmi/model.tar.gz", "Environment": {"OPTION_TENSOR_PARALLEL_DEGREE": "24"}}
    assert config["ProductionVariants"] == [{
        "VariantName": "AllTraffic", "ModelName": "llama", "InstanceType": "ml.inf2.48xlarge",
        "InitialInstanceCount": 1, "ModelDataDownloadTimeoutInSeconds": 1800,
        "ContainerStartupHealthCheckTimeoutInSeconds": 1800, "VolumeSizeInGB": 256}]
    assert endpoint == {"EndpointName": "llama", "EndpointConfigName": "llama"}
    expect_creation(stubber, plan)
    for status in ("Creating", "Creating", "InService"):
        stubber.add_response("describe_endpoint", describe(status), {"EndpointName": "llama"})
    seen = []
    result = lib.deploy(sm, None, plan, poll_s=0, check=False, on_status=lambda s, _: seen.append(s))
    assert result["EndpointStatus"] == "InService" and seen == ["Creating", "Creating", "InService"]


def test_g5_prefix_uses_model_data_source_the_gpu_image_and_no_volume(stubbed):
    sm, stubber = stubbed
    plan = lib.plan_deployment(spec(artifact=f"s3://{BUCKET}/raw/", instance="ml.g5.12xlarge", download_timeout=600,
                                    startup_timeout=900, lmi_version="0.30.0", instance_count=2))
    model, config, _ = (call.params for call in plan.calls)
    assert model["PrimaryContainer"] == {
        "Image": "763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:0.30.0-lmi12.0.0-cu124",
        "ModelDataSource": {"S3DataSource": {"S3Uri": f"s3://{BUCKET}/raw/", "S3DataType": "S3Prefix",
                                             "CompressionType": "None"}}}
    variant = config["ProductionVariants"][0]
    assert "VolumeSizeInGB" not in variant and variant["InitialInstanceCount"] == 2
    assert (variant["ModelDataDownloadTimeoutInSeconds"], variant["ContainerStartupHealthCheckTimeoutInSeconds"]) \
        == (600, 900)
    expect_creation(stubber, plan)
    answer = lib.deploy(sm, None, plan, wait=False, check=False)
    assert answer["EndpointArn"].endswith("endpoint/llama")


def test_a_failed_endpoint_reports_sagemakers_failure_reason(stubbed):
    sm, stubber = stubbed
    reason = "The primary container for production variant AllTraffic did not pass the ping health check."
    for status in ("Creating", "Creating", "Failed"):
        stubber.add_response("describe_endpoint", describe(status, reason if status == "Failed" else None))
    with pytest.raises(AwsError, match="endpoint llama is Failed: The primary container") as info:
        lib.wait_in_service(sm, "llama", poll_s=0)
    assert info.value.kind == "failed" and "lmi delete llama --config --model" in info.value.hint


def test_waiting_gives_up_after_the_timeout(stubbed):
    sm, stubber = stubbed
    now = [0.0]
    for _ in range(4):
        stubber.add_response("describe_endpoint", describe("Creating"))
    with pytest.raises(AwsError, match="still Creating after 90 s") as info:
        lib.wait_in_service(sm, "llama", timeout_s=100, poll_s=30, sleep=lambda s: now.__setitem__(0, now[0] + s),
                            clock=lambda: now[0])
    assert info.value.kind == "timeout" and "describe-endpoint" in info.value.hint


def test_a_failed_call_removes_what_this_run_created(stubbed):
    sm, stubber = stubbed
    plan = lib.plan_deployment(spec())
    stubber.add_response("create_model", {"ModelArn": "arn:aws:sagemaker:us-east-1:123456789012:model/llama"})
    stubber.add_client_error("create_endpoint_config", "ResourceLimitExceeded",
                             "The account-level service limit 'ml.inf2.48xlarge for endpoint usage' is 0 Instances",
                             http_status_code=400)
    stubber.add_response("delete_model", {}, {"ModelName": "llama"})
    with pytest.raises(AwsError, match="ml.inf2.48xlarge for endpoint usage") as info:
        lib.create(sm, plan)
    assert info.value.kind == "quota" and "Service Quotas" in info.value.hint
    assert "removed what this run created: model llama" in info.value.hint


def test_existing_names_are_refused_before_anything_is_created(stubbed):
    sm, stubber = stubbed
    stubber.add_client_error("describe_model", "ValidationException", "Could not find model 'llama'.")
    stubber.add_response("describe_endpoint_config", {
        "EndpointConfigName": "llama", "EndpointConfigArn": "arn:aws:sagemaker:us-east-1:123456789012:endpoint-config/x",
        "ProductionVariants": [{"VariantName": "AllTraffic", "ModelName": "llama"}], "CreationTime": NOW})
    with pytest.raises(AwsError, match="endpoint config named llama already exists") as info:
        lib.check_names_free(sm, "llama")
    assert info.value.kind == "in-use"


@pytest.mark.parametrize("changes, message", [
    ({"name": "bad_name"}, "--name 'bad_name'"),
    ({"name": "x" * 64}, "not a valid SageMaker name"),
    ({"role": "SageMakerRole"}, "not an IAM role ARN"),
    ({"download_timeout": 30}, "--download-timeout 30 is out of range"),
    ({"startup_timeout": 4000}, "--startup-timeout 4000"),
    ({"volume_size": 600}, "--volume-size 600"),
    ({"instance": "ml.g5.2xlarge", "volume_size": 100}, "local NVMe"),
    ({"artifact": f"s3://{BUCKET}/model.zip"}, "neither a .tar.gz object nor a prefix"),
    ({"environment": {"AWS_SECRET_ACCESS_KEY": "x"}}, "AWS credentials must not be passed"),
    ({"environment": {f"K{i}": "v" for i in range(101)}}, "at most 100"),
    ({"environment": {"K": "v" * 1025}}, "1 to 1024 bytes"),
])
def test_bad_specs_are_usage_errors_naming_the_option(changes, message):
    with pytest.raises(UsageError, match=message):
        lib.plan_deployment(spec(**changes))


def test_default_names_follow_sagemakers_rules():
    name = lib.default_name(f"s3://{BUCKET}/my_models/Llama-2.7b.tar.gz", NOW)
    assert name == "lmi-Llama-2-7b-20260101-000000" and lib.NAME.fullmatch(name)
    assert lib.NAME.fullmatch(lib.default_name("s3://b/" + "x" * 200 + "/"))


def test_dry_run_masks_secret_environment_values():
    calls = lib.plan_deployment(spec(environment={"HF_TOKEN": "hf_live_value", "OPTION_DTYPE": "fp16"})).as_json()
    assert calls["calls"][0]["params"]["PrimaryContainer"]["Environment"] == {"HF_TOKEN": "****",
                                                                             "OPTION_DTYPE": "fp16"}
    assert [c["operation"] for c in calls["calls"]] == ["CreateModel", "CreateEndpointConfig", "CreateEndpoint"]


def test_artifact_checks(aws):
    s3, _ = aws
    with pytest.raises(AwsError, match="does not exist") as info:
        lib.check_artifact(s3, S3Uri(BUCKET, "lmi/model.tar.gz"), "us-east-1")
    assert "lmi upload" in info.value.hint
    with pytest.raises(UsageError, match="bucket lmi-test-artifacts is in us-east-1, the endpoint would be in"):
        lib.check_artifact(s3, S3Uri(BUCKET, "lmi/model.tar.gz"), "eu-west-1")
    with pytest.raises(AwsError, match="holds no objects"):
        lib.check_artifact(s3, S3Uri(BUCKET, "raw/"), "us-east-1")
    s3.put_object(Bucket=BUCKET, Key="raw/serving.properties", Body=b"engine=Python\n")
    lib.check_artifact(s3, S3Uri(BUCKET, "raw/"), "us-east-1")
    s3.put_object(Bucket=BUCKET, Key="raw/weights/", Body=b"")  # what the S3 console's "Create folder" makes
    with pytest.raises(UsageError, match="zero-byte folder keys"):
        lib.check_artifact(s3, S3Uri(BUCKET, "raw/"), "us-east-1")
