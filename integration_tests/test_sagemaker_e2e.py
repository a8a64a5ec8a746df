"""The SageMaker path end to end, offline: package the tiny model with ``lmi package``,
upload it to moto's S3, deploy it on moto's SageMaker control plane, play SageMaker's part (download and
untar the model data, serve it with ``lmi serve``, whose SageMaker Runtime paths a real boto3 client calls),
invoke it with and without streaming, compare with ``/predictions/<model>``, and delete everything.

Once through the library API, once through the CLI as docs/sagemaker.md tells a user to run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import shutil
from pathlib import Path

import boto3
import httpx
import pytest

from lmi_tools.packaging.artifact import unpack
from lmi_tools.packaging.package import build
from lmi_tools.sagemaker import deploy as deploy_lib
from lmi_tools.sagemaker import invoke as invoke_lib
from lmi_tools.sagemaker.delete import delete, plan_teardown
from lmi_tools.sagemaker.upload import S3Uri, plan_upload, upload

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "lmi-e2e-artifacts"
ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
INSTANCE = "ml.g4dn.xlarge"  # moto refuses ml.g5 / ml.inf2 (their request shapes are covered with Stubber)
PROMPT = "The quick brown fox"
PARAMETERS = {"max_new_tokens": 16}
# Dummy credentials and nothing from the user's AWS configuration: these tests never reach AWS.
OFFLINE_AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
               "AWS_EC2_METADATA_DISABLED": "true"}
SERVING_PROPERTIES = ("engine=Python\noption.entryPoint=lmi_handlers.entrypoint\noption.rolling_batch=scheduler\n"
                      "option.max_new_tokens=16\n")


@pytest.fixture(scope="module")
def moto_url():
    """moto's S3 and SageMaker control plane on a free loopback port (a real HTTP server, as AWS would be)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def aws_client(service: str, url: str):
    return boto3.client(service, endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing")


def model_directory(tiny_model_dir: Path, base: Path) -> Path:
    """The tiny model's weights with a serving.properties: a self-contained model directory."""
    model_dir = base / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    (model_dir / "serving.properties").write_text(SERVING_PROPERTIES)
    return model_dir


def package(tiny_model_dir: Path, out: Path) -> Path:
    """``lmi package``'s library call: validated, the runtime vendored, reproducible bytes."""
    build(model_directory(tiny_model_dir, out.parent), out, None, instance="g5.xlarge")
    return out


def act_as_sagemaker(s3, sm, endpoint: str, base: Path) -> Path:
    """What SageMaker does with the model: read the endpoint's model data from S3 and untar it into
    /opt/ml/model (here ``base/<endpoint>``, so that lmi serve names the model after the endpoint)."""
    config = sm.describe_endpoint_config(EndpointConfigName=sm.describe_endpoint(EndpointName=endpoint)
                                         ["EndpointConfigName"])
    container = sm.describe_model(ModelName=config["ProductionVariants"][0]["ModelName"])["PrimaryContainer"]
    uri = S3Uri.parse(container["ModelDataUrl"])
    archive = base / "download.tar.gz"
    s3.download_file(uri.bucket, uri.key, str(archive))
    return unpack(archive, base / endpoint)


def predictions_text(server, name: str) -> str:
    answer = httpx.post(f"{server.url}/predictions/{name}", json={"inputs": PROMPT, "parameters": PARAMETERS},
                        timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()["generated_text"]


def assert_nothing_left(s3, sm):
    assert sm.list_endpoints()["Endpoints"] == [] and sm.list_endpoint_configs()["EndpointConfigs"] == []
    assert sm.list_models()["Models"] == [] and "Contents" not in s3.list_objects_v2(Bucket=BUCKET)


def test_library_end_to_end(moto_url, tiny_model_dir, serve, tmp_path):
    s3, sm = aws_client("s3", moto_url), aws_client("sagemaker", moto_url)
    s3.create_bucket(Bucket=BUCKET)
    uploaded = upload(s3, plan_upload(package(tiny_model_dir, tmp_path / "model.tar.gz"), f"s3://{BUCKET}/lib/"))
    spec = deploy_lib.EndpointSpec(artifact=str(uploaded.uri), instance=INSTANCE, role=ROLE, name="tiny-lib",
                                 region="us-east-1")
    assert deploy_lib.deploy(sm, s3, deploy_lib.plan_deployment(spec), poll_s=0)["EndpointStatus"] == "InService"

    server = serve([act_as_sagemaker(s3, sm, "tiny-lib", tmp_path)], args=["--sagemaker-part-size", "7"])
    runtime = boto3.client("sagemaker-runtime", endpoint_url=server.url, region_name="us-east-1",
                           aws_access_key_id="testing", aws_secret_access_key="testing")
    expected = predictions_text(server, "tiny-lib")
    plain = invoke_lib.invoke(runtime, "tiny-lib", invoke_lib.request_body(PROMPT, PARAMETERS))
    tokens = invoke_lib.invoke_stream(runtime, "tiny-lib", invoke_lib.request_body(PROMPT, PARAMETERS, stream=True))
    pieces = list(tokens)
    assert len(pieces) == 16 and plain.text == "".join(pieces) == tokens.answer.text == expected

    delete(sm, s3, plan_teardown(sm, "tiny-lib", config=True, model=True, artifacts=True))
    assert_nothing_left(s3, sm)


def lmi(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmi_tools", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_cli_end_to_end_as_documented(moto_url, tiny_model_dir, serve, tmp_path):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **OFFLINE_AWS,
           "AWS_ENDPOINT_URL": moto_url, "PYTHONPATH": str(ROOT)}
    s3, sm = aws_client("s3", moto_url), aws_client("sagemaker", moto_url)
    s3.create_bucket(Bucket=BUCKET)  # aws s3 mb s3://BUCKET
    tarball = tmp_path / "model.tar.gz"
    done = lmi("package", str(model_directory(tiny_model_dir, tmp_path)), "-o", str(tarball), "--instance",
               "g5.xlarge", env=env)
    assert done.returncode == 0, done.stderr

    done = lmi("upload", str(tarball), f"s3://{BUCKET}/cli/", env=env)
    assert done.returncode == 0, done.stderr
    artifact = done.stdout.strip()
    assert artifact == f"s3://{BUCKET}/cli/model.tar.gz"
    done = lmi("deploy", "--artifact", artifact, "--instance", INSTANCE, "--role", ROLE, "--name", "tiny-cli",
               "--poll-interval", "1", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["EndpointStatus"] == "InService"

    server = serve([act_as_sagemaker(s3, sm, "tiny-cli", tmp_path)], args=["--sagemaker-part-size", "5"])
    expected = predictions_text(server, "tiny-cli")
    ask = ["invoke", "tiny-cli", "--prompt", PROMPT, "--parameters", json.dumps(PARAMETERS)]
    plain = lmi(*ask, "--endpoint-url", server.url, env=env)
    assert plain.returncode == 0, plain.stderr
    # The streamed call finds lmi serve through boto3's per-service variable instead of --endpoint-url.
    streamed = lmi(*ask, "--stream", env={**env, "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": server.url})
    assert streamed.returncode == 0, streamed.stderr
    assert plain.stdout == streamed.stdout == expected + "\n"

    done = lmi("delete", "tiny-cli", "--all", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"scaling": [], "components": [], "endpoint": "tiny-cli",
                                       "endpoint_config": "tiny-cli", "models": ["tiny-cli"], "artifacts": [artifact]}
    assert_nothing_left(s3, sm)
