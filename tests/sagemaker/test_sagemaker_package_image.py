"""lmi deploy --model-dir on an LMI image: the default image is the package's ``# lmi: image=`` line's, and a handler
that needs DJL's async engine is refused on an image older than DJL 0.33.0 (the CLI's dry run; the calls against
botocore's Stubber; a refusal leaves moto's SageMaker untouched)."""

import json

import pytest

from lmi_tools.cli import main
from lmi_tools.errors import UsageError
from lmi_tools.modeldir import image as image_lines
from lmi_tools.sagemaker import deploy as lib
from lmi_tools.sagemaker.package_image import read_package

from ..tools.test_validate import SHIM
from .conftest import BUCKET
from .test_sagemaker_deploy import ROLE, describe, expect_creation, spec

ASYNC = {"engine": "Python", "option.entryPoint": "model.py", "option.model_id": "HuggingFaceTB/SmolLM2-135M",
         "option.backend": "vllm", "option.async_mode": "true", "option.rolling_batch": "disable"}
SYNC = {**{k: v for k, v in ASYNC.items() if k != "option.async_mode"}, "option.rolling_batch": "vllm"}
OWN_ASYNC = "async def handle(inputs):\n    return None\n"
TAG_33 = "djl-inference:0.33.0-lmi15.0.0-cu128"


def package(root, props, image="djl-lmi:0.33.0", model_py=SHIM):
    root.mkdir(parents=True, exist_ok=True)
    lines = ["# lmi: instance_type=ml.g5.2xlarge", *([f"# lmi: image={image}"] if image else [])]
    (root / "serving.properties").write_text("\n".join([*lines, *(f"{k}={v}" for k, v in props.items())]) + "\n")
    (root / "model.py").write_text(model_py)
    return root


def deploy(capsys, model_dir, *extra):
    code = main(["deploy", "--artifact", f"s3://{BUCKET}/lmi/model.tar.gz", "--instance", "ml.g5.2xlarge",
                 "--role", ROLE, "--name", "llama", "--model-dir", str(model_dir), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_default_image_is_the_packages_and_the_options_win(tmp_path, capsys):
    model_dir = package(tmp_path / "m", ASYNC)
    code, out, _ = deploy(capsys, model_dir, "--dry-run")
    image = json.loads(out)["image"]
    assert code == 0 and image["uri"].endswith(TAG_33)
    assert f"# lmi: image=djl-lmi:0.33.0 in {model_dir}/serving.properties" in image["source"]
    code, out, _ = deploy(capsys, model_dir, "--dry-run", "--lmi-version", "0.38.0")
    assert code == 0 and json.loads(out)["image"]["uri"].endswith("djl-inference:0.38.0-lmi29.0.0-cu130")


@pytest.mark.parametrize("image, message", [
    ("djl-neuronx:0.29.0", "ml.g5.2xlarge runs djl-lmi, not djl-neuronx"),
    ("djl-lmi:0.99.0", "djl-lmi 0.99.0 (# lmi: image=djl-lmi:0.99.0 in "),
])
def test_a_line_deploy_cannot_honour_is_named(tmp_path, capsys, image, message):
    code, _, err = deploy(capsys, package(tmp_path / "m", SYNC, image), "--dry-run")
    assert code == 2 and message in " ".join(err.split())


@pytest.mark.parametrize("props, model_py, extra, why", [
    (ASYNC, SHIM, ("--lmi-version", "0.30.0"), "option.async_mode=true"),
    (ASYNC, SHIM, ("--image", "763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:0.30.0-lmi12.0.0-cu124"),
     "option.async_mode=true"),
    (SYNC, OWN_ASYNC, ("--lmi-version", "0.30.0"), "defines an async def handle()"),
])
def test_a_handler_that_needs_async_mode_is_refused_on_an_older_image(tmp_path, capsys, props, model_py, extra, why):
    code, _, err = deploy(capsys, package(tmp_path / "m", props, model_py=model_py), "--dry-run", *extra)
    said = " ".join(err.split())
    assert code == 2 and why in said
    assert "djl-lmi:0.30.0 (DJL 0.30.0) has only the synchronous engine" in said  # the image and its version
    assert "allowed: an LMI image from DJL 0.33.0 (LMI v15) on, with option.async_mode=true" in said


def test_what_the_sync_engine_serves_and_images_it_cannot_read_deploy(tmp_path, capsys):
    code, out, _ = deploy(capsys, package(tmp_path / "sync", SYNC), "--dry-run", "--lmi-version", "0.30.0")
    assert code == 0 and json.loads(out)["image"]["uri"].endswith("0.30.0-lmi12.0.0-cu124")
    code, out, _ = deploy(capsys, package(tmp_path / "async", ASYNC), "--dry-run", "--image", "my.ecr/lmi:custom")
    assert code == 0 and json.loads(out)["image"] == {"uri": "my.ecr/lmi:custom", "source": "--image"}


def test_the_packages_image_reaches_create_model(tmp_path, stubbed):
    sm, stubber = stubbed
    plan = lib.plan_deployment(spec(instance="ml.g5.2xlarge", package=read_package(package(tmp_path / "m", ASYNC))))
    assert plan.calls[0].params["PrimaryContainer"]["Image"].endswith(TAG_33)
    expect_creation(stubber, plan)
    stubber.add_response("describe_endpoint", describe("InService"), {"EndpointName": "llama"})
    assert lib.deploy(sm, None, plan, poll_s=0, check=False)["EndpointStatus"] == "InService"
    with pytest.raises(UsageError, match="has only the synchronous engine"):  # refused before any call is made
        lib.plan_deployment(spec(instance="ml.g5.2xlarge", lmi_version="0.29.0",
                                 package=read_package(tmp_path / "m")))


def test_a_refused_deploy_creates_nothing(tmp_path, capsys, aws):
    _, sm = aws
    code, _, err = deploy(capsys, package(tmp_path / "m", ASYNC), "--lmi-version", "0.29.0", "--no-wait")
    assert code == 2 and "djl-lmi:0.29.0" in err
    assert sm.list_models()["Models"] == [] and sm.list_endpoints()["Endpoints"] == []


@pytest.mark.parametrize("image", [image_lines.LAST_NEURONX, image_lines.CURRENT_LMI])
def test_every_image_a_package_defaults_to_is_in_the_deploy_table(image):
    """A package's default ``# lmi: image=`` line deploys without the SDK: our table knows its tag."""
    from lmi_tools.sagemaker.images import TAGS

    assert image.version in TAGS[image.name]
