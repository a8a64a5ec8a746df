"""Offline AWS for the SageMaker tooling tests: dummy credentials, one region, moto in memory."""

import boto3
import pytest
from botocore.stub import Stubber

BUCKET = "lmi-test-artifacts"


@pytest.fixture(autouse=True)
def dummy_aws(monkeypatch):
    """Never real AWS: dummy credentials, no profile files, no instance metadata, us-east-1."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_SAGEMAKER",
                 "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def aws():
    """moto's in-memory S3 and SageMaker, with an empty bucket; yields (s3, sagemaker) clients."""
    from moto import mock_aws

    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        yield s3, boto3.client("sagemaker", region_name="us-east-1")


@pytest.fixture
def stubbed():
    """A SageMaker client and its botocore Stubber: every request is checked against the service model and the
    queued expectations, and a test fails if an expected call was never made."""
    client = boto3.client("sagemaker", region_name="us-east-1")
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()
