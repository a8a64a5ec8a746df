"""Upload, deploy and delete against moto's S3 and SageMaker control plane (an instance type moto accepts)."""

import io
import tarfile

import boto3
import pytest

from lmi_tools.errors import AwsError, UsageError
from lmi_tools.sagemaker import deploy as deploy_lib
from lmi_tools.sagemaker.delete import delete, plan_teardown
from lmi_tools.sagemaker.scaling import Autoscaling
from lmi_tools.sagemaker.upload import plan_upload, upload

from .conftest import BUCKET

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"


def tarball(path):
    with tarfile.open(path, "w:gz") as tar:
        data = b"engine=Python\noption.entryPoint=lmi_handlers.entrypoint\n"
        info = tarfile.TarInfo("serving.properties")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def deployed(aws, source, destination, name="tiny", autoscaling=None, client=None):
    s3, sm = aws
    plan = upload(s3, plan_upload(source, destination))
    spec = deploy_lib.EndpointSpec(artifact=str(plan.uri), instance="ml.g4dn.xlarge", role=ROLE, name=name,
                                 region="us-east-1", environment={"OPTION_DTYPE": "fp32"}, autoscaling=autoscaling)
    steps = []
    description = deploy_lib.deploy(sm, s3, deploy_lib.plan_deployment(spec), poll_s=0, on_step=steps.append,
                                    autoscaling=client)
    assert description["EndpointStatus"] == "InService" and len(steps) == (5 if autoscaling else 3)
    return plan


def test_tarball_lifecycle(aws, tmp_path):
    s3, sm = aws
    plan = deployed(aws, tarball(tmp_path / "model.tar.gz"), f"s3://{BUCKET}/lmi/")
    model = sm.describe_model(ModelName="tiny")["PrimaryContainer"]
    assert model["ModelDataUrl"] == str(plan.uri) and model["Environment"] == {"OPTION_DTYPE": "fp32"}
    assert model["Image"].endswith("djl-inference:0.29.0-lmi11.0.0-cu124")
    variant = sm.describe_endpoint_config(EndpointConfigName="tiny")["ProductionVariants"][0]
    assert variant["ModelDataDownloadTimeoutInSeconds"] == 1800 and "VolumeSizeInGB" not in variant  # g4dn: NVMe

    teardown = plan_teardown(sm, "tiny", config=True, model=True, artifacts=True)
    assert teardown.as_json() == {"scaling": [], "components": [], "endpoint": "tiny", "endpoint_config": "tiny",
                                  "models": ["tiny"], "artifacts": [str(plan.uri)]}
    done = []
    delete(sm, s3, teardown, done.append)
    assert done == ["deleted endpoint tiny", "deleted endpoint config tiny", "deleted model tiny",
                    f"deleted 1 object(s) at {plan.uri}"]
    assert sm.list_endpoints()["Endpoints"] == [] and sm.list_models()["Models"] == []
    assert sm.list_endpoint_configs()["EndpointConfigs"] == [] and "Contents" not in s3.list_objects_v2(Bucket=BUCKET)


def test_prefix_lifecycle_deletes_every_object_under_the_prefix_only(aws, tmp_path):
    s3, sm = aws
    (tmp_path / "model" / "tokenizer").mkdir(parents=True)
    (tmp_path / "model" / "serving.properties").write_text("engine=Python\n")
    (tmp_path / "model" / "tokenizer" / "tokenizer.json").write_text("{}")
    s3.put_object(Bucket=BUCKET, Key="keep/other.bin", Body=b"x")
    plan = deployed(aws, tmp_path / "model", f"s3://{BUCKET}/raw/")
    assert sm.describe_model(ModelName="tiny")["PrimaryContainer"]["ModelDataSource"]["S3DataSource"]["S3Uri"] \
        == f"s3://{BUCKET}/raw/"
    teardown = plan_teardown(sm, "tiny", artifacts=True)
    assert (teardown.config, teardown.models, [str(u) for u in teardown.artifacts]) == (None, [], [str(plan.uri)])
    delete(sm, s3, teardown)
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]] == ["keep/other.bin"]
    assert sm.list_models()["Models"]  # not asked to delete the model


