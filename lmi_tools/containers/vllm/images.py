"""AWS's vLLM container images for SageMaker: from the sagemaker SDK where it knows them, else from our table.

AWS publishes the image in the ``vllm`` repository of its Deep Learning Containers accounts, one tag per vLLM release
with the ``-sagemaker`` suffix (``<account>.dkr.ecr.<region>.amazonaws.com/vllm:0.27.1-gpu-py312-cu130-ubuntu22.04-
sagemaker``), and on the ECR Public Gallery (``public.ecr.aws/deep-learning-containers/vllm:<tag>``). The tags below
are the SageMaker images that aws/deep-learning-containers lists in ``docs/src/data/vllm/*-gpu-sagemaker.yml``; the
accounts are the Deep Learning Containers' registries, the same as LMI's (``sagemaker/images.py``).

The sagemaker SDK's ``image_uris.retrieve("vllm", ...)`` is asked first, as for LMI's images: SDK v3's
configuration (``sagemaker-core/src/sagemaker/core/image_uri_config/vllm.json``) lists this image from vLLM 0.28.0 on
(older SDKs list only ``huggingface-vllm``, Hugging Face's vLLM image), so for the releases below, or without the SDK,
the table answers. A release newer than both needs ``--image``.
"""

from __future__ import annotations

from ...errors import UsageError
from ...sagemaker.images import ACCOUNTS, ImageChoice, sdk_uri

FRAMEWORK = "vllm"
REPOSITORY = "vllm"
PUBLIC_REGISTRY = "public.ecr.aws/deep-learning-containers"
#: vLLM release -> the SageMaker image's tag.
TAGS = {version: f"{version}-gpu-py312-{cuda}-ubuntu22.04-sagemaker" for version, cuda in (
    ("0.13.0", "cu129"), ("0.14.0", "cu129"), ("0.15.1", "cu129"), ("0.16.0", "cu129"), ("0.17.0", "cu129"),
    ("0.17.1", "cu129"), ("0.18.0", "cu129"), ("0.18.1", "cu129"), ("0.19.0", "cu129"), ("0.19.1", "cu129"),
    ("0.20.0", "cu130"), ("0.20.1", "cu130"), ("0.20.2", "cu130"), ("0.21.0", "cu130"), ("0.22.0", "cu130"),
    ("0.22.1", "cu130"), ("0.23.0", "cu130"), ("0.24.0", "cu130"), ("0.25.0", "cu130"), ("0.25.1", "cu130"),
    ("0.26.0", "cu130"), ("0.27.1", "cu130"))}
DEFAULT_VERSION = "0.27.1"


def _tag(version: str) -> str:
    if version not in TAGS:
        raise UsageError(f"--vllm-version {version!r} is not in the vLLM container's image table",
                         hint=f"known versions: {', '.join(TAGS)}; or pass the image URI with --image")
    return TAGS[version]


def vllm_image(region: str, image: str | None = None, version: str | None = None) -> ImageChoice:
    """The vLLM container's image in ``region``: ``image`` as given, else the sagemaker SDK's, else our table's."""
    if image and version:
        raise UsageError("--image and --vllm-version exclude each other", hint="give one of them")
    if image:
        return ImageChoice(image, "--image")
    version = version or DEFAULT_VERSION
    found = sdk_uri(FRAMEWORK, version, region)
    if found is not None:
        return ImageChoice(found[0], f"sagemaker SDK ({found[1]})", FRAMEWORK, version)
    tag = _tag(version)
    if region not in ACCOUNTS:
        raise UsageError(f"no vLLM container image is known in region {region}",
                         hint=f"regions: {', '.join(sorted(ACCOUNTS))}; or pass --image")
    domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return ImageChoice(f"{ACCOUNTS[region]}.dkr.ecr.{region}.{domain}/{REPOSITORY}:{tag}", "lmi_tools vLLM table",
                       FRAMEWORK, version)


def public_image(version: str | None = None) -> str:
    """The same image on the ECR Public Gallery, for ``docker run`` on an EC2 host."""
    return f"{PUBLIC_REGISTRY}/{REPOSITORY}:{_tag(version or DEFAULT_VERSION)}"
