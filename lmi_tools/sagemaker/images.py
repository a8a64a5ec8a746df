"""LMI (DJLServing) image URIs for SageMaker: from the sagemaker SDK when it is installed, else from our table.

The SDK is an optional extra (it pulls in 60-130 packages, reference/sagemaker.md §1.2); its
``image_uris.retrieve(framework, region, version)`` reads a JSON table shipped in the wheel and works offline.
Without it we use the table below, copied by hand from the SDK's ``image_uri_config/djl-neuronx.json`` and
``djl-lmi.json`` (sagemaker-core's, which has 0.31.0-0.36.0; reference/sagemaker.md §1.3, reference/neuron.md §5),
plus djl-neuronx 0.30.0 from aws/deep-learning-containers' list of images. Images live in the ``djl-inference``
ECR repository of AWS's account for the region: 763104351884 in most commercial regions; opt-in, China and
GovCloud regions have their own. A release newer than the table needs ``--image``.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass

from ..errors import UsageError
from ..instances import HostingInstance

DEFAULT_VERSION = "0.29.0"  # the last LMI line with transformers-neuronx (reference/djl-contract.md)
FRAMEWORKS = {"neuron": "djl-neuronx", "gpu": "djl-lmi"}
REPOSITORY = "djl-inference"

TAGS = {
    "djl-neuronx": {
        "0.22.1": "0.22.1-neuronx-sdk2.10.0", "0.23.0": "0.23.0-neuronx-sdk2.12.0",
        "0.24.0": "0.24.0-neuronx-sdk2.14.1", "0.25.0": "0.25.0-neuronx-sdk2.15.0",
        "0.26.0": "0.26.0-neuronx-sdk2.16.0", "0.27.0": "0.27.0-neuronx-sdk2.18.1",
        "0.28.0": "0.28.0-neuronx-sdk2.18.2", "0.29.0": "0.29.0-neuronx-sdk2.19.1",
        "0.30.0": "0.30.0-neuronx-sdk2.20.1",  # not in the SDK's table: aws/deep-learning-containers' list
    },
    "djl-lmi": {
        "0.28.0": "0.28.0-lmi10.0.0-cu124", "0.29.0": "0.29.0-lmi11.0.0-cu124", "0.30.0": "0.30.0-lmi12.0.0-cu124",
        "0.31.0": "0.31.0-lmi13.0.0-cu124", "0.32.0": "0.32.0-lmi14.0.0-cu126", "0.33.0": "0.33.0-lmi15.0.0-cu128",
        "0.34.0": "0.34.0-lmi16.0.0-cu128", "0.35.0": "0.35.0-lmi17.0.0-cu128", "0.36.0": "0.36.0-lmi27.0.0-cu130",
        "0.38.0": "0.38.0-lmi29.0.0-cu130",
    },
}

MAIN_ACCOUNT = "763104351884"
_MAIN_REGIONS = ("ap-northeast-1 ap-northeast-2 ap-south-1 ap-southeast-1 ap-southeast-2 ca-central-1 eu-central-1 "
                 "eu-north-1 eu-west-1 eu-west-2 eu-west-3 sa-east-1 us-east-1 us-east-2 us-west-1 us-west-2")
ACCOUNTS = {
    **{region: MAIN_ACCOUNT for region in _MAIN_REGIONS.split()},
    "af-south-1": "626614931356", "ap-east-1": "871362719292", "ap-northeast-3": "364406365360",
    "ap-southeast-3": "907027046896", "ca-west-1": "204538143572", "cn-north-1": "727897471807",
    "cn-northwest-1": "727897471807", "eu-south-1": "692866216735", "il-central-1": "780543022126",
    "me-central-1": "914824155844", "me-south-1": "217643126080", "us-gov-east-1": "446045086412",
    "us-gov-west-1": "442386744353",
}
# djl-neuronx is published in fewer regions than djl-lmi.
REGIONS = {
    "djl-neuronx": frozenset({"ap-northeast-1", "ap-south-1", "ap-southeast-1", "ap-southeast-2", "eu-central-1",
                              "eu-west-1", "eu-west-3", "sa-east-1", "us-east-1", "us-east-2", "us-west-2",
                              "ca-west-1"}),
    "djl-lmi": frozenset(ACCOUNTS),
}
SDK_MODULES = ("sagemaker.core.image_uris", "sagemaker.image_uris")  # v3 (and sagemaker-core), then v2


@dataclass(frozen=True)
class ImageChoice:
    """The image to deploy and where its URI came from (``--image``, the sagemaker SDK, or our table)."""

    uri: str
    source: str
    framework: str | None = None
    version: str | None = None


def table_uri(framework: str, version: str, region: str, asked_by: str = "--lmi-version") -> str:
    """The URI from our own table; ``UsageError`` naming what is known when the version or region is not.
    ``asked_by``: what asked for ``version``, for the message."""
    tags = TAGS[framework]
    if version not in tags:
        raise UsageError(f"{framework} {version} ({asked_by}) is not in the image table",
                         hint=f"known versions: {', '.join(tags)}; or pass the image URI with --image, or "
                              "install the sagemaker SDK, whose table may know it")
    if region not in REGIONS[framework]:
        raise UsageError(f"no {framework} image is known in region {region}",
                         hint=f"{framework} regions: {', '.join(sorted(REGIONS[framework]))}; or pass --image")
    domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"{ACCOUNTS[region]}.dkr.ecr.{region}.{domain}/{REPOSITORY}:{tags[version]}"


def sdk_uri(framework: str, version: str, region: str) -> tuple[str, str] | None:
    """``(uri, module)`` from an installed sagemaker SDK; None without the SDK or when its table lacks the image."""
    for name in SDK_MODULES:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # v2 warns about its own deprecation on import
                module = importlib.import_module(name)
        except ImportError:
            continue
        try:
            return module.retrieve(framework, region=region, version=version), name
        except (ValueError, FileNotFoundError):  # "Unsupported ... version/region", or a framework it has no
            return None  # configuration for: our table may still know it
    return None


def resolve_image(instance: HostingInstance, region: str, image: str | None = None,
                  lmi_version: str | None = None, asked_by: str = "--lmi-version") -> ImageChoice:
    """The image for ``instance`` in ``region``: ``image`` as given, else djl-neuronx (Neuron) or djl-lmi (GPU), of
    ``lmi_version`` (``asked_by`` says where it came from) or the default."""
    if image and lmi_version:
        raise UsageError("--image and --lmi-version exclude each other", hint="give one of them")
    if image:
        return ImageChoice(image, "--image")
    framework = FRAMEWORKS[instance.kind]
    version = lmi_version or DEFAULT_VERSION
    found = sdk_uri(framework, version, region)
    if found is not None:
        return ImageChoice(found[0], f"sagemaker SDK ({found[1]})", framework, version)
    return ImageChoice(table_uri(framework, version, region, asked_by), "lmi_tools table", framework, version)
