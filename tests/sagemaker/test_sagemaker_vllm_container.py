"""lmi deploy --container vllm: AWS's vLLM container's image and the model directory's serving.properties as its
SM_VLLM_* environment in create_model (a dry run through the CLI; the calls against botocore's Stubber)."""

import json

from lmi_tools.cli import main
from lmi_tools.sagemaker import deploy as lib

from ..tools.model_shapes import LLAMA_2_13B
from ..tools.test_validate import make_dir
from .test_sagemaker_deploy import ROLE, describe, expect_creation, spec

PROPS = {"engine": "Python", "option.entryPoint": "model.py", "option.model_id": "meta-llama/Llama-2-13b-chat-hf",
         "option.tensor_parallel_degree": "max", "option.max_rolling_batch_size": "16", "option.dtype": "fp16"}
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:0.27.1-gpu-py312-cu130-ubuntu22.04-sagemaker"


def deploy(capsys, model_dir, *extra):
    code = main(["deploy", "--artifact", "s3://lmi-test-artifacts/lmi/model.tar.gz", "--instance", "ml.g5.12xlarge",
                 "--role", ROLE, "--name", "llama", "--container", "vllm", "--model-dir", str(model_dir),
                 "--dry-run", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_dry_run_creates_the_model_with_the_vllm_image_and_environment(tmp_path, capsys):
    model_dir = make_dir(tmp_path, PROPS, None, LLAMA_2_13B)
    code, out, _ = deploy(capsys, model_dir, "--env", "SM_VLLM_MAX_NUM_SEQS=8", "--env", "HF_TOKEN=hf_x")
    plan = json.loads(out)
    assert code == 0 and plan["image"] == {"uri": IMAGE, "source": "lmi_tools vLLM table"}
    container = plan["calls"][0]["params"]["PrimaryContainer"]
    assert container["Image"] == IMAGE
    assert container["Environment"] == {"SM_VLLM_DTYPE": "float16", "SM_VLLM_MAX_NUM_SEQS": "8",  # --env wins
                                        "SM_VLLM_MODEL": "meta-llama/Llama-2-13b-chat-hf",
                                        "SM_VLLM_TENSOR_PARALLEL_SIZE": "4", "HF_TOKEN": "****"}


def test_refusals_name_what_to_change(tmp_path, capsys):
    model_dir = make_dir(tmp_path, {**PROPS, "option.backend": "hf"}, None, LLAMA_2_13B)
    code, _, err = deploy(capsys, model_dir)
    assert code == 2 and "option.backend" in err and "lmi validate --container vllm" in err
    code, _, err = deploy(capsys, make_dir(tmp_path / "ok", PROPS, None, LLAMA_2_13B), "--lmi-version", "0.29.0")
    assert code == 2 and "--vllm-version" in err
    assert main(["deploy", "--artifact", "s3://b/m.tar.gz", "--instance", "ml.g5.2xlarge", "--role", ROLE,
                 "--container", "vllm", "--dry-run"]) == 2
    assert "--model-dir" in capsys.readouterr().err


def test_the_calls_reach_sagemaker_as_planned(stubbed):
    sm, stubber = stubbed
    plan = lib.plan_deployment(spec(instance="ml.g5.12xlarge", container="vllm", vllm_version="0.25.1",
                                    environment={"SM_VLLM_MODEL": "/opt/ml/model"}))
    assert plan.calls[0].params["PrimaryContainer"]["Image"].endswith("/vllm:0.25.1-gpu-py312-cu130-ubuntu22.04-"
                                                                      "sagemaker")
    expect_creation(stubber, plan)
    stubber.add_response("describe_endpoint", describe("InService"), {"EndpointName": "llama"})
    assert lib.deploy(sm, None, plan, poll_s=0, check=False)["EndpointStatus"] == "InService"
