"""The SageMaker commands through ``lmi_tools.cli.main``: dry runs, one-line errors with hints, exit codes,
and no secret in any output."""

import json

import pytest
from botocore.exceptions import ClientError

from lmi_tools.cli import main
from lmi_tools.errors import AwsError, ModelFailed
from lmi_tools.sagemaker.aws import from_client_error

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYSECRETKEY"
ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
DEPLOY = ["deploy", "--artifact", "s3://lmi-test-artifacts/lmi/model.tar.gz", "--instance", "ml.g5.12xlarge",
          "--role", ROLE, "--name", "llama"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    return code, out, err


def test_dry_run_prints_the_calls_and_no_secret(capsys, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    code, out, _ = run(capsys, *DEPLOY, "--env", f"HF_TOKEN={SECRET}", "--env", "OPTION_DTYPE=fp16", "--dry-run")
    plan = json.loads(out)
    assert code == 0 and plan["region"] == "us-east-1"
    assert [c["method"] for c in plan["calls"]] == ["create_model", "create_endpoint_config", "create_endpoint"]
    assert plan["calls"][0]["params"]["PrimaryContainer"]["Environment"] == {"HF_TOKEN": "****",
                                                                            "OPTION_DTYPE": "fp16"}


def test_dry_run_needs_no_credentials(capsys, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    code, out, _ = run(capsys, *DEPLOY, "--region", "eu-west-1", "--dry-run")
    assert code == 0 and json.loads(out)["image"]["uri"].startswith("763104351884.dkr.ecr.eu-west-1.")


def test_missing_credentials_are_one_line_with_a_hint(capsys, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # never reached: signing fails first
    code, _, err = run(capsys, "delete", "llama")
    assert code == AwsError.exit_code
    assert err.splitlines() == ["error: describe endpoint llama failed: no AWS credentials were found",
                                "hint: configure credentials (aws configure, aws sso login, AWS_PROFILE, or "
                                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY); the --dry-run of deploy, delete "
                                "and optimize start needs none"]


def test_invoke_without_credentials_suggests_no_option_it_lacks(capsys, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    code, _, err = run(capsys, "invoke", "llama", "--prompt", "hi")
    assert code == AwsError.exit_code and "no AWS credentials were found" in err
    assert "--dry-run of deploy, delete and optimize start" in err


def test_aws_errors_keep_the_secret_out(capsys, monkeypatch, aws):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    code, _, err = run(capsys, "delete", "ghost", "--all")
    assert code == AwsError.exit_code and err.startswith("error: no endpoint ghost exists")
    code, _, err = run(capsys, *DEPLOY[:4], "ml.g4dn.xlarge", *DEPLOY[5:], "--lmi-version", "0.29.0")
    assert code == AwsError.exit_code and "lmi/model.tar.gz does not exist" in err and "hint: upload it" in err


@pytest.mark.parametrize("argv, message", [
    (["invoke", "ep", "--prompt", "hi", "--parameters", "{bad"], "--parameters is not JSON"),
    (["invoke", "ep", "--prompt", "hi", "--parameters", "[1]"], "must be a JSON object"),
    ([*DEPLOY, "--env", "NOVALUE", "--dry-run"], "is not KEY=VALUE"),
    ([*DEPLOY, "--image", "x", "--lmi-version", "0.29.0", "--dry-run"], "exclude each other"),
    (["upload", "missing.tar.gz", "s3://b/x/"], "does not exist"),
])
def test_usage_errors_exit_2(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err


@pytest.mark.parametrize("code, message, kind", [
    ("AccessDeniedException", "User is not authorized to perform: sagemaker:CreateModel", "access-denied"),
    ("ResourceLimitExceeded", "The account-level service limit is 0 Instances", "quota"),
    ("ResourceInUse", "Cannot delete a model in use", "in-use"),
    ("ValidationException", "Could not find endpoint 'x'.", "not-found"),
    ("ValidationException", 'Cannot create already existing endpoint "arn:..."', "in-use"),
    ("ValidationException", "1 validation error detected: Value 'x' at 'instanceType'", "validation"),
    ("ExpiredTokenException", "The security token included in the request is expired", "credentials"),
    ("ThrottlingException", "Rate exceeded", "throttled"),
    ("SomethingNew", "?", "aws"),
])
def test_aws_error_codes_become_kinds_with_hints(code, message, kind):
    error = from_client_error(ClientError({"Error": {"Code": code, "Message": message}}, "CreateModel"), "deploying")
    assert isinstance(error, AwsError) and error.kind == kind and error.code == code
    assert str(error) == f"deploying failed: {message} ({code})"
    assert (error.hint is None) == (kind == "aws")


def test_a_secret_inside_an_aws_message_is_masked(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    error = from_client_error(ClientError({"Error": {"Code": "SignatureDoesNotMatch",
                                                     "Message": f"signed with {SECRET}"}}, "PutObject"), "uploading")
    assert SECRET not in str(error) and "****" in str(error)


def test_model_error_carries_the_containers_status_and_message():
    error = from_client_error(ClientError({"Error": {"Code": "ModelError", "Message": "Received client error (400)"},
                                           "OriginalStatusCode": 400, "OriginalMessage": '{"error": "bad"}',
                                           "LogStreamArn": "arn:aws:logs:...:log-group:/aws/sagemaker/Endpoints/x"},
                                          "InvokeEndpoint"), "invoking endpoint x")
    assert isinstance(error, ModelFailed) and str(error) == 'the model answered 400: {"error": "bad"}'
    assert "log-group:/aws/sagemaker/Endpoints/x" in error.hint


def test_directory_upload_deploy_and_delete_through_the_cli(capsys, aws, tmp_path):
    s3, sm = aws
    (tmp_path / "model" / "tokenizer").mkdir(parents=True)
    (tmp_path / "model" / "serving.properties").write_text("engine=Python\n")
    (tmp_path / "model" / "tokenizer" / "tokenizer.json").write_text("{}")
    code, out, _ = run(capsys, "upload", str(tmp_path / "model"), "s3://lmi-test-artifacts/raw")
    assert (code, out) == (0, "s3://lmi-test-artifacts/raw/\n")
    code, out, err = run(capsys, "deploy", "--artifact", out.strip(), "--instance", "ml.g4dn.xlarge", "--role", ROLE,
                         "--name", "raw-ep", "--poll-interval", "0")
    assert code == 0 and json.loads(out)["EndpointStatus"] == "InService" and "create_endpoint: raw-ep" in err
    source = sm.describe_model(ModelName="raw-ep")["PrimaryContainer"]["ModelDataSource"]["S3DataSource"]
    assert source == {"S3Uri": "s3://lmi-test-artifacts/raw/", "S3DataType": "S3Prefix", "CompressionType": "None"}
    code, out, _ = run(capsys, "delete", "raw-ep", "--all", "--dry-run")
    assert json.loads(out)["artifacts"] == ["s3://lmi-test-artifacts/raw/"] and sm.list_endpoints()["Endpoints"]
    code, out, err = run(capsys, "delete", "raw-ep", "--all")
    assert code == 0 and "deleted 2 object(s) at s3://lmi-test-artifacts/raw/" in err
    assert "Contents" not in s3.list_objects_v2(Bucket="lmi-test-artifacts")
