"""The one-stack EC2 chat host: the template passes cfn-lint and says what the docs say, its user data is valid
bash, ``lmi chat-stack`` prints a create-stack line AWS's CLI can take (through the installed command), and
``--deploy`` creates the stack (moto)."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from cfnlint.api import lint_all
from cfnlint.decode.cfn_yaml import loads

from lmi_tools.ec2.chat_stack import INSTANCE_TYPES, MIN_VOLUME_GIB, ChatStack, parse_model, template_text

ROOT = Path(__file__).resolve().parents[2]
WHEEL = "s3://bkt/lmi_handlers-0.1.0-py3-none-any.whl"
MODELS = ["llama=s3://bkt/llama/model.tar.gz", "s3://bkt/codellama/model.tar.gz"]


@pytest.fixture(scope="module")
def template():
    return loads(template_text())


def test_template_passes_cfn_lint():
    # Errors and warnings, as the cfn-lint command reports by default (its informational rules are opt-in).
    assert [str(m) for m in lint_all(template_text()) if m.rule.id[0] in "EW"] == []


def test_template_has_the_source_parameters_and_outputs_the_url(template):
    params = template["Parameters"]
    assert tuple(params["InstanceType"]["AllowedValues"]) == INSTANCE_TYPES
    assert params["VolumeSize"]["MinValue"] == MIN_VOLUME_GIB and params["KeyName"]["Type"] == "AWS::EC2::KeyPair::KeyName"
    assert params["VpcId"]["Default"] == "" and params["SubnetId"]["Default"] == ""
    new_vpc = {k for k, r in template["Resources"].items() if r.get("Condition") == "NewVpc"}
    assert {"Vpc", "PublicSubnet", "InternetGateway", "DefaultRoute"} <= new_vpc
    host = template["Resources"]["Host"]["Properties"]
    assert host["NetworkInterfaces"][0]["AssociatePublicIpAddress"] is True
    assert template["Outputs"]["Url"]["Value"]["Fn::Sub"] == "http://${Host.PublicDnsName}:8080/"


def test_user_data_is_valid_bash_running_lmi_serve_one_model_at_a_time(template, tmp_path):
    script, _ = template["Resources"]["Host"]["Properties"]["UserData"]["Fn::Base64"]["Fn::Sub"]
    assert "lmi serve $models --host 0.0.0.0 --port 8080 --one-at-a-time" in script
    rendered = re.sub(r"\$\{(\w+)\}", "X", script)  # what Fn::Sub fills in
    (tmp_path / "user-data.sh").write_text(rendered)
    subprocess.run(["bash", "-n", str(tmp_path / "user-data.sh")], check=True)


def lmi(*args, cwd):
    return subprocess.run([sys.executable, "-m", "lmi_tools", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)


def test_lmi_chat_stack_prints_the_create_stack_line(tmp_path):
    result = lmi("chat-stack", *MODELS, "--wheel", WHEEL, "--key-name", "mine", "--instance", "inf2.8xlarge",
                 "--template", "host.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout)
    assert argv[:3] == ["aws", "cloudformation", "create-stack"]
    assert argv[argv.index("--template-body") + 1] == "file://host.yaml"
    assert (tmp_path / "host.yaml").read_text() == template_text()
    params = {p["ParameterKey"]: p["ParameterValue"] for p in json.loads(argv[argv.index("--parameters") + 1])}
    assert params["ModelArtifacts"] == "llama=s3://bkt/llama/model.tar.gz,codellama=s3://bkt/codellama/model.tar.gz"
    assert params["ArtifactBucket"] == "bkt" and params["InstanceType"] == "inf2.8xlarge"
    assert re.fullmatch(loads(template_text())["Parameters"]["ModelArtifacts"]["AllowedPattern"],
                        params["ModelArtifacts"])


@pytest.mark.parametrize("args, message", [
    (["--instance", "inf2.48xlarge"], "--instance inf2.48xlarge is not one this stack serves from"),
    (["--volume-size", "40"], "--volume-size 40 is too small: expected at least 80"),
    (["--vpc-id", "vpc-1"], "--vpc-id vpc-1 needs --subnet-id"),
])
def test_bad_options_are_usage_errors(tmp_path, args, message):
    result = lmi("chat-stack", *MODELS, "--wheel", WHEEL, "--key-name", "k", *args, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def models(*specs):
    return tuple((name, uri) for name, uri, _ in (parse_model(spec, "bkt") for spec in specs))


def test_artifacts_and_wheel_must_share_the_bucket_the_host_may_read():
    stack = ChatStack("s", "inf2.xlarge", "k", models("a=s3://other/a.tar.gz"), WHEEL)
    with pytest.raises(Exception, match="not in the wheel's bucket bkt"):
        stack.check()
    with pytest.raises(Exception, match="neither an S3 URI nor a model directory"):
        parse_model("a=/nowhere/model.tar.gz", "bkt")


def test_a_model_directory_gets_its_package_and_upload_lines(tmp_path):
    (tmp_path / "mistral").mkdir()
    (tmp_path / "mistral" / "serving.properties").write_text("engine=Python\n")
    result = lmi("chat-stack", "chat=mistral", "s3://bkt/code/model.tar.gz", "--wheel", WHEEL, "--key-name", "k",
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    package, upload, create = result.stdout.splitlines()
    assert package == "lmi package mistral -o chat.tar.gz"
    assert upload == "lmi upload chat.tar.gz s3://bkt/lmi-chat/chat/model.tar.gz"
    assert "chat=s3://bkt/lmi-chat/chat/model.tar.gz,code=s3://bkt/code/model.tar.gz" in create
    deploy = lmi("chat-stack", "chat=mistral", "--wheel", WHEEL, "--key-name", "k", "--deploy", cwd=tmp_path)
    assert deploy.returncode == 2 and "must be in S3 before the stack is created" in deploy.stderr


def test_deploy_creates_the_stack(monkeypatch):
    from moto import mock_aws

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        stack = ChatStack("lmi-chat", "inf2.xlarge", "mine", models(*MODELS), WHEEL)
        cloudformation = boto3.client("cloudformation")
        stack_id = stack.create(cloudformation)
        described = cloudformation.describe_stacks(StackName=stack_id)["Stacks"][0]
    assert described["StackStatus"] == "CREATE_COMPLETE"
    assert {p["ParameterKey"]: p["ParameterValue"] for p in described["Parameters"]}["KeyName"] == "mine"