def test_a_second_deployment_under_the_same_name_is_refused(aws, tmp_path):
    deployed(aws, tarball(tmp_path / "model.tar.gz"), f"s3://{BUCKET}/lmi/")
    with pytest.raises(AwsError, match="model named tiny already exists") as info:
        deployed(aws, tarball(tmp_path / "model.tar.gz"), f"s3://{BUCKET}/lmi2/")
    assert info.value.kind == "in-use"


def test_delete_after_the_endpoint_is_gone_finds_config_and_model_by_name(aws, tmp_path):
    s3, sm = aws
    deployed(aws, tarball(tmp_path / "model.tar.gz"), f"s3://{BUCKET}/lmi/")
    sm.delete_endpoint(EndpointName="tiny")
    teardown = plan_teardown(sm, "tiny", config=True, model=True)
    assert (teardown.endpoint, teardown.config, teardown.models) == (None, "tiny", ["tiny"])
    delete(sm, s3, teardown)
    assert sm.list_models()["Models"] == []


def test_deleting_what_does_not_exist_is_a_not_found_error(aws):
    _, sm = aws
    with pytest.raises(AwsError, match="no endpoint ghost exists") as info:
        plan_teardown(sm, "ghost", config=True, model=True)
    assert info.value.kind == "not-found"


def test_a_model_on_a_whole_bucket_is_not_emptied(aws):
    s3, sm = aws
    sm.create_model(ModelName="wide", ExecutionRoleArn=ROLE, PrimaryContainer={
        "Image": "img", "ModelDataSource": {"S3DataSource": {"S3Uri": f"s3://{BUCKET}/", "S3DataType": "S3Prefix",
                                                             "CompressionType": "None"}}})
    sm.create_endpoint_config(EndpointConfigName="wide", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": "wide", "InstanceType": "ml.g4dn.xlarge",
        "InitialInstanceCount": 1}])
    sm.create_endpoint(EndpointName="wide", EndpointConfigName="wide")
    with pytest.raises(UsageError, match="whole bucket"):
        plan_teardown(sm, "wide", artifacts=True)


def test_autoscaling_lifecycle_registers_the_variant_and_delete_removes_policy_and_target_first(aws, tmp_path):
    """moto emulates Application Auto Scaling for endpoint variants (not for inference components)."""
    s3, sm = aws
    scaling = boto3.client("application-autoscaling", region_name="us-east-1")
    deployed(aws, tarball(tmp_path / "model.tar.gz"), f"s3://{BUCKET}/lmi/", autoscaling=Autoscaling(
        1, 3, 4.0, "invocations", scale_in_cooldown=900), client=scaling)
    resource = "endpoint/tiny/variant/AllTraffic"
    [target] = scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert (target["ResourceId"], target["ScalableDimension"], target["MinCapacity"], target["MaxCapacity"]) == \
        (resource, "sagemaker:variant:DesiredInstanceCount", 1, 3)
    [policy] = scaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
    tracking = policy["TargetTrackingScalingPolicyConfiguration"]
    assert policy["PolicyName"] == "lmi-invocations-target-tracking" and tracking["TargetValue"] == 4.0
    assert tracking["PredefinedMetricSpecification"] == {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"}
    assert (tracking["ScaleInCooldown"], tracking["ScaleOutCooldown"]) == (900, 300)

    teardown = plan_teardown(sm, "tiny", config=True, model=True, artifacts=True, autoscaling=scaling)
    done = []
    delete(sm, s3, teardown, done.append, autoscaling=scaling)
    assert done[:3] == ["delete_scaling_policy: lmi-invocations-target-tracking",
                        f"deregister_scalable_target: {resource}", "deleted endpoint tiny"]
    assert scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert scaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"] == []
    assert sm.list_endpoints()["Endpoints"] == [] and sm.list_models()["Models"] == []
